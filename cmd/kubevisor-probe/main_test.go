package main

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubevisor/kubevisor/core/handler/cluster/guestprobe"
	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/internal/testbin"
)

// TestBinary runs the real, static binary against a guest probe socket: ping and exec reach the
// server with the handler's share of --timeout; success exits 0; a failure exits 1 after the
// guest command's output and one line of reason on stderr; no server, or one that does not answer
// within --timeout, exits 1 saying so; bad arguments exit 2.
func TestBinary(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "kvp-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// As hack/images builds it for the launcher image: without cgo, so static.
	bin := filepath.Join(dir, "bin", layout.GuestProbeCommand)
	build := exec.Command(testbin.GoTool(), "build", "-o", bin, "github.com/kubevisor/kubevisor/cmd/kubevisor-probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has an ELF interpreter: it is dynamically linked")
		}
	}
	f.Close()

	socket := filepath.Join(dir, "guest-probe", "probe.sock")
	// The handler runs in the server's goroutines; the test reads the last request after the
	// command exited, which the race detector cannot see as ordered: hence the lock.
	var (
		mu      sync.Mutex
		lastReq guestprobe.Request
	)
	last := func() guestprobe.Request {
		mu.Lock()
		defer mu.Unlock()
		return lastReq
	}
	s, err := guestprobe.Listen(socket, -1, -1, func(ctx context.Context, req guestprobe.Request) guestprobe.Result {
		mu.Lock()
		lastReq = req
		mu.Unlock()
		switch {
		case req.Ping:
			return guestprobe.Result{Success: true}
		case req.Command[0] == "hang":
			time.Sleep(3 * time.Second)
			return guestprobe.Result{Success: true}
		case req.Command[0] == "ok":
			return guestprobe.Result{Success: true, Stdout: []byte("fine\n")}
		}
		return guestprobe.Result{Reason: `command ["false"] in the guest exited with status 1`, Stdout: []byte("out\n"), Stderr: []byte("err\n")}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })

	run := func(args ...string) (int, string, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0, stdout.String(), stderr.String()
		case errors.As(err, &ee):
			return ee.ExitCode(), stdout.String(), stderr.String()
		}
		t.Fatal(err)
		return 0, "", ""
	}
	if code, _, stderr := run("--socket", socket, "--timeout", "2s", "ping"); code != 0 || !last().Ping || last().TimeoutMillis != 1600 {
		t.Errorf("ping: exit %d (%s), request %+v; want 0 and a ping with 1.6s for the handler", code, stderr, last())
	}
	if code, stdout, _ := run("--socket", socket, "exec", "--", "ok", "-x"); code != 0 || stdout != "fine\n" || strings.Join(last().Command, " ") != "ok -x" || last().TimeoutMillis != 800 {
		t.Errorf("exec ok: exit %d, stdout %q, request %+v", code, stdout, last())
	}
	code, stdout, stderr := run("--socket", socket, "--timeout", "10s", "exec", "false")
	if code != 1 || stdout != "out\n" || stderr != "err\nkubevisor-probe: command [\"false\"] in the guest exited with status 1\n" || last().TimeoutMillis != 9000 {
		t.Errorf("exec false: exit %d, stdout %q, stderr %q, request %+v", code, stdout, stderr, last())
	}
	begin := time.Now()
	if code, _, stderr := run("--socket", socket, "--timeout", "500ms", "exec", "hang"); code != 1 || !strings.Contains(stderr, "did not answer in time") || time.Since(begin) > 2*time.Second {
		t.Errorf("a handler slower than --timeout: exit %d after %s, stderr %q", code, time.Since(begin), stderr)
	}
	if code, _, stderr := run("--socket", filepath.Join(dir, "none.sock"), "ping"); code != 1 || !strings.HasPrefix(stderr, "kubevisor-probe: cannot reach the node handler") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("no server: exit %d, stderr %q", code, stderr)
	}
	for _, args := range [][]string{{"ping"}, {"--socket", socket}, {"--socket", socket, "exec"}, {"--socket", socket, "exec", "--"}, {"--socket", socket, "reboot"}} {
		if code, _, _ := run(args...); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
}
