package qmp

// Tests against real QEMU (TCG unless KVM works). They boot the tiny boot-sector guests of
// bootsector.go, and the project's test guest (_output/guest, `make guest`) where a test needs a
// real kernel.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// GuestReadyMarker is what the project's test guest prints on its serial console once it is up.
const GuestReadyMarker = "KUBEVISOR-GUEST-READY"

func requireQEMU(t *testing.T) {
	t.Helper()
	testenv.Command(t, "qemu-system-x86_64", "qemu-system-x86")
}

func testLogger() hclog.Logger {
	if os.Getenv("KUBEVISOR_TEST_LOG") == "" {
		return hclog.NewNullLogger()
	}
	return hclog.New(&hclog.LoggerOptions{Name: "qmp", Level: hclog.Debug, Output: os.Stderr})
}

// newTestDriver returns a configured driver with stateDir; its QEMUs are killed at cleanup.
func newTestDriver(t *testing.T, stateDir string) *Driver {
	t.Helper()
	requireQEMU(t)
	d := New(WithLogger(testLogger()))
	if err := d.Configure(context.Background(), &basev1.ConfigureRequest{StateDir: stateDir}); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	t.Cleanup(func() { killAll(d) })
	return d
}

// hostClient is the host's client of the driver with the optional interfaces it declares, as
// driver.Optional hands them out.
type hostClient struct {
	*driver.HypervisorClient
	driver.Pauser
	driver.Rebooter
	driver.Consoler
	driver.Displayer
	driver.Recoverer
}

// inProcess serves d over in-memory gRPC and returns the host's client.
func inProcess(t *testing.T, d *Driver) *hostClient {
	t.Helper()
	c, stop, err := driver.InProcess(basev1.Kind_KIND_HYPERVISOR, d)
	if err != nil {
		t.Fatalf("InProcess: %v", err)
	}
	t.Cleanup(stop)
	hc := &hostClient{HypervisorClient: c.(*driver.HypervisorClient)}
	var ok [5]bool
	ctx := context.Background()
	hc.Pauser, ok[0] = driver.Optional[driver.Pauser](ctx, hc.HypervisorClient)
	hc.Rebooter, ok[1] = driver.Optional[driver.Rebooter](ctx, hc.HypervisorClient)
	hc.Consoler, ok[2] = driver.Optional[driver.Consoler](ctx, hc.HypervisorClient)
	hc.Displayer, ok[3] = driver.Optional[driver.Displayer](ctx, hc.HypervisorClient)
	hc.Recoverer, ok[4] = driver.Optional[driver.Recoverer](ctx, hc.HypervisorClient)
	if ok != [5]bool{true, true, true, true, true} {
		t.Fatalf("the driver's client does not offer Pauser, Rebooter, Consoler, Displayer and Recoverer: %v", ok)
	}
	return hc
}

// killQEMUAtCleanup kills whatever QEMU the run dir's pidfile names, whichever driver owns it.
func killQEMUAtCleanup(t *testing.T, runDir string) {
	t.Cleanup(func() {
		pidFile := filepath.Join(runDir, "qemu.pid")
		if pid := readPIDFile(pidFile); isQEMUOf(pid, pidFile) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// echoSpec is a VM booting the echo boot sector from a disk on bus.
func echoSpec(t *testing.T, id string, acpi bool, bus domainv1.DiskBus) *domainv1.DomainSpec {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(dir, "boot.img")
	if err := WriteBootDisk(img, EchoBootSector(acpi)); err != nil {
		t.Fatal(err)
	}
	runDir := filepath.Join(dir, "run")
	if err := os.Mkdir(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	killQEMUAtCleanup(t, runDir)
	return &domainv1.DomainSpec{
		Id: id, Name: "test/" + id, Uuid: "6a1f2b3c-1111-4222-8333-444455556666",
		Memory:   &domainv1.Memory{GuestBytes: 64 << 20},
		Firmware: &domainv1.Firmware{Serial: "serial-" + id},
		Disks:    []*domainv1.Disk{{Name: "boot", Path: img, Format: domainv1.DiskFormat_DISK_FORMAT_RAW, Bus: bus, BootOrder: 1}},
		RunDir:   runDir,
	}
}

// consoleBuf collects console output.
type consoleBuf struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newConsoleBuf() *consoleBuf { return &consoleBuf{changed: make(chan struct{})} }

func (c *consoleBuf) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf.Write(p)
	close(c.changed)
	c.changed = make(chan struct{})
	return len(p), nil
}

func (c *consoleBuf) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// waitCount waits until s occurs n times in the output.
func (c *consoleBuf) waitCount(t *testing.T, s string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		c.mu.Lock()
		got, ch := strings.Count(c.buf.String(), s), c.changed
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("console: %q seen %d times within %s, want %d; output:\n%s", s, got, timeout, n, c.String())
		}
	}
}

// attachConsole runs Console until the test ends or the VM stops; write to the returned writer
// to type.
func attachConsole(t *testing.T, c driver.Consoler, id string) (*consoleBuf, io.Writer, <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	inR, inW := io.Pipe()
	out := newConsoleBuf()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Console(ctx, id, inR, out); err != nil {
			t.Errorf("Console: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = inW.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("Console did not return after its context was cancelled")
		}
	})
	return out, inW, done
}

