package launcher_test

import (
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lclient "github.com/kubevisor/kubevisor/core/driver/launcher"
	launcherv1 "github.com/kubevisor/kubevisor/core/driver/launcher/v1"
	"github.com/kubevisor/kubevisor/core/launcher"
)

// A driver SIGKILLed after the launcher started its VM process, before it recorded it, leaves
// a process no later driver process knows: a SocketStarter with KillLeftover kills it and
// starts the new one, where a plain one is refused for good.
func TestSocketStarterKillsLeftover(t *testing.T) {
	t.Parallel()
	in, c := start(t, options{})
	ctx := ctxT(t)
	logPath := filepath.Join(in.dir, "vm.log")
	old, err := c.Start(ctx, &lclient.StartOptions{Argv: []string{"sleep", "60"}, LogPath: logPath, Name: "qemu"})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(in.dir, launcher.SocketName)
	cmd := &lclient.Command{Path: "sleep", Args: []string{"61"}, LogPath: logPath}

	if _, err := lclient.NewStarter(sock).Start(ctx, cmd); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "one process at a time") {
		t.Fatalf("start beside the leftover without KillLeftover: %v, want FailedPrecondition", err)
	}

	var told []*launcherv1.Process
	s := &lclient.SocketStarter{Socket: sock, KillLeftover: true, Leftover: func(p *launcherv1.Process) { told = append(told, p) }}
	pid, err := s.Start(ctx, cmd)
	if err != nil {
		t.Fatalf("start with KillLeftover: %v\n%s", err, in.logs())
	}
	if len(told) != 1 || told[0].GetPid() != old.Process.GetPid() || told[0].GetName() != "qemu" {
		t.Errorf("Leftover told %v, want the first process (pid %d, qemu)", told, old.Process.GetPid())
	}
	exit, err := c.Wait(ctx, int(old.Process.GetPid()))
	if err != nil || exit.GetDescription() != "signal: killed" {
		t.Errorf("the leftover: %v %v, want signal: killed", exit, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := info.GetProcess(); !p.GetRunning() || c.LocalPid(p.GetProcess()) != pid {
		t.Errorf("the launcher runs %v, want the new process (pid %d)", p, pid)
	}

	// Nothing running: KillLeftover kills nothing.
	if err := c.Signal(ctx, int(info.GetProcess().GetProcess().GetPid()), 9); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, int(info.GetProcess().GetProcess().GetPid())); err != nil {
		t.Fatal(err)
	}
	told = nil
	if _, err := s.Start(ctx, cmd); err != nil {
		t.Fatalf("start with KillLeftover and nothing running: %v", err)
	}
	if len(told) != 0 {
		t.Errorf("Leftover told %v with nothing running", told)
	}
}
