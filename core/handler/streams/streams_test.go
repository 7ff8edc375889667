package streams

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/handler/internal/testpki"
	"github.com/kubevisor/kubevisor/core/nodeapi"
	"github.com/kubevisor/kubevisor/core/wsstream"
	"github.com/kubevisor/kubevisor/drivers/fake"
	"github.com/kubevisor/kubevisor/internal/tlstest"
)

// env is a running endpoint: its address, the CA of its certificates, and kubevisor-api's
// client certificate.
type env struct {
	srv    *Server
	dir    string
	ca     *testpki.CA
	client tls.Certificate
}

// servingLeaf is the endpoint's serving certificate, as kubevisor-api issues it: for
// nodeapi.ServerName.
var servingLeaf = testpki.Leaf{CommonName: "kubevisor-handler", DNSNames: []string{nodeapi.ServerName}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}

// clientLeaf is a client certificate with common name cn.
func clientLeaf(cn string) testpki.Leaf {
	return testpki.Leaf{CommonName: cn, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
}

// clientTLS is kubevisor-api's side: the handler's CA as roots, ServerName checked, and cert
// (when any) presented.
func clientTLS(serverCA *testpki.CA, cert *tls.Certificate) *tls.Config {
	c := &tls.Config{RootCAs: serverCA.Pool(), ServerName: nodeapi.ServerName, MinVersion: tls.VersionTLS12}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}

func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "streams", Level: hclog.Debug, Output: testWriter{t}})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // a log line after the test ended
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startServer runs the endpoint for b on a free port of 127.0.0.1 with certificates of one CA,
// as kubevisor-api writes them.
func startServer(t *testing.T, b Backend) *env {
	t.Helper()
	e := &env{dir: t.TempDir(), ca: testpki.NewCA(t, "kubevisor-ca")}
	testpki.WriteCertDir(t, e.dir, e.ca, servingLeaf, e.ca)
	e.client = e.ca.KeyPair(t, clientLeaf(nodeapi.ClientName))
	e.srv = run(t, b, e.dir)
	waitServing(t, e.srv)
	return e
}

// run runs an endpoint for b with the certificates in dir until the test ends.
func run(t *testing.T, b Backend, dir string) *Server {
	t.Helper()
	srv := New(Config{Addr: "127.0.0.1:0", CertDir: dir, CertPoll: 20 * time.Millisecond, Logger: testLogger(t)}, b)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return srv
}

func waitServing(t *testing.T, srv *Server) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for srv.Addr() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the endpoint does not serve")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *env) url(scheme, path string) string {
	return scheme + "://" + e.srv.Addr().String() + path
}

// do sends a request as kubevisor-api (cert nil: without a client certificate).
func (e *env) do(method, path string, tc *tls.Config) (*http.Response, error) {
	if tc == nil {
		tc = clientTLS(e.ca, &e.client)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	req, err := http.NewRequest(method, e.url("https", path), nil)
	if err != nil {
		return nil, err
	}
	return c.Do(req)
}

// status sends a request and decodes its metav1.Status answer.
func (e *env) status(t *testing.T, method, path string) metav1.Status {
	t.Helper()
	resp, err := e.do(method, path, nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var st metav1.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("%s %s: %d, body not a Status: %v", method, path, resp.StatusCode, err)
	}
	if int(st.Code) != resp.StatusCode {
		t.Errorf("%s %s: HTTP %d, Status.code %d", method, path, resp.StatusCode, st.Code)
	}
	return st
}

func (e *env) dial(t *testing.T, path string) (net.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return wsstream.Dial(ctx, e.url("wss", path), wsstream.DialOptions{TLS: clientTLS(e.ca, &e.client)})
}

func (e *env) mustDial(t *testing.T, path string) net.Conn {
	t.Helper()
	c, err := e.dial(t, path)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// readUntil reads r until what it read contains want, within 10s.
func readUntil(t *testing.T, c net.Conn, want string) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	var got bytes.Buffer
	buf := make([]byte, 4096)
	for !strings.Contains(got.String(), want) {
		n, err := c.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			t.Fatalf("read: %v; got %q, want %q in it", err, got.String(), want)
		}
	}
	return got.String()
}

