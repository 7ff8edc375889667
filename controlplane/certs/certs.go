// Package certs keeps kubevisor-api's self-signed CA and the certificates it issues, renews
// them before they expire, and hands the CA bundle to whoever must trust them.
//
// Layout. In the certificate directory (Options.Dir, kubevisor-api's --cert-dir):
//
//	ca.crt, ca.key       the current CA
//	ca-bundle.crt        the CA bundle: the current CA, and the previous one while it is valid
//	tls.crt, tls.key     serving certificate of the kubevisor-api Service (webhooks and the
//	                     aggregated API), ExtKeyUsage serverAuth
//	client.crt,          client certificate of kubevisor-api (Options.ClientName, in practice
//	client.key           nodeapi.ClientName), ExtKeyUsage clientAuth, with which the aggregated
//	                     API dials the handlers; it verifies them with ca-bundle.crt
//
// In the install namespace, the kubernetes.io/tls Secret nodeapi.HandlerCertSecret
// (EnsureSecret): tls.crt and tls.key, the handlers' serving certificate for
// nodeapi.ServerName (ExtKeyUsage serverAuth), and ca.crt, the CA bundle that client
// certificates must chain to.
//
// The CA bundle is injected into the webhook configurations (InjectCABundle) and into the
// APIService of the aggregated API (InjectAPIServiceCABundle). Rotator does all of it in a loop.
//
// The CA itself lives in the Secret DefaultCASecret of the install namespace (casecret.go:
// EnsureCA keeps it, SyncCA copies it into the directory, and Ensure with Options.ExternalCA
// issues from it), so that it outlives the process; without a CA Secret, Ensure keeps a CA of its
// own in the directory.
//
// The current CA also signs the handlers' node certificates, whose keys it never sees
// (LoadCA, CA.Issue; controlplane/nodecerts); the handlers trust them with the bundle of the
// Secret.
package certs

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Names of the files in the certificate directory. tls.crt and tls.key are what
// controller-runtime's webhook server reads (and reloads on change); the CA's files let a
// restarted process keep the CA the API server already trusts.
const (
	CertFile   = "tls.crt"
	KeyFile    = "tls.key"
	CAFile     = "ca.crt"
	CAKeyFile  = "ca.key"
	BundleFile = "ca-bundle.crt"
	// ClientCertFile and ClientKeyFile are the client certificate (Options.ClientName).
	ClientCertFile = "client.crt"
	ClientKeyFile  = "client.key"
)

// Defaults of Options.
const (
	DefaultLifetime    = 90 * 24 * time.Hour
	DefaultRenewBefore = 30 * 24 * time.Hour
	// DefaultCALifetimeFactor is how many serving-certificate lifetimes a CA lives, so that
	// most renewals reuse the CA and need no new bundle in the webhook configurations.
	DefaultCALifetimeFactor = 4
	// clockSkew backdates NotBefore so that an API server whose clock is slightly behind accepts
	// a certificate made a moment ago.
	clockSkew = 5 * time.Minute
)

// Options say what to issue and when to renew it.
type Options struct {
	// Dir is where the files are written. Required.
	Dir string
	// ServiceName and ServiceNamespace give the DNS names of the certificate:
	// <svc>, <svc>.<ns>, <svc>.<ns>.svc and <svc>.<ns>.svc.cluster.local.
	ServiceName, ServiceNamespace string
	// ExtraNames are added to the certificate: an IP address as an IP SAN, anything else as a
	// DNS name (for example "localhost", "127.0.0.1").
	ExtraNames []string
	// Lifetime of a serving certificate; DefaultLifetime when 0.
	Lifetime time.Duration
	// RenewBefore is how long before expiry a certificate (or CA) is renewed;
	// DefaultRenewBefore when 0, and at most half of Lifetime.
	RenewBefore time.Duration
	// ClientName, when set, is the common name of a client certificate (ExtKeyUsage
	// clientAuth) kept in ClientCertFile and ClientKeyFile, with Lifetime and RenewBefore.
	ClientName string
	// CALifetime is the lifetime of the CA; DefaultCALifetimeFactor*Lifetime when 0, and at
	// least 2*Lifetime.
	CALifetime time.Duration
	// ExternalCA says the CA is someone else's: SyncCA wrote it into Dir from the CA Secret
	// (casecret.go). Ensure then never makes or replaces a CA, takes the bundle as it is, and
	// keeps a serving certificate of a previous CA of the bundle until it is due.
	ExternalCA bool
	// Now returns the current time; time.Now when nil (tests move it).
	Now func() time.Time
}

