package libvirt

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/drivers/qmp"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// requireLibvirt needs QEMU and libvirtd (Debian's libvirt-daemon-driver-qemu, make deps).
func requireLibvirt(t *testing.T) {
	t.Helper()
	testenv.Command(t, "qemu-system-x86_64", "qemu-system-x86")
	testenv.Command(t, "libvirtd", "libvirt-daemon")
	if os.Geteuid() != 0 {
		testenv.Missing(t, "the driver's daemons are started as another user: run as root")
	}
}

func testLogger() hclog.Logger {
	if os.Getenv("KUBEVISOR_TEST_LOG") == "" {
		return hclog.NewNullLogger()
	}
	return hclog.New(&hclog.LoggerOptions{Name: "libvirt", Level: hclog.Debug, Output: os.Stderr})
}

// reachableDir is a temporary directory for a VM's files: t.TempDir and its parent are root's
// 0700, and the driver gives the VM's user, who runs QEMU, its way to them (access.go).
func reachableDir(t *testing.T) string {
	t.Helper()
	return t.TempDir()
}

// bootDisk writes the qmp driver's echo boot sector (ACPI-aware: Shutdown is graceful) as a
// read-only raw disk readable by all.
func bootDisk(t *testing.T, dir string) string {
	t.Helper()
	img := filepath.Join(dir, "boot.img")
	if err := qmp.WriteBootDisk(img, qmp.EchoBootSector(true)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(img, 0o644); err != nil {
		t.Fatal(err)
	}
	return img
}

func newTestDriver(t *testing.T) *Driver {
	t.Helper()
	d := New(WithLogger(testLogger()))
	if err := d.Configure(context.Background(), &basev1.ConfigureRequest{StateDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killAll(d) })
	return d
}

// killAll destroys every domain and daemon the driver runs.
func killAll(d *Driver) {
	d.mu.Lock()
	ids := make([]string, 0, len(d.vms))
	for id := range d.vms {
		ids = append(ids, id)
	}
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, id := range ids {
		_ = d.Kill(ctx, id)
		_ = d.Delete(ctx, id)
	}
}

// consoleBuf collects a console's output.
type consoleBuf struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (c *consoleBuf) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.Write(p)
}

func (c *consoleBuf) count(s string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Count(c.buf.String(), s)
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLifecycle boots the echo boot sector under a per-VM libvirtd: console, pause and resume,
// reset, graceful shutdown, start again, kill, delete; the daemon runs as the driver's user and
// is gone after Delete.
func TestLifecycle(t *testing.T) {
	requireLibvirt(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := newTestDriver(t)
	dir := reachableDir(t)
	spec := &domainv1.DomainSpec{
		Id: "lv-life", Name: "test/lv-life", Memory: &domainv1.Memory{GuestBytes: 64 << 20},
		Disks:  []*domainv1.Disk{{Name: "boot", Path: bootDisk(t, dir), ReadOnly: true, BootOrder: 1}},
		RunDir: filepath.Join(dir, "run"),
		Serial: &domainv1.Serial{SocketPath: filepath.Join(dir, "run", "serial.sock")},
	}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []string
	go func() {
		_ = d.Events(ctx, "lv-life", func(e *hypervisorv1.Event) error {
			mu.Lock()
			events = append(events, strings.TrimPrefix(e.GetType().String(), "EVENT_TYPE_")+"/"+e.GetReason())
			mu.Unlock()
			return nil
		})
	}()
	if err := d.Start(ctx, "lv-life"); err != nil {
		t.Fatal(err)
	}
	out := &consoleBuf{}
	go func() { _ = d.Console(ctx, "lv-life", nil, out) }()
	waitFor(t, "the boot sector's marker", time.Minute, func() bool { return out.count(qmp.BootSectorMarker) >= 1 })

	st, _ := d.Status(ctx, "lv-life")
	if st.GetState() != hypervisorv1.State_STATE_RUNNING || st.GetBoots() != 1 || st.GetPid() == 0 {
		t.Fatalf("status after start = %v, want RUNNING, boots 1, QEMU's pid", st)
	}
	if u := procUser(t, int(st.GetPid())); u != "65534" {
		t.Errorf("QEMU runs as uid %s, want the driver's user nobody (65534)", u)
	}
	if err := d.Pause(ctx, "lv-life"); err != nil {
		t.Fatal(err)
	}
	if err := d.Resume(ctx, "lv-life"); err != nil {
		t.Fatal(err)
	}
	if err := d.Reboot(ctx, "lv-life"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the marker again after the reset", time.Minute, func() bool { return out.count(qmp.BootSectorMarker) >= 2 })
	if st, _ := d.Status(ctx, "lv-life"); st.GetBoots() != 2 {
		t.Fatalf("boots after reset = %d, want 2", st.GetBoots())
	}
	graceful, err := d.Shutdown(ctx, "lv-life", 30*time.Second)
	if err != nil || !graceful {
		t.Fatalf("Shutdown = %v, %v; want graceful", graceful, err)
	}
	if err := d.Start(ctx, "lv-life"); err != nil {
		t.Fatal(err)
	}
	if err := d.Kill(ctx, "lv-life"); err != nil {
		t.Fatal(err)
	}
	daemonPID := daemonPIDOf(d, "lv-life")
	if err := d.Delete(ctx, "lv-life"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/proc", itoa(daemonPID))); err == nil && isDaemonOf(daemonPID, newDaemon(filepath.Join(dir, "run"), vmUser{}, "")) {
		t.Errorf("libvirtd %d still runs after Delete", daemonPID)
	}
	mu.Lock()
	got := strings.Join(events, " ")
	mu.Unlock()
	want := "STARTED/Started PAUSED/Paused RESUMED/Resumed RESET/HostReset POWERDOWN_REQUESTED/PowerdownRequested"
	// SHUTDOWN before STOPPED is the contract's MAY (libvirt reports one for a destroy too).
	got = strings.ReplaceAll(got, "SHUTDOWN/GuestShutdown STOPPED/GuestShutdown", "STOPPED/GuestShutdown")
	got = strings.ReplaceAll(got, "SHUTDOWN/Killed STOPPED/Killed", "STOPPED/Killed")
	if !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "STOPPED/GuestShutdown STARTED/Started STOPPED/Killed") {
		t.Errorf("events = %s\nwant %s STOPPED/GuestShutdown STARTED/Started STOPPED/Killed", got, want)
	}
}

func procUser(t *testing.T, pid int) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("/proc", itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
			return f[1]
		}
	}
	return ""
}