// refused checks that a client with tc gets no answer: the TLS handshake or the first read
// fails, and the backend is not reached.
func refused(t *testing.T, e *env, tc *tls.Config) {
	t.Helper()
	resp, err := e.do(http.MethodPut, nodeapi.VMIPath("default", "vm1", "pause"), tc)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("answered %d, want the TLS handshake refused", resp.StatusCode)
	}
	// The same at the TLS layer alone.
	conn, err := tls.Dial("tcp", e.srv.Addr().String(), tc)
	if err == nil {
		// TLS 1.3: the server checks the client's certificate after the client finished; its
		// refusal is the first thing read.
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	var ae tls.AlertError
	var ne net.Error
	if err == nil || (!errors.As(err, &ae) && !strings.Contains(err.Error(), "tls:") && !(errors.As(err, &ne) && !ne.Timeout())) {
		t.Fatalf("TLS connection: %v, want a TLS alert", err)
	}
}

func TestClientWithoutCertificateIsRefused(t *testing.T) {
	b := newFakeBackend(t, "vm1")
	e := startServer(t, b)
	refused(t, e, clientTLS(e.ca, nil))
	if s := b.state(t, "uid-vm1"); s.String() != "STATE_RUNNING" {
		t.Errorf("VM %v after the refused pause", s)
	}
}

func TestClientOfAnotherCAIsRefused(t *testing.T) {
	e := startServer(t, newFakeBackend(t, "vm1"))
	other := testpki.NewCA(t, "other-ca").KeyPair(t, clientLeaf(nodeapi.ClientName))
	refused(t, e, clientTLS(e.ca, &other))
}

func TestClientWithAnotherNameIsRefused(t *testing.T) {
	e := startServer(t, newFakeBackend(t, "vm1"))
	for _, cn := range []string{"system:node:node-1", "kubevisor-api-x", ""} {
		c := e.ca.KeyPair(t, clientLeaf(cn))
		refused(t, e, clientTLS(e.ca, &c))
	}
}

// TestTLS11IsRefused: the endpoint's own configuration refuses TLS 1.1 (tlstest: Go's default
// would too, unless GODEBUG says otherwise), and takes kubevisor-api's client at TLS 1.2.
func TestTLS11IsRefused(t *testing.T) {
	e := startServer(t, newFakeBackend(t, "vm1"))
	tlstest.RefusesTLS11(t, e.srv.Addr().String(), clientTLS(e.ca, &e.client))
}

func TestConsoleCarriesBytesBothWays(t *testing.T) {
	e := startServer(t, newFakeBackend(t, "vm1"))
	c := e.mustDial(t, nodeapi.VMIPath("default", "vm1", "console"))
	readUntil(t, c, fake.ConsoleMarker)
	if _, err := c.Write([]byte("root\r")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, c, "root\r") // the fake guest echoes its input
}

func TestConsoleTakeOverClosesTheFirstSession(t *testing.T) {
	e := startServer(t, newFakeBackend(t, "vm1"))
	path := nodeapi.VMIPath("default", "vm1", "console")
	first := e.mustDial(t, path)
	readUntil(t, first, fake.ConsoleMarker)

	second := e.mustDial(t, path)
	readUntil(t, second, fake.ConsoleMarker)
	got := readUntil(t, first, TakeOverMessage)
	_ = first.SetReadDeadline(time.Now().Add(5 * time.Second))
	rest, err := io.ReadAll(first)
	if err != nil {
		t.Fatalf("first session after the take-over: %v (read %q), want it closed", err, rest)
	}
	if strings.Contains(got+string(rest), "after") {
		t.Errorf("the first session got output after it was taken over: %q", got+string(rest))
	}
	if _, err := second.Write([]byte("after\r")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, second, "after\r")
}

func TestPauseAndUnpauseChangeTheVM(t *testing.T) {
	b := newFakeBackend(t, "vm1")
	e := startServer(t, b)
	steps := []struct {
		path  string
		code  int32
		state string
	}{
		{"pause", 200, "STATE_PAUSED"},
		{"pause", 409, "STATE_PAUSED"}, // already paused
		{"unpause", 200, "STATE_RUNNING"},
		{"unpause", 409, "STATE_RUNNING"}, // not paused
		{"reset", 200, "STATE_RUNNING"},
	}
	for _, s := range steps {
		st := e.status(t, http.MethodPut, nodeapi.VMIPath("default", "vm1", s.path))
		if st.Code != s.code {
			t.Fatalf("PUT %s: %d %q, want %d", s.path, st.Code, st.Message, s.code)
		}
		wantStatus := metav1.StatusSuccess
		if s.code != 200 {
			wantStatus = metav1.StatusFailure
		}
		if st.Status != wantStatus {
			t.Errorf("PUT %s: status %q, want %q", s.path, st.Status, wantStatus)
		}
		if got := b.state(t, "uid-vm1").String(); got != s.state {
			t.Errorf("after PUT %s (%d): VM %s, want %s", s.path, s.code, got, s.state)
		}
	}
	if st := e.status(t, http.MethodGet, nodeapi.VMIPath("default", "vm1", "pause")); st.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET pause: %d, want 405", st.Code)
	}
}

