package migrationproxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/kubevisor/kubevisor/core/nodeapi"
)

const (
	// Protocol is the application protocol (ALPN) of a migration connection.
	Protocol = "kubevisor-migration/1"
	// ServerNameSuffix follows the migration's identifier in the TLS server name.
	ServerNameSuffix = ".migration.kubevisor.io"
)

// idPattern is a DNS label (RFC 1123): what a Kubernetes UID is, and what fits in a server name.
var idPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// ValidID says whether id can name a migration: a DNS label (lower-case letters, digits and
// '-', at most 63), as a Kubernetes UID is.
func ValidID(id string) bool { return idPattern.MatchString(id) }

// ServerName is the TLS server name (SNI) of a connection of migration id on ChannelMemory.
func ServerName(id string) string { return id + ServerNameSuffix }

// ChannelServerName is the TLS server name of a connection of migration id on channel:
// ServerName(id) for ChannelMemory, else "<channel>.<id>.migration.kubevisor.io".
func ChannelServerName(id, channel string) string {
	if channel == ChannelMemory {
		return ServerName(id)
	}
	return channel + "." + ServerName(id)
}

// idOfServerName is the migration and the channel a server name names.
func idOfServerName(name string) (id, channel string, err error) {
	rest, ok := strings.CutSuffix(name, ServerNameSuffix)
	channel, id, two := strings.Cut(rest, ".")
	if !two {
		channel, id = ChannelMemory, rest
	}
	if !ok || !ValidID(id) || !ValidID(channel) {
		return "", "", fmt.Errorf("server name %q does not name a migration and channel ([<channel>.]<id>%s)", name, ServerNameSuffix)
	}
	return id, channel, nil
}

// creds are this node's certificate and the CA pool peers must chain to.
type creds struct {
	cert *tls.Certificate
	pool *x509.CertPool
}

// serverConfig is the target side's TLS configuration of one connection: the migration and its
// channel are found from the ClientHello's server name, and the client must present a
// certificate of the CA naming that migration's source node. hello is told the server name the
// client sent, and admit admits the connection to the migration's channel (Migration.admit).
func (p *Proxy) serverConfig(hello func(serverName string), admit func(*Migration, *channel) error) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			hello(h.ServerName)
			id, chName, err := idOfServerName(h.ServerName)
			if err != nil {
				return nil, err
			}
			if !slices.Contains(h.SupportedProtos, Protocol) {
				return nil, fmt.Errorf("the client does not offer the protocol %s (ALPN %q)", Protocol, h.SupportedProtos)
			}
			m := p.incomingMigration(id)
			if m == nil {
				return nil, fmt.Errorf("no incoming migration %s on this node", id)
			}
			ch := m.channels[chName]
			if ch == nil {
				return nil, fmt.Errorf("the incoming migration %s has no channel %q on this node", id, chName)
			}
			c, err := p.credentials()
			if err != nil {
				return nil, err
			}
			if err := admit(m, ch); err != nil {
				return nil, err
			}
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*c.cert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    c.pool,
				NextProtos:   []string{Protocol},
				VerifyConnection: func(cs tls.ConnectionState) error {
					return checkPeer(cs, m.peer, "client")
				},
				// Every connection is verified against the current CA bundle: no resumption
				// of a session made under an earlier one.
				SessionTicketsDisabled: true,
			}, nil
		},
	}
}

// clientConfig is the source side's TLS configuration for a connection to targetNode named
// serverName (ChannelServerName: the migration and its channel): this node's certificate, and a
// server certificate of the CA naming targetNode.
func clientConfig(c creds, serverName, targetNode string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		NextProtos: []string{Protocol},
		// Presented whatever CAs the server names, so that a target of another CA says so
		// (unknown authority) rather than that no certificate came.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.cert, nil },
		// The server name is the migration's, not a name in the target's certificate: the chain
		// and the node are verified by VerifyConnection instead, which runs all the same.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if err := verifyChain(cs, c.pool, x509.ExtKeyUsageServerAuth); err != nil {
				return err
			}
			if cs.NegotiatedProtocol != Protocol {
				return fmt.Errorf("the server did not agree to the protocol %s (ALPN %q)", Protocol, cs.NegotiatedProtocol)
			}
			return checkPeer(cs, targetNode, "server")
		},
		SessionTicketsDisabled: true,
	}
}

// verifyChain verifies the peer's certificate chain against pool for usage, as the TLS stack
// does when it verifies names itself.
func verifyChain(cs tls.ConnectionState, pool *x509.CertPool, usage x509.ExtKeyUsage) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots: pool, Intermediates: inter, CurrentTime: time.Now(), KeyUsages: []x509.ExtKeyUsage{usage},
	})
	if err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
	}
	return nil
}

// checkPeer says whether the peer's (verified) certificate is node's.
func checkPeer(cs tls.ConnectionState, node, role string) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("no %s certificate", role)
	}
	cn := cs.PeerCertificates[0].Subject.CommonName
	got, ok := nodeapi.NodeOfCommonName(cn)
	switch {
	case !ok:
		return fmt.Errorf("the %s certificate (common name %q) is not a node certificate", role, cn)
	case got != node:
		return fmt.Errorf("the %s certificate is node %q's, and the migration's %s is node %q", role, got, map[string]string{"client": "source", "server": "target"}[role], node)
	}
	return nil
}

// peerName is the common name of the certificate a peer presented in a failed handshake, when
// the error carries it, for the log.
func peerName(err error) string {
	var ve *tls.CertificateVerificationError
	if errors.As(err, &ve) && len(ve.UnverifiedCertificates) > 0 {
		return ve.UnverifiedCertificates[0].Subject.CommonName
	}
	return ""
}
