package qmp

import (
	"context"
	"encoding/json"
	"fmt"
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

// DialQMP connects with go-qemu's SocketMonitor. It gives up when ctx is done, including while
// it waits for QEMU's greeting (QEMU greets one client at a time).
func DialQMP(ctx context.Context, path string) (Monitor, error) {
	timeout := 2 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	mon, err := qmp.NewSocketMonitor("unix", path, timeout)
	if err != nil {
		return nil, err
	}
	type result struct {
		events <-chan qmp.Event
		err    error
	}
	// The handshake runs in its own goroutine; if the caller gives up first, that goroutine
	// closes what it opened, so no connection is left holding QEMU's single QMP client slot.
	var mu sync.Mutex
	gaveUp := false
	done := make(chan result, 1)
	go func() {
		err := mon.Connect()
		var evs <-chan qmp.Event
		if err == nil {
			evs, err = mon.Events(context.Background())
		}
		mu.Lock()
		defer mu.Unlock()
		if gaveUp {
			_ = mon.Disconnect()
			return
		}
		done <- result{evs, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			_ = mon.Disconnect()
			return nil, fmt.Errorf("qmp handshake: %w", r.err)
		}
		return &socketMonitor{mon: mon, events: r.events}, nil
	case <-ctx.Done():
		mu.Lock()
		gaveUp = true
		select {
		case <-done: // it finished as we gave up
			_ = mon.Disconnect()
		default:
		}
		mu.Unlock()
		return nil, fmt.Errorf("qmp handshake: %w", ctx.Err())
	}
}

type socketMonitor struct {
	mon    *qmp.SocketMonitor
	events <-chan qmp.Event
	once   sync.Once
}

func (m *socketMonitor) Run(ctx context.Context, command string, args any) (json.RawMessage, error) {
	raw, err := json.Marshal(qmp.Command{Execute: command, Args: args})
	if err != nil {
		return nil, err
	}
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := m.mon.Run(raw)
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("qmp %s: %w", command, r.err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
		}
		if err := json.Unmarshal(r.out, &resp); err != nil {
			return nil, fmt.Errorf("qmp %s: %w", command, err)
		}
		return resp.Return, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("qmp %s: %w", command, ctx.Err())
	}
}

func (m *socketMonitor) Events() <-chan qmp.Event { return m.events }

func (m *socketMonitor) Close() error {
	var err error
	m.once.Do(func() { err = m.mon.Disconnect() })
	return err
}
