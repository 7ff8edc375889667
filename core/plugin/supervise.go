package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/backoff"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
)

const (
	// exitGrace is how long a failed call waits for the plugin's exit to be noticed, so that
	// its error can say why the plugin died.
	exitGrace = 500 * time.Millisecond
	// readyGrace is that wait when the connection still looks healthy: a process that died
	// is seen within milliseconds, and a driver's own Unavailable should not wait long.
	readyGrace = 100 * time.Millisecond
	// drainTimeout bounds the wait for go-plugin to collect an exited plugin and read the rest
	// of its stderr (a grandchild that inherited the pipe would hold it open for ever).
	drainTimeout = 2 * time.Second
	// gracePeriod is how long a plugin asked to exit gets before it is killed.
	gracePeriod = 2 * time.Second
	// killTimeout bounds the wait for a killed plugin to be gone.
	killTimeout = 5 * time.Second
)

// managed is one driver under supervision: the manifest, the current plugin process, and what
// Status reports.
type managed struct {
	h    *Host
	m    Manifest
	kind basev1.Kind
	log  hclog.Logger

	ctx    context.Context // cancelled by Stop, Close and Detach: supervision ends
	cancel context.CancelFunc
	done   chan struct{} // closed when supervision has ended

	cur atomic.Pointer[instance] // the process serving calls; nil while none does

	clientOnce sync.Once
	drv        driver.Driver

	// configuring serialises configuring a process: a start's (ready) and Reconfigure.
	configuring sync.Mutex

	mu sync.Mutex
	// config is the driver's configuration: the manifest's, until a Reconfigure the driver
	// accepted replaces it. Every process started from then on is configured with it.
	config   json.RawMessage
	restarts int
	down     string // why no process serves calls; "" while one does
	lastErr  string // the last failure, kept after a restart
}

// instance is one plugin process, launched or reattached.
type instance struct {
	client     *plugin.Client
	rpc        *plugin.GRPCClient
	cmd        *exec.Cmd // nil when reattached
	proc       *proc     // nil when the process was gone before it could be opened
	pid        int
	version    int // the protocol version negotiated (or recorded, when reattached)
	reattached bool
	stderr     *tail
	started    time.Time
	rec        *record // its reattach record, once written

	exited chan struct{} // closed by watch once the process is gone
	cause  string        // why it exited; set before exited is closed
}

func (mp *managed) client() driver.Driver {
	mp.clientOnce.Do(func() {
		mp.drv, _ = driver.NewClient(mp.kind, &conn{h: mp.h, name: mp.m.Name}) // kind was validated
	})
	return mp.drv
}

func (mp *managed) status() PluginStatus {
	inst := mp.cur.Load()
	mp.mu.Lock()
	defer mp.mu.Unlock()
	st := PluginStatus{Name: mp.m.Name, Kind: mp.m.Kind, Restarts: mp.restarts, LastError: mp.lastErr}
	if inst != nil && !inst.hasExited() {
		st.Running, st.Pid, st.Reattached = true, inst.pid, inst.reattached
	}
	return st
}

// configuration is the driver's current configuration (managed.config).
func (mp *managed) configuration() json.RawMessage {
	mp.mu.Lock()
	defer mp.mu.Unlock()
	return mp.config
}

func (mp *managed) downReason() string {
	mp.mu.Lock()
	defer mp.mu.Unlock()
	if mp.down == "" {
		return "restarting"
	}
	return mp.down
}

func (mp *managed) setDown(why string, failure bool) {
	mp.mu.Lock()
	defer mp.mu.Unlock()
	mp.down = why
	if failure {
		mp.lastErr = why
	}
}

func (mp *managed) setRunning(inst *instance) {
	mp.mu.Lock()
	mp.down = ""
	mp.mu.Unlock()
	mp.cur.Store(inst)
}

// watch waits for the process to exit, works out why, and closes inst.exited.
func (inst *instance) watch() {
	if inst.proc != nil {
		inst.proc.wait()
	}
	exit := ""
	switch {
	case inst.cmd != nil:
		// go-plugin reaps its child and reads the rest of its stderr: wait for that.
		if waitUntil(drainTimeout, inst.client.Exited) && inst.cmd.ProcessState != nil {
			exit = inst.cmd.ProcessState.String()
		}
	case inst.proc != nil:
		exit, _ = inst.proc.reap()
	}
	if inst.proc != nil {
		inst.proc.close()
	}
	cause := "exited"
	if exit != "" {
		cause += " (" + exit + ")"
	}
	if s := inst.stderr.Summary(); s != "" {
		cause += ": " + s
	} else if inst.reattached {
		cause += "; it was reattached, so its stderr went to the host that started it"
	}
	inst.cause = cause
	close(inst.exited)
}

func (inst *instance) hasExited() bool {
	select {
	case <-inst.exited:
		return true
	default:
		return false
	}
}

// explain replaces a call's error by the process's exit cause when the call failed because the
// process died.
func (inst *instance) explain(err error) error {
	if c := status.Code(err); c != codes.Unavailable && c != codes.Canceled && c != codes.DeadlineExceeded && c != codes.Internal {
		return err
	}
	select {
	case <-inst.exited:
		return errors.New(inst.cause)
	case <-time.After(exitGrace):
		return err
	}
}

