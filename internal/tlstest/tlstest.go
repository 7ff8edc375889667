// Package tlstest checks that a TLS server refuses protocol versions older than TLS 1.2 because
// its own configuration says so, not only because of Go's default.
package tlstest

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"
)

// AllowOldServers makes the Go TLS servers of this test binary accept TLS 1.0 and 1.1 when
// their configuration sets no MinVersion (GODEBUG tls10server=1, which a deployment can set
// too), until the test ends. Under it a server refuses TLS 1.1 only when its configuration
// (or the one its GetConfigForClient returns) asks for TLS 1.2 or later: a handshake test then
// fails when a server forgets to. The setting is process-wide: not for parallel tests.
func AllowOldServers(t testing.TB) {
	t.Helper()
	t.Setenv("GODEBUG", "tls10server=1")
}

// RefusesTLS11 checks, under AllowOldServers, that the server at addr refuses a handshake capped
// at TLS 1.1 for a protocol version, and completes the same handshake at TLS 1.2 (so that the
// refusal is the version's): cfg is what a client the server accepts sends (server name, roots,
// client certificate), and is not modified.
func RefusesTLS11(t testing.TB, addr string, cfg *tls.Config) {
	t.Helper()
	AllowOldServers(t)
	old := cfg.Clone()
	old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	conn, err := handshake(addr, old)
	if err == nil {
		conn.Close()
		t.Errorf("%s: a TLS 1.1 handshake succeeded, want it refused", addr)
	} else if !strings.Contains(err.Error(), "protocol version") {
		t.Errorf("%s: TLS 1.1 handshake: %v, want the protocol version refused", addr, err)
	}
	v12 := cfg.Clone()
	v12.MinVersion, v12.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	conn, err = handshake(addr, v12)
	if err != nil {
		t.Errorf("%s: TLS 1.2 handshake: %v, want it to succeed", addr, err)
		return
	}
	conn.Close()
}

func handshake(addr string, cfg *tls.Config) (*tls.Conn, error) {
	return tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
}