// eventLog collects events.
type eventLog struct {
	mu     sync.Mutex
	events []*hypervisorv1.Event
}

func watchEvents(t *testing.T, h driver.Hypervisor, id string) *eventLog {
	ctx, cancel := context.WithCancel(context.Background())
	l := &eventLog{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = h.Events(ctx, id, func(e *hypervisorv1.Event) error {
			l.mu.Lock()
			l.events = append(l.events, e)
			l.mu.Unlock()
			return nil
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// waitTypes waits until the events include each of types, in order.
func (l *eventLog) waitTypes(t *testing.T, timeout time.Duration, types ...hypervisorv1.EventType) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		l.mu.Lock()
		i := 0
		var got []string
		for _, e := range l.events {
			got = append(got, e.GetType().String())
			if i < len(types) && e.GetType() == types[i] {
				i++
			}
		}
		l.mu.Unlock()
		if i == len(types) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("events %v do not include %v in order", got, types)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mustStatus(t *testing.T, h driver.Hypervisor, id string, want hypervisorv1.State) *hypervisorv1.VMStatus {
	t.Helper()
	st, err := h.Status(context.Background(), id)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if st.GetState() != want {
		t.Fatalf("state = %s (%s: %s), want %s", st.GetState(), st.GetReason(), st.GetMessage(), want)
	}
	return st
}

// waitState polls Status until the VM is in state want.
func waitState(t *testing.T, h driver.Hypervisor, id string, want hypervisorv1.State, timeout time.Duration) *hypervisorv1.VMStatus {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st, err := h.Status(context.Background(), id)
		if err != nil {
			t.Fatalf("Status: %v", err)
		}
		if st.GetState() == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("state = %s (%s: %s) after %s, want %s", st.GetState(), st.GetReason(), st.GetMessage(), timeout, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func queryStatus(t *testing.T, d *Driver, id string) string {
	t.Helper()
	v, err := d.get(id)
	if err != nil {
		t.Fatal(err)
	}
	s, _, err := v.running()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.mon.Run(context.Background(), "query-status", nil)
	if err != nil {
		t.Fatalf("query-status: %v", err)
	}
	var qs struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(raw, &qs); err != nil {
		t.Fatal(err)
	}
	return qs.Status
}

func TestProbeRealQEMU(t *testing.T) {
	requireQEMU(t)
	h := defaultProber.Probe(context.Background(), ProbeOptions{})
	if h.Problem != "" || !h.TCG {
		t.Fatalf("probe: problem %q, tcg %v (%s)", h.Problem, h.TCG, h.TCGReason)
	}
	fp := h.Fingerprint()
	t.Logf("fingerprint: %s %q %v; TCG probe took %s", fp.GetHealth(), fp.GetHealthDescription(), fp.GetAttributes(), h.TCGBoot)
	if fp.GetAttributes()["qemu-version"] == "" || fp.GetAttributes()["accel"] == "" {
		t.Fatalf("attributes %v lack qemu-version or accel", fp.GetAttributes())
	}
}

// TestLifecycle runs a VM through every operation, across the real plugin boundary (gRPC).
func TestLifecycle(t *testing.T) {
	t.Parallel()
	d := newTestDriver(t, t.TempDir())
	h := inProcess(t, d)
	ctx := context.Background()
	spec := echoSpec(t, "lifecycle", true, domainv1.DiskBus_DISK_BUS_VIRTIO)
	events := watchEvents(t, h, spec.GetId())

	handle, err := h.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if handle.GetId() != spec.GetId() || handle.GetDriver() != Name || len(handle.GetState()) == 0 {
		t.Fatalf("handle = %v", handle)
	}
	if _, err := h.Create(ctx, spec); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("second Create: %v, want AlreadyExists", err)
	}
	mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_CREATED)

	start := time.Now()
	if err := h.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	st := mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_RUNNING)
	if st.GetPid() == 0 || st.GetBoots() != 1 || st.GetStartedAt() == nil {
		t.Fatalf("status after Start = %v", st)
	}
	if err := h.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start of a running VM: %v", err)
	}
	out, in, _ := attachConsole(t, h, spec.GetId())
	out.waitCount(t, BootSectorMarker, 1, 30*time.Second)
	t.Logf("TCG boot to marker: %s (Start returned after %s)", time.Since(start), st.GetStartedAt().AsTime().Sub(start))

	// A second console gets the output so far first.
	out2, _, _ := attachConsole(t, h, spec.GetId())
	out2.waitCount(t, BootSectorMarker, 1, 5*time.Second)

	if _, err := io.WriteString(in, "echo-me"); err != nil {
		t.Fatal(err)
	}
	out.waitCount(t, "echo-me", 1, 10*time.Second)
	out2.waitCount(t, "echo-me", 1, 10*time.Second)

	// Pause: QEMU says paused and the guest's once-a-second dots stop.
	out.waitCount(t, ".", 1, 10*time.Second)
	if err := h.Pause(ctx, spec.GetId()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_PAUSED)
	if qs := queryStatus(t, d, spec.GetId()); qs != "paused" {
		t.Fatalf("query-status = %q while paused", qs)
	}
	if err := h.Pause(ctx, spec.GetId()); err != nil {
		t.Fatalf("Pause of a paused VM: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	frozen := out.String()
	time.Sleep(2 * time.Second)
	if now := out.String(); now != frozen {
		t.Fatalf("console output went on while paused: %q", now[len(frozen):])
	}
	if err := h.Resume(ctx, spec.GetId()); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_RUNNING)
	out.waitCount(t, ".", strings.Count(frozen, ".")+1, 10*time.Second)

	// Reboot: the guest boots again.
	if err := h.Reboot(ctx, spec.GetId()); err != nil {
		t.Fatalf("Reboot: %v", err)
	}
	out.waitCount(t, BootSectorMarker, 2, 30*time.Second)
	if st := mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_RUNNING); st.GetBoots() != 2 {
		t.Fatalf("boots = %d after reboot, want 2", st.GetBoots())
	}

	if err := h.Delete(ctx, spec.GetId()); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Delete of a running VM: %v, want FailedPrecondition", err)
	}

	// Graceful shutdown: this guest powers off on the ACPI power button.
	graceful, err := h.Shutdown(ctx, spec.GetId(), 30*time.Second)
	if err != nil || !graceful {
		t.Fatalf("Shutdown = %v, %v; want graceful; console: %q", graceful, err, out.String())
	}
	st = mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_STOPPED)
	if st.GetReason() != driver.ReasonGuestShutdown || st.GetPid() != 0 {
		t.Fatalf("status after shutdown = %v", st)
	}
	events.waitTypes(t, 5*time.Second,
		hypervisorv1.EventType_EVENT_TYPE_STARTED, hypervisorv1.EventType_EVENT_TYPE_PAUSED,
		hypervisorv1.EventType_EVENT_TYPE_RESUMED, hypervisorv1.EventType_EVENT_TYPE_RESET,
		hypervisorv1.EventType_EVENT_TYPE_POWERDOWN_REQUESTED, hypervisorv1.EventType_EVENT_TYPE_SHUTDOWN,
		hypervisorv1.EventType_EVENT_TYPE_STOPPED)
	if graceful, err := h.Shutdown(ctx, spec.GetId(), time.Second); err != nil || graceful {
		t.Fatalf("Shutdown of a stopped VM = %v, %v", graceful, err)
	}
	if err := h.Kill(ctx, spec.GetId()); err != nil {
		t.Fatalf("Kill of a stopped VM: %v", err)
	}
	if err := h.Console(ctx, spec.GetId(), nil, io.Discard); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Console of a stopped VM: %v, want FailedPrecondition", err)
	}

	// Start again: a new QEMU, a new boot.
	if err := h.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start after shutdown: %v", err)
	}
	out3, _, _ := attachConsole(t, h, spec.GetId())
	out3.waitCount(t, BootSectorMarker, 1, 30*time.Second)
	if st := mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_RUNNING); st.GetBoots() != 3 {
		t.Fatalf("boots = %d after restart, want 3", st.GetBoots())
	}
	if err := h.Kill(ctx, spec.GetId()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if st := mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_STOPPED); st.GetReason() != driver.ReasonKilled {
		t.Fatalf("reason after Kill = %q", st.GetReason())
	}

	if err := h.Delete(ctx, spec.GetId()); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := h.Status(ctx, spec.GetId()); status.Code(err) != codes.NotFound {
		t.Fatalf("Status after Delete: %v, want NotFound", err)
	}
	left, _ := os.ReadDir(spec.GetRunDir())
	if len(left) != 0 {
		t.Fatalf("run dir keeps %v after Delete", left)
	}
	if err := h.Delete(ctx, spec.GetId()); err != nil {
		t.Fatalf("Delete of an unknown id: %v", err)
	}
}