func (o Options) withDefaults() (Options, error) {
	if o.Dir == "" {
		return o, errors.New("certificate directory is required")
	}
	if o.ServiceName == "" && len(o.ExtraNames) == 0 {
		return o, errors.New("a service name or an extra DNS name is required")
	}
	return o.lifetimes()
}

// lifetimes fills in the defaults of the lifetimes and Now, and checks them against each other.
func (o Options) lifetimes() (Options, error) {
	if o.Lifetime <= 0 {
		o.Lifetime = DefaultLifetime
	}
	if o.RenewBefore <= 0 {
		o.RenewBefore = DefaultRenewBefore
	}
	o.RenewBefore = min(o.RenewBefore, o.Lifetime/2)
	if o.CALifetime <= 0 {
		o.CALifetime = DefaultCALifetimeFactor * o.Lifetime
	}
	// A CA is renewed once it cannot outlive a new certificate; with less than two certificate
	// lifetimes that would be due again as soon as it is made.
	if o.CALifetime < 2*o.Lifetime {
		return o, fmt.Errorf("CA lifetime %s must be at least twice the certificate lifetime %s", o.CALifetime, o.Lifetime)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o, nil
}

// Names are the DNS names and IP addresses the serving certificate is valid for.
func (o Options) Names() []string {
	var names []string
	if s, ns := o.ServiceName, o.ServiceNamespace; s != "" {
		names = append(names, s)
		if ns != "" {
			names = append(names, s+"."+ns, s+"."+ns+".svc", s+"."+ns+".svc.cluster.local")
		}
	}
	return append(names, o.ExtraNames...)
}

// State is what Ensure found or made.
type State struct {
	// Bundle is the PEM CA bundle clients must trust: the current CA, and the previous one while
	// it is still valid (so that a client given the bundle before a CA change keeps working).
	Bundle []byte
	// NotAfter is when the serving certificate expires; RenewAt when Ensure will renew it or
	// the client certificate or the CA, whichever comes first.
	NotAfter, RenewAt time.Time
	// Rotated says Ensure wrote a new serving certificate; CARotated that it made a new CA;
	// ClientRotated that it wrote a new client certificate.
	Rotated, CARotated, ClientRotated bool
	// SecretRotated says the Rotator wrote a new certificate into its Secret (EnsureSecret).
	SecretRotated bool

	// ca is the current CA, with which EnsureSecret issues.
	ca *keyPair
}

type keyPair struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
	keyPEM  []byte
}

