// Package wsstream carries a byte stream (a serial console, an RFB session, one TCP connection)
// over a WebSocket: binary messages in both directions under the subprotocol
// plain.kubevisor.io, with the server pinging so that an idle stream survives proxies and a dead
// peer is noticed. The node handler serves streams with Upgrade, clients (vmctl, tests) open
// them with Dial, and both sides then use the stream as a net.Conn.
//
// Limits: one stream per WebSocket (no multiplexing, so port-forward opens one WebSocket per
// TCP connection); text messages are refused; a message is at most MaxMessage bytes.
package wsstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
)

// Protocol is the WebSocket subprotocol of every stream.
const Protocol = subv1.StreamProtocol

const (
	// PingInterval is how often the server pings; a peer that has not answered (any message
	// or pong) within PongWait is gone.
	PingInterval = 15 * time.Second
	PongWait     = 2 * PingInterval
	// MaxMessage bounds one binary message.
	MaxMessage = 1 << 20
	writeWait  = 10 * time.Second
)

// Upgrade turns the request into a stream. It answers 400 when the client does not offer
// Protocol. The returned conn pings the client every PingInterval until it is closed.
func Upgrade(w http.ResponseWriter, r *http.Request) (net.Conn, error) {
	if !offers(websocket.Subprotocols(r), Protocol) {
		http.Error(w, fmt.Sprintf("websocket subprotocol %q is required", Protocol), http.StatusBadRequest)
		return nil, fmt.Errorf("client does not offer subprotocol %q", Protocol)
	}
	up := websocket.Upgrader{
		Subprotocols:    []string{Protocol},
		ReadBufferSize:  32 << 10,
		WriteBufferSize: 32 << 10,
		// The caller authenticates and authorizes the request (mutual TLS on the node, the
		// API server's delegated authorization in kubevisor-api); the Origin header of a
		// browser does not apply to these clients.
		CheckOrigin: func(*http.Request) bool { return true },
	}
	ws, err := up.Upgrade(w, r, nil)
	if err != nil {
		return nil, err
	}
	c := newConn(ws)
	go c.pinger()
	return c, nil
}

// DialOptions say how Dial reaches the server.
type DialOptions struct {
	// TLS is the client's TLS configuration (nil for ws:// URLs).
	TLS *tls.Config
	// Header is sent with the handshake (Authorization, Impersonate-User...).
	Header http.Header
	// Proxy chooses a proxy for the URL; none when nil.
	Proxy func(*http.Request) (*url.URL, error)
}

// Dial opens a stream to url (ws:// or wss://). An HTTP answer other than 101 becomes an
// *HTTPError with the answer's status code and body, so that the caller can tell "forbidden"
// from "not running".
func Dial(ctx context.Context, url string, o DialOptions) (net.Conn, error) {
	d := websocket.Dialer{
		TLSClientConfig:  o.TLS,
		Subprotocols:     []string{Protocol},
		Proxy:            o.Proxy,
		HandshakeTimeout: 30 * time.Second,
		ReadBufferSize:   32 << 10,
		WriteBufferSize:  32 << 10,
	}
	ws, resp, err := d.DialContext(ctx, url, o.Header)
	if err != nil {
		if resp != nil {
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			return nil, &HTTPError{StatusCode: resp.StatusCode, Body: body}
		}
		return nil, err
	}
	if ws.Subprotocol() != Protocol {
		ws.Close()
		return nil, fmt.Errorf("server chose websocket subprotocol %q, not %q", ws.Subprotocol(), Protocol)
	}
	c := newConn(ws)
	// The client answers pings (gorilla does by default) and keeps a read deadline only while
	// reading; it does not ping itself.
	return c, nil
}

// HTTPError is a refused handshake.
type HTTPError struct {
	StatusCode int
	// Body is the answer, typically a JSON metav1.Status.
	Body []byte
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.StatusCode, http.StatusText(e.StatusCode), e.Body)
}

func offers(list []string, p string) bool {
	for _, s := range list {
		if s == p {
			return true
		}
	}
	return false
}

// conn adapts a WebSocket to net.Conn: Write sends one binary message, Read returns the bytes of
// the messages in order.
type conn struct {
	ws      *websocket.Conn
	wmu     sync.Mutex // gorilla allows one concurrent writer
	reader  io.Reader  // the rest of the current message
	rerr    error      // the error that ended reading, returned by every later Read
	closed  chan struct{}
	closeMu sync.Once
}

func newConn(ws *websocket.Conn) *conn {
	ws.SetReadLimit(MaxMessage)
	c := &conn{ws: ws, closed: make(chan struct{})}
	ws.SetPongHandler(func(string) error { return ws.SetReadDeadline(time.Now().Add(PongWait)) })
	return c
}

func (c *conn) pinger() {
	_ = c.ws.SetReadDeadline(time.Now().Add(PongWait))
	t := time.NewTicker(PingInterval)
	defer t.Stop()
	for {
		select {
		case <-c.closed:
			return
		case <-t.C:
			if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeWait)); err != nil {
				return
			}
		}
	}
}

// Read returns the bytes of the binary messages in order. The error that ends the stream (io.EOF
// after a normal close) is returned again by every later Read: gorilla panics on the 1000th
// read of a failed connection, so a failed stream is not read from again.
func (c *conn) Read(p []byte) (int, error) {
	if c.rerr != nil {
		return 0, c.rerr
	}
	for {
		if c.reader != nil {
			n, err := c.reader.Read(p)
			if errors.Is(err, io.EOF) {
				c.reader = nil
				if n > 0 {
					return n, nil
				}
				continue
			}
			if err != nil {
				c.rerr = err
			}
			return n, err
		}
		typ, r, err := c.ws.NextReader()
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) && (ce.Code == websocket.CloseNormalClosure || ce.Code == websocket.CloseGoingAway) {
				err = io.EOF
			}
			c.rerr = err
			return 0, err
		}
		if typ != websocket.BinaryMessage {
			c.Close()
			c.rerr = errors.New("websocket: text message on a binary stream")
			return 0, c.rerr
		}
		// Any message shows the peer is alive, as a pong does.
		_ = c.ws.SetReadDeadline(time.Now().Add(PongWait))
		c.reader = r
	}
}

func (c *conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.ws.SetWriteDeadline(time.Now().Add(writeWait))
	if err := c.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close sends a normal close message and closes the connection.
func (c *conn) Close() error {
	var err error
	c.closeMu.Do(func() {
		close(c.closed)
		c.wmu.Lock()
		_ = c.ws.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		c.wmu.Unlock()
		err = c.ws.Close()
	})
	return err
}

func (c *conn) LocalAddr() net.Addr  { return c.ws.LocalAddr() }
func (c *conn) RemoteAddr() net.Addr { return c.ws.RemoteAddr() }
func (c *conn) SetDeadline(t time.Time) error {
	return errors.Join(c.SetReadDeadline(t), c.SetWriteDeadline(t))
}
func (c *conn) SetReadDeadline(t time.Time) error  { return c.ws.SetReadDeadline(t) }
func (c *conn) SetWriteDeadline(t time.Time) error { return c.ws.SetWriteDeadline(t) }