// TestShutdownForced: a guest that ignores ACPI is stopped at the timeout.
func TestShutdownForced(t *testing.T) {
	t.Parallel()
	d := newTestDriver(t, t.TempDir())
	ctx := context.Background()
	spec := echoSpec(t, "forced", false, domainv1.DiskBus_DISK_BUS_SATA)
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := d.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	out, _, _ := attachConsole(t, d, spec.GetId())
	out.waitCount(t, BootSectorMarker, 1, 30*time.Second)
	begin := time.Now()
	graceful, err := d.Shutdown(ctx, spec.GetId(), 2*time.Second)
	took := time.Since(begin)
	if err != nil || graceful {
		t.Fatalf("Shutdown = %v, %v; want forced", graceful, err)
	}
	if took < 2*time.Second || took > 10*time.Second {
		t.Fatalf("Shutdown took %s with a 2s timeout", took)
	}
	if st := mustStatus(t, d, spec.GetId(), hypervisorv1.State_STATE_STOPPED); st.GetReason() != driver.ReasonForcedShutdown {
		t.Fatalf("reason = %q, want %s", st.GetReason(), driver.ReasonForcedShutdown)
	}

	// Kill cuts short a Shutdown waiting for the guest.
	if err := d.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	type result struct {
		graceful bool
		err      error
	}
	done := make(chan result, 1)
	go func() {
		g, err := d.Shutdown(ctx, spec.GetId(), time.Minute)
		done <- result{g, err}
	}()
	waitState(t, d, spec.GetId(), hypervisorv1.State_STATE_SHUTTING_DOWN, 10*time.Second)
	if err := d.Kill(ctx, spec.GetId()); err != nil {
		t.Fatalf("Kill during Shutdown: %v", err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.graceful {
			t.Fatalf("Shutdown cut short by Kill = %v, %v", r.graceful, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return after Kill")
	}
	if st := mustStatus(t, d, spec.GetId(), hypervisorv1.State_STATE_STOPPED); st.GetReason() != driver.ReasonKilled {
		t.Fatalf("reason = %q, want %s", st.GetReason(), driver.ReasonKilled)
	}
}

// TestGuestEnds: a guest powering off by itself stops the VM; a guest panic or the death of QEMU
// crashes it, with the end of QEMU's log in the message.
func TestGuestEnds(t *testing.T) {
	t.Parallel()
	d := newTestDriver(t, t.TempDir())
	ctx := context.Background()
	spec := echoSpec(t, "ends", false, domainv1.DiskBus_DISK_BUS_SCSI)
	events := watchEvents(t, d, spec.GetId())
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	boot := func() io.Writer {
		t.Helper()
		if err := d.Start(ctx, spec.GetId()); err != nil {
			t.Fatalf("Start: %v", err)
		}
		out, in, _ := attachConsole(t, d, spec.GetId())
		out.waitCount(t, BootSectorMarker, 1, 30*time.Second)
		return in
	}

	in := boot()
	_, _ = io.WriteString(in, "S")
	if st := waitState(t, d, spec.GetId(), hypervisorv1.State_STATE_STOPPED, 10*time.Second); st.GetReason() != driver.ReasonGuestShutdown {
		t.Fatalf("reason after the guest powered off = %q", st.GetReason())
	}

	in = boot()
	_, _ = io.WriteString(in, "P")
	if st := waitState(t, d, spec.GetId(), hypervisorv1.State_STATE_CRASHED, 10*time.Second); st.GetReason() != driver.ReasonGuestPanicked {
		t.Fatalf("reason after a guest panic = %q", st.GetReason())
	}
	events.waitTypes(t, 5*time.Second, hypervisorv1.EventType_EVENT_TYPE_GUEST_PANICKED, hypervisorv1.EventType_EVENT_TYPE_CRASHED)

	boot()
	st := mustStatus(t, d, spec.GetId(), hypervisorv1.State_STATE_RUNNING)
	if err := syscall.Kill(int(st.GetPid()), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st = waitState(t, d, spec.GetId(), hypervisorv1.State_STATE_CRASHED, 10*time.Second)
	if st.GetReason() != driver.ReasonProcessExited || !strings.Contains(st.GetMessage(), "exited unexpectedly") {
		t.Fatalf("status after SIGKILL = %v", st)
	}
	t.Logf("crash message: %s", st.GetMessage())
}

// TestRecover: a new driver re-adopts a running QEMU from its handle.
func TestRecover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stateDir := t.TempDir()
	a := newTestDriver(t, stateDir)
	spec := echoSpec(t, "recover", true, domainv1.DiskBus_DISK_BUS_USB)
	handle, err := a.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := a.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	outA, _, doneA := attachConsole(t, a, spec.GetId())
	outA.waitCount(t, BootSectorMarker, 1, 30*time.Second)
	if err := a.Reboot(ctx, spec.GetId()); err != nil {
		t.Fatalf("Reboot: %v", err)
	}
	// Input typed while the firmware runs is lost: wait for the guest.
	outA.waitCount(t, BootSectorMarker, 2, 30*time.Second)
	stA := mustStatus(t, a, spec.GetId(), hypervisorv1.State_STATE_RUNNING)

	// The driver process "dies": its connections close, QEMU goes on.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-doneA:
	case <-time.After(5 * time.Second):
		t.Fatal("console of the closed driver did not end")
	}
	if !isQEMUOf(int(stA.GetPid()), filepath.Join(spec.GetRunDir(), "qemu.pid")) {
		t.Fatal("QEMU did not survive its driver")
	}

	b := newTestDriver(t, stateDir)
	hb := inProcess(t, b)
	st, err := hb.Recover(ctx, handle)
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if st.GetState() != hypervisorv1.State_STATE_RUNNING || st.GetPid() != stA.GetPid() || st.GetBoots() != 2 {
		t.Fatalf("recovered status = %v, want RUNNING, pid %d, boots 2", st, stA.GetPid())
	}
	if again, err := hb.Recover(ctx, handle); err != nil || again.GetPid() != st.GetPid() {
		t.Fatalf("second Recover = %v, %v", again, err)
	}
	out, in, _ := attachConsole(t, hb, spec.GetId())
	if _, err := io.WriteString(in, "after-recover"); err != nil {
		t.Fatal(err)
	}
	out.waitCount(t, "after-recover", 1, 10*time.Second)
	if err := hb.Pause(ctx, spec.GetId()); err != nil {
		t.Fatalf("Pause after Recover: %v", err)
	}
	if qs := queryStatus(t, b, spec.GetId()); qs != "paused" {
		t.Fatalf("query-status = %q", qs)
	}
	// Shutdown resumes a paused guest, which then powers off by itself.
	graceful, err := hb.Shutdown(ctx, spec.GetId(), 30*time.Second)
	if err != nil || !graceful {
		t.Fatalf("Shutdown after Recover = %v, %v", graceful, err)
	}
	mustStatus(t, hb, spec.GetId(), hypervisorv1.State_STATE_STOPPED)

	// A third driver, from the handle alone (no state dir record): the VM is gone, so STOPPED.
	c := newTestDriver(t, t.TempDir())
	st, err = c.Recover(ctx, handle)
	if err != nil {
		t.Fatalf("Recover of a stopped VM: %v", err)
	}
	if st.GetState() != hypervisorv1.State_STATE_STOPPED || st.GetReason() != driver.ReasonProcessGone || st.GetPid() != 0 {
		t.Fatalf("recovered stopped VM = %v", st)
	}
	// ... and it can start it again.
	if err := c.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start after Recover: %v", err)
	}
	outC, _, _ := attachConsole(t, c, spec.GetId())
	outC.waitCount(t, BootSectorMarker, 1, 30*time.Second)
	if err := c.Kill(ctx, spec.GetId()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := c.Delete(ctx, spec.GetId()); err != nil {
		t.Fatalf("Delete: %v", err)
	}
}

// TestRecoverFromPIDFile: a handle alone (the state dir lost) finds a running QEMU through its
// pidfile.
func TestRecoverFromPIDFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := newTestDriver(t, "")
	spec := echoSpec(t, "pidfile", false, domainv1.DiskBus_DISK_BUS_VIRTIO)
	handle, err := a.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := a.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	pid := mustStatus(t, a, spec.GetId(), hypervisorv1.State_STATE_RUNNING).GetPid()
	_ = a.Close()
	b := newTestDriver(t, t.TempDir())
	st, err := b.Recover(ctx, handle)
	if err != nil || st.GetState() != hypervisorv1.State_STATE_RUNNING || st.GetPid() != pid {
		t.Fatalf("Recover = %v, %v; want RUNNING with pid %d", st, err, pid)
	}
	if err := b.Kill(ctx, spec.GetId()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
}

// TestFirmware boots OVMF, with and without Secure Boot, far enough to see it on the console.
func TestFirmware(t *testing.T) {
	t.Parallel()
	for _, f := range []string{DefaultOVMF.Code, DefaultOVMF.SecureCode} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("%s missing: install ovmf (make deps)", f)
		}
	}
	d := newTestDriver(t, t.TempDir())
	ctx := context.Background()
	cases := []struct {
		name   string
		secure bool
		want   string
	}{
		{"efi", false, "UEFI Interactive Shell"},
		// Secure Boot refuses the unsigned built-in shell.
		{"secureboot", true, "Security Violation"},
	}
	var wg sync.WaitGroup
	for _, c := range cases {
		spec := echoSpec(t, c.name, false, domainv1.DiskBus_DISK_BUS_VIRTIO)
		spec.Disks = nil
		spec.Memory.GuestBytes = 256 << 20
		spec.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{SecureBoot: c.secure}}}
		if _, err := d.Create(ctx, spec); err != nil {
			t.Fatalf("Create %s: %v", c.name, err)
		}
		if err := d.Start(ctx, spec.GetId()); err != nil {
			t.Fatalf("Start %s: %v", c.name, err)
		}
		if _, err := os.Stat(filepath.Join(spec.GetRunDir(), "OVMF_VARS.fd")); err != nil {
			t.Fatalf("%s: per-VM variable store: %v", c.name, err)
		}
		out, _, _ := attachConsole(t, d, spec.GetId())
		wg.Add(1)
		go func() {
			defer wg.Done()
			out.waitCount(t, c.want, 1, 90*time.Second)
			if err := d.Kill(ctx, spec.GetId()); err != nil {
				t.Errorf("Kill %s: %v", c.name, err)
			}
		}()
	}
	wg.Wait()
}