// kill stops a process: it asks the plugin to exit, then kills it after gracePeriod.
func (mp *managed) kill(inst *instance) {
	if inst.cmd != nil {
		done := make(chan struct{})
		go func() { inst.client.Kill(); close(done) }() // asks, waits 2s, kills, collects
		select {
		case <-done:
		case <-time.After(gracePeriod + killTimeout):
			mp.log.Warn("plugin did not stop: killing it", "pid", inst.pid)
			inst.killNow()
		}
	} else {
		// go-plugin's Kill of a reattached process waits for its 1s pid polling, and cannot
		// tell a zombie from a live process: do it here, on the pidfd.
		go func() { _ = inst.rpc.Close() }()
		select {
		case <-inst.exited:
		case <-time.After(gracePeriod):
			mp.log.Warn("plugin did not exit when asked: killing it", "pid", inst.pid)
			inst.killNow()
		}
	}
	select {
	case <-inst.exited:
	case <-time.After(killTimeout):
		mp.log.Error("plugin process is still there after SIGKILL", "pid", inst.pid)
	}
}

func (inst *instance) killNow() {
	if inst.proc != nil {
		_ = inst.proc.kill()
	}
}

// supervise restarts the plugin each time its process exits, until ctx is cancelled.
func (mp *managed) supervise(inst *instance) {
	defer close(mp.done)
	b := backoff.NewRetry(backoff.Exponential{Initial: mp.h.cfg.MinBackoff, Max: mp.h.cfg.MaxBackoff})
	for {
		select {
		case <-inst.exited:
		case <-mp.ctx.Done():
			return
		}
		if mp.ctx.Err() != nil {
			return // Stop, Close or Detach: not a crash
		}
		uptime := time.Since(inst.started)
		mp.cur.CompareAndSwap(inst, nil)
		mp.setDown(inst.cause, true)
		if inst.rec != nil {
			mp.h.removeRecord(mp.m.Name, inst.rec)
		}
		delay := restartDelay(b, uptime)
		mp.log.Error("plugin exited unexpectedly", "pid", inst.pid, "cause", inst.cause, "uptime", uptime.Round(time.Millisecond),
			"restart_in", delay, "stderr", strings.Join(inst.stderr.Lines(), "\n"))
		dead := inst
		for {
			select {
			case <-time.After(delay):
			case <-mp.ctx.Done():
				if dead != nil {
					mp.kill(dead)
				}
				return
			}
			if dead != nil {
				// Only now release go-plugin's side of the dead process (its connection):
				// calls in flight have seen the connection break rather than be closed.
				mp.kill(dead)
				dead = nil
			}
			mp.mu.Lock()
			mp.restarts++
			mp.mu.Unlock()
			next, err := mp.launch(mp.ctx)
			if err == nil {
				inst = next
				break
			}
			if mp.ctx.Err() != nil {
				return
			}
			mp.setDown(err.Error(), true)
			delay = b.Next()
			mp.log.Error("plugin restart failed", "error", err, "restart_in", delay)
		}
		mp.setRunning(inst)
		mp.log.Info("plugin restarted", "pid", inst.pid, "restarts", mp.status().Restarts)
	}
}

// shutdown ends supervision, kills the process and removes the reattach record.
func (mp *managed) shutdown() {
	mp.cancel()
	<-mp.done
	inst := mp.cur.Swap(nil)
	mp.setDown("stopped", false)
	if inst != nil {
		mp.kill(inst)
	}
	rec, _ := mp.h.readRecord(mp.m.Name)
	mp.h.removeRecord(mp.m.Name, rec)
}

// detach ends supervision and disconnects, leaving the process and its record.
func (mp *managed) detach() {
	mp.cancel()
	<-mp.done
	inst := mp.cur.Swap(nil)
	mp.setDown("host detached", false)
	if inst != nil {
		_ = inst.rpc.Conn.Close() // not rpc.Close, which would ask the plugin to exit
		mp.log.Info("detached from plugin", "pid", inst.pid)
	}
}

// restartDelay is the wait before restarting a plugin whose process ran for uptime: the retry's
// next delay, starting over when the process stayed up backoffReset (a new crash, not a loop).
func restartDelay(b *backoff.Retry, uptime time.Duration) time.Duration {
	if uptime >= backoffReset {
		b.Reset()
	}
	return b.Next()
}

// waitUntil polls cond until it holds or d has passed, and reports whether it held.
func waitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// lineLogger logs what a plugin writes to its os.Stdout or os.Stderr after Serve, line by line.
type lineLogger struct {
	log    hclog.Logger
	stream string

	mu  sync.Mutex
	buf []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		if line := strings.TrimRight(string(l.buf[:i]), "\r"); line != "" {
			l.log.Info(line, "stream", l.stream)
		}
		l.buf = l.buf[i+1:]
	}
	if len(l.buf) > 64<<10 { // a very long line: log what there is
		l.log.Info(string(l.buf), "stream", l.stream)
		l.buf = nil
	}
	return len(p), nil
}