func TestUndeclaredAbilitiesAre501(t *testing.T) {
	b := newFakeBackend(t, "vm1")
	b.hv.noPause, b.display = true, false
	e := startServer(t, b)
	for _, sub := range []string{"pause", "unpause", "softreboot"} {
		st := e.status(t, http.MethodPut, nodeapi.VMIPath("default", "vm1", sub))
		if st.Code != http.StatusNotImplemented || !strings.Contains(st.Message, "does not offer") {
			t.Errorf("PUT %s: %d %q, want 501 saying what the driver does not offer", sub, st.Code, st.Message)
		}
	}
	if s := b.state(t, "uid-vm1").String(); s != "STATE_RUNNING" {
		t.Errorf("VM %s after an undeclared pause", s)
	}
	st := e.status(t, http.MethodGet, nodeapi.VMIPath("default", "vm1", "guestosinfo"))
	if st.Code != http.StatusNotImplemented || !strings.Contains(st.Message, "no guest agent") {
		t.Errorf("GET guestosinfo: %d %q, want 501 no guest agent", st.Code, st.Message)
	}
	_, err := e.dial(t, nodeapi.VMIPath("default", "vm1", "vnc"))
	var he *wsstream.HTTPError
	if !errors.As(err, &he) || he.StatusCode != http.StatusNotImplemented || !strings.Contains(string(he.Body), "does not offer a VNC display") {
		t.Errorf("vnc: %v, want 501 naming the VNC display", err)
	}
}

func TestUnknownVMIIs404(t *testing.T) {
	e := startServer(t, newFakeBackend(t, "vm1"))
	for _, p := range []struct{ method, path string }{
		{http.MethodPut, nodeapi.VMIPath("default", "nope", "pause")},
		{http.MethodPut, nodeapi.VMIPath("other", "vm1", "pause")},
		{http.MethodGet, nodeapi.VMIPath("default", "nope", "guestosinfo")},
		{http.MethodGet, "/v1alpha1/namespaces/default/pods/vm1/console"},
		{http.MethodGet, nodeapi.VMIPath("default", "vm1", "screenshot")},
	} {
		st := e.status(t, p.method, p.path)
		if st.Code != http.StatusNotFound || st.Reason != metav1.StatusReasonNotFound {
			t.Errorf("%s %s: %d %s %q, want 404 NotFound", p.method, p.path, st.Code, st.Reason, st.Message)
		}
	}
	_, err := e.dial(t, nodeapi.VMIPath("default", "nope", "console"))
	var he *wsstream.HTTPError
	if !errors.As(err, &he) || he.StatusCode != http.StatusNotFound {
		t.Errorf("console of an unknown VMI: %v, want 404", err)
	}
}

func TestVNCCarriesBytesBothWays(t *testing.T) {
	e := startServer(t, newFakeBackend(t, "vm1"))
	c := e.mustDial(t, nodeapi.VMIPath("default", "vm1", "vnc"))
	readUntil(t, c, "RFB 003.008\n")
	if _, err := c.Write([]byte("RFB 003.008\n")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, c, "RFB 003.008\n") // the fake display echoes
}

// echoServer accepts on ln and echoes each connection, prefixed by a greeting.
func echoServer(t *testing.T, ln net.Listener) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = c.Write([]byte("hello from the guest\n"))
				_, _ = io.Copy(c, c)
			}()
		}
	}()
}

func TestPortForwardToATCPServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, ln)
	e := startServer(t, newFakeBackend(t, "vm1"))
	port := int32(ln.Addr().(*net.TCPAddr).Port)
	for _, proto := range []string{"", "tcp", "TCP"} {
		path := nodeapi.VMIPath("default", "vm1", "portforward", fmt.Sprint(port))
		if proto != "" {
			path += "/" + proto
		}
		c := e.mustDial(t, path)
		readUntil(t, c, "hello from the guest\n")
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		readUntil(t, c, "ping\n")
		c.Close()
	}
}

