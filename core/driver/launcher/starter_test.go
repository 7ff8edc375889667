package launcher

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
)

func TestFor(t *testing.T) {
	if s, ok := For(&domainv1.Sandbox{LauncherSocket: "/run/x/launcher.sock"}).(*SocketStarter); !ok || s.Socket != "/run/x/launcher.sock" {
		t.Errorf("For a sandbox with a launcher socket = %#v, want a SocketStarter on it", s)
	}
	for _, sb := range []*domainv1.Sandbox{nil, {NetnsPath: "/proc/1/ns/net"}} {
		if _, ok := For(sb).(LocalStarter); !ok {
			t.Errorf("For(%v) is not LocalStarter", sb)
		}
	}
}

// TestLocalStarter: the process runs the binary itself, in a session of its own, with the environment given, its output
// appended to the log and stdin /dev/null.
func TestLocalStarter(t *testing.T) {
	log := filepath.Join(t.TempDir(), "vm.log")
	if err := os.WriteFile(log, []byte("before\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pid, err := LocalStarter{}.Start(context.Background(), &Command{
		Path: "/bin/sh", Args: []string{"-c", "echo out; echo err >&2; echo env=$KV_TEST; read x || echo eof; exec sleep 60"}, LogPath: log,
		Env: []string{"KV_TEST=given"},
	})
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); _ = unix.Close(fd) })
	if sid, err := unix.Getsid(pid); err != nil || sid != pid {
		t.Errorf("session of the process = %d, %v; want its own (%d)", sid, err, pid)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		raw, _ := os.ReadFile(log)
		if got := string(raw); strings.Contains(got, "eof") {
			if !strings.HasPrefix(got, "before\n") || !strings.Contains(got, "out\n") || !strings.Contains(got, "err\n") || !strings.Contains(got, "env=given\n") {
				t.Errorf("log = %q, want it appended with stdout and stderr, the environment given", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log = %q, want the process's output", raw)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