// TestLongRunDir boots a VM whose run dir has the longest length the driver takes, and refuses
// one a byte longer by its field: the daemon's QEMU monitor socket below the run dir must fit
// in a unix socket path.
func TestLongRunDir(t *testing.T) {
	requireLibvirt(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := newTestDriver(t)
	dir := reachableDir(t)
	runDir := func(n int) string {
		base := filepath.Join(dir, "r")
		return base + strings.Repeat("x", n-len(base))
	}
	spec := &domainv1.DomainSpec{
		Id: "lv-long", Name: "test/lv-long", Memory: &domainv1.Memory{GuestBytes: 64 << 20},
		Disks:  []*domainv1.Disk{{Name: "boot", Path: bootDisk(t, dir), ReadOnly: true, BootOrder: 1}},
		RunDir: runDir(maxRunDir + 1),
	}
	_, err := d.Create(ctx, spec)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "run_dir") {
		t.Fatalf("Create with a run dir of %d bytes = %v, want InvalidArgument naming run_dir", maxRunDir+1, err)
	}
	spec.RunDir = runDir(maxRunDir)
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx, "lv-long"); err != nil {
		t.Fatal(err)
	}
	out := &consoleBuf{}
	go func() { _ = d.Console(ctx, "lv-long", nil, out) }()
	waitFor(t, "the boot sector's marker", time.Minute, func() bool { return out.count(qmp.BootSectorMarker) >= 1 })
}

// bootSpec is a VM of the echo boot sector with its files in dir.
func bootSpec(t *testing.T, id, dir string) *domainv1.DomainSpec {
	t.Helper()
	return &domainv1.DomainSpec{
		Id: id, Name: "test/" + id, Memory: &domainv1.Memory{GuestBytes: 64 << 20},
		Disks:  []*domainv1.Disk{{Name: "boot", Path: bootDisk(t, dir), ReadOnly: true, BootOrder: 1}},
		RunDir: filepath.Join(dir, "run"),
	}
}

