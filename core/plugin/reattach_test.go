package plugin

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// TestReattachAfterHostEnds runs a host in a process of its own, which starts a plugin, creates
// a VM on it and then detaches and exits, or is killed with SIGKILL. A new host on the same
// state directory reattaches to the same plugin process, which still has the VM; a crash of the
// reattached process is supervised like any other.
func TestReattachAfterHostEnds(t *testing.T) {
	for _, mode := range []string{"detach", "sigkill"} {
		t.Run(mode, func(t *testing.T) {
			dir := stateDir(t)
			m := testManifest(t, "alpha")
			marker := markerOf(t, "alpha")
			helperMode := mode
			if mode == "sigkill" {
				helperMode = "wait"
			}
			helper, pid, helperLog := helperHost(t, helperMode, dir, m)
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // if the test fails early
			if mode == "sigkill" {
				if err := helper.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			if err := helper.Wait(); err != nil && mode == "detach" {
				t.Fatalf("helper host: %v\n%s", err, helperLog)
			}
			if !pidAlive(pid) {
				t.Fatalf("the plugin died with its host\n%s", helperLog)
			}

			h := newTestHost(t, HostConfig{StateDir: dir})
			h.start(t, m)
			st := h.Status("alpha")
			if !st.Running || !st.Reattached || st.Pid != pid {
				t.Fatalf("status = %+v, want reattached to pid %d", st, pid)
			}
			hv := h.hv(t, "alpha")
			ctx := context.Background()
			vm, err := hv.Status(ctx, "vm-1")
			if err != nil || vm.GetState() != hypervisorv1.State_STATE_CREATED {
				t.Fatalf("the VM created through the first host: %v, %v", vm, err)
			}
			if n := countProcs(t, marker); n != 1 {
				t.Errorf("%d plugin processes, want 1", n)
			}
			// Reattaching configures the plugin again, as a start does.
			if got := fingerprint(t, hv)["configures"]; got != "2" {
				t.Errorf("configured %s times, want 2", got)
			}

			// The reattached process is supervised: killed, it is started anew.
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, func() error {
				if st := h.Status("alpha"); !st.Running || st.Pid == pid {
					return fmt.Errorf("status %+v", st)
				}
				return nil
			})
			st = h.Status("alpha")
			// This test process is a child subreaper: it adopted the orphaned plugin, so the host
			// reaps it and knows how it ended.
			if st.Reattached || st.Restarts != 1 || !strings.Contains(st.LastError, "exited (signal: killed); it was reattached") {
				t.Errorf("status after the crash = %+v", st)
			}
			if _, err := hv.Status(ctx, "vm-1"); err == nil {
				t.Error("a new plugin process still has the VM")
			}
			if n := countProcs(t, marker); n != 1 {
				t.Errorf("%d plugin processes after the restart, want 1", n)
			}
			if err := h.Close(); err != nil {
				t.Fatal(err)
			}
			if n := countProcs(t, marker); n != 0 {
				t.Errorf("%d plugin processes after Close", n)
			}
		})
	}
}

// TestDetachAndReattach does the same within one process, and checks that a reattached plugin
// stops cleanly.
func TestDetachAndReattach(t *testing.T) {
	dir := stateDir(t)
	m := testManifest(t, "alpha")
	h1 := newTestHost(t, HostConfig{StateDir: dir})
	h1.start(t, m)
	pid := h1.Status("alpha").Pid
	ctx := context.Background()
	if _, err := h1.hv(t, "alpha").Create(ctx, &domainv1.DomainSpec{Id: "vm-1"}); err != nil {
		t.Fatal(err)
	}
	if err := h1.Detach(); err != nil {
		t.Fatal(err)
	}
	if !pidAlive(pid) {
		t.Fatal("Detach killed the plugin")
	}
	if _, err := os.Stat(h1.recordPath("alpha")); err != nil {
		t.Fatalf("record after Detach: %v", err)
	}

	h2 := newTestHost(t, HostConfig{StateDir: dir})
	h2.start(t, m)
	if st := h2.Status("alpha"); !st.Reattached || st.Pid != pid {
		t.Fatalf("status = %+v", st)
	}
	if _, err := h2.hv(t, "alpha").Status(ctx, "vm-1"); err != nil {
		t.Fatal(err)
	}
	rec := mustRecord(t, h2, "alpha")
	start := time.Now()
	if err := h2.Stop("alpha"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("stopping a reattached plugin took %s", d)
	}
	if pidAlive(pid) {
		t.Error("the plugin runs after Stop")
	}
	if _, err := os.Stat(rec.Addr); !os.IsNotExist(err) {
		t.Errorf("socket after Stop: %v", err)
	}
}

