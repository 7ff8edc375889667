// Package testpki makes a throwaway PKI for the node handler's tests: a certificate authority,
// leaf certificates of it with the names, usages and validity a test asks for, and a credentials
// directory in the layout core/handler/internal/certdir reads. Every key is an ECDSA P-256 key
// made in the test; a failure ends the test with t.Fatal. It is for tests only.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubevisor/kubevisor/core/handler/internal/certdir"
)

// serial numbers every certificate made in the test binary, CAs and leaves alike.
var serial atomic.Int64

// CA is a certificate authority made in the test, valid from an hour ago to an hour from now.
type CA struct {
	// Cert is the CA's certificate.
	Cert *x509.Certificate
	// PEM is Cert PEM-encoded: a CA bundle of this CA alone.
	PEM []byte

	key *ecdsa.PrivateKey
}

// Leaf says what CA.Issue makes.
type Leaf struct {
	// CommonName is the subject's common name.
	CommonName string
	// DNSNames are the subject alternative names; none when empty.
	DNSNames []string
	// Usages are the extended key usages (x509.ExtKeyUsageServerAuth, ...).
	Usages []x509.ExtKeyUsage
	// NotAfter is the end of the validity; zero: an hour from now. The validity starts two
	// hours ago, so that a NotAfter in the recent past makes an expired certificate.
	NotAfter time.Time
}

// NewCA makes a self-signed CA with common name name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}
}

// Pool is a certificate pool of the CA alone, for a tls.Config's RootCAs or ClientCAs.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool
}

// Issue makes a certificate of the CA for l, with a new key, and returns both PEM-encoded.
func (ca *CA) Issue(t testing.TB, l Leaf) (crtPEM, keyPEM []byte) {
	t.Helper()
	key := newKey(t)
	notAfter := l.NotAfter
	if notAfter.IsZero() {
		notAfter = time.Now().Add(time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: l.CommonName},
		DNSNames:  l.DNSNames,
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: l.Usages,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// KeyPair is Issue's certificate and key as a tls.Certificate.
func (ca *CA) KeyPair(t testing.TB, l Leaf) tls.Certificate {
	t.Helper()
	crt, key := ca.Issue(t, l)
	c, err := tls.X509KeyPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// WriteCertDir writes a credentials directory into dir as a mounted kubernetes.io/tls Secret
// has it (certdir.CertFile, certdir.KeyFile, certdir.CAFile): a certificate of ca for l with
// its key, and trusted's bundle. Each file is written under a temporary name and renamed into
// place, as the kubelet swaps a Secret's files, so writing again into a directory a
// certdir.Store polls rotates the credentials under it.
func WriteCertDir(t testing.TB, dir string, ca *CA, l Leaf, trusted *CA) {
	t.Helper()
	crt, key := ca.Issue(t, l)
	for _, f := range []struct {
		name string
		data []byte
	}{{certdir.CertFile, crt}, {certdir.KeyFile, key}, {certdir.CAFile, trusted.PEM}} {
		tmp := filepath.Join(dir, "."+f.name+".tmp")
		if err := os.WriteFile(tmp, f.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, f.name)); err != nil {
			t.Fatal(err)
		}
	}
}

// CertDir is WriteCertDir into a new temporary directory of the test, which it returns.
func CertDir(t testing.TB, ca *CA, l Leaf, trusted *CA) string {
	t.Helper()
	dir := t.TempDir()
	WriteCertDir(t, dir, ca, l, trusted)
	return dir
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