// TestCreateInvalid: specs the driver cannot honour are refused, naming the field, across gRPC.
func TestCreateInvalid(t *testing.T) {
	t.Parallel()
	h := inProcess(t, newTestDriver(t, t.TempDir()))
	ctx := context.Background()
	cases := []struct {
		name  string
		spec  func(*domainv1.DomainSpec)
		code  codes.Code
		field string
	}{
		{"no memory", func(s *domainv1.DomainSpec) { s.Memory = nil }, codes.InvalidArgument, "memory.guestBytes"},
		{"relative disk path", func(s *domainv1.DomainSpec) { s.Disks[0].Path = "boot.img" }, codes.InvalidArgument, "disks[0].path"},
		{"virtio cdrom", func(s *domainv1.DomainSpec) { s.Disks[0].Device = domainv1.DiskDevice_DISK_DEVICE_CDROM }, codes.InvalidArgument, "disks[0].bus"},
		{"id unusable as a file name", func(s *domainv1.DomainSpec) { s.Id = "../x" }, codes.InvalidArgument, "id"},
		{"unknown nic model", func(s *domainv1.DomainSpec) {
			s.Nics = []*domainv1.NIC{{Name: "n", TapName: "tap0", Mac: "52:54:00:00:00:01", Model: "pcnet"}}
		}, codes.InvalidArgument, "nics[0].model"},
		{"host-passthrough under emulation", func(s *domainv1.DomainSpec) {
			s.Acceleration = domainv1.Acceleration_ACCELERATION_EMULATED
			s.Cpu = &domainv1.CPU{Model: "host-passthrough"}
		}, codes.InvalidArgument, "cpu.model"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := echoSpec(t, "invalid", false, domainv1.DiskBus_DISK_BUS_VIRTIO)
			c.spec(spec)
			_, err := h.Create(ctx, spec)
			if status.Code(err) != c.code || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("Create = %v, want %s naming %s", err, c.code, c.field)
			}
		})
	}
	t.Run("acceleration required without KVM", func(t *testing.T) {
		if defaultProber.Probe(ctx, ProbeOptions{}).KVM {
			t.Skip("KVM works on this machine")
		}
		spec := echoSpec(t, "needs-kvm", false, domainv1.DiskBus_DISK_BUS_VIRTIO)
		spec.Acceleration = domainv1.Acceleration_ACCELERATION_REQUIRED
		if _, err := h.Create(ctx, spec); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "KVM") {
			t.Fatalf("Create = %v, want FailedPrecondition about KVM", err)
		}
	})
	t.Run("unknown id", func(t *testing.T) {
		if _, err := h.Status(ctx, "nope"); status.Code(err) != codes.NotFound {
			t.Fatalf("Status = %v", err)
		}
		if err := h.Start(ctx, "nope"); status.Code(err) != codes.NotFound {
			t.Fatalf("Start = %v", err)
		}
	})
}

