package launcher_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	lclient "github.com/kubevisor/kubevisor/core/driver/launcher"
	"github.com/kubevisor/kubevisor/core/launcher"
	"github.com/kubevisor/kubevisor/internal/testbin"
)

// launcherBin is cmd/kubevisor-launcher, built once by TestMain (with -race when the tests run
// with it).
var launcherBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kubevisor-launcher-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	launcherBin = filepath.Join(dir, "kubevisor-launcher")
	if err := testbin.Build(dir, raceEnabled, "github.com/kubevisor/kubevisor/cmd/kubevisor-launcher"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// instance is a kubevisor-launcher process of a test.
type instance struct {
	t      *testing.T
	dir    string
	cmd    *exec.Cmd
	stderr string // file
	exited chan struct{}
	code   int // exit code, once exited is closed
}

type options struct {
	dir   string   // default: a new directory the launcher creates
	flags []string // more flags
	wrap  []string // a command to run the launcher under ("unshare", "-n", "--")
}

// run starts a launcher without waiting for it to serve.
func run(t *testing.T, o options) *instance {
	t.Helper()
	if o.dir == "" {
		o.dir = filepath.Join(t.TempDir(), "vmi")
	}
	argv := append(append([]string{}, o.wrap...), launcherBin, "--dir", o.dir, "--vmi", t.Name())
	argv = append(argv, o.flags...)
	cmd := exec.Command(argv[0], argv[1:]...)
	// A file, not a pipe: Wait would wait for a pipe's other holders, a launcher's children.
	stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	in := &instance{t: t, dir: o.dir, cmd: cmd, stderr: stderr.Name(), exited: make(chan struct{})}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = cmd.Wait()
		in.code = cmd.ProcessState.ExitCode()
		close(in.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-in.exited:
		default:
			_ = cmd.Process.Kill()
			<-in.exited
		}
		if t.Failed() {
			t.Logf("launcher stderr:\n%s", in.logs())
		}
	})
	return in
}

// start starts a launcher and connects to it.
func start(t *testing.T, o options) (*instance, *lclient.Client) {
	t.Helper()
	in := run(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := lclient.Dial(ctx, filepath.Join(in.dir, launcher.SocketName))
	if err != nil {
		t.Fatalf("dial: %v\n%s", err, in.logs())
	}
	t.Cleanup(func() { _ = c.Close() })
	return in, c
}

// wait waits for the launcher to exit and returns its exit code.
func (in *instance) wait(timeout time.Duration) int {
	in.t.Helper()
	select {
	case <-in.exited:
		return in.code
	case <-time.After(timeout):
		in.t.Fatalf("launcher still running after %s\n%s", timeout, in.logs())
		return -1
	}
}

// logs is what the launcher wrote to stderr.
func (in *instance) logs() string {
	raw, _ := os.ReadFile(in.stderr)
	return string(raw)
}

func (in *instance) status() *launcher.Status {
	in.t.Helper()
	st, err := launcher.ReadStatus(in.dir)
	if err != nil {
		in.t.Fatal(err)
	}
	return st
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// procStat returns fields of /proc/PID/stat after the command name: [0] is field 3.
func procStat(t *testing.T, pid int) []string {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
}

func nsLink(t *testing.T, pid any, kind string) string {
	t.Helper()
	l, err := os.Readlink(fmt.Sprintf("/proc/%v/ns/%s", pid, kind))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// waitGone waits until pid has exited (it may stay a zombie of another parent).
func waitGone(t *testing.T, pidfd int, timeout time.Duration) bool {
	t.Helper()
	n, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, int(timeout/time.Millisecond))
	return err == nil && n > 0
}

func pidfdOpen(t *testing.T, pid int) int {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	return fd
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
