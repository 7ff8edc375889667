package qmp

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeQMP serves one QMP client at path: the greeting, qmp_capabilities, then answers each
// command with the reply answer gives it, after sending burst events, so that events and
// replies interleave on the wire as a migrating QEMU's do.
func fakeQMP(t *testing.T, path string, burst int, answer func(cmd string) string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintln(c, `{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}}, "capabilities": []}}`)
		// Commands as QEMU reads them: a JSON stream, no line ends needed.
		dec := json.NewDecoder(c)
		for {
			var cmd struct {
				Execute string `json:"execute"`
			}
			if dec.Decode(&cmd) != nil {
				return
			}
			if cmd.Execute == "qmp_capabilities" {
				fmt.Fprintln(c, `{"return": {}}`)
				continue
			}
			var b strings.Builder
			for i := range burst {
				fmt.Fprintf(&b, `{"timestamp": {"seconds": 1, "microseconds": %d}, "event": "MIGRATION_PASS", "data": {"pass": %d}}`+"\n", i, i)
			}
			b.WriteString(answer(cmd.Execute) + "\n")
			if _, err := c.Write([]byte(b.String())); err != nil {
				return
			}
		}
	}()
}

// TestMonitorRepliesBetweenEvents: each command gets its own reply whole while events stream
// around it (go-qemu's monitor handed replies in a buffer the next line overwrote: run with
// -race), events arrive in order, and an error reply is QEMU's desc.
func TestMonitorRepliesBetweenEvents(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qmp.sock")
	fakeQMP(t, path, 20, func(cmd string) string {
		if cmd == "bad" {
			return `{"error": {"class": "GenericError", "desc": "no such thing"}}`
		}
		return fmt.Sprintf(`{"return": {"command": %q, "padding": %q}}`, cmd, strings.Repeat("x", 512))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := DialQMP(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	passes := make(chan int, 1)
	go func() {
		n := 0
		for ev := range m.Events() {
			if p, _ := ev.Data["pass"].(float64); int(p) != n%20 {
				t.Errorf("event %d: pass %v, want %d", n, ev.Data["pass"], n%20)
			}
			n++
		}
		passes <- n
	}()
	for i := range 50 {
		cmd := fmt.Sprintf("query-%d", i)
		out, err := m.Run(ctx, cmd, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got struct{ Command string }
		if err := json.Unmarshal(out, &got); err != nil || got.Command != cmd {
			t.Fatalf("reply to %s = %s (%v)", cmd, out, err)
		}
	}
	if _, err := m.Run(ctx, "bad", nil); err == nil || !strings.Contains(err.Error(), "qmp bad: no such thing") {
		t.Errorf("error reply: %v", err)
	}
	_ = m.Close()
	if n := <-passes; n != 51*20 {
		t.Errorf("%d events, want %d", n, 51*20)
	}
	if _, err := m.Run(ctx, "after-close", nil); err == nil {
		t.Error("Run after Close succeeded")
	}
}

// TestDialQMPGivesUp: a socket that never greets (QEMU serving another client) is given up
// when ctx ends, with the handshake named.
func TestDialQMPGivesUp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := DialQMP(ctx, path); err == nil || !strings.Contains(err.Error(), "qmp handshake") {
		t.Fatalf("DialQMP to a silent socket = %v", err)
	}
}