// TestDaemonDies kills one VM's libvirtd: that VM ends CRASHED, ProcessExited, with the daemon
// named, and its QEMU, which nothing could manage any more, is gone, with no socket of either
// left, and the VM starts again; the other VM, on a daemon of its own, runs on and still
// answers.
func TestDaemonDies(t *testing.T) {
	requireLibvirt(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d := newTestDriver(t)
	runDirs := map[string]string{}
	outB := &consoleBuf{}
	for _, id := range []string{"lv-a", "lv-b"} {
		spec := bootSpec(t, id, reachableDir(t))
		runDirs[id] = spec.GetRunDir()
		if _, err := d.Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
		if err := d.Start(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// lv-b's guest has booted before anything happens to lv-a: the marker counted after the
	// reset below is then the reset's own (the console's backlog holds the first).
	go func() { _ = d.Console(ctx, "lv-b", nil, outB) }()
	waitForMarkers(t, d, "lv-b", outB, 1)
	a, _ := d.Status(ctx, "lv-a")
	b, _ := d.Status(ctx, "lv-b")
	daemonA := daemonPIDOf(d, "lv-a")
	if err := unix.Kill(daemonA, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "lv-a crashed", time.Minute, func() bool {
		st, _ := d.Status(ctx, "lv-a")
		return st.GetState() == hypervisorv1.State_STATE_CRASHED
	})
	st, _ := d.Status(ctx, "lv-a")
	if st.GetReason() != "ProcessExited" || !strings.Contains(st.GetMessage(), "libvirtd went away") {
		t.Errorf("lv-a: reason %q, message %q; want ProcessExited naming libvirtd", st.GetReason(), st.GetMessage())
	}
	waitFor(t, "lv-a's QEMU gone", 10*time.Second, func() bool { return !processAlive(int(a.GetPid())) })
	// Nothing of lv-a runs on, and no socket of its dead daemon or QEMU is left.
	if left := leftovers(t, runDirs["lv-a"]); len(left) > 0 {
		t.Errorf("after lv-a's daemon died: %s", strings.Join(left, "; "))
	}
	if st, _ := d.Status(ctx, "lv-b"); st.GetState() != hypervisorv1.State_STATE_RUNNING || st.GetPid() != b.GetPid() || !processAlive(int(b.GetPid())) {
		t.Fatalf("lv-b after lv-a's daemon died: %v (pid before %d)", st, b.GetPid())
	}
	// lv-b's daemon still serves it: a reset goes through and the guest boots again.
	if err := d.Reboot(ctx, "lv-b"); err != nil {
		t.Fatal(err)
	}
	waitForMarkers(t, d, "lv-b", outB, 2)
	// lv-a starts again, on a new daemon.
	if err := d.Start(ctx, "lv-a"); err != nil {
		t.Fatalf("Start after its daemon died: %v", err)
	}
	if err := d.Kill(ctx, "lv-a"); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, "lv-a"); err != nil {
		t.Fatal(err)
	}
}

// waitForMarkers waits up to two minutes (TCG on a node loaded by the other test packages)
// for the n-th boot marker on id's console, and otherwise fails with what the console and
// QEMU's log hold.
func waitForMarkers(t *testing.T, d *Driver, id string, out *consoleBuf, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for out.count(qmp.BootSectorMarker) < n {
		if time.Now().After(deadline) {
			st, _ := d.Status(context.Background(), id)
			log := "(no VM)"
			if v, err := d.get(id); err == nil {
				v.mu.Lock()
				log = tailLog(v.dmn.qemuLog(), 0)
				v.mu.Unlock()
			}
			out.mu.Lock()
			console := out.buf.String()
			out.mu.Unlock()
			t.Fatalf("timed out waiting for boot marker %d of %s; status %v\nconsole: %q\nQEMU log: %s", n, id, st, console, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDaemonFailsToStart: a libvirtd that exits at once fails Start with an error naming the
// daemon, leaves the VM startable and deletable, and no daemon directory behind after Delete.
func TestDaemonFailsToStart(t *testing.T) {
	requireLibvirt(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := New(WithLogger(testLogger()))
	if err := d.Configure(ctx, &basev1.ConfigureRequest{StateDir: t.TempDir(), Config: []byte(`{"libvirtd": "/bin/false"}`)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killAll(d) })
	dir := reachableDir(t)
	if _, err := d.Create(ctx, bootSpec(t, "lv-nodaemon", dir)); err != nil {
		t.Fatal(err)
	}
	err := d.Start(ctx, "lv-nodaemon")
	if err == nil || !strings.Contains(err.Error(), "libvirtd") {
		t.Fatalf("Start with a libvirtd that exits = %v, want an error naming libvirtd", err)
	}
	if st, _ := d.Status(ctx, "lv-nodaemon"); active(st.GetState()) {
		t.Errorf("state after the failed start: %v", st.GetState())
	}
	if err := d.Delete(ctx, "lv-nodaemon"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "run", daemonDir)); !os.IsNotExist(err) {
		t.Errorf("the daemon's directory is left after Delete: %v", err)
	}
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	raw, err := os.ReadFile(filepath.Join("/proc", itoa(pid), "stat"))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(raw), ')')
	return i < 0 || i+2 >= len(raw) || raw[i+2] != 'Z'
}
