package wsstream

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// Opcodes and bits of RFC 6455 §5.2 frames.
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xa
	finBit         = 0x80
	maskBit        = 0x80
)

// frame encodes one client frame (masked with key, as a client's must be).
func frame(fin bool, op byte, key [4]byte, payload []byte) []byte {
	b := []byte{op, maskBit}
	if fin {
		b[0] |= finBit
	}
	switch n := len(payload); {
	case n < 126:
		b[1] |= byte(n)
	case n <= 0xffff:
		b[1] |= 126
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b[1] |= 127
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	b = append(b, key[:]...)
	for i, c := range payload {
		b = append(b, c^key[i%4])
	}
	return b
}

func closeFrame(code uint16, reason string) []byte {
	return frame(true, opClose, [4]byte{1, 2, 3, 4}, append(binary.BigEndian.AppendUint16(nil, code), reason...))
}

// messages turns body into client frames, so that the fuzzer reaches long valid streams: each
// record is a header byte h, a length byte l and l bytes of payload. h&7 picks the frame: 0-3
// a binary message in 1+(h>>3)&3 fragments (a ping between the first two), 4 a ping, 5 a pong,
// 6 a text message, 7 a close with status 1000+(h>>3)&3, after which the rest is raw bytes.
func messages(body []byte) []byte {
	var out []byte
	for len(body) >= 2 {
		h, l := body[0], int(body[1])
		body = body[2:]
		p := body[:min(l, len(body))]
		body = body[len(p):]
		key := [4]byte{h, byte(l), 0x5a, 0xa5}
		switch h & 7 {
		case 4:
			out = append(out, frame(true, opPing, key, p[:min(len(p), 125)])...)
		case 5:
			out = append(out, frame(true, opPong, key, p[:min(len(p), 125)])...)
		case 6:
			out = append(out, frame(true, opText, key, p)...)
		case 7:
			out = append(out, closeFrame(1000+uint16(h>>3&3), string(p[:min(len(p), 123)]))...)
			return append(out, body...)
		default:
			parts := 1 + int(h>>3&3)
			op := byte(opBinary)
			for i := range parts {
				part := p[len(p)*i/parts : len(p)*(i+1)/parts]
				out = append(out, frame(i == parts-1, op, key, part)...)
				if i == 0 && parts > 1 {
					out = append(out, frame(true, opPing, key, []byte("ping"))...)
				}
				op = opContinuation
			}
		}
	}
	return out
}

// model is what a server's Read must return for raw bytes from a client (RFC 6455 §5): the
// payloads of the binary messages in order, up to the first text message, protocol error
// (reserved bits, an unknown opcode, an unmasked frame, a control frame fragmented or longer
// than 125 bytes, a continuation outside a message, a new message inside one, a message over
// MaxMessage), close frame or truncated frame, including what arrived of a truncated data frame;
// and whether the stream ends with io.EOF: a close frame of status 1000 or 1001 (with a UTF-8
// reason) between messages. Anything else ends Read with another error.
func model(in []byte) (data []byte, eof bool) {
	inMessage := false // a binary message's final frame is still to come
	var msgLen int64
	for {
		if len(in) < 2 {
			return data, false
		}
		b0, b1 := in[0], in[1]
		in = in[2:]
		fin, op, n := b0&finBit != 0, b0&0x0f, int64(b1&0x7f)
		if b0&0x70 != 0 || b1&maskBit == 0 {
			return data, false
		}
		switch op {
		case opClose, opPing, opPong:
			if !fin || n > 125 {
				return data, false
			}
		case opBinary:
			if inMessage {
				return data, false
			}
			msgLen = 0
		case opContinuation:
			if !inMessage {
				return data, false
			}
		default: // text (refused) and the reserved opcodes
			return data, false
		}
		switch n {
		case 126:
			if len(in) < 2 {
				return data, false
			}
			n, in = int64(binary.BigEndian.Uint16(in)), in[2:]
		case 127:
			if len(in) < 8 {
				return data, false
			}
			u := binary.BigEndian.Uint64(in)
			if u>>63 != 0 {
				return data, false
			}
			n, in = int64(u), in[8:]
		}
		if len(in) < 4 {
			return data, false
		}
		key := in[:4]
		in = in[4:]
		payload := make([]byte, min(n, int64(len(in))))
		for i := range payload {
			payload[i] = in[i] ^ key[i%4]
		}
		in = in[len(payload):]
		if op == opBinary || op == opContinuation {
			if n > MaxMessage-msgLen {
				return data, false
			}
			msgLen += n
			data = append(data, payload...)
			if int64(len(payload)) < n {
				return data, false
			}
			inMessage = !fin
			continue
		}
		if int64(len(payload)) < n {
			return data, false
		}
		if op == opClose {
			if inMessage || len(payload) < 2 || !utf8.Valid(payload[2:]) {
				return data, false
			}
			code := binary.BigEndian.Uint16(payload)
			return data, code == 1000 || code == 1001
		}
	}
}

// peerConn is the server's end of a connection from a client that wrote in and hung up: reads
// return in at most chunk bytes at a time, then io.EOF; writes (the handshake's answer, pongs,
// close frames) are dropped.
type peerConn struct {
	mu     sync.Mutex
	in     []byte
	chunk  int
	closed bool
}

func (c *peerConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	if len(c.in) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.chunk)], c.in)
	c.in = c.in[n:]
	return n, nil
}

