package serial

import (
	"bytes"
	"net"
	"testing"
	"time"
)

func TestConsoleFanOut(t *testing.T) {
	a, b := net.Pipe()
	c := New(a)
	defer c.Close()
	early, backlog := c.subscribe()
	if len(backlog) != 0 {
		t.Fatalf("backlog = %q before any output", backlog)
	}
	if _, err := b.Write([]byte("hello ")); err != nil {
		t.Fatal(err)
	}
	waitPending := func(s *subscriber, want string) {
		t.Helper()
		var got []byte
		deadline := time.After(5 * time.Second)
		for !bytes.Contains(got, []byte(want)) {
			select {
			case <-s.notify:
				got = append(got, s.take()...)
			case <-deadline:
				t.Fatalf("subscriber got %q, want %q", got, want)
			}
		}
	}
	waitPending(early, "hello ")
	late, backlog := c.subscribe()
	if string(backlog) != "hello " {
		t.Fatalf("late subscriber backlog = %q", backlog)
	}
	if _, err := b.Write([]byte("world")); err != nil {
		t.Fatal(err)
	}
	waitPending(early, "world")
	waitPending(late, "world")

	go func() { _, _ = c.Write([]byte("input")) }()
	buf := make([]byte, 5)
	if _, err := b.Read(buf); err != nil || string(buf) != "input" {
		t.Fatalf("input reached the socket as %q, %v", buf, err)
	}

	// The backlog keeps only the last consoleBacklog bytes.
	big := bytes.Repeat([]byte("x"), consoleBacklog+1000)
	c.publish(big)
	if _, backlog := c.subscribe(); len(backlog) != consoleBacklog {
		t.Fatalf("backlog is %d bytes, want %d", len(backlog), consoleBacklog)
	}

	_ = b.Close()
	select {
	case <-early.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("subscriber not closed when the socket closed")
	}
}
