package keyedmutex

import (
	"sync"
	"testing"
	"time"
)

func TestSameKeySerialises(t *testing.T) {
	var m Mutex
	unlock := m.Lock("a")
	got := make(chan struct{})
	go func() {
		u := m.Lock("a")
		close(got)
		u()
	}()
	select {
	case <-got:
		t.Fatal("second Lock of the same key did not wait")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	<-got
}

func TestOtherKeysDoNotWait(t *testing.T) {
	var m Mutex
	unlock := m.Lock("a")
	defer unlock()
	done := make(chan struct{})
	go func() { m.Lock("b")(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Lock of another key waited")
	}
}

func TestEntriesAreDropped(t *testing.T) {
	var m Mutex
	var wg sync.WaitGroup
	counter := 0
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock := m.Lock("k")
			counter++
			unlock()
		}()
	}
	wg.Wait()
	if counter != 50 {
		t.Fatalf("counter = %d, want 50 (lost updates: not exclusive)", counter)
	}
	if n := m.Len(); n != 0 {
		t.Fatalf("%d entries left after every unlock", n)
	}
}