// TestStartFailure: QEMU refusing to start is an error quoting its log; the VM stays as it was.
func TestStartFailure(t *testing.T) {
	t.Parallel()
	d := newTestDriver(t, t.TempDir())
	ctx := context.Background()
	spec := echoSpec(t, "nodisk", false, domainv1.DiskBus_DISK_BUS_VIRTIO)
	spec.Disks[0].Path = filepath.Join(t.TempDir(), "missing.img")
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	err := d.Start(ctx, spec.GetId())
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "missing.img") {
		t.Fatalf("Start = %v, want Internal quoting QEMU's complaint about the disk", err)
	}
	t.Logf("Start: %v", err)
	mustStatus(t, d, spec.GetId(), hypervisorv1.State_STATE_CREATED)
	if err := d.Delete(ctx, spec.GetId()); err != nil {
		t.Fatalf("Delete: %v", err)
	}
}

// TestFingerprint: the driver reports what the probe found, with the accel attribute.
func TestFingerprint(t *testing.T) {
	t.Parallel()
	h := inProcess(t, newTestDriver(t, t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan *basev1.FingerprintResponse, 1)
	go func() {
		_ = h.Fingerprint(ctx, func(r *basev1.FingerprintResponse) error {
			select {
			case got <- r:
			default: // a later one: the first is what the test reads
			}
			return nil
		})
	}()
	select {
	case r := <-got:
		cancel() // the stream ends; the select cannot take this for a timeout any more
		accel := r.GetAttributes()["accel"]
		switch {
		case accel == "kvm" && r.GetHealth() == basev1.Health_HEALTH_HEALTHY:
		case accel == "tcg" && r.GetHealth() == basev1.Health_HEALTH_DEGRADED && strings.Contains(r.GetHealthDescription(), "emulation only"):
		default:
			t.Fatalf("fingerprint = %v", r)
		}
		t.Logf("fingerprint: %s %q %v", r.GetHealth(), r.GetHealthDescription(), r.GetAttributes())
	case <-ctx.Done():
		t.Fatal("no fingerprint within 30s")
	}
	caps, err := h.Capabilities(context.Background())
	if err != nil {
		t.Fatalf("Capabilities: %v", err)
	}
	want := []basev1.Feature{
		basev1.Feature_FEATURE_HYPERVISOR_PAUSE, basev1.Feature_FEATURE_HYPERVISOR_REBOOT,
		basev1.Feature_FEATURE_HYPERVISOR_SOFT_REBOOT, basev1.Feature_FEATURE_HYPERVISOR_GUEST_AGENT,
		basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC,
		basev1.Feature_FEATURE_HYPERVISOR_CONSOLE, basev1.Feature_FEATURE_HYPERVISOR_DISPLAY,
		basev1.Feature_FEATURE_HYPERVISOR_RECOVER, basev1.Feature_FEATURE_HYPERVISOR_MIGRATE,
	}
	if got := caps.GetFeatures(); !slices.Equal(got, want) {
		t.Fatalf("Capabilities features = %v, want %v", got, want)
	}
	if !caps.GetMigrationDisks() || !caps.GetMigrationPostCopy() {
		t.Errorf("Capabilities migration_disks %v, migration_post_copy %v: the driver copies disks and switches to post-copy", caps.GetMigrationDisks(), caps.GetMigrationPostCopy())
	}
}

// guestDir is where the project's test guest is built.
// realGuestSpec is a VM booting the project's test guest's kernel and initramfs with 256 MiB,
// no disk; the test needs the guest built (make guest).
func realGuestSpec(t *testing.T, id string) *domainv1.DomainSpec {
	t.Helper()
	dir := guestDir()
	for _, f := range []string{"vmlinuz", "initramfs.cpio.gz"} {
		testenv.File(t, filepath.Join(dir, f), "guest")
	}
	spec := echoSpec(t, id, false, domainv1.DiskBus_DISK_BUS_VIRTIO)
	spec.Disks = nil
	spec.Memory.GuestBytes = 256 << 20
	cmdline := "console=ttyS0"
	if raw, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil {
		cmdline = strings.TrimSpace(string(raw))
	}
	spec.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{
		KernelPath: filepath.Join(dir, "vmlinuz"), InitrdPath: filepath.Join(dir, "initramfs.cpio.gz"), Cmdline: cmdline,
	}}}
	return spec
}

