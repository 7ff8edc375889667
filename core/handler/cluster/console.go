package cluster

import (
	"context"
	"io"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/layout"
)

// DefaultConsoleLogMax is the size at which a VMI's console log starts a new file.
const DefaultConsoleLogMax = 4 << 20

// consoleSource is what gives a VMI's serial console (handler.Handler does).
type consoleSource interface {
	Console(ctx context.Context, uid types.UID, in io.Reader, out io.Writer) error
}

// consoleLogs writes each running VMI's serial console into layout.ConsoleLog in its host
// directory, which the launcher pod's guest-console-log container follows.
type consoleLogs struct {
	src   consoleSource
	root  string // host state dir
	max   int64
	retry time.Duration
	log   logr.Logger
	// label, when set, labels a new log file of a VMI with the VMI's SELinux level
	// (handler.Handler.LabelFiles), before guest-console-log sees it.
	label func(uid types.UID, path string, recurse bool) error

	mu      sync.Mutex
	running map[types.UID]context.CancelFunc
	wg      sync.WaitGroup
}

func newConsoleLogs(src consoleSource, root string, log logr.Logger) *consoleLogs {
	return &consoleLogs{src: src, root: root, max: DefaultConsoleLogMax, retry: 2 * time.Second, log: log,
		running: map[types.UID]context.CancelFunc{}}
}

// ensure starts writing the VMI's console log unless it is being written.
func (c *consoleLogs) ensure(ctx context.Context, uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.running[uid]; ok {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	c.running[uid] = cancel
	c.wg.Go(func() { c.follow(ctx, uid) })
}

// stop stops writing the VMI's console log (the file stays for the pod's last logs).
func (c *consoleLogs) stop(uid types.UID) {
	c.mu.Lock()
	cancel := c.running[uid]
	delete(c.running, uid)
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// close stops every writer and waits for them.
func (c *consoleLogs) close() {
	c.mu.Lock()
	for uid, cancel := range c.running {
		cancel()
		delete(c.running, uid)
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// follow attaches to the console until ctx ends, and again after it ends (the VM stopped and
// runs again; a driver restart the handler's Console does not ride out). Each attach starts a
// new file, since the driver replays its backlog to a new console.
func (c *consoleLogs) follow(ctx context.Context, uid types.UID) {
	path := layout.ConsoleLog(c.root, uid)
	for ctx.Err() == nil {
		w := &rotatingFile{path: path, max: c.max}
		if c.label != nil {
			w.label = func(p string) error { return c.label(uid, p, false) }
		}
		err := c.src.Console(ctx, uid, nil, w)
		w.close()
		if ctx.Err() != nil {
			return
		}
		c.log.V(1).Info("console ended; attaching again", "uid", uid, "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(c.retry):
		}
	}
}

// rotatingFile writes to path, starting a new file (by rename, so that a follower notices) on
// its first write and whenever the file would pass max bytes.
type rotatingFile struct {
	path string
	max  int64
	// label, when set, labels each new file before it takes path's name.
	label func(path string) error
	f     *os.File
	n     int64
}

func (r *rotatingFile) Write(p []byte) (int, error) {
	if r.f == nil || r.n+int64(len(p)) > r.max {
		if err := r.rotate(); err != nil {
			return 0, err
		}
	}
	n, err := r.f.Write(p)
	r.n += int64(n)
	return n, err
}

func (r *rotatingFile) rotate() error {
	r.close()
	tmp := r.path + ".new"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if r.label != nil {
		if err := r.label(tmp); err != nil {
			f.Close()
			return err
		}
	}
	if err := os.Rename(tmp, r.path); err != nil {
		f.Close()
		return err
	}
	r.f, r.n = f, 0
	return nil
}

func (r *rotatingFile) close() {
	if r.f != nil {
		r.f.Close()
		r.f = nil
	}
}
