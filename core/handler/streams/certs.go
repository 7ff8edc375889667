package streams

import (
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/kubevisor/kubevisor/core/handler/internal/certdir"
)

// Files of Config.CertDir, the keys of the Secret nodeapi.HandlerCertSecret.
const (
	CertFile = certdir.CertFile
	KeyFile  = certdir.KeyFile
	CAFile   = certdir.CAFile
)

// tlsConfig is the endpoint's TLS configuration: TLS 1.2 or later, the store's current serving
// certificate, and a client certificate required, chaining to the store's current CA bundle,
// with common name clientName.
func tlsConfig(s *certdir.Store, clientName string) *tls.Config {
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
			cert, pool, err := s.Load()
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