// Ensure makes the directory hold a CA and a serving certificate signed by it for
// o.Names() that are valid for at least RenewBefore, renewing whichever is not (or is
// missing, unreadable, or for other names). Files are replaced atomically; the serving
// certificate and key are renamed key first, and readers that see a mismatched pair retry (as
// controller-runtime's certwatcher does). A CA is renewed when it would expire before a new
// serving certificate does.
func Ensure(o Options) (State, error) {
	o, err := o.withDefaults()
	if err != nil {
		return State{}, err
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return State{}, fmt.Errorf("create certificate directory: %w", err)
	}
	now := o.Now()
	var st State

	ca, _ := readPair(filepath.Join(o.Dir, CAFile), filepath.Join(o.Dir, CAKeyFile))
	// trusted are the CAs a serving certificate may be signed by and still be kept.
	var trusted []*x509.Certificate
	if o.ExternalCA {
		if ca == nil || !ca.cert.IsCA || !now.Before(ca.cert.NotAfter) {
			return State{}, fmt.Errorf("no valid CA in %s: it is copied there from the CA secret (SyncCA)", o.Dir)
		}
		if st.Bundle, err = os.ReadFile(filepath.Join(o.Dir, BundleFile)); err != nil {
			return State{}, fmt.Errorf("CA bundle: %w", err)
		}
		trusted = parseCerts(st.Bundle)
	} else {
		var oldCA *keyPair
		if ca == nil || !ca.cert.IsCA || now.Add(o.Lifetime).After(ca.cert.NotAfter) {
			oldCA = ca
			if ca, err = newCA(now, o.CALifetime); err != nil {
				return State{}, err
			}
			st.CARotated = true
		}

		// The bundle goes first, so that whoever reads it trusts the new CA before a certificate
		// signed by it is served.
		st.Bundle = bundle(o.Dir, ca, oldCA, now)
		if err := writeAtomic(filepath.Join(o.Dir, BundleFile), st.Bundle, 0o644); err != nil {
			return State{}, err
		}
		if st.CARotated {
			if err := writeAtomic(filepath.Join(o.Dir, CAKeyFile), ca.keyPEM, 0o600); err != nil {
				return State{}, err
			}
			if err := writeAtomic(filepath.Join(o.Dir, CAFile), ca.certPEM, 0o644); err != nil {
				return State{}, err
			}
		}
		trusted = []*x509.Certificate{ca.cert}
	}

	serving, _ := readPair(filepath.Join(o.Dir, CertFile), filepath.Join(o.Dir, KeyFile))
	if st.CARotated || !valid(serving, trusted, o, now) {
		if serving, err = newServing(ca, now, o); err != nil {
			return State{}, err
		}
		if err := writeAtomic(filepath.Join(o.Dir, KeyFile), serving.keyPEM, 0o600); err != nil {
			return State{}, err
		}
		if err := writeAtomic(filepath.Join(o.Dir, CertFile), serving.certPEM, 0o644); err != nil {
			return State{}, err
		}
		st.Rotated = true
	}
	st.NotAfter = serving.cert.NotAfter
	st.RenewAt = serving.cert.NotAfter.Add(-o.RenewBefore)
	if !o.ExternalCA {
		st.RenewAt = earlier(st.RenewAt, ca.cert.NotAfter.Add(-o.Lifetime))
	}

	if o.ClientName != "" {
		renewAt, rotated, err := ensureClient(o, ca, st.Bundle, now)
		if err != nil {
			return State{}, err
		}
		st.ClientRotated = rotated
		st.RenewAt = earlier(st.RenewAt, renewAt)
	}
	st.ca = ca
	return st, nil
}

// ensureClient keeps a client certificate for o.ClientName in the directory. A certificate
// that chains to any CA of the bundle is kept until it is due: after a CA rotation it stays on
// the previous CA, so that the servers it is presented to have time to receive the new bundle
// before a certificate of the new CA reaches them.
func ensureClient(o Options, ca *keyPair, bundle []byte, now time.Time) (renewAt time.Time, rotated bool, err error) {
	certPath, keyPath := filepath.Join(o.Dir, ClientCertFile), filepath.Join(o.Dir, ClientKeyFile)
	cl, _ := readPair(certPath, keyPath)
	if !validLeaf(cl, leafSpec{commonName: o.ClientName, usage: x509.ExtKeyUsageClientAuth}, parseCerts(bundle), o.RenewBefore, now) {
		if cl, err = newLeaf(ca, now, o.Lifetime, leafSpec{commonName: o.ClientName, usage: x509.ExtKeyUsageClientAuth}); err != nil {
			return time.Time{}, false, err
		}
		if err := writeAtomic(keyPath, cl.keyPEM, 0o600); err != nil {
			return time.Time{}, false, err
		}
		if err := writeAtomic(certPath, cl.certPEM, 0o644); err != nil {
			return time.Time{}, false, err
		}
		rotated = true
	}
	return cl.cert.NotAfter.Add(-o.RenewBefore), rotated, nil
}

// valid says serving is signed by one of cas, covers o's names, and has more than RenewBefore
// left.
func valid(serving *keyPair, cas []*x509.Certificate, o Options, now time.Time) bool {
	if serving == nil {
		return false
	}
	c := serving.cert
	if now.Before(c.NotBefore) || !now.Add(o.RenewBefore).Before(c.NotAfter) {
		return false
	}
	for _, name := range o.Names() {
		if c.VerifyHostname(name) != nil {
			return false
		}
	}
	return slices.ContainsFunc(cas, func(ca *x509.Certificate) bool {
		return now.Before(ca.NotAfter) && c.CheckSignatureFrom(ca) == nil
	})
}

