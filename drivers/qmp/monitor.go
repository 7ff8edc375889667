package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// Monitor is a QMP connection to one QEMU, past the capabilities handshake.
type Monitor interface {
	// Run executes a QMP command and returns its "return" value.
	Run(ctx context.Context, command string, args any) (json.RawMessage, error)
	// Events delivers QMP events; it is closed when the connection ends. The caller MUST read
	// it until then: QEMU's replies queue behind undelivered events.
	Events() <-chan qmp.Event
	// Close ends the connection, leaving QEMU running.
	Close() error
}

// DialFunc connects to the QMP socket at path.
type DialFunc func(ctx context.Context, path string) (Monitor, error)

// DialQMP connects to QEMU's QMP socket at path and makes the capabilities handshake. It gives
// up when ctx is done, including while it waits for QEMU's greeting (QEMU greets one client at
// a time), and then closes what it opened, so that no connection is left holding QEMU's single
// QMP client slot.
//
// This is the driver's own small QMP client, with go-qemu's message types, rather than
// go-qemu's SocketMonitor: that one hands a command's reply to its caller in its line
// scanner's buffer, which the next line QEMU sends (an event: a migration sends many) overwrites
// while the caller still decodes the reply. The race detector found it in the migration tests.
// Here every message is decoded from bytes of its own.
func DialQMP(ctx context.Context, path string) (Monitor, error) {
	d := net.Dialer{Timeout: 2 * time.Second}
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	// A done ctx unblocks the handshake's reads and writes.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	dec, err := handshake(conn)
	if !stop() {
		err = ctx.Err()
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("qmp handshake: %w", err)
	}
	m := &socketMonitor{
		conn:    conn,
		events:  make(chan qmp.Event),
		replies: make(chan reply),
		ended:   make(chan struct{}),
		closing: make(chan struct{}),
	}
	go m.read(dec)
	return m, nil
}

// reply is QEMU's answer to a command: its "return" value, or its "error".
type reply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
}

func (r reply) err() error {
	if r.Error == nil {
		return nil
	}
	if r.Error.Desc == "" {
		return errors.New(r.Error.Class)
	}
	return errors.New(r.Error.Desc)
}

// handshake reads QEMU's greeting and leaves capabilities negotiation mode. It returns the
// decoder, which may hold what QEMU sent after.
func handshake(conn net.Conn) (*json.Decoder, error) {
	dec := json.NewDecoder(conn)
	var greeting struct {
		QMP *json.RawMessage `json:"QMP"`
	}
	if err := dec.Decode(&greeting); err != nil {
		return nil, fmt.Errorf("read QEMU's greeting: %w", err)
	}
	if greeting.QMP == nil {
		return nil, errors.New("the socket's first message is not a QMP greeting")
	}
	if err := json.NewEncoder(conn).Encode(qmp.Command{Execute: "qmp_capabilities"}); err != nil {
		return nil, err
	}
	var r reply
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("read the reply to qmp_capabilities: %w", err)
	}
	if err := r.err(); err != nil {
		return nil, fmt.Errorf("qmp_capabilities: %w", err)
	}
	return dec, nil
}

// socketMonitor is a QMP connection: one reader goroutine sorts QEMU's messages into events
// and replies; commands run one at a time, each waiting for the next reply.
type socketMonitor struct {
	conn    net.Conn
	events  chan qmp.Event
	replies chan reply
	ended   chan struct{} // closed when the reader stops; readErr says why
	readErr error
	closing chan struct{} // closed by Close
	once    sync.Once
	mu      sync.Mutex // one command at a time: QEMU answers in order
}

// read decodes QEMU's messages until the connection ends.
func (m *socketMonitor) read(dec *json.Decoder) {
	defer close(m.events)
	defer close(m.ended)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			m.readErr = err
			return
		}
		var kind struct {
			Event string `json:"event"`
		}
		if json.Unmarshal(raw, &kind) != nil {
			continue
		}
		if kind.Event != "" {
			var ev qmp.Event
			if json.Unmarshal(raw, &ev) != nil {
				continue
			}
			select {
			case m.events <- ev:
			case <-m.closing:
				m.readErr = net.ErrClosed
				return
			}
			continue
		}
		var r reply
		if json.Unmarshal(raw, &r) != nil {
			continue
		}
		select {
		case m.replies <- r:
		case <-m.closing:
			m.readErr = net.ErrClosed
			return
		}
	}
}

func (m *socketMonitor) Run(ctx context.Context, command string, args any) (json.RawMessage, error) {
	raw, err := json.Marshal(qmp.Command{Execute: command, Args: args})
	if err != nil {
		return nil, err
	}
	type result struct {
		out json.RawMessage
		err error
	}
	// The command runs to its reply even when ctx ends first, holding the lock: the next
	// command must not take this one's late reply for its own.
	done := make(chan result, 1)
	go func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if _, err := m.conn.Write(raw); err != nil {
			done <- result{err: err}
			return
		}
		select {
		case r := <-m.replies:
			done <- result{r.Return, r.err()}
		case <-m.ended:
			err := m.readErr
			if err == nil {
				err = net.ErrClosed
			}
			done <- result{err: fmt.Errorf("the connection ended before QEMU answered: %w", err)}
		}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("qmp %s: %w", command, r.err)
		}
		return r.out, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("qmp %s: %w", command, ctx.Err())
	}
}

func (m *socketMonitor) Events() <-chan qmp.Event { return m.events }

func (m *socketMonitor) Close() error {
	var err error
	m.once.Do(func() {
		close(m.closing)
		err = m.conn.Close()
	})
	return err
}
