package conformance

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"
)

// Status is the outcome of one check.
type Status string

// Outcomes of a check.
const (
	StatusPass Status = "PASS"
	StatusFail Status = "FAIL"
	StatusSkip Status = "SKIP"
)

// Result is the outcome of one check a Recorder ran.
type Result struct {
	// Name is the check's full name: the suite given to Recorder.Run, then the subtest names,
	// joined with "/" ("hypervisor/Lifecycle/CreateStartStatusShutdownDelete").
	Name     string
	Status   Status
	Duration time.Duration
	// Message is the first error of a failed check, or the reason of a skipped one.
	Message string
	// Output is every message the check logged, errors and skip reason included, in order.
	Output []string
}

// RecorderConfig configures a Recorder.
type RecorderConfig struct {
	// Progress, when set, gets a line per check as it ends, as `go test -v` prints them
	// ("--- PASS: hypervisor/Kill (0.01s)"), followed by the check's messages, indented.
	Progress io.Writer
	// Run, when set, selects the checks to run as `go test -run` does, with the pattern applied
	// to the names below the suite: "Lifecycle" or "Setup/StableMAC|Teardown".
	Run string
	// Skip, when set, leaves out the checks it matches, as `go test -skip` does: split at its
	// slashes like Run, a check is left out when every element matches its name's element at
	// that depth ("Migrate" leaves out Migrate and every check below it).
	Skip string
	// TempDir is where the checks' temporary directories are made. Default: os.TempDir().
	TempDir string
}

// Recorder runs checks outside `go test`, as T, and records their results. The CLI uses it; a
// test can use it to assert that a check fails. A check is a subtest without subtests of its
// own (a test that fails or skips by itself with subtests is recorded too).
type Recorder struct {
	cfg    RecorderConfig
	filter []*regexp.Regexp
	skip   []*regexp.Regexp

	mu      sync.Mutex
	results []Result
}

// NewRecorder returns a Recorder, or an error if cfg.Run or cfg.Skip is not a valid pattern.
func NewRecorder(cfg RecorderConfig) (*Recorder, error) {
	filter, err := compilePattern("run", cfg.Run)
	if err != nil {
		return nil, err
	}
	skip, err := compilePattern("skip", cfg.Skip)
	if err != nil {
		return nil, err
	}
	return &Recorder{cfg: cfg, filter: filter, skip: skip}, nil
}

// compilePattern compiles each element of a -run or -skip pattern; "" is no pattern.
func compilePattern(what, p string) ([]*regexp.Regexp, error) {
	if p == "" {
		return nil, nil
	}
	var res []*regexp.Regexp
	for _, elem := range splitPattern(p) {
		re, err := regexp.Compile(elem)
		if err != nil {
			return nil, fmt.Errorf("%s pattern %q: %w", what, p, err)
		}
		res = append(res, re)
	}
	return res, nil
}

// splitPattern splits a -run pattern at the slashes outside brackets and parentheses, as
// `go test` does.
func splitPattern(p string) []string {
	var elems []string
	depth, start := 0, 0
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			i++
		case '[', '(':
			depth++
		case ']', ')':
			depth = max(depth-1, 0)
		case '/':
			if depth == 0 {
				elems = append(elems, p[start:i])
				start = i + 1
			}
		}
	}
	return append(elems, p[start:])
}

// selected reports whether a test with these name elements below the suite runs: Run matches
// each element it has a pattern for, and Skip does not match them all.
func (r *Recorder) selected(elems []string) bool {
	for i, elem := range elems {
		if i < len(r.filter) && !r.filter[i].MatchString(elem) {
			return false
		}
	}
	if len(r.skip) == 0 || len(elems) < len(r.skip) {
		return true
	}
	for i, re := range r.skip {
		if !re.MatchString(elems[i]) {
			return true
		}
	}
	return false
}

// Run runs f as the suite named name, in a goroutine of its own, and reports whether it passed.
func (r *Recorder) Run(name string, f func(T)) bool {
	return r.run(nil, rewriteName(name), f)
}

// Results returns the results of the checks run so far, in the order they ended.
func (r *Recorder) Results() []Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Result(nil), r.results...)
}

// Result returns the result of the check with the full name given.
func (r *Recorder) Result(name string) (Result, bool) {
	for _, res := range r.Results() {
		if res.Name == name {
			return res, true
		}
	}
	return Result{}, false
}

// Counts returns how many checks passed, failed and were skipped.
func (r *Recorder) Counts() (passed, failed, skipped int) {
	for _, res := range r.Results() {
		switch res.Status {
		case StatusPass:
			passed++
		case StatusFail:
			failed++
		case StatusSkip:
			skipped++
		}
	}
	return passed, failed, skipped
}

// Summary returns "N passed, N failed, N skipped".
func (r *Recorder) Summary() string {
	p, f, s := r.Counts()
	return fmt.Sprintf("%d passed, %d failed, %d skipped", p, f, s)
}

