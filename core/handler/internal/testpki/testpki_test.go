package testpki

import (
	"crypto/x509"
	"slices"
	"testing"
	"time"

	"github.com/kubevisor/kubevisor/core/handler/internal/certdir"
)

// TestLeafVerifies: a leaf carries the names, usages and validity asked for, verifies against
// its CA's pool for its usage and name, and not against another CA's, nor once it expired.
func TestLeafVerifies(t *testing.T) {
	ca, other := NewCA(t, "ca"), NewCA(t, "other-ca")
	l := Leaf{CommonName: "srv", DNSNames: []string{"srv.example"}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	kp := ca.KeyPair(t, l)
	c := kp.Leaf
	if c.Subject.CommonName != "srv" || !slices.Equal(c.DNSNames, l.DNSNames) || !slices.Equal(c.ExtKeyUsage, l.Usages) {
		t.Fatalf("leaf %q %v %v, want %+v", c.Subject.CommonName, c.DNSNames, c.ExtKeyUsage, l)
	}
	if d := time.Until(c.NotAfter); d < 50*time.Minute || d > 70*time.Minute {
		t.Errorf("NotAfter in %v, want about an hour", d)
	}
	opts := x509.VerifyOptions{Roots: ca.Pool(), DNSName: "srv.example", KeyUsages: l.Usages}
	if _, err := c.Verify(opts); err != nil {
		t.Errorf("verify against its CA: %v", err)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("a serverAuth leaf verified for clientAuth")
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: other.Pool(), DNSName: "srv.example", KeyUsages: l.Usages}); err == nil {
		t.Error("verified against another CA")
	}
	l.NotAfter = time.Now().Add(-time.Minute)
	if _, err := ca.KeyPair(t, l).Leaf.Verify(opts); err == nil {
		t.Error("an expired leaf verified")
	}
	if c2 := ca.KeyPair(t, Leaf{CommonName: "srv"}).Leaf; c2.SerialNumber.Cmp(c.SerialNumber) == 0 {
		t.Errorf("two leaves with serial %v", c.SerialNumber)
	}
}

// TestCertDirIsReadByCertdir: certdir.Store reads CertDir's directory (the leaf and the trusted
// CA's bundle), and WriteCertDir into the same directory rotates both under it.
func TestCertDirIsReadByCertdir(t *testing.T) {
	ca, trusted := NewCA(t, "ca"), NewCA(t, "trusted-ca")
	s := &certdir.Store{Dir: CertDir(t, ca, Leaf{CommonName: "one"}, trusted)}
	cert, pool, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if cert.Leaf.Subject.CommonName != "one" || cert.Leaf.Issuer.CommonName != "ca" {
		t.Errorf("certificate %q of %q, want \"one\" of \"ca\"", cert.Leaf.Subject.CommonName, cert.Leaf.Issuer.CommonName)
	}
	if !pool.Equal(trusted.Pool()) {
		t.Error("the CA bundle is not the trusted CA's")
	}

	WriteCertDir(t, s.Dir, trusted, Leaf{CommonName: "two"}, ca)
	cert, pool, err = s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if cert.Leaf.Subject.CommonName != "two" || !pool.Equal(ca.Pool()) {
		t.Errorf("after the rewrite: certificate %q, bundle the trusted CA's %v; want \"two\" and the first CA's", cert.Leaf.Subject.CommonName, pool.Equal(trusted.Pool()))
	}
}
