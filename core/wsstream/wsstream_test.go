package wsstream

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"
)

func echoServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/forbidden" {
			http.Error(w, `{"message":"no"}`, http.StatusForbidden)
			return
		}
		c, err := Upgrade(w, r)
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func wsURL(srv *httptest.Server, path string) string {
	return "ws" + strings.TrimPrefix(srv.URL, "http") + path
}

func TestStreamCarriesBytesBothWays(t *testing.T) {
	srv := echoServer(t)
	c, err := Dial(context.Background(), wsURL(srv, "/"), DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Larger than one read buffer, so Read must span messages and partial messages.
	want := bytes.Repeat([]byte("0123456789abcdef"), 8<<10)
	go func() { _, _ = c.Write(want[:len(want)/2]); _, _ = c.Write(want[len(want)/2:]) }()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("echoed bytes differ")
	}
}

func TestRefusedHandshakeIsAnHTTPError(t *testing.T) {
	srv := echoServer(t)
	_, err := Dial(context.Background(), wsURL(srv, "/forbidden"), DialOptions{})
	var he *HTTPError
	if !errors.As(err, &he) || he.StatusCode != http.StatusForbidden || !strings.Contains(string(he.Body), "no") {
		t.Fatalf("err = %v, want HTTPError 403 with the body", err)
	}
}

func TestServerRequiresTheSubprotocol(t *testing.T) {
	srv := echoServer(t)
	_, resp, err := websocket.DefaultDialer.Dial(wsURL(srv, "/"), nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("dial without subprotocol: err %v, resp %v; want 400", err, resp)
	}
}

func TestCloseEndsThePeersRead(t *testing.T) {
	srv := echoServer(t)
	c, err := Dial(context.Background(), wsURL(srv, "/"), DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read after close succeeded")
	}
}

// TestReadAfterTheEndKeepsFailing: every Read after the one that ended the stream returns that
// error again; gorilla panics on the 1000th read of a failed connection, so conn must not ask it.
func TestReadAfterTheEndKeepsFailing(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, err := Upgrade(w, r); err == nil {
			c.Close()
		}
	}))
	defer srv.Close()
	c, err := Dial(context.Background(), wsURL(srv, "/"), DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 1100 {
		if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
			t.Fatalf("read %d = %d, %v; want io.EOF", i, n, err)
		}
	}
}