func TestPortForwardRefusals(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens on free any more
	e := startServer(t, newFakeBackend(t, "vm1"))
	for _, c := range []struct {
		rest []string
		code int
	}{
		{[]string{"0"}, 400},
		{[]string{"65536"}, 400},
		{[]string{"http"}, 400},
		{[]string{"80", "udp"}, 400},
		{[]string{"80", "sctp"}, 400},
		{[]string{fmt.Sprint(free)}, 502},
		{[]string{"80", "tcp", "x"}, 400},
	} {
		_, err := e.dial(t, nodeapi.VMIPath("default", "vm1", "portforward", c.rest...))
		var he *wsstream.HTTPError
		if !errors.As(err, &he) || he.StatusCode != c.code {
			t.Errorf("portforward/%s: %v, want %d", strings.Join(c.rest, "/"), err, c.code)
		}
	}
}

func TestRotatedServingCertificateIsUsedWithoutRestart(t *testing.T) {
	e := startServer(t, newFakeBackend(t, "vm1"))
	serving := func() string {
		t.Helper()
		conn, err := tls.Dial("tcp", e.srv.Addr().String(), clientTLS(e.ca, &e.client))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := serving()
	testpki.WriteCertDir(t, e.dir, e.ca, servingLeaf, e.ca)
	after := serving()
	if after == before {
		t.Fatalf("serving certificate %s after the rotation, the old one", after)
	}
	// And the new client CA bundle: a new CA's client is accepted once the bundle has it, the
	// old CA's no longer.
	newCA := testpki.NewCA(t, "kubevisor-ca-2")
	testpki.WriteCertDir(t, e.dir, e.ca, servingLeaf, newCA)
	refused(t, e, clientTLS(e.ca, &e.client))
	e.client = newCA.KeyPair(t, clientLeaf(nodeapi.ClientName))
	if st := e.status(t, http.MethodPut, nodeapi.VMIPath("default", "vm1", "reset")); st.Code != 200 {
		t.Fatalf("reset with the new CA's client: %d %q", st.Code, st.Message)
	}
}

func TestNotServedUntilTheCertificatesExist(t *testing.T) {
	dir := t.TempDir()
	srv := run(t, newFakeBackend(t, "vm1"), dir)
	time.Sleep(200 * time.Millisecond) // several polls
	if a := srv.Addr(); a != nil {
		t.Fatalf("serving on %v without certificates", a)
	}
	ca := testpki.NewCA(t, "kubevisor-ca")
	testpki.WriteCertDir(t, dir, ca, servingLeaf, ca)
	waitServing(t, srv)
	e := &env{srv: srv, dir: dir, ca: ca, client: ca.KeyPair(t, clientLeaf(nodeapi.ClientName))}
	if st := e.status(t, http.MethodPut, nodeapi.VMIPath("default", "vm1", "pause")); st.Code != 200 {
		t.Fatalf("pause once the certificates exist: %d %q", st.Code, st.Message)
	}
}

func TestDisabledEndpointReturns(t *testing.T) {
	for _, addr := range []string{"", "0"} {
		srv := New(Config{Addr: addr, CertDir: t.TempDir()}, newFakeBackend(t))
		if err := srv.Run(context.Background()); err != nil || srv.Addr() != nil {
			t.Errorf("Addr %q: Run = %v, serving %v", addr, err, srv.Addr())
		}
	}
}

func TestStoppedVMIIs409(t *testing.T) {
	b := newFakeBackend(t, "vm1")
	e := startServer(t, b)
	if err := b.hv.Kill(context.Background(), "uid-vm1"); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"pause", "unpause", "reset"} {
		if st := e.status(t, http.MethodPut, nodeapi.VMIPath("default", "vm1", sub)); st.Code != http.StatusConflict || st.Reason != metav1.StatusReasonConflict {
			t.Errorf("PUT %s of a stopped VMI: %d %s %q, want 409 Conflict", sub, st.Code, st.Reason, st.Message)
		}
	}
	for _, sub := range []string{"console", "vnc", "portforward/22"} {
		_, err := e.dial(t, nodeapi.VMIPath("default", "vm1", sub))
		var he *wsstream.HTTPError
		if !errors.As(err, &he) || he.StatusCode != http.StatusConflict || !strings.Contains(string(he.Body), "stopped") {
			t.Errorf("%s of a stopped VMI: %v, want 409 saying it is stopped", sub, err)
		}
	}
}