// bundle is the current CA plus the previous one (the one being replaced, or the one kept in
// the bundle file from an earlier rotation) while it is still valid.
func bundle(dir string, ca, oldCA *keyPair, now time.Time) []byte {
	var previous []*x509.Certificate
	if oldCA != nil {
		previous = append(previous, oldCA.cert)
	}
	if data, err := os.ReadFile(filepath.Join(dir, BundleFile)); err == nil {
		previous = append(previous, parseCerts(data)...)
	}
	return joinBundle(ca, previous, now)
}

// joinBundle is ca's certificate followed by the first of previous that is another CA and still
// valid: one previous CA is enough, since older ones signed no certificate still served.
func joinBundle(ca *keyPair, previous []*x509.Certificate, now time.Time) []byte {
	out := bytes.Clone(ca.certPEM)
	for _, c := range previous {
		if c.Equal(ca.cert) || now.After(c.NotAfter) || !c.IsCA {
			continue
		}
		return append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

func parseCerts(data []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil && b.Type == "CERTIFICATE" {
			out = append(out, c)
		}
	}
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return n, nil
}

func newCA(now time.Time, lifetime time.Duration) (*keyPair, error) {
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("kubevisor-webhook-ca@%d", now.Unix())},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	return sign(tmpl, nil)
}

func newServing(ca *keyPair, now time.Time, o Options) (*keyPair, error) {
	names := o.Names()
	return newLeaf(ca, now, o.Lifetime, leafSpec{commonName: names[0], names: names, usage: x509.ExtKeyUsageServerAuth})
}

// leafSpec is what a certificate issued by the CA is for.
type leafSpec struct {
	// commonName of the subject.
	commonName string
	// names are DNS names, or IP addresses, the certificate is valid for (servers).
	names []string
	// usage is serverAuth or clientAuth.
	usage x509.ExtKeyUsage
}

// newLeaf issues a certificate for spec, valid for lifetime but not beyond the CA.
func newLeaf(ca *keyPair, now time.Time, lifetime time.Duration, spec leafSpec) (*keyPair, error) {
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	var dnsNames []string
	var ips []net.IP
	for _, n := range spec.names {
		if ip := net.ParseIP(n); ip != nil {
			ips = append(ips, ip)
		} else {
			dnsNames = append(dnsNames, n)
		}
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: spec.commonName},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     earlier(now.Add(lifetime), ca.cert.NotAfter),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{spec.usage},
	}
	return sign(tmpl, ca)
}

// validLeaf says leaf is for spec (common name, every name, usage), is signed by one of cas,
// and has more than renewBefore left.
func validLeaf(leaf *keyPair, spec leafSpec, cas []*x509.Certificate, renewBefore time.Duration, now time.Time) bool {
	if leaf == nil {
		return false
	}
	c := leaf.cert
	if now.Before(c.NotBefore) || !now.Add(renewBefore).Before(c.NotAfter) {
		return false
	}
	if c.Subject.CommonName != spec.commonName || !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{spec.usage}) {
		return false
	}
	for _, name := range spec.names {
		if c.VerifyHostname(name) != nil {
			return false
		}
	}
	return slices.ContainsFunc(cas, func(ca *x509.Certificate) bool {
		return now.Before(ca.NotAfter) && c.CheckSignatureFrom(ca) == nil
	})
}

// earlier of two times.
func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// sign makes a key and a certificate from tmpl, signed by parent (self-signed when nil).
func sign(tmpl *x509.Certificate, parent *keyPair) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	parentCert, parentKey := tmpl, key
	if parent != nil {
		parentCert, parentKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parentCert, &key.PublicKey, parentKey)
	if err != nil {
		return nil, fmt.Errorf("create certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	return &keyPair{
		cert:    cert,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:     key,
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// readPair reads a certificate and its EC key; nil when either is missing or they do not match.
func readPair(certPath, keyPath string) (*keyPair, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	return parsePair(certPEM, keyPEM)
}

// parsePair parses a PEM certificate and its PEM EC key; an error when either is not one or
// they do not match.
func parsePair(certPEM, keyPEM []byte) (*keyPair, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, err
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return nil, errors.New("certificate and key do not match")
	}
	return &keyPair{cert: cert, certPEM: certPEM, key: key, keyPEM: keyPEM}, nil
}

// writeAtomic replaces path with data through a rename, so that a reader sees the old or the
// new file, never half of one.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
