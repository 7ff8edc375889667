package launcher

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	launcherv1 "github.com/kubevisor/kubevisor/core/driver/launcher/v1"
)

// oldLauncher is a launcher from before companions: its Info lists no features, and a Start
// that reaches it is counted.
type oldLauncher struct {
	launcherv1.UnimplementedLauncherServer
	starts int
}

func (*oldLauncher) Info(context.Context, *launcherv1.InfoRequest) (*launcherv1.InfoResponse, error) {
	return &launcherv1.InfoResponse{Pid: 1}, nil
}

func (l *oldLauncher) Start(context.Context, *launcherv1.StartRequest) (*launcherv1.StartResponse, error) {
	l.starts++
	return &launcherv1.StartResponse{Process: &launcherv1.Process{Pid: 2}}, nil
}

// TestCompanionsNeedTheFeature: against a launcher that does not list FEATURE_COMPANIONS, a
// Start with companions fails with FailedPrecondition and never reaches the launcher (which
// would ignore them and start the VM process alone).
func TestCompanionsNeedTheFeature(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, SocketName)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv, old := grpc.NewServer(), &oldLauncher{}
	launcherv1.RegisterLauncherServer(srv, old)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = NewStarter(sock).Start(ctx, &Command{
		Path: "/usr/bin/qemu-system-x86_64", LogPath: filepath.Join(dir, "qemu.log"),
		Companions: []*Companion{{Name: "swtpm", Path: "/usr/bin/swtpm", LogPath: filepath.Join(dir, "swtpm.log")}},
	})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "FEATURE_COMPANIONS") {
		t.Errorf("Start = %v, want FailedPrecondition naming FEATURE_COMPANIONS", err)
	}
	if old.starts != 0 {
		t.Errorf("the old launcher was asked to Start %d times", old.starts)
	}
}

func alive(pid int) bool {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

func waitDead(t *testing.T, pid int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) still runs", what, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLocalStarterCompanions: LocalStarter starts companions before the process, each in a
// session of its own with its files; they are stopped when the process exits, and killed when
// it cannot be started.
func TestLocalStarterCompanions(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "companion.pid")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	pid, err := LocalStarter{}.Start(context.Background(), &Command{
		// The process outlives the checks below (a loaded machine may take a while to run
		// them): its end ends the companion. It waits for the companion's pid file first: the
		// companion is started before it, not necessarily run that far (on a loaded machine
		// the process ran first, exited, and its end killed the companion before it wrote).
		Path: "/bin/sh", Args: []string{"-c", "i=0; while ! test -s " + pidFile + " && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; test -s " + pidFile + " && sleep 3"},
		LogPath: filepath.Join(dir, "vm.log"),
		Companions: []*Companion{{Name: "helper", Path: "/bin/sh", LogPath: filepath.Join(dir, "helper.log"), ExtraFiles: []*os.File{w},
			Args: []string{"-c", "echo $$ >" + pidFile + "; echo ok >&3; exec 3>&-; exec sleep 60"}}},
	})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if n, _ := r.Read(buf); string(buf[:n]) != "ok\n" {
		t.Errorf("companion's fd 3 said %q", buf[:n])
	}
	raw, _ := os.ReadFile(pidFile)
	comp, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatalf("companion pid file %q: %v", raw, err)
	}
	if sid, _ := unix.Getsid(comp); sid != comp {
		t.Errorf("companion's session %d, want its own (%d)", sid, comp)
	}
	waitDead(t, pid, "the process")
	waitDead(t, comp, "the companion after its process exited")

	// The process cannot start: the companion started before it is killed.
	_ = os.Remove(pidFile)
	_, err = LocalStarter{}.Start(context.Background(), &Command{
		Path: "/nonexistent/qemu", LogPath: filepath.Join(dir, "vm.log"),
		Companions: []*Companion{{Name: "helper", Path: "/bin/sh", LogPath: filepath.Join(dir, "helper.log"),
			Args: []string{"-c", "echo $$ >" + pidFile + "; exec sleep 60"}}},
	})
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Start of a missing binary = %v", err)
	}
	if raw, err := os.ReadFile(pidFile); err == nil {
		if comp, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil {
			waitDead(t, comp, "the companion of a failed start")
		}
	}
}
