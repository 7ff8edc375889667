// Package certdir reads a node handler's TLS credentials from a directory laid out as a mounted
// kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt), again whenever the files change. The
// stream endpoint (core/handler/streams) and the migration proxy (core/handler/migrationproxy)
// read theirs with it.
package certdir

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

// Files of a credentials directory, the keys of a kubernetes.io/tls Secret with its CA bundle.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// Store reads the certificate, its key and the CA bundle from Dir, again whenever the files'
// contents change. It reads the three (small) files on every Load and parses them only when
// they differ from the last good ones: the kubelet replaces a mounted Secret's files in place
// (an atomic swap of a symlinked directory), and no watch survives that reliably.
type Store struct {
	// Dir holds CertFile, KeyFile and CAFile.
	Dir string
	// OnLoadErr, when set, is told about a load error, once until the next success.
	OnLoadErr func(err error)

	mu           sync.Mutex
	crt, key, ca []byte // the raw files of the current pair and pool
	cert         *tls.Certificate
	pool         *x509.CertPool
	lastErr      string // the last load error reported, to report each once
}

// Load returns the current certificate (its Leaf parsed) and CA pool, reading the files again.
// When the files cannot be read or do not make a valid pair (a half-done update), the last
// good ones stay and are returned with the error; with none it returns the error alone.
func (s *Store) Load() (*tls.Certificate, *x509.CertPool, error) {
	crt, err1 := os.ReadFile(filepath.Join(s.Dir, CertFile))
	key, err2 := os.ReadFile(filepath.Join(s.Dir, KeyFile))
	ca, err3 := os.ReadFile(filepath.Join(s.Dir, CAFile))
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
		return s.cert, s.pool, s.failed(fmt.Errorf("certificate %s, %s: %w", CertFile, KeyFile, err))
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return s.cert, s.pool, s.failed(fmt.Errorf("CA bundle %s: no PEM certificate in it", CAFile))
	}
	s.crt, s.key, s.ca, s.cert, s.pool, s.lastErr = crt, key, ca, &cert, pool, ""
	return s.cert, s.pool, nil
}

// failed reports a load error once until the next success, and returns it.
func (s *Store) failed(err error) error {
	if err.Error() != s.lastErr && s.OnLoadErr != nil {
		s.OnLoadErr(err)
	}
	s.lastErr = err.Error()
	return err
}
