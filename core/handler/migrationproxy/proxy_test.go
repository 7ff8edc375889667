package migrationproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kubevisor/kubevisor/core/handler/internal/testpki"
	"github.com/kubevisor/kubevisor/core/nodeapi"
	"github.com/kubevisor/kubevisor/internal/tlstest"
)

// node is a node certificate's leaf, as the control plane issues it.
func node(name string) testpki.Leaf {
	return testpki.Leaf{CommonName: nodeapi.NodeCommonName(name), Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
}

// logBuf collects a proxy's log lines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitLog waits for a log line holding every one of parts.
func (l *logBuf) waitLog(t *testing.T, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for line := range strings.SplitSeq(l.String(), "\n") {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(line, p)
			}
			if all {
				return line
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q; the log:\n%s", parts, l.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testNode is a node's proxy, served on a loopback port.
type testNode struct {
	name string
	p    *Proxy
	log  *logBuf
	reg  *prometheus.Registry
	addr string
	// stop ends Serve and waits for it (at most 10 s).
	stop func()
}

func startNode(t *testing.T, name, certDir string) *testNode {
	t.Helper()
	n := &testNode{name: name, log: &logBuf{}, reg: prometheus.NewRegistry()}
	var err error
	n.p, err = New(Config{
		NodeName: name, Addr: "127.0.0.1:0", CertDir: certDir,
		HandshakeTimeout: 5 * time.Second, DialTimeout: 5 * time.Second,
		Logger:     hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Debug, Output: n.log}),
		Registerer: n.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.p.Serve(ctx, ln) }()
	var once sync.Once
	n.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Serve of %s: %v", name, err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("Serve of %s did not return within 10 s of its end", name)
			}
		})
	}
	t.Cleanup(func() {
		n.stop()
		if t.Failed() {
			t.Logf("log of %s:\n%s", name, n.log.String())
		}
	})
	for n.p.Addr() == nil {
		time.Sleep(time.Millisecond)
	}
	return n
}

// shortDir is a directory with a path short enough for unix sockets.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvmp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// fakeVM is the target VM's incoming socket: each connection is served by serve.
type fakeVM struct {
	socket   string
	accepted atomic.Int32
}

func startVM(t *testing.T, serve func(c *net.UnixConn)) *fakeVM {
	t.Helper()
	vm := &fakeVM{socket: filepath.Join(shortDir(t), "incoming.sock")}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Net: "unix", Name: vm.socket})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			vm.accepted.Add(1)
			wg.Go(func() { defer c.Close(); serve(c) })
		}
	})
	return vm
}

// digestThenReply reads its connection to EOF, then answers with the length and SHA-256 of
// what it read and a tail of fill bytes, then ends its side.
func digestThenReply(fill int) func(c *net.UnixConn) {
	return func(c *net.UnixConn) {
		h := sha256.New()
		n, err := io.Copy(h, c)
		if err != nil {
			return
		}
		fmt.Fprintf(c, "%d %x\n", n, h.Sum(nil))
		_, _ = c.Write(bytes.Repeat([]byte{'z'}, fill))
		_ = c.CloseWrite()
		_, _ = io.Copy(io.Discard, c)
	}
}

const (
	testID     = "6f1c2a9e-0d1b-4c55-9a7e-5e5b1c1f0a01"
	sourceNode = "node-a"
	targetNode = "node-b"
)

// pairSetup is a source node and a target node of one CA, with a migration of testID from the
// first to the second whose target VM serves each connection with serve.
type pairSetup struct {
	ca       *testpki.CA
	src, tgt *testNode
	vm       *fakeVM
	in, out  *Migration
	socket   string // the source's socket
}

func newPair(t *testing.T, serve func(c *net.UnixConn)) *pairSetup {
	t.Helper()
	ps := &pairSetup{ca: testpki.NewCA(t, "kubevisor-ca")}
	ps.src = startNode(t, sourceNode, testpki.CertDir(t, ps.ca, node(sourceNode), ps.ca))
	ps.tgt = startNode(t, targetNode, testpki.CertDir(t, ps.ca, node(targetNode), ps.ca))
	ps.vm = startVM(t, serve)
	var err error
	ps.in, err = ps.tgt.p.Incoming(IncomingSpec{ID: testID, SourceNode: sourceNode, TargetSocket: ps.vm.socket})
	if err != nil {
		t.Fatalf("Incoming: %v", err)
	}
	t.Cleanup(func() { ps.in.Close() })
	ps.out = ps.outgoing(t, ps.src, testID, targetNode)
	ps.socket = ps.out.SocketPath()
	return ps
}

