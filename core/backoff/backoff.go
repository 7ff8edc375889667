// Package backoff is the one exponential back-off of the project: the handler's retries, the
// plugin host's restarts of crashed plugins and the VM controller's crash-loop back-off all
// use it.
package backoff

import (
	"context"
	"time"
)

// Exponential is a delay that starts at Initial and doubles with each consecutive failure, up
// to Max.
type Exponential struct {
	Initial time.Duration
	Max     time.Duration
}

// Delay is the wait after the n-th consecutive failure: Initial·2^(n-1), at most Max; 0 for
// n <= 0. It is pure, so a caller can keep n wherever it likes (a status field, a counter).
func (e Exponential) Delay(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	d := e.Initial
	for i := 1; i < n && d < e.Max; i++ {
		d *= 2
	}
	return min(d, e.Max)
}

// Retry counts consecutive failures for an Exponential: Next gives the next delay, Reset starts
// over after a success. It is not safe for concurrent use.
type Retry struct {
	Exponential
	failures int
}

// NewRetry returns a Retry of e with no failure counted.
func NewRetry(e Exponential) *Retry { return &Retry{Exponential: e} }

// Next counts one more failure and returns the delay before the next attempt.
func (r *Retry) Next() time.Duration {
	if r.Delay(r.failures) < r.Max {
		r.failures++ // stop counting at the cap: the delay no longer grows
	}
	return r.Delay(r.failures)
}

// Reset forgets the failures counted so far.
func (r *Retry) Reset() { r.failures = 0 }

// Wait counts one more failure and sleeps its delay, or until ctx is done; it reports whether
// the whole delay passed.
func (r *Retry) Wait(ctx context.Context) bool {
	t := time.NewTimer(r.Next())
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
