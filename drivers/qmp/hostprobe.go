package qmp

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Retry schedule of a HostProbe whose result is Transient: the first retry after
// ProbeRetryMin, each next one twice as late up to ProbeRetryMax, the test boot's timeout
// doubled each time up to ProbeRetryTimeoutFactor times the configured one.
const (
	ProbeRetryMin           = 10 * time.Second
	ProbeRetryMax           = 5 * time.Minute
	ProbeRetryTimeoutFactor = 4
	// ProbeSettleWait bounds how long Settled waits for a result that is not transient.
	ProbeSettleWait = time.Minute
)

// HostProbe is a driver's view of the host's QEMU: the probe of its options (Start), run in
// the background, its latest result (Info) and every later one (Watch).
//
// A result that rests on a timeout (HostInfo.Transient: no accelerator finished the test guest
// in time, which a node busy starting many processes causes as surely as a broken QEMU) is not
// final: the probe runs again with backoff and a longer timeout until a result is not
// transient, and each new result reaches Watch, so the driver's fingerprint (its node's
// health, hence where VMIs are placed) recovers without a restart. A result that is not
// transient is final for the options.
type HostProbe struct {
	// Prober runs the probes; Log, when set, is told each result and how long it took.
	Prober *Prober
	Log    func(h *HostInfo, took time.Duration)
	// RetryMin and RetryMax override ProbeRetryMin and ProbeRetryMax (tests).
	RetryMin, RetryMax time.Duration

	mu      sync.Mutex
	started bool
	opts    ProbeOptions
	gen     int           // counts Start calls with new options; a retry of an older one stops
	info    *HostInfo     // latest result of opts, nil until the first
	changed chan struct{} // closed (and replaced) when info changes
	kick    chan struct{} // wakes a retry's wait early (Settled); buffered, made by Start
}

// Start probes with opts in the background, unless the probe already runs (or ran) with the
// same options.
func (p *HostProbe) Start(opts ProbeOptions) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.startLocked(opts)
}

func (p *HostProbe) startLocked(opts ProbeOptions) {
	if p.started && p.opts == opts {
		return
	}
	p.started, p.opts, p.info = true, opts, nil
	p.gen++
	p.notifyLocked()
	p.kick = make(chan struct{}, 1)
	go p.run(p.gen, opts, p.kick)
}

// notifyLocked wakes every waiter on changed.
func (p *HostProbe) notifyLocked() {
	if p.changed != nil {
		close(p.changed)
	}
	p.changed = make(chan struct{})
}

// Set makes info the result, as if a probe had found it, and stops any probe under way from
// reporting (tests, and drivers whose host is known).
func (p *HostProbe) Set(info *HostInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.started = true
	p.gen++
	p.info = info
	p.notifyLocked()
}

// run probes with opts for generation gen, again while the result is transient: after its
// wait, or earlier when kick is sent to.
func (p *HostProbe) run(gen int, opts ProbeOptions, kick <-chan struct{}) {
	wait, lo := p.RetryMin, p.RetryMax
	if wait <= 0 {
		wait = ProbeRetryMin
	}
	if lo <= 0 {
		lo = ProbeRetryMax
	}
	base := opts.Timeout
	if base <= 0 {
		base = DefaultProbeTimeout
	}
	try := opts
	for {
		start := time.Now()
		h := p.Prober.Probe(context.Background(), try)
		if p.Log != nil {
			p.Log(h, time.Since(start))
		}
		p.mu.Lock()
		if p.gen != gen {
			p.mu.Unlock()
			return
		}
		p.info = h
		p.notifyLocked()
		p.mu.Unlock()
		if !h.Transient {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-kick:
			t.Stop()
		}
		wait = min(2*wait, lo)
		try.Timeout = min(2*max(try.Timeout, base), ProbeRetryTimeoutFactor*base)
	}
}

// Info waits for a result (starting the probe with defaults when Start was not called) and
// returns the latest one.
func (p *HostProbe) Info(ctx context.Context, defaults ProbeOptions) (*HostInfo, error) {
	var got *HostInfo
	_ = p.Watch(ctx, defaults, func(h *HostInfo) error {
		got = h
		return errGot
	})
	if got == nil {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return got, nil
}

// Settled is Info for an operation that refuses when QEMU is not usable (a VM's Create or
// Start): while the latest result finds a problem but is transient, it has the probe run again
// now (with its longer timeout) rather than at its next retry, and waits, up to maxWait or
// until ctx is done, for a result that is not transient or finds no problem. It returns the
// latest result then. On a node busy enough that the first test guest timed out, a VM is
// then refused only when a longer probe fails too.
func (p *HostProbe) Settled(ctx context.Context, defaults ProbeOptions, maxWait time.Duration) (*HostInfo, error) {
	wctx, cancel := context.WithTimeout(ctx, maxWait)
	defer cancel()
	var got *HostInfo
	_ = p.Watch(wctx, defaults, func(h *HostInfo) error {
		got = h
		if !h.Transient || h.Problem == "" {
			return errGot
		}
		p.mu.Lock()
		select {
		case p.kick <- struct{}{}:
		default:
		}
		p.mu.Unlock()
		return nil
	})
	if got == nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, status.Errorf(codes.Unavailable, "the host's QEMU probe gave no result within %s", maxWait)
	}
	return got, nil
}

// errGot ends Info's Watch at the first result.
var errGot = errors.New("got a result")

// Watch calls fn with the latest result and then with each new one, until ctx is done (it
// returns nil then) or fn fails (it returns fn's error).
func (p *HostProbe) Watch(ctx context.Context, defaults ProbeOptions, fn func(*HostInfo) error) error {
	var last *HostInfo
	for {
		p.mu.Lock()
		if !p.started {
			p.startLocked(defaults)
		}
		info, changed := p.info, p.changed
		p.mu.Unlock()
		if info != nil && info != last {
			if err := fn(info); err != nil {
				return err
			}
			last = info
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		}
	}
}
