package certs

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"path/filepath"
	"time"
)

// CA is the current CA of a certificate directory, for a signer that issues certificates for
// keys it does not hold (controlplane/nodecerts signs the handlers' CSRs with it).
type CA struct {
	pair *keyPair
}

// LoadCA reads the current CA (ca.crt and ca.key) of dir, as Ensure keeps it. It fails while
// there is none, or while a rotation has replaced one file and not yet the other.
func LoadCA(dir string) (*CA, error) {
	p, err := readPair(filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("read CA of %s: %w", dir, err)
	}
	if !p.cert.IsCA {
		return nil, fmt.Errorf("read CA of %s: %s is not a CA certificate", dir, CAFile)
	}
	return &CA{pair: p}, nil
}

// Certificate is the CA's certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.pair.cert }

// Issue signs a certificate for pub: subject, KeyUsage digitalSignature, the ExtKeyUsages
// usages, no names, valid from now (backdated by a few minutes for clocks behind) for lifetime
// but not beyond the CA. It returns the certificate in PEM.
func (ca *CA) Issue(pub crypto.PublicKey, subject pkix.Name, usages []x509.ExtKeyUsage, lifetime time.Duration, now time.Time) ([]byte, error) {
	if lifetime <= 0 {
		return nil, errors.New("issue: the lifetime must be positive")
	}
	if !now.Before(ca.pair.cert.NotAfter) {
		return nil, fmt.Errorf("issue: the CA expired at %s", ca.pair.cert.NotAfter)
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      subject,
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     earlier(now.Add(lifetime), ca.pair.cert.NotAfter),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usages,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.pair.cert, pub, ca.pair.key)
	if err != nil {
		return nil, fmt.Errorf("issue: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}