func (r *Recorder) run(parent *recT, name string, f func(T)) bool {
	c := &recT{r: r, parent: parent, name: name, start: time.Now()}
	ctx := context.Background()
	if parent != nil {
		ctx = parent.ctx
	}
	c.ctx, c.cancel = context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer c.finish()
		defer func() {
			if p := recover(); p != nil {
				c.report(msgError, fmt.Sprintf("panic: %v\n%s", p, debug.Stack()))
			}
		}()
		f(c)
	}()
	<-done
	return !c.Failed()
}

// rewriteName makes a subtest name as `go test` does: spaces become underscores.
func rewriteName(name string) string {
	return strings.ReplaceAll(name, " ", "_")
}

type msgKind int

const (
	msgLog msgKind = iota
	msgError
	msgSkip
)

// recT is one test run by a Recorder.
type recT struct {
	r      *Recorder
	parent *recT
	name   string
	start  time.Time
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex
	// failed includes the failures of subtests; selfFailed and skipped are the test's own.
	failed, selfFailed, skipped bool
	ranSub, filteredSub         bool
	message                     string
	output                      []string
	cleanups                    []func()
}

var _ T = (*recT)(nil)

func (c *recT) report(kind msgKind, msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.output = append(c.output, msg)
	switch kind {
	case msgError:
		if !c.selfFailed && !c.skipped {
			c.message = msg
		}
		c.failed, c.selfFailed = true, true
	case msgSkip:
		if !c.selfFailed {
			c.message = msg
		}
		c.skipped = true
	}
}

// Helper implements T; a Recorder does not report source lines.
func (c *recT) Helper() {}

// Errorf implements T.
func (c *recT) Errorf(format string, args ...any) { c.report(msgError, fmt.Sprintf(format, args...)) }

// Fatalf implements T.
func (c *recT) Fatalf(format string, args ...any) {
	c.report(msgError, fmt.Sprintf(format, args...))
	runtime.Goexit()
}

// Skipf implements T.
func (c *recT) Skipf(format string, args ...any) {
	c.report(msgSkip, fmt.Sprintf(format, args...))
	runtime.Goexit()
}

// Logf implements T.
func (c *recT) Logf(format string, args ...any) { c.report(msgLog, fmt.Sprintf(format, args...)) }

// Failed implements T.
func (c *recT) Failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}

// Context implements T.
func (c *recT) Context() context.Context { return c.ctx }

// Cleanup implements T.
func (c *recT) Cleanup(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cleanups = append(c.cleanups, f)
}

// TempDir implements T: a new directory, removed when the test ends.
func (c *recT) TempDir() string {
	dir, err := os.MkdirTemp(c.r.cfg.TempDir, "kvc-")
	if err != nil {
		c.Fatalf("TempDir: %v", err)
	}
	c.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			c.Errorf("TempDir cleanup: %v", err)
		}
	})
	return dir
}

// Run implements T.
func (c *recT) Run(name string, f func(T)) bool {
	full := c.name + "/" + rewriteName(name)
	elems := strings.Split(full, "/")[1:]
	if !c.r.selected(elems) {
		c.mu.Lock()
		c.filteredSub = true
		c.mu.Unlock()
		return true
	}
	c.mu.Lock()
	c.ranSub = true
	c.mu.Unlock()
	ok := c.r.run(c, full, f)
	if !ok {
		c.mu.Lock()
		c.failed = true
		c.mu.Unlock()
	}
	return ok
}

// finish runs the cleanups and records the result.
func (c *recT) finish() {
	c.cancel()
	for {
		c.mu.Lock()
		n := len(c.cleanups)
		if n == 0 {
			c.mu.Unlock()
			break
		}
		f := c.cleanups[n-1]
		c.cleanups = c.cleanups[:n-1]
		c.mu.Unlock()
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer func() {
				if p := recover(); p != nil {
					c.report(msgError, fmt.Sprintf("panic in cleanup: %v\n%s", p, debug.Stack()))
				}
			}()
			f()
		}()
		<-done
	}

	c.mu.Lock()
	res := Result{Name: c.name, Duration: time.Since(c.start), Message: c.message, Output: append([]string(nil), c.output...)}
	switch {
	case c.selfFailed:
		res.Status = StatusFail
	case c.skipped:
		res.Status = StatusSkip
	case c.failed:
		res.Status = StatusFail
	default:
		res.Status = StatusPass
	}
	// A test with subtests is a group, not a check, unless it failed or skipped by itself.
	record := (!c.ranSub && !c.filteredSub) || c.selfFailed || c.skipped
	c.mu.Unlock()
	if !record {
		return
	}
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	c.r.results = append(c.r.results, res)
	if w := c.r.cfg.Progress; w != nil {
		fmt.Fprintf(w, "--- %s: %s (%.2fs)\n", res.Status, res.Name, res.Duration.Seconds())
		for _, msg := range res.Output {
			fmt.Fprintf(w, "    %s\n", strings.ReplaceAll(msg, "\n", "\n        "))
		}
	}
}