func guestDir() string {
	if d := os.Getenv("KUBEVISOR_GUEST_DIR"); d != "" {
		return d
	}
	abs, _ := filepath.Abs(filepath.Join("..", "..", "_output", "guest"))
	return abs
}

// TestRealGuest runs the project's test guest (a Linux kernel with an initramfs) through its
// lifecycle: boot to its marker, pause, resume, reboot, graceful ACPI shutdown.
func TestRealGuest(t *testing.T) {
	t.Parallel()
	dir := guestDir()
	d := newTestDriver(t, t.TempDir())
	h := inProcess(t, d)
	ctx := context.Background()
	spec := realGuestSpec(t, "guest")
	if base := filepath.Join(dir, "disk.qcow2"); fileExists(base) {
		overlay := filepath.Join(t.TempDir(), "disk.qcow2")
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, overlay).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img create (install qemu-utils): %v: %s", err, out)
		}
		spec.Disks = []*domainv1.Disk{{Name: "data", Path: overlay, Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, Cache: "writeback", Serial: "data"}}
	}
	if _, err := h.Create(ctx, spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	start := time.Now()
	if err := h.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	out, _, _ := attachConsole(t, h, spec.GetId())
	out.waitCount(t, GuestReadyMarker, 1, 120*time.Second)
	t.Logf("TCG boot of the test guest to %s: %s", GuestReadyMarker, time.Since(start))

	if err := h.Pause(ctx, spec.GetId()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if qs := queryStatus(t, d, spec.GetId()); qs != "paused" {
		t.Fatalf("query-status = %q", qs)
	}
	if err := h.Resume(ctx, spec.GetId()); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := h.Reboot(ctx, spec.GetId()); err != nil {
		t.Fatalf("Reboot: %v", err)
	}
	out.waitCount(t, GuestReadyMarker, 2, 120*time.Second)
	if st := mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_RUNNING); st.GetBoots() != 2 {
		t.Fatalf("boots = %d, want 2", st.GetBoots())
	}
	begin := time.Now()
	graceful, err := h.Shutdown(ctx, spec.GetId(), 60*time.Second)
	if err != nil || !graceful {
		t.Fatalf("Shutdown = %v, %v; want graceful. Console:\n%s", graceful, err, out.String())
	}
	t.Logf("graceful shutdown took %s", time.Since(begin))
	if st := mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_STOPPED); st.GetReason() != driver.ReasonGuestShutdown {
		t.Fatalf("reason = %q", st.GetReason())
	}
	if err := h.Delete(ctx, spec.GetId()); err != nil {
		t.Fatalf("Delete: %v", err)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, os.ErrNotExist)
}

