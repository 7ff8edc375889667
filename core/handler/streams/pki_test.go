package streams

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
	"testing"
	"time"

	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// testCA is a certificate authority made in the test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial int64

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key := newKey(t)
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
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
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue makes a leaf certificate: a serving one for nodeapi.ServerName when server, else a
// client one, with common name cn. It returns the PEM certificate and key.
func (ca *testCA) issue(t *testing.T, cn string, server bool) (crtPEM, keyPEM []byte) {
	t.Helper()
	key := newKey(t)
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{nodeapi.ServerName}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
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

// keyPair is the tls.Certificate of issue's PEM.
func (ca *testCA) keyPair(t *testing.T, cn string, server bool) tls.Certificate {
	t.Helper()
	crt, key := ca.issue(t, cn, server)
	c, err := tls.X509KeyPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// writeCertDir writes a handler certificate directory as the Secret's mount has it: a serving
// certificate of ca for nodeapi.ServerName, and clientCA's bundle. It returns the serving
// certificate's PEM.
func writeCertDir(t *testing.T, dir string, ca, clientCA *testCA) []byte {
	t.Helper()
	crt, key := ca.issue(t, "kubevisor-handler", true)
	for name, data := range map[string][]byte{CertFile: crt, KeyFile: key, CAFile: clientCA.pem} {
		// Write and rename, as the kubelet swaps a Secret's files in one step.
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return crt
}

// clientTLS is kubevisor-api's side: the handler's CA as roots, ServerName checked, and cert
// (when any) presented.
func clientTLS(serverCA *testCA, cert *tls.Certificate) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(serverCA.cert)
	c := &tls.Config{RootCAs: pool, ServerName: nodeapi.ServerName, MinVersion: tls.VersionTLS12}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}