// TestReattachRefusesOtherProcess: a record whose pid now names another process is not
// reattached to, and that process is left alone.
func TestReattachRefusesOtherProcess(t *testing.T) {
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })

	h := newTestHost(t, HostConfig{})
	m := testManifest(t, "alpha")
	_, start, err := procStat(sleeper.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range []record{
		{Name: "alpha", SHA256: m.SHA256, Protocol: "grpc", ProtocolVersion: 1, Network: "unix", Addr: filepath.Join(h.dir, "sockets", "plugin1"), Pid: sleeper.Process.Pid, StartTime: start + 1, BootID: bootID()},
		{Name: "alpha", SHA256: m.SHA256, Protocol: "grpc", ProtocolVersion: 1, Network: "unix", Addr: filepath.Join(h.dir, "sockets", "plugin1"), Pid: sleeper.Process.Pid, StartTime: start, BootID: "another-boot"},
	} {
		if err := h.writeRecord(&rec); err != nil {
			t.Fatal(err)
		}
		h.start(t, m)
		if st := h.Status("alpha"); !st.Running || st.Reattached || st.Pid == sleeper.Process.Pid {
			t.Errorf("status = %+v", st)
		}
		if !pidAlive(sleeper.Process.Pid) {
			t.Fatal("the host killed a process that is not its plugin")
		}
		if err := h.Stop("alpha"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReattachReplacesChangedPlugin: when the manifest names another binary, or other args,
// the process the previous host started (provably its plugin) is killed and a new one launched.
func TestReattachReplacesChangedPlugin(t *testing.T) {
	for _, change := range []string{"binary", "args"} {
		t.Run(change, func(t *testing.T) {
			dir := stateDir(t)
			old := testManifest(t, "alpha")
			h1 := newTestHost(t, HostConfig{StateDir: dir})
			h1.start(t, old)
			oldPid := h1.Status("alpha").Pid
			if err := h1.Detach(); err != nil {
				t.Fatal(err)
			}

			m := old
			m.Args = append([]string(nil), old.Args...)
			switch change {
			case "binary": // the same driver with a trailing byte: another digest, same behaviour
				newBin := filepath.Join(t.TempDir(), "testdriver-v2")
				copyFile(t, testdriverBin, newBin)
				f, err := os.OpenFile(newBin, os.O_APPEND|os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				f.Write([]byte{0})
				f.Close()
				nm, err := ManifestFor(newBin, "hypervisor", "alpha")
				if err != nil {
					t.Fatal(err)
				}
				m.Binary, m.SHA256 = nm.Binary, nm.SHA256
			case "args":
				m.Args = append(m.Args, "slow-start=1ms")
			}

			h2 := newTestHost(t, HostConfig{StateDir: dir})
			h2.start(t, m)
			st := h2.Status("alpha")
			if st.Reattached || st.Pid == oldPid {
				t.Errorf("status = %+v, old pid %d", st, oldPid)
			}
			eventually(t, 5*time.Second, func() error {
				if pidAlive(oldPid) {
					return fmt.Errorf("the old process %d still runs", oldPid)
				}
				return nil
			})
			rec := mustRecord(t, h2, "alpha")
			if rec.SHA256 != m.SHA256 || rec.Pid != st.Pid || !slices.Equal(rec.Args, m.Args) {
				t.Errorf("record = %+v", rec)
			}
			if !strings.Contains(h2.log.String(), "killing the plugin process left by the previous host") {
				t.Error("the kill is not logged")
			}
		})
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
