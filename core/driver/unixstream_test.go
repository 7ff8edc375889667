package driver

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"
)

func TestServeUnixStream(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			// A server that speaks first, as an RFB server does, then echoes.
			go func() { _, _ = c.Write([]byte("hello ")); _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	// A session carries both ways; it ends when the client's side closes.
	pr, pw := io.Pipe()
	out := &notifyWriter{got: make(chan string, 4)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ServeUnixStream(ctx, path, pr, out) }()
	if got := <-out.got; got != "hello " {
		t.Fatalf("first from the server %q, want hello", got)
	}
	if _, err := pw.Write([]byte("back")); err != nil {
		t.Fatal(err)
	}
	if got := <-out.got; got != "back" {
		t.Fatalf("echoed %q, want back", got)
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The end of ctx ends a session without an error.
	pr2, pw2 := io.Pipe()
	defer pw2.Close()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if err := ServeUnixStream(ctx2, path, pr2, io.Discard); err != nil {
		t.Errorf("session ended by ctx: %v", err)
	}
	// No socket: a DialError.
	var de *DialError
	if err := ServeUnixStream(ctx, filepath.Join(t.TempDir(), "none.sock"), nil, io.Discard); !errors.As(err, &de) {
		t.Errorf("missing socket: %v, want a DialError", err)
	}
}

// notifyWriter passes each write on got.
type notifyWriter struct{ got chan string }

func (w *notifyWriter) Write(p []byte) (int, error) { w.got <- string(p); return len(p), nil }
