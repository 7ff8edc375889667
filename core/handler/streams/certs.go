package streams

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// Files of Config.CertDir, the keys of the Secret nodeapi.HandlerCertSecret.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// certStore reads the serving certificate and the client CA bundle from a directory, again
// whenever the files' contents change. It reads the three (small) files on every handshake and
// parses them only when they differ from the last good ones: the kubelet replaces a mounted
// Secret's files in place (an atomic swap of a symlinked directory), and no watch survives that
// reliably.
type certStore struct {
	dir string

	mu           sync.Mutex
	crt, key, ca []byte // the raw files of the current pair and pool
	cert         *tls.Certificate
	pool         *x509.CertPool
	lastErr      string // the last load error logged, to log each once
	onLoadErr    func(err error)
}

// load returns the current serving certificate and client CA pool, reading the files again.
// When the files cannot be read or do not make a valid pair (a half-done update), the last
// good ones stay and are returned with the error; with none it returns the error alone.
func (s *certStore) load() (*tls.Certificate, *x509.CertPool, error) {
	crt, err1 := os.ReadFile(filepath.Join(s.dir, CertFile))
	key, err2 := os.ReadFile(filepath.Join(s.dir, KeyFile))
	ca, err3 := os.ReadFile(filepath.Join(s.dir, CAFile))
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := errors.Join(err1, err2, err3); err != nil {
		return s.cert, s.pool, s.failed(fmt.Errorf("read certificates: %w", err))
	}
	if s.cert != nil && bytes.Equal(crt, s.crt) && bytes.Equal(key, s.key) && bytes.Equal(ca, s.ca) {
		return s.cert, s.pool, nil
	}
	cert, err := tls.X509KeyPair(crt, key)
	if err != nil {
		return s.cert, s.pool, s.failed(fmt.Errorf("serving certificate %s, %s: %w", CertFile, KeyFile, err))
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return s.cert, s.pool, s.failed(fmt.Errorf("client CA bundle %s: no PEM certificate in it", CAFile))
	}
	s.crt, s.key, s.ca, s.cert, s.pool, s.lastErr = crt, key, ca, &cert, pool, ""
	return s.cert, s.pool, nil
}

// failed reports a load error once until the next success, and returns it.
func (s *certStore) failed(err error) error {
	if err.Error() != s.lastErr && s.onLoadErr != nil {
		s.onLoadErr(err)
	}
	s.lastErr = err.Error()
	return err
}

// tlsConfig is the endpoint's TLS configuration: TLS 1.2 or later, the store's current serving
// certificate, and a client certificate required, chaining to the store's current CA bundle,
// with common name clientName.
func tlsConfig(s *certStore, clientName string) *tls.Config {
	verifyCN := func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("no client certificate")
		}
		if cn := cs.PeerCertificates[0].Subject.CommonName; cn != clientName {
			return fmt.Errorf("client certificate common name %q is not %q", cn, clientName)
		}
		return nil
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool, err := s.load()
			if cert == nil {
				return nil, err
			}
			return &tls.Config{
				MinVersion:       tls.VersionTLS12,
				Certificates:     []tls.Certificate{*cert},
				ClientAuth:       tls.RequireAndVerifyClientCert,
				ClientCAs:        pool,
				VerifyConnection: verifyCN,
				NextProtos:       []string{"http/1.1"},
				// Every connection is verified against the current CA bundle: no resumption
				// of a session made under an earlier one.
				SessionTicketsDisabled: true,
			}, nil
		},
	}
}
