package driver

import (
	"context"
	"fmt"
	"testing"
	"time"

	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

func TestBroadcasterFiltersAndDropsOldest(t *testing.T) {
	var b Broadcaster
	all, one := b.subscribe(""), b.subscribe("a")
	for i := range maxEventQueue + 10 {
		b.Publish(&hypervisorv1.Event{Id: "a", Message: fmt.Sprint(i)})
	}
	b.Publish(&hypervisorv1.Event{Id: "b"})
	got := all.take()
	if len(got) != maxEventQueue || got[0].GetMessage() != "11" || got[len(got)-1].GetId() != "b" {
		t.Fatalf("all: %d events from %q to %q, want the newest %d ending with b's", len(got), got[0].GetMessage(), got[len(got)-1].GetId(), maxEventQueue)
	}
	for _, ev := range one.take() {
		if ev.GetId() != "a" {
			t.Fatalf("the stream of a got an event of %q", ev.GetId())
		}
	}
}

func TestBroadcasterServe(t *testing.T) {
	var b Broadcaster
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got := make(chan string, 2)
	done := make(chan error, 1)
	go func() {
		done <- b.Serve(ctx, "a", func(ev *hypervisorv1.Event) error { got <- ev.GetId(); return nil })
	}()
	for { // subscribed once Serve runs
		b.mu.Lock()
		n := len(b.subs)
		b.mu.Unlock()
		if n > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	b.Publish(&hypervisorv1.Event{Id: "b"})
	b.Publish(&hypervisorv1.Event{Id: "a"})
	if id := <-got; id != "a" {
		t.Fatalf("served an event of %q", id)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
