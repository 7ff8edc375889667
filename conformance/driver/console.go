package conformance

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/kubevisor/kubevisor/core/driver"
)

// consoleTail is how much of the end of a console's output an error message quotes.
const consoleTail = 2 << 10

// consoleLog is the output of a serial console, safe for one writer (the Console call) and any
// number of readers, which can wait for text to appear.
type consoleLog struct {
	mu      sync.Mutex
	buf     []byte
	changed chan struct{} // closed and replaced on every write and at the end
	ended   bool
	err     error // what the Console call returned, once ended
}

func newConsoleLog() *consoleLog {
	return &consoleLog{changed: make(chan struct{})}
}

// Write implements io.Writer: the Console call writes the output here.
func (l *consoleLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	close(l.changed)
	l.changed = make(chan struct{})
	return len(p), nil
}

// end records that the Console call returned err: no more output comes.
func (l *consoleLog) end(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	l.ended, l.err = true, err
	close(l.changed)
	l.changed = make(chan struct{})
}

// String returns the output so far.
func (l *consoleLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}

// Len returns how many bytes of output there are so far.
func (l *consoleLog) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buf)
}

// Count returns how many times text occurs in the output so far.
func (l *consoleLog) Count(text string) int {
	return strings.Count(l.String(), text)
}

// Tail returns the last consoleTail bytes of the output, for an error message.
func (l *consoleLog) Tail() string {
	return tailOf(l.String(), consoleTail)
}

// tailOf returns the last n bytes of s as an indented block, carriage returns dropped.
func tailOf(s string, n int) string {
	cut := ""
	if len(s) > n {
		s, cut = s[len(s)-n:], "…"
	}
	size := len(s)
	s = strings.ReplaceAll(s, "\r", "")
	if strings.TrimSpace(s) == "" {
		return "(no console output)"
	}
	return fmt.Sprintf("last %d bytes of console output:\n%s%s", size, cut, s)
}

// WaitFor waits until text occurs at least n times in the output. It fails when timeout passes,
// ctx is done, or the console ends first; the error quotes the end of the output.
func (l *consoleLog) WaitFor(ctx context.Context, text string, n int, timeout time.Duration) error {
	return l.waitUntil(ctx, timeout, fmt.Sprintf("%q %s", text, times(n)), func(out string) bool {
		return strings.Count(out, text) >= n
	})
}

// waitUntil waits until cond holds for the output; what describes cond for the error.
func (l *consoleLog) waitUntil(ctx context.Context, timeout time.Duration, what string, cond func(out string) bool) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		l.mu.Lock()
		out, changed, ended, endErr := string(l.buf), l.changed, l.ended, l.err
		l.mu.Unlock()
		if cond(out) {
			return nil
		}
		if ended {
			return fmt.Errorf("the console ended (Console returned %s) before it showed %s; %s", describe(endErr), what, tailOf(out, consoleTail))
		}
		select {
		case <-changed:
		case <-timer.C:
			return fmt.Errorf("the console did not show %s within %s; %s", what, timeout, l.Tail())
		case <-ctx.Done():
			return fmt.Errorf("the console did not show %s before the check's time ran out (%v); %s", what, context.Cause(ctx), l.Tail())
		}
	}
}

func times(n int) string {
	if n == 1 {
		return "once"
	}
	return fmt.Sprintf("%d times", n)
}

// consoleSession is a Console call running in the background, its output in out.
type consoleSession struct {
	out    *consoleLog
	in     *io.PipeWriter
	cancel context.CancelFunc
	done   chan error
	// retype is how often typeUntil types a command again: retypeEvery.
	retype time.Duration
}

// attachConsole starts a Console call of VM id that lasts until the check ends or cancel.
func attachConsole(t T, c driver.Consoler, id string) *consoleSession {
	ctx, cancel := context.WithCancel(t.Context())
	inR, inW := io.Pipe()
	cs := &consoleSession{out: newConsoleLog(), in: inW, cancel: cancel, done: make(chan error, 1), retype: retypeEvery}
	go func() {
		err := c.Console(ctx, id, inR, cs.out)
		// Input written after the call ended fails instead of blocking for ever.
		_ = inR.CloseWithError(io.ErrClosedPipe)
		cs.out.end(err)
		cs.done <- err
	}()
	t.Cleanup(func() {
		cancel()
		_ = inW.Close()
	})
	return cs
}

// wait waits up to timeout for the Console call to return, and reports whether it did and
// with what.
func (cs *consoleSession) wait(timeout time.Duration) (ended bool, err error) {
	if timeout <= 0 {
		select {
		case err := <-cs.done:
			cs.done <- err
			return true, err
		default:
			return false, nil
		}
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-cs.done:
		cs.done <- err
		return true, err
	case <-timer.C:
		return false, nil
	}
}

// retypeEvery is how often typeUntil re-sends a command whose output has not appeared: a line
// typed while the guest's shell is not yet reading may be lost.
const retypeEvery = 5 * time.Second

// typeUntil types line (and a newline) on the console until want occurs more often than it
// did before, or timeout passes. want should not occur in line itself, which the terminal
// echoes: type `echo kv-$((6*7))` and wait for "kv-42".
func (cs *consoleSession) typeUntil(ctx context.Context, line, want string, timeout time.Duration) error {
	before := cs.out.Count(want)
	deadline := time.Now().Add(timeout)
	for {
		if err := cs.send(line + "\n"); err != nil {
			return fmt.Errorf("type %q on the console: %w; %s", line, err, cs.out.Tail())
		}
		wait := min(cs.retype, time.Until(deadline))
		err := cs.out.WaitFor(ctx, want, before+1, wait)
		if err == nil || time.Until(deadline) <= 0 || ctx.Err() != nil {
			if err != nil {
				return fmt.Errorf("typed %q: %w", line, err)
			}
			return nil
		}
		if ended, _ := cs.wait(0); ended {
			return fmt.Errorf("typed %q: %w", line, err)
		}
	}
}

// send writes s to the console's input, failing rather than blocking when nobody reads it.
func (cs *consoleSession) send(s string) error {
	done := make(chan error, 1)
	go func() {
		_, err := io.WriteString(cs.in, s)
		done <- err
	}()
	timer := time.NewTimer(cs.retype)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return fmt.Errorf("the Console call did not read its input within %s", cs.retype)
	}
}