func (c *peerConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	return len(p), nil
}

func (c *peerConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (*peerConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (*peerConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (*peerConn) SetDeadline(time.Time) error      { return nil }
func (*peerConn) SetReadDeadline(time.Time) error  { return nil }
func (*peerConn) SetWriteDeadline(time.Time) error { return nil }

// hijacker is a ResponseWriter that hands its connection to Upgrade.
type hijacker struct {
	conn   net.Conn
	header http.Header
}

func (w *hijacker) Header() http.Header         { return w.header }
func (w *hijacker) Write(p []byte) (int, error) { return len(p), nil }
func (w *hijacker) WriteHeader(int)             {}
func (w *hijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return w.conn, bufio.NewReadWriter(bufio.NewReader(w.conn), bufio.NewWriter(w.conn)), nil
}

// upgradeRequest is a client's handshake offering Protocol.
func upgradeRequest() *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Connection", "Upgrade")
	r.Header.Set("Upgrade", "websocket")
	r.Header.Set("Sec-WebSocket-Version", "13")
	r.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	r.Header.Set("Sec-WebSocket-Protocol", Protocol)
	return r
}

var (
	chunkSizes = []int{1, 2, 7, 64, 1 << 20} // bytes per read of the connection
	readSizes  = []int{1, 3, 16, 4096}       // the caller's buffer
)

// checkStream upgrades a connection whose client wrote in, reads the stream to its end with a
// buffer of readSize, and checks what model says: the bytes in order, then io.EOF only after a
// normal close, another error otherwise; the same error on every later Read; and, once closed,
// no pinger goroutine left.
func checkStream(t *testing.T, in []byte, chunk, readSize int) {
	c, err := Upgrade(&hijacker{conn: &peerConn{in: in, chunk: chunk}, header: http.Header{}}, upgradeRequest())
	if err != nil {
		t.Fatalf("Upgrade: %v", err)
	}
	var got []byte
	buf := make([]byte, readSize)
	for reads := 0; ; reads++ {
		if reads > len(in)+1 {
			c.Close()
			t.Fatalf("%d reads of %d input bytes have not ended the stream", reads, len(in))
		}
		n, rerr := c.Read(buf)
		got = append(got, buf[:n]...)
		if rerr != nil {
			err = rerr
			break
		}
		if n == 0 {
			c.Close()
			t.Fatal("Read returned 0 bytes and no error")
		}
	}
	want, eof := model(in)
	if !bytes.Equal(got, want) {
		t.Errorf("Read returned %q, want %q", got, want)
	}
	if errors.Is(err, io.EOF) != eof {
		t.Errorf("Read ended with %v, want io.EOF %v", err, eof)
	}
	// A stream that failed stays failed: a caller that reads again gets an error, not data or
	// a panic (gorilla panics on the 1000th read of a failed connection).
	for range 1001 {
		if n, again := c.Read(buf); n != 0 || again == nil {
			t.Fatalf("Read after %v = %d, %v; want 0 and an error", err, n, again)
		}
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); pingers() > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d pinger goroutines left after Close", pingers())
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// pingers counts the goroutines running conn.pinger. (The fuzzing worker's own goroutines come
// and go, so a count of all goroutines would not do.)
func pingers() int {
	buf := make([]byte, 64<<10)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte("wsstream.(*conn).pinger("))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// FuzzRead feeds the server side of a stream what a client sends after the handshake: raw
// frames (the input's first byte even) or records that messages encodes into frames (odd). Bits
// 1-3 of that byte pick how the connection delivers the bytes and bits 4-5 the size of the
// caller's buffer. checkStream holds Read to model.
func FuzzRead(f *testing.F) {
	key := [4]byte{0x37, 0xfa, 0x21, 0x3d}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	raw := func(flags byte, frames ...[]byte) []byte { return cat(append([][]byte{{flags &^ 1}}, frames...)...) }
	hello := frame(true, opBinary, key, []byte("hello"))
	for _, seed := range [][]byte{
		raw(0x00, hello, closeFrame(1000, "")),
		raw(0x16, hello, frame(true, opBinary, key, []byte(" world")), closeFrame(1001, "going away")),
		raw(0x32, frame(false, opBinary, key, []byte("frag")), frame(true, opPing, key, nil),
			frame(false, opContinuation, key, []byte("men")), frame(true, opPong, key, []byte("p")),
			frame(true, opContinuation, key, []byte("ted")), closeFrame(1000, "bye")),
		raw(0x08, frame(true, opBinary, key, bytes.Repeat([]byte{0xff}, 300)), frame(true, opBinary, key, bytes.Repeat([]byte("ab"), 40000))),
		raw(0x24, frame(true, opBinary, key, nil), hello),                                      // an empty message, then the peer hangs up
		raw(0x00, hello, frame(true, opText, key, []byte("text"))),                             // text is refused
		raw(0x00, hello, frame(true, opBinary, key, []byte("x"))[:4]),                          // truncated frame header
		raw(0x00, hello, frame(true, opBinary, key, []byte("truncated"))[:9]),                  // truncated payload
		raw(0x00, hello, []byte{finBit | opBinary, 3, 'a', 'b', 'c'}),                          // unmasked
		raw(0x00, []byte{finBit | 0x40 | opBinary, maskBit}, key[:]),                           // RSV1 without compression
		raw(0x00, []byte{finBit | 0x3, maskBit}, key[:]),                                       // reserved opcode
		raw(0x00, frame(false, opPing, key, nil)),                                              // fragmented control frame
		raw(0x00, frame(true, opContinuation, key, []byte("x"))),                               // continuation outside a message
		raw(0x00, frame(false, opBinary, key, []byte("x")), hello),                             // a new message inside one
		raw(0x00, []byte{finBit | opBinary, maskBit | 127, 0, 0, 0, 0, 0, 0x10, 0, 1}, key[:]), // over MaxMessage
		raw(0x00, []byte{finBit | opBinary, maskBit | 127, 0x80, 0, 0, 0, 0, 0, 0, 0}, key[:]), // negative length
		raw(0x00, hello, frame(true, opClose, key, nil)),                                       // close without a status
		raw(0x00, hello, closeFrame(1002, "protocol error")),
		raw(0x00, hello, closeFrame(999, "")), // not a status a peer may send
		raw(0x00, hello, closeFrame(1000, "\xff")),
		raw(0x00, frame(false, opBinary, key, []byte("x")), closeFrame(1000, "")), // a close inside a message
		{0x01, 0, 5, 'h', 'e', 'l', 'l', 'o', 0x1c, 4, 'a', 'b', 'c', 'd', 4, 2, 'h', 'i', 7, 0},
		{0x03, 6, 1, 'x'},
		{0x0f, 0x18, 200},
		{},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			checkStream(t, nil, 1, 1)
			return
		}
		flags, body := data[0], data[1:]
		if flags&1 == 1 {
			body = messages(body)
		}
		checkStream(t, body, chunkSizes[int(flags>>1&7)%len(chunkSizes)], readSizes[flags>>4&3])
	})
}
