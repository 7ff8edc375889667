package bench

import (
	"bytes"
	"context"
	"image"
	"image/color"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kubevisor/kubevisor/internal/rfb/rfbtest"
)

func TestSubresourceURL(t *testing.T) {
	for _, tc := range []struct{ host, want, err string }{
		{"https://10.0.0.1:6443", "wss://10.0.0.1:6443/apis/subresources.kubevisor.io/v1alpha1/namespaces/ns/virtualmachineinstances/vm/console", ""},
		{"http://127.0.0.1:8080/prefix/", "ws://127.0.0.1:8080/prefix/apis/subresources.kubevisor.io/v1alpha1/namespaces/ns/virtualmachineinstances/vm/console", ""},
		{"10.0.0.1:6443", "wss://10.0.0.1:6443/apis/subresources.kubevisor.io/v1alpha1/namespaces/ns/virtualmachineinstances/vm/console", ""},
		{"ftp://x", "", "scheme"},
		{"", "", "no API server"},
	} {
		got, err := subresourceURL(tc.host, "ns", "vm", "console")
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("subresourceURL(%q) = %q, %v; want an error saying %q", tc.host, got, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("subresourceURL(%q) = %q, %v; want %q", tc.host, got, err, tc.want)
		}
	}
}

// TestAuthHeaders: the WebSocket handshake carries what client-go would send for the
// kubeconfig's user.
func TestAuthHeaders(t *testing.T) {
	h, err := authHeaders(&rest.Config{Host: "https://x", BearerToken: "TOKEN", Impersonate: rest.ImpersonationConfig{UserName: "alice"}})
	if err != nil {
		t.Fatal(err)
	}
	if h.Get("Authorization") != "Bearer TOKEN" || h.Get("Impersonate-User") != "alice" {
		t.Errorf("headers %v", h)
	}
	h, err = authHeaders(&rest.Config{Host: "https://x", Username: "u", Password: "p"})
	if err != nil || !strings.HasPrefix(h.Get("Authorization"), "Basic ") {
		t.Errorf("basic auth headers %v, %v", h, err)
	}
}

func TestRFBFirstUpdate(t *testing.T) {
	img := image.NewRGBA(image.Rect(0, 0, 720, 400))
	img.Set(3, 4, color.RGBA{R: 200, A: 255})
	client, server := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- rfbtest.Serve(server, img) }()
	got, err := rfbFirstUpdate(client)
	client.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got.Width != 720 || got.Height != 400 || got.FirstUpdate.Before(got.ServerInit) {
		t.Errorf("rfbFirstUpdate = %+v", got)
	}
	if err := <-done; err != nil {
		t.Errorf("server: %v", err)
	}
}

// fakeSerial is a guest's serial console with a shell on it, as the driver serves it to
// several consoles at once: each new console gets the backlog, input from any is echoed to
// all, and Enter prints a prompt.
type fakeSerial struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (s *fakeSerial) attach(t *testing.T) net.Conn {
	client, server := net.Pipe()
	s.mu.Lock()
	s.conns = append(s.conns, server)
	s.mu.Unlock()
	go func() {
		s.write([]byte("KUBEVISOR-GUEST-READY\r\n"))
		buf := make([]byte, 64)
		for {
			n, err := server.Read(buf)
			if err != nil {
				return
			}
			for _, c := range buf[:n] {
				if c == '\r' {
					s.write([]byte("\r\nkubevisor-guest:/# "))
				} else {
					s.write([]byte{c})
				}
			}
		}
	}()
	t.Cleanup(func() { client.Close(); server.Close() })
	return client
}

func (s *fakeSerial) write(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		_, _ = c.Write(b)
	}
}

// slowConn delays every read, as a longer path would.
type slowConn struct {
	net.Conn
	delay time.Duration
}

func (c slowConn) Read(p []byte) (int, error) {
	time.Sleep(c.delay)
	return c.Conn.Read(p)
}

// TestMeasureKeystrokes: keystrokes alternate between the paths, each is measured on its own
// path up to its echo, and the slower path's latencies hold its delay.
func TestMeasureKeystrokes(t *testing.T) {
	serial := &fakeSerial{}
	const delay = 3 * time.Millisecond
	paths := []streamPath{
		{name: "slow", dial: func(context.Context, string) (net.Conn, error) { return slowConn{serial.attach(t), delay}, nil }},
		{name: "fast", dial: func(context.Context, string) (net.Conn, error) { return serial.attach(t), nil }},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lat, err := measureKeystrokes(ctx, paths, ConsoleConfig{Chars: 50, Warmup: 3, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(lat) != 2 || len(lat[0]) != 50 || len(lat[1]) != 50 {
		t.Fatalf("measured %d paths, %v keystrokes", len(lat), []int{len(lat[0]), len(lat[1])})
	}
	if quantile(lat[0], 50) < delay {
		t.Errorf("the slow path's p50 %s is below its delay %s", quantile(lat[0], 50), delay)
	}
	for _, l := range lat {
		if l[0] <= 0 || quantile(l, 100) > 10*time.Second {
			t.Errorf("latencies out of range: %v", l)
		}
	}
	var out bytes.Buffer
	printLatencies(&out, "title", paths, lat)
	if s := out.String(); !strings.Contains(s, "ratio slow / fast: p50 ") || !strings.Contains(s, "  fast") {
		t.Errorf("printed:\n%s", s)
	}
}

func TestQuantile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 200; i++ {
		d = append(d, time.Duration(i)*time.Microsecond)
	}
	for p, want := range map[int]time.Duration{50: 100 * time.Microsecond, 99: 198 * time.Microsecond, 100: 200 * time.Microsecond, 0: time.Microsecond} {
		if got := quantile(d, p); got != want {
			t.Errorf("quantile(1..200µs, %d) = %s, want %s", p, got, want)
		}
	}
	if quantile(nil, 50) != 0 {
		t.Error("quantile of nothing")
	}
}
