package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestIssueSignsWithTheCurrentCA issues a certificate for a key the CA never sees: it chains
// to the bundle, carries exactly the subject and usages asked, no names, and lives no longer
// than asked nor than the CA; after a CA rotation LoadCA signs with the new CA.
func TestIssueSignsWithTheCurrentCA(t *testing.T) {
	dir := t.TempDir()
	clk := &clock{t: time.Now()}
	o := testOptions(dir, clk.Now)
	st := mustEnsure(t, o)
	ca, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	usages := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	data, err := ca.Issue(&key.PublicKey, pkix.Name{CommonName: "kubevisor-node:n1"}, usages, 30*time.Minute, clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "CERTIFICATE" {
		t.Fatalf("Issue returned %q, want one PEM certificate", data)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(st.Bundle)
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: clk.Now(), KeyUsages: usages}); err != nil {
		t.Errorf("issued certificate does not verify against the bundle: %v", err)
	}
	if c.Subject.CommonName != "kubevisor-node:n1" || !slices.Equal(c.ExtKeyUsage, usages) ||
		c.KeyUsage != x509.KeyUsageDigitalSignature || len(c.DNSNames)+len(c.IPAddresses)+len(c.URIs)+len(c.EmailAddresses) != 0 {
		t.Errorf("issued %v usages %v keyUsage %v names %v %v", c.Subject, c.ExtKeyUsage, c.KeyUsage, c.DNSNames, c.IPAddresses)
	}
	if got := c.NotAfter.Sub(clk.Now()); got > 30*time.Minute || got < 29*time.Minute {
		t.Errorf("lifetime %s, want 30m", got)
	}
	if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		t.Error("the certificate is not for the key asked")
	}

	// Never beyond the CA (3h here).
	long, err := ca.Issue(&key.PublicKey, pkix.Name{CommonName: "x"}, usages, 100*time.Hour, clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, _ = pem.Decode(long)
	lc, _ := x509.ParseCertificate(b.Bytes)
	if lc.NotAfter.After(ca.Certificate().NotAfter) {
		t.Errorf("certificate outlives its CA: %s > %s", lc.NotAfter, ca.Certificate().NotAfter)
	}

	// The CA rotates (less than a certificate lifetime left): LoadCA gives the new one.
	clk.Add(2*time.Hour + time.Minute)
	if st := mustEnsure(t, o); !st.CARotated {
		t.Fatal("want a CA rotation")
	}
	ca2, err := LoadCA(dir)
	if err != nil || ca2.Certificate().Equal(ca.Certificate()) {
		t.Fatalf("LoadCA after rotation: %v, same CA %v", err, err == nil && ca2.Certificate().Equal(ca.Certificate()))
	}

	// No CA, or a key that is not the CA's: an error.
	if _, err := LoadCA(t.TempDir()); err == nil {
		t.Error("LoadCA of an empty directory: no error")
	}
	if err := os.WriteFile(filepath.Join(dir, CAKeyFile), pemKey(t), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(dir); err == nil {
		t.Error("LoadCA with a mismatched key: no error")
	}
}

func pemKey(t *testing.T) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}