// outgoing starts an Outgoing on n of migration id to the pair's target, as target node.
func (ps *pairSetup) outgoing(t *testing.T, n *testNode, id, target string) *Migration {
	t.Helper()
	out, err := n.p.Outgoing(OutgoingSpec{ID: id, TargetNode: target, TargetAddr: ps.tgt.addr, Socket: filepath.Join(shortDir(t), SocketName)})
	if err != nil {
		t.Fatalf("Outgoing: %v", err)
	}
	t.Cleanup(func() { out.Close() })
	return out
}

// dialSource connects to a source socket as the VM process does.
func dialSource(t *testing.T, socket string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Net: "unix", Name: socket})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBytesBothWaysWithHalfClose: 4 MiB written into the source's socket reach the target VM's
// socket whole; the VM sees EOF when the source half-closes, and only then answers; the answer
// comes back after the source stopped writing; the counts and metrics say so.
func TestBytesBothWaysWithHalfClose(t *testing.T) {
	const fill = 100 << 10
	ps := newPair(t, digestThenReply(fill))
	payload := randomBytes(t, 4<<20)
	c := dialSource(t, ps.socket)
	if _, err := c.Write(payload); err != nil {
		t.Fatalf("write into the source socket: %v", err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	reply, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	line, tail, _ := bytes.Cut(reply, []byte("\n"))
	if want := fmt.Sprintf("%d %x", len(payload), sha256.Sum256(payload)); string(line) != want {
		t.Fatalf("the target VM got %q, want %q", line, want)
	}
	if len(tail) != fill || bytes.Count(tail, []byte{'z'}) != fill {
		t.Fatalf("the answer's tail is %d bytes, want %d 'z'", len(tail), fill)
	}
	wantBack := uint64(len(reply))
	waitFor(t, "the connection ends on both sides", func() bool {
		return ps.out.Stats().Active == 0 && ps.in.Stats().Active == 0
	})
	for _, m := range []*Migration{ps.out, ps.in} {
		st := m.Stats()
		if st.ToTarget != uint64(len(payload)) || st.ToSource != wantBack || st.Carried != 1 || st.Refused != 0 {
			t.Errorf("%s side stats %+v, want %d bytes to the target, %d back, 1 carried", m.side, st, len(payload), wantBack)
		}
	}
	for _, n := range []*testNode{ps.src, ps.tgt} {
		side := map[string]string{sourceNode: "source", targetNode: "target"}[n.name]
		metric := fmt.Sprintf(`
# HELP kubevisor_migration_proxy_bytes_total Bytes the migration proxy carried, by side of the migration this node is (source, target) and direction (to_target, to_source).
# TYPE kubevisor_migration_proxy_bytes_total counter
kubevisor_migration_proxy_bytes_total{direction="to_source",side="%[1]s"} %[2]d
kubevisor_migration_proxy_bytes_total{direction="to_target",side="%[1]s"} %[3]d
`, side, wantBack, len(payload))
		if err := testutil.GatherAndCompare(n.reg, strings.NewReader(metric), "kubevisor_migration_proxy_bytes_total"); err != nil {
			t.Errorf("metrics of %s: %v", n.name, err)
		}
	}
	if n := ps.vm.accepted.Load(); n != 1 {
		t.Errorf("the target VM's socket got %d connections, want 1", n)
	}
}

// TestHalfCloseFromTheTarget: the target VM ends its side first; the source reads EOF, goes on
// writing, and the target VM reads it all.
func TestHalfCloseFromTheTarget(t *testing.T) {
	got := make(chan string, 1)
	ps := newPair(t, func(c *net.UnixConn) {
		_, _ = c.Write([]byte("bye from the target\n"))
		_ = c.CloseWrite()
		b, _ := io.ReadAll(c)
		got <- string(b)
	})
	c := dialSource(t, ps.socket)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil || string(b) != "bye from the target\n" {
		t.Fatalf("read until the target's half-close: %q, %v", b, err)
	}
	late := strings.Repeat("written after the target's EOF\n", 1000)
	if _, err := c.Write([]byte(late)); err != nil {
		t.Fatalf("write after the target's half-close: %v", err)
	}
	_ = c.CloseWrite()
	select {
	case s := <-got:
		if s != late {
			t.Fatalf("the target VM read %d bytes after its half-close, want %d", len(s), len(late))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the target VM did not get the source's bytes after its half-close")
	}
}

// TestSeveralConnectionsAtOnce: four connections of one migration (a main stream, a return
// path, ...) carried at once, each talking both ways in turns, none mixed with another.
func TestSeveralConnectionsAtOnce(t *testing.T) {
	ps := newPair(t, func(c *net.UnixConn) {
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if _, err := c.Write([]byte("echo " + line)); err != nil {
				return
			}
		}
	})
	const conns, rounds = 4, 200
	conn := make([]*net.UnixConn, conns)
	for i := range conn {
		conn[i] = dialSource(t, ps.socket)
	}
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i, c := range conn {
		wg.Go(func() {
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			r := bufio.NewReader(c)
			for j := range rounds {
				msg := fmt.Sprintf("conn %d round %d %s\n", i, j, strings.Repeat("x", j*10))
				if _, err := c.Write([]byte(msg)); err != nil {
					errs <- err
					return
				}
				got, err := r.ReadString('\n')
				if err != nil || got != "echo "+msg {
					errs <- fmt.Errorf("connection %d round %d: read %q, %v", i, j, got, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := ps.in.Stats(); st.Carried != conns || st.Active != conns {
		t.Errorf("target stats %+v, want %d carried and active", st, conns)
	}
	if n := ps.vm.accepted.Load(); n != conns {
		t.Errorf("the target VM's socket got %d connections, want %d", n, conns)
	}
	for _, c := range conn {
		c.Close()
	}
	waitFor(t, "every connection ends", func() bool { return ps.out.Stats().Active == 0 && ps.in.Stats().Active == 0 })
}

// TestCloseTearsDown: closing the migration closes its carried connections on both sides,
// removes the source's socket, and refuses what comes after; the target VM's socket stays (it
// is the driver's).
func TestCloseTearsDown(t *testing.T) {
	ps := newPair(t, func(c *net.UnixConn) { _, _ = io.Copy(c, c) })
	c := dialSource(t, ps.socket)
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("echo through the proxy: %v", err)
	}
	if err := ps.out.Close(); err != nil {
		t.Fatalf("Close of the source side: %v", err)
	}
	// The VM process's connection is closed: it reads EOF (or a reset), not a hang.
	if _, err := c.Read(buf); err == nil {
		t.Fatal("the source's connection still reads after Close")
	}
	if _, err := os.Lstat(ps.socket); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the source's socket %s is there after Close: %v", ps.socket, err)
	}
	waitFor(t, "the target side's connection ends", func() bool { return ps.in.Stats().Active == 0 })
	if err := ps.in.Close(); err != nil {
		t.Fatalf("Close of the target side: %v", err)
	}
	if _, err := os.Lstat(ps.vm.socket); err != nil {
		t.Errorf("the target VM's socket is gone after Close: %v (it is the driver's)", err)
	}
	// A new Outgoing of the same migration reaches a target that no longer expects it.
	out := ps.outgoing(t, ps.src, testID, targetNode)
	c2 := dialSource(t, out.SocketPath())
	_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c2.Read(buf); err == nil {
		t.Fatalf("a connection after the target's Close read %q", buf[:n])
	}
	ps.tgt.log.waitLog(t, "migration connection refused", "no incoming migration "+testID)
	if n := ps.vm.accepted.Load(); n != 1 {
		t.Errorf("the target VM's socket got %d connections, want 1", n)
	}
	// Close again is harmless.
	if err := ps.out.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestEndOfServeClosesEverything: when the proxy's Serve ends, its migrations are closed and the
// source's socket is removed.
func TestEndOfServeClosesEverything(t *testing.T) {
	ca := testpki.NewCA(t, "kubevisor-ca")
	p, err := New(Config{NodeName: sourceNode, Addr: "127.0.0.1:0", CertDir: testpki.CertDir(t, ca, node(sourceNode), ca), Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Outgoing(OutgoingSpec{ID: testID, TargetNode: targetNode, TargetAddr: "127.0.0.1:1", Socket: filepath.Join(shortDir(t), SocketName)}); !errors.Is(err, ErrDisabled) {
		t.Fatalf("Outgoing before Serve: %v, want ErrDisabled", err)
	}
	// Not serving yet: WaitServing waits, and says so when its ctx ends first.
	short, stopShort := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer stopShort()
	if err := p.WaitServing(short); !errors.Is(err, ErrDisabled) || !strings.Contains(err.Error(), "not serving yet") {
		t.Fatalf("WaitServing before Serve: %v, want ErrDisabled, not serving yet", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	waited := make(chan error, 1)
	go func() { waited <- p.WaitServing(context.Background()) }()
	go func() { done <- p.Serve(ctx, ln) }()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("WaitServing while Serve starts: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitServing did not return once Serve served")
	}
	var out *Migration
	waitFor(t, "Serve runs", func() bool {
		out, err = p.Outgoing(OutgoingSpec{ID: testID, TargetNode: targetNode, TargetAddr: "127.0.0.1:1", Socket: filepath.Join(shortDir(t), SocketName)})
		return err == nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := os.Lstat(out.SocketPath()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the source's socket is there after Serve ended: %v", err)
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Errorf("the port still accepts after Serve ended")
	}
	if err := p.WaitServing(context.Background()); !errors.Is(err, ErrDisabled) {
		t.Errorf("WaitServing after Serve ended: %v, want ErrDisabled at once", err)
	}
}

// TestEndOfServeWithConnections: Serve that ends while connections are carried closes them
// and returns, and the other side sees its connection end.
func TestEndOfServeWithConnections(t *testing.T) {
	ps := newPair(t, func(c *net.UnixConn) { _, _ = io.Copy(c, c) })
	c := dialSource(t, ps.socket)
	buf := make([]byte, 5)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("echo through the proxy: %v", err)
	}
	start := time.Now()
	ps.tgt.stop()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Serve took %s to end with a connection carried", took)
	}
	if _, err := c.Read(buf); err == nil {
		t.Fatal("the source's connection still reads after the target's proxy ended")
	}
	if st := ps.in.Stats(); st.Active != 0 {
		t.Errorf("target stats %+v after Serve ended, want none active", st)
	}
	if _, err := ps.tgt.p.Incoming(IncomingSpec{ID: "abc", SourceNode: sourceNode, TargetSocket: ps.vm.socket}); !errors.Is(err, ErrDisabled) {
		t.Errorf("Incoming after Serve ended: %v, want ErrDisabled", err)
	}
}

// TestRefusedClients: the target refuses, in the handshake, a client of another CA, of another
// node, with an expired certificate, with no certificate, a server certificate's, TLS 1.1, no
// ALPN, and an unknown migration; each refusal is logged with its reason, counted, and the
// target VM's socket never sees a connection.
func TestRefusedClients(t *testing.T) {
	// TLS 1.1 is refused by the proxy's configuration, not only by Go's default.
	tlstest.AllowOldServers(t)
	ps := newPair(t, func(c *net.UnixConn) { _, _ = io.Copy(c, c) })
	other := testpki.NewCA(t, "another-ca")
	roots := ps.ca.Pool()
	serverOnly := testpki.Leaf{CommonName: node(sourceNode).CommonName, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	expired := node(sourceNode)
	expired.NotAfter = time.Now().Add(-time.Minute)
	for _, tc := range []struct {
		name   string
		cert   *tls.Certificate
		id     string
		alpn   []string
		maxVer uint16
		reason string // in the target's log line (hclog quotes it: \" for ")
	}{
		{"another CA", ptr(other.KeyPair(t, node(sourceNode))), testID, []string{Protocol}, 0, "certificate signed by unknown authority"},
		{"another node", ptr(ps.ca.KeyPair(t, node("node-c"))), testID, []string{Protocol}, 0, `the client certificate is node \"node-c\"'s, and the migration's source is node \"node-a\"`},
		{"not a node certificate", ptr(ps.ca.KeyPair(t, testpki.Leaf{CommonName: "kubevisor-api", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})), testID, []string{Protocol}, 0, `(common name \"kubevisor-api\") is not a node certificate`},
		{"expired", ptr(ps.ca.KeyPair(t, expired)), testID, []string{Protocol}, 0, "certificate has expired"},
		{"server usage only", ptr(ps.ca.KeyPair(t, serverOnly)), testID, []string{Protocol}, 0, "incompatible key usage"},
		{"no certificate", nil, testID, []string{Protocol}, 0, "client didn't provide a certificate"},
		{"unknown migration", ptr(ps.ca.KeyPair(t, node(sourceNode))), "0000-unknown", []string{Protocol}, 0, "no incoming migration 0000-unknown on this node"},
		{"no ALPN", ptr(ps.ca.KeyPair(t, node(sourceNode))), testID, nil, 0, "does not offer the protocol " + Protocol},
		{"TLS 1.1", ptr(ps.ca.KeyPair(t, node(sourceNode))), testID, []string{Protocol}, tls.VersionTLS11, "offered only unsupported versions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &tls.Config{
				ServerName: ServerName(tc.id), NextProtos: tc.alpn, RootCAs: roots, MinVersion: tls.VersionTLS10, MaxVersion: tc.maxVer,
				InsecureSkipVerify: true, // the server's name is not the server name here
			}
			if tc.cert != nil {
				// Sent whatever CAs the server asks for.
				cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return tc.cert, nil }
			}
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ps.tgt.addr, cfg)
			if err == nil {
				// TLS 1.3: the refusal of the client's certificate comes with the first read.
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				_, _ = c.Write([]byte("x"))
				_, err = c.Read(make([]byte, 1))
				c.Close()
			}
			if err == nil {
				t.Fatalf("the connection was carried")
			}
			ps.tgt.log.waitLog(t, "migration connection refused", tc.reason)
		})
	}
	if n := ps.vm.accepted.Load(); n != 0 {
		t.Errorf("the target VM's socket got %d connections, want none", n)
	}
	// Refusals naming the migration are counted in it; the one of an unknown migration is not.
	if st := ps.in.Stats(); st.Refused != 8 || st.Carried != 0 {
		t.Errorf("target stats %+v, want 8 refused, none carried", st)
	}
	if got := testutil.ToFloat64(ps.tgt.p.metrics.conns.WithLabelValues("target", "refused")); got != 9 {
		t.Errorf("refused connections metric %v, want 9", got)
	}
}

func ptr[T any](v T) *T { return &v }

// TestSourceChecksTheTarget: the source carries nothing to a target whose certificate names
// another node or comes from another CA, and logs why; the VM process's connection is closed.
func TestSourceChecksTheTarget(t *testing.T) {
	ps := newPair(t, func(c *net.UnixConn) { _, _ = io.Copy(c, c) })
	// The pair's target is node-b, and expects the migration: one that the source says goes
	// to node-c is refused by the source.
	in, err := ps.tgt.p.Incoming(IncomingSpec{ID: "7a7a-another-node", SourceNode: sourceNode, TargetSocket: ps.vm.socket})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out := ps.outgoing(t, ps.src, "7a7a-another-node", "node-c")
	c := dialSource(t, out.SocketPath())
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 8)); err == nil {
		t.Fatalf("read %d bytes from a refused target", n)
	}
	ps.src.log.waitLog(t, "migration connection not carried", `the server certificate is node \"node-b\"'s, and the migration's target is node \"node-c\"`)
	if st := out.Stats(); st.Refused != 1 || st.Carried != 0 {
		t.Errorf("source stats %+v, want 1 refused", st)
	}
	if n := ps.vm.accepted.Load(); n != 0 {
		t.Errorf("the target VM's socket got %d connections, want none", n)
	}

	// A target of another CA (the source trusts the pair's CA only).
	rogueCA := testpki.NewCA(t, "rogue-ca")
	rogue := startNode(t, targetNode, testpki.CertDir(t, rogueCA, node(targetNode), ps.ca))
	vm := startVM(t, func(c *net.UnixConn) {})
	if _, err := rogue.p.Incoming(IncomingSpec{ID: "8b8b-rogue", SourceNode: sourceNode, TargetSocket: vm.socket}); err != nil {
		t.Fatal(err)
	}
	rout, err := ps.src.p.Outgoing(OutgoingSpec{ID: "8b8b-rogue", TargetNode: targetNode, TargetAddr: rogue.addr, Socket: filepath.Join(shortDir(t), SocketName)})
	if err != nil {
		t.Fatal(err)
	}
	defer rout.Close()
	c = dialSource(t, rout.SocketPath())
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 8)); err == nil {
		t.Fatal("read from a target of another CA")
	}
	ps.src.log.waitLog(t, "migration connection not carried", "certificate signed by unknown authority")
	if n := vm.accepted.Load(); n != 0 {
		t.Errorf("the rogue target's VM socket got %d connections", n)
	}
}

// TestSourceProxiesRefusedByTheTarget: proxy to proxy, a source node the migration does not
// name, and a source of another CA, are refused by the target; the source logs the target's
// refusal, and the target VM's socket sees nothing.
func TestSourceProxiesRefusedByTheTarget(t *testing.T) {
	ps := newPair(t, func(c *net.UnixConn) { _, _ = io.Copy(c, c) })
	otherCA := testpki.NewCA(t, "another-ca")
	for _, tc := range []struct {
		name, node, reason string
		ca                 *testpki.CA
	}{
		{"another node", "node-c", `the client certificate is node \"node-c\"'s, and the migration's source is node \"node-a\"`, ps.ca},
		{"another CA", sourceNode, "certificate signed by unknown authority", otherCA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The source trusts the pair's CA, so that it accepts the target: only the target refuses.
			src := startNode(t, tc.node, testpki.CertDir(t, tc.ca, node(tc.node), ps.ca))
			out := ps.outgoing(t, src, testID, targetNode)
			c := dialSource(t, out.SocketPath())
			_, _ = c.Write([]byte("hello"))
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if n, err := c.Read(make([]byte, 8)); err == nil {
				t.Fatalf("read %d bytes through a refused connection", n)
			}
			ps.tgt.log.waitLog(t, "migration connection refused", tc.reason)
			src.log.waitLog(t, "migration connection refused by the peer", "remote error: tls:")
			waitFor(t, "the source counts the refusal", func() bool { return out.Stats().Refused == 1 })
		})
	}
	if n := ps.vm.accepted.Load(); n != 0 {
		t.Errorf("the target VM's socket got %d connections, want none", n)
	}
}

// TestRefusedSpecs: what Incoming and Outgoing refuse before anything listens.
func TestRefusedSpecs(t *testing.T) {
	ca := testpki.NewCA(t, "kubevisor-ca")
	n := startNode(t, sourceNode, testpki.CertDir(t, ca, node(sourceNode), ca))
	sock := filepath.Join(shortDir(t), SocketName)
	notSocket := filepath.Join(shortDir(t), "file")
	if err := os.WriteFile(notSocket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		do   func() error
		want error
	}{
		{"id not a DNS label", func() error {
			_, err := n.p.Incoming(IncomingSpec{ID: "Not_A_Label", SourceNode: "node-x", TargetSocket: "/x.sock"})
			return err
		}, ErrInvalid},
		{"incoming from this node", func() error {
			_, err := n.p.Incoming(IncomingSpec{ID: "abc", SourceNode: sourceNode, TargetSocket: "/x.sock"})
			return err
		}, ErrInvalid},
		{"relative target socket", func() error {
			_, err := n.p.Incoming(IncomingSpec{ID: "abc", SourceNode: "node-x", TargetSocket: "x.sock"})
			return err
		}, ErrInvalid},
		{"outgoing to this node", func() error {
			_, err := n.p.Outgoing(OutgoingSpec{ID: "abc", TargetNode: sourceNode, TargetAddr: "127.0.0.1:1", Socket: sock})
			return err
		}, ErrInvalid},
		{"no port", func() error {
			_, err := n.p.Outgoing(OutgoingSpec{ID: "abc", TargetNode: "node-x", TargetAddr: "127.0.0.1", Socket: sock})
			return err
		}, ErrInvalid},
		{"socket path too long", func() error {
			_, err := n.p.Outgoing(OutgoingSpec{ID: "abc", TargetNode: "node-x", TargetAddr: "127.0.0.1:1", Socket: "/" + strings.Repeat("d", 120)})
			return err
		}, ErrInvalid},
		{"not a socket there", func() error {
			_, err := n.p.Outgoing(OutgoingSpec{ID: "abc", TargetNode: "node-x", TargetAddr: "127.0.0.1:1", Socket: notSocket})
			return err
		}, ErrInvalid},
	} {
		if err := tc.do(); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// Twice the same side of one migration.
	in := IncomingSpec{ID: "abc", SourceNode: "node-x", TargetSocket: "/x.sock"}
	m, err := n.p.Incoming(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.p.Incoming(in); !errors.Is(err, ErrExists) {
		t.Errorf("a second Incoming of one migration: %v, want ErrExists", err)
	}
	m.Close()
	if m, err = n.p.Incoming(in); err != nil {
		t.Errorf("Incoming after the first was closed: %v", err)
	} else {
		m.Close()
	}
}

// TestCertificateOfAnotherNode: a proxy whose certificate names another node (or none) does
// not serve, and Incoming and Outgoing say why.
func TestCertificateOfAnotherNode(t *testing.T) {
	ca := testpki.NewCA(t, "kubevisor-ca")
	p, err := New(Config{NodeName: sourceNode, Addr: "127.0.0.1:0", CertDir: testpki.CertDir(t, ca, node("node-z"), ca), Logger: hclog.NewNullLogger(), CertPoll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.credentials()
	if !errors.Is(err, ErrNoCertificate) || !strings.Contains(err.Error(), `is for "kubevisor-node:node-z", not "kubevisor-node:node-a"`) {
		t.Errorf("credentials: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := p.Run(ctx); err != nil {
		t.Errorf("Run: %v", err)
	}
	if p.Addr() != nil {
		t.Errorf("the proxy served %s with another node's certificate", p.Addr())
	}
	if _, err := p.Incoming(IncomingSpec{ID: "abc", SourceNode: "node-x", TargetSocket: "/x.sock"}); err == nil {
		t.Error("Incoming without this node's certificate succeeded")
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTwoChannels: a migration with ChannelDisks as well carries each source socket's
// connections to its own target socket (the memory stream to the VM's incoming socket, the
// disks' to its NBD socket), counts each channel apart, refuses a channel the target does not
// expect, and removes both source sockets on Close.
func TestTwoChannels(t *testing.T) {
	ca := testpki.NewCA(t, "kubevisor-ca")
	src := startNode(t, sourceNode, testpki.CertDir(t, ca, node(sourceNode), ca))
	tgt := startNode(t, targetNode, testpki.CertDir(t, ca, node(targetNode), ca))
	echoAs := func(tag string) func(c *net.UnixConn) {
		return func(c *net.UnixConn) {
			b, err := io.ReadAll(c)
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s got %d bytes", tag, len(b))
			_ = c.CloseWrite()
		}
	}
	mem, disks := startVM(t, echoAs("memory")), startVM(t, echoAs("disks"))
	in, err := tgt.p.Incoming(IncomingSpec{ID: testID, SourceNode: sourceNode, TargetSocket: mem.socket, DisksTargetSocket: disks.socket})
	if err != nil {
		t.Fatalf("Incoming with two channels: %v", err)
	}
	defer in.Close()
	dir := shortDir(t)
	out, err := src.p.Outgoing(OutgoingSpec{ID: testID, TargetNode: targetNode, TargetAddr: tgt.addr,
		Socket: filepath.Join(dir, SocketName), DisksSocket: filepath.Join(dir, DisksSocketName)})
	if err != nil {
		t.Fatalf("Outgoing with two channels: %v", err)
	}
	if out.DisksSocketPath() != filepath.Join(dir, DisksSocketName) || in.DisksSocketPath() != disks.socket {
		t.Fatalf("DisksSocketPath: source %q, target %q", out.DisksSocketPath(), in.DisksSocketPath())
	}
	send := func(socket string, n int) string {
		c := dialSource(t, socket)
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Write(randomBytes(t, n)); err != nil {
			t.Fatalf("write into %s: %v", socket, err)
		}
		_ = c.CloseWrite()
		b, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("read from %s: %v", socket, err)
		}
		return string(b)
	}
	if got := send(out.SocketPath(), 1<<20); got != "memory got 1048576 bytes" {
		t.Errorf("the memory channel's answer: %q", got)
	}
	if got := send(out.DisksSocketPath(), 3<<20); got != "disks got 3145728 bytes" {
		t.Errorf("the disks channel's answer: %q", got)
	}
	if got := send(out.DisksSocketPath(), 1000); got != "disks got 1000 bytes" {
		t.Errorf("the disks channel's second answer: %q", got)
	}
	waitFor(t, "the connections end on both sides", func() bool { return out.Stats().Active == 0 && in.Stats().Active == 0 })
	for _, m := range []*Migration{out, in} {
		st := m.Stats()
		cm, cd := st.Channels[ChannelMemory], st.Channels[ChannelDisks]
		if cm.Carried != 1 || cm.ToTarget != 1<<20 || cd.Carried != 2 || cd.ToTarget != 3<<20+1000 || st.ToTarget != 4<<20+1000 || st.Carried != 3 || st.Refused != 0 {
			t.Errorf("%s side stats %+v, want memory 1 connection of 1 MiB, disks 2 of 3 MiB + 1000 bytes, none refused", m.side, st)
		}
	}
	if mem.accepted.Load() != 1 || disks.accepted.Load() != 2 {
		t.Errorf("the VM's sockets got %d (memory) and %d (disks) connections, want 1 and 2", mem.accepted.Load(), disks.accepted.Load())
	}

	// A migration that expects no disks channel refuses one in the handshake.
	const other = "0b0b-no-disks"
	in2, err := tgt.p.Incoming(IncomingSpec{ID: other, SourceNode: sourceNode, TargetSocket: mem.socket})
	if err != nil {
		t.Fatal(err)
	}
	defer in2.Close()
	out2, err := src.p.Outgoing(OutgoingSpec{ID: other, TargetNode: targetNode, TargetAddr: tgt.addr,
		Socket: filepath.Join(dir, "m2.sock"), DisksSocket: filepath.Join(dir, "d2.sock")})
	if err != nil {
		t.Fatal(err)
	}
	defer out2.Close()
	c := dialSource(t, out2.DisksSocketPath())
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if b, _ := io.ReadAll(c); len(b) != 0 {
		t.Errorf("a connection on a channel the target does not expect got %q", b)
	}
	waitFor(t, "the refusal is counted", func() bool { return out2.Stats().Refused == 1 })
	// The source sees the refused handshake before the target has necessarily logged why.
	waitFor(t, "the target logs the unknown channel", func() bool {
		l := tgt.log.String()
		return strings.Contains(l, `has no channel \"disks\"`) || strings.Contains(l, `has no channel "disks"`)
	})

	if _, err := src.p.Outgoing(OutgoingSpec{ID: "0c0c", TargetNode: targetNode, TargetAddr: tgt.addr, Socket: filepath.Join(dir, "x.sock"), DisksSocket: filepath.Join(dir, "x.sock")}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Outgoing with one socket for both channels = %v, want ErrInvalid", err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, SocketName), filepath.Join(dir, DisksSocketName)} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the source socket %s is left after Close: %v", p, err)
		}
	}
}

func TestServerNames(t *testing.T) {
	for _, tc := range []struct{ name, id, channel string }{
		{ServerName("abc"), "abc", ChannelMemory},
		{ChannelServerName("abc", ChannelMemory), "abc", ChannelMemory},
		{ChannelServerName("abc", ChannelDisks), "abc", ChannelDisks},
	} {
		id, ch, err := idOfServerName(tc.name)
		if err != nil || id != tc.id || ch != tc.channel {
			t.Errorf("idOfServerName(%q) = %q, %q, %v; want %q, %q", tc.name, id, ch, err, tc.id, tc.channel)
		}
	}
	for _, bad := range []string{"abc.example.org", "a.b.c" + ServerNameSuffix, "Disks.abc" + ServerNameSuffix, ServerNameSuffix} {
		if _, _, err := idOfServerName(bad); err == nil {
			t.Errorf("idOfServerName(%q) is not an error", bad)
		}
	}
}
