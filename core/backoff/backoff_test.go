package backoff

import (
	"context"
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	e := Exponential{Initial: 100 * time.Millisecond, Max: 2 * time.Second}
	for n, want := range map[int]time.Duration{
		-1: 0, 0: 0, 1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond,
		5: 1600 * time.Millisecond, 6: 2 * time.Second, 100: 2 * time.Second,
	} {
		if got := e.Delay(n); got != want {
			t.Errorf("Delay(%d) = %v, want %v", n, got, want)
		}
	}
	// A Max below Initial caps the first delay too.
	if got := (Exponential{Initial: time.Second, Max: 300 * time.Millisecond}).Delay(1); got != 300*time.Millisecond {
		t.Errorf("Delay(1) with Max < Initial = %v, want 300ms", got)
	}
}

func TestRetry(t *testing.T) {
	r := NewRetry(Exponential{Initial: time.Millisecond, Max: 4 * time.Millisecond})
	var got []time.Duration
	for range 5 {
		got = append(got, r.Next())
	}
	want := []time.Duration{1, 2, 4, 4, 4}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("Next sequence = %v, want %v ms", got, want)
		}
	}
	r.Reset()
	if d := r.Next(); d != time.Millisecond {
		t.Errorf("Next after Reset = %v, want 1ms", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if NewRetry(Exponential{Initial: time.Hour, Max: time.Hour}).Wait(ctx) {
		t.Error("Wait on a done context reported the whole delay passed")
	}
	if !NewRetry(Exponential{Initial: time.Millisecond, Max: time.Millisecond}).Wait(context.Background()) {
		t.Error("Wait of 1ms did not report the delay passed")
	}
}