// TestNICs attaches a tap by name and one by descriptor to a VM (needs CAP_NET_ADMIN).
func TestNICs(t *testing.T) {
	t.Parallel()
	suffix := strconv.Itoa(os.Getpid() % 100000)
	named, passed := "kvqn"+suffix, "kvqf"+suffix
	testenv.Root(t, "makes taps")
	testenv.Command(t, "ip", "iproute2")
	if out, err := exec.Command("ip", "tuntap", "add", "dev", named, "mode", "tap").CombinedOutput(); err != nil {
		t.Fatalf("ip tuntap add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", named).Run() })
	if out, err := exec.Command("ip", "link", "set", named, "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set up: %v: %s", err, out)
	}
	tun, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	ifr, err := unix.NewIfreq(passed)
	if err != nil {
		t.Fatal(err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(int(tun.Fd()), unix.TUNSETIFF, ifr); err != nil {
		t.Fatalf("TUNSETIFF: %v", err)
	}
	carrier := func() string {
		raw, _ := os.ReadFile("/sys/class/net/" + named + "/carrier")
		return strings.TrimSpace(string(raw))
	}
	if c := carrier(); c != "0" {
		t.Fatalf("carrier of %s is %q before QEMU attached", named, c)
	}

	d := newTestDriver(t, t.TempDir())
	ctx := context.Background()
	spec := echoSpec(t, "nics", false, domainv1.DiskBus_DISK_BUS_VIRTIO)
	spec.Nics = []*domainv1.NIC{
		{Name: "a", TapName: named, Mac: "52:54:00:00:00:0a", Mtu: 1400},
		{Name: "b", TapFdPath: "/proc/self/fd/" + strconv.Itoa(int(tun.Fd())), Mac: "52:54:00:00:00:0b", Model: "e1000",
			PciAddress: "0000:00:10.0", LinkDown: true},
	}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := d.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if c := carrier(); c != "1" {
		t.Errorf("carrier of %s is %q with QEMU attached", named, c)
	}
	v, _ := d.get(spec.GetId())
	s, _, _ := v.running()
	raw, err := s.mon.Run(ctx, "human-monitor-command", map[string]any{"command-line": "info network"})
	if err != nil {
		t.Fatal(err)
	}
	var info string
	_ = json.Unmarshal(raw, &info)
	t.Logf("info network:\n%s", info)
	for _, want := range []string{"ifname=" + named, "fd=3", "virtio-net-pci", "52:54:00:00:00:0a", "e1000", "52:54:00:00:00:0b"} {
		if !strings.Contains(info, want) {
			t.Errorf("info network lacks %q:\n%s", want, info)
		}
	}
	// NIC b is at slot 0x10 of the root bus, ahead of the devices QEMU placed itself (its
	// link was taken down with set_link before cont: Start fails when QEMU refuses it; QEMU
	// shows a link's state to no query).
	if strings.Index(info, "ua-net1") > strings.Index(info, "ua-net0") {
		t.Errorf("info network: nics[1], which has a PCI address, is not first on the command line:\n%s", info)
	}
	raw, err = s.mon.Run(ctx, "query-pci", nil)
	if err != nil {
		t.Fatal(err)
	}
	var buses []struct {
		Devices []struct {
			Slot, Function int
			QdevID         string `json:"qdev_id"`
		}
	}
	if err := json.Unmarshal(raw, &buses); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, bus := range buses {
		for _, dev := range bus.Devices {
			if dev.QdevID == "ua-net1" {
				found = true
				if dev.Slot != 0x10 || dev.Function != 0 {
					t.Errorf("nics[1] is at slot %#x function %d, want 0x10.0 (its pciAddress)", dev.Slot, dev.Function)
				}
			}
		}
	}
	if !found {
		t.Errorf("query-pci has no ua-net1: %s", raw)
	}
	if err := d.Kill(ctx, spec.GetId()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
}

// TestStartPaused: a VM whose spec starts it paused is PAUSED after Start with its vCPUs never
// run (QEMU in prelaunch, no console output), stays paused across a driver restart, and boots
// on Resume.
func TestStartPaused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stateDir := t.TempDir()
	a := newTestDriver(t, stateDir)
	spec := echoSpec(t, "startpaused", true, domainv1.DiskBus_DISK_BUS_VIRTIO)
	spec.StartPaused = true
	handle, err := a.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := a.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	mustStatus(t, a, spec.GetId(), hypervisorv1.State_STATE_PAUSED)
	if qs := queryStatus(t, a, spec.GetId()); qs != "prelaunch" {
		t.Fatalf("query-status = %q, want prelaunch (the vCPUs never ran)", qs)
	}
	out, _, done := attachConsole(t, a, spec.GetId())
	time.Sleep(2 * time.Second)
	if s := out.String(); strings.Contains(s, BootSectorMarker) {
		t.Fatalf("the guest booted while started paused: %q", s)
	}

	// A new driver process finds it paused, not half started.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	<-done
	b := newTestDriver(t, stateDir)
	st, err := b.Recover(ctx, handle)
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if st.GetState() != hypervisorv1.State_STATE_PAUSED {
		t.Fatalf("recovered state %s, want PAUSED", st.GetState())
	}
	out, _, _ = attachConsole(t, b, spec.GetId())
	if err := b.Resume(ctx, spec.GetId()); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	mustStatus(t, b, spec.GetId(), hypervisorv1.State_STATE_RUNNING)
	out.waitCount(t, BootSectorMarker, 1, 30*time.Second)
	if err := b.Kill(ctx, spec.GetId()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
}

// TestBIOSUseSerial: with the BIOS's output on the serial console the console shows SeaBIOS's
// banner before the guest's marker; without, only the guest's.
func TestBIOSUseSerial(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newTestDriver(t, t.TempDir())
	for _, useSerial := range []bool{true, false} {
		spec := echoSpec(t, "biosserial-"+strconv.FormatBool(useSerial), true, domainv1.DiskBus_DISK_BUS_VIRTIO)
		spec.Firmware.Boot = &domainv1.Firmware_Bios{Bios: &domainv1.BIOS{UseSerial: useSerial}}
		if _, err := d.Create(ctx, spec); err != nil {
			t.Fatalf("Create: %v", err)
		}
		if err := d.Start(ctx, spec.GetId()); err != nil {
			t.Fatalf("Start: %v", err)
		}
		// A console gets the output from the start (the driver keeps it).
		out, _, _ := attachConsole(t, d, spec.GetId())
		out.waitCount(t, BootSectorMarker, 1, 30*time.Second)
		if got := strings.Contains(out.String(), "SeaBIOS"); got != useSerial {
			t.Errorf("useSerial %v: SeaBIOS on the console = %v: %q", useSerial, got, out.String())
		}
		if err := d.Kill(ctx, spec.GetId()); err != nil {
			t.Fatalf("Kill: %v", err)
		}
	}
}
