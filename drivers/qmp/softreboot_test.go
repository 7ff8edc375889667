package qmp

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// softRebooter is the driver's SoftRebooter as the host reaches it, over gRPC.
func softRebooter(t *testing.T, d *Driver) (*hostClient, driver.SoftRebooter) {
	t.Helper()
	hc := inProcess(t, d)
	r, ok := driver.Optional[driver.SoftRebooter](context.Background(), hc.HypervisorClient)
	if !ok {
		t.Fatal("the driver's client does not offer SoftRebooter")
	}
	return hc, r
}

// bootEcho creates and starts an echo guest and waits for its marker.
func bootEcho(t *testing.T, h *hostClient, spec *domainv1.DomainSpec) (*consoleBuf, io.Writer) {
	t.Helper()
	ctx := context.Background()
	if _, err := h.Create(ctx, spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := h.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	out, in, _ := attachConsole(t, h, spec.GetId())
	out.waitCount(t, BootSectorMarker, 1, 30*time.Second)
	return out, in
}

// eventsSince are the events of l from index i on.
func (l *eventLog) since(i int) []*hypervisorv1.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events[min(i, len(l.events)):])
}

// TestSoftReboot: a guest that powers off at the power button boots again, the same QEMU, and
// the VM is never reported stopped or paused; after it, the guest's own power-off stops the VM.
func TestSoftReboot(t *testing.T) {
	t.Parallel()
	d := newTestDriver(t, t.TempDir())
	h, r := softRebooter(t, d)
	ctx := context.Background()
	spec := echoSpec(t, "softreboot", true, domainv1.DiskBus_DISK_BUS_VIRTIO)
	events := watchEvents(t, h, spec.GetId())
	out, in := bootEcho(t, h, spec)
	before := mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_RUNNING)

	if err := r.SoftReboot(ctx, spec.GetId()); err != nil {
		t.Fatalf("SoftReboot: %v", err)
	}
	out.waitCount(t, BootSectorMarker, 2, 30*time.Second)
	after := waitState(t, h, spec.GetId(), hypervisorv1.State_STATE_RUNNING, 5*time.Second)
	if after.GetPid() != before.GetPid() || after.GetBoots() != before.GetBoots()+1 {
		t.Fatalf("after the soft reboot: pid %d, boots %d; want pid %d, boots %d", after.GetPid(), after.GetBoots(), before.GetPid(), before.GetBoots()+1)
	}
	var types []hypervisorv1.EventType
	for _, e := range events.since(0) {
		types = append(types, e.GetType())
		switch e.GetType() {
		case hypervisorv1.EventType_EVENT_TYPE_SHUTDOWN, hypervisorv1.EventType_EVENT_TYPE_STOPPED, hypervisorv1.EventType_EVENT_TYPE_PAUSED:
			t.Errorf("a soft reboot reported %s (%s)", e.GetType(), e.GetReason())
		case hypervisorv1.EventType_EVENT_TYPE_RESET:
			if e.GetReason() != driver.ReasonGuestReset {
				t.Errorf("the soft reboot's RESET has reason %q, want %q", e.GetReason(), driver.ReasonGuestReset)
			}
		}
	}
	if !slices.Contains(types, hypervisorv1.EventType_EVENT_TYPE_POWERDOWN_REQUESTED) || !slices.Contains(types, hypervisorv1.EventType_EVENT_TYPE_RESET) {
		t.Errorf("events of a soft reboot = %v, want POWERDOWN_REQUESTED and RESET", types)
	}
	if qs := queryStatus(t, d, spec.GetId()); qs != "running" {
		t.Fatalf("QEMU after the soft reboot is %q", qs)
	}

	// The reboot is done: the guest powering off now stops the VM.
	if _, err := io.WriteString(in, "S"); err != nil {
		t.Fatal(err)
	}
	if st := waitState(t, h, spec.GetId(), hypervisorv1.State_STATE_STOPPED, 10*time.Second); st.GetReason() != driver.ReasonGuestShutdown {
		t.Fatalf("reason after the guest powered off = %q, want %q", st.GetReason(), driver.ReasonGuestShutdown)
	}
}

// TestSoftRebootIgnored: the guest decides. One that ignores the power button goes on running,
// untouched; a Shutdown after it stops the VM (forcibly, the guest ignores that too) instead of
// rebooting it; SoftReboot of a VM that is not running is FailedPrecondition.
func TestSoftRebootIgnored(t *testing.T) {
	t.Parallel()
	d := newTestDriver(t, t.TempDir())
	h, r := softRebooter(t, d)
	ctx := context.Background()
	spec := echoSpec(t, "softreboot-ignored", false, domainv1.DiskBus_DISK_BUS_VIRTIO)
	out, in := bootEcho(t, h, spec)
	before := mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_RUNNING)
	if err := r.SoftReboot(ctx, spec.GetId()); err != nil {
		t.Fatalf("SoftReboot: %v", err)
	}
	time.Sleep(2 * time.Second)
	if _, err := io.WriteString(in, "still-here"); err != nil {
		t.Fatal(err)
	}
	out.waitCount(t, "still-here", 1, 10*time.Second)
	if st := mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_RUNNING); st.GetBoots() != before.GetBoots() {
		t.Fatalf("a soft reboot the guest ignored changed boots from %d to %d", before.GetBoots(), st.GetBoots())
	}

	if err := h.Pause(ctx, spec.GetId()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := r.SoftReboot(ctx, spec.GetId()); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("SoftReboot of a paused VM = %v, want FailedPrecondition", err)
	}
	if err := h.Resume(ctx, spec.GetId()); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	graceful, err := h.Shutdown(ctx, spec.GetId(), time.Second)
	if err != nil || graceful {
		t.Fatalf("Shutdown = %v, %v; want a forced stop", graceful, err)
	}
	mustStatus(t, h, spec.GetId(), hypervisorv1.State_STATE_STOPPED)
	if err := r.SoftReboot(ctx, spec.GetId()); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("SoftReboot of a stopped VM = %v, want FailedPrecondition", err)
	}
}

// TestSoftRebootPendingAcrossRestart: a soft reboot asked of one driver process and answered by
// the guest while no driver runs is finished by the next one, which recovers the VM running.
func TestSoftRebootPendingAcrossRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stateDir := t.TempDir()
	a := newTestDriver(t, stateDir)
	ha, ra := softRebooter(t, a)
	// A guest that ignores the button but powers off when told ('S'): the reboot stays pending.
	spec := echoSpec(t, "softreboot-recover", false, domainv1.DiskBus_DISK_BUS_VIRTIO)
	handle, err := ha.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := ha.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	outA, _, doneA := attachConsole(t, ha, spec.GetId())
	outA.waitCount(t, BootSectorMarker, 1, 30*time.Second)
	before := mustStatus(t, ha, spec.GetId(), hypervisorv1.State_STATE_RUNNING)
	if err := ra.SoftReboot(ctx, spec.GetId()); err != nil {
		t.Fatalf("SoftReboot: %v", err)
	}
	// The driver "dies", then the guest powers off: QEMU waits, paused, for a driver.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	<-doneA
	paths := RunPaths(spec, spec.GetRunDir())
	typeOnSerial(t, paths.Serial, "S")
	waitQEMUStatus(t, paths.QMP, "shutdown")

	b := newTestDriver(t, stateDir)
	hb := inProcess(t, b)
	st, err := hb.Recover(ctx, handle)
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if st.GetState() != hypervisorv1.State_STATE_RUNNING || st.GetPid() != before.GetPid() {
		t.Fatalf("recovered status = %v, want RUNNING with pid %d", st, before.GetPid())
	}
	outB, _, _ := attachConsole(t, hb, spec.GetId())
	outB.waitCount(t, BootSectorMarker, 1, 30*time.Second)
	if st := waitState(t, hb, spec.GetId(), hypervisorv1.State_STATE_RUNNING, 5*time.Second); st.GetBoots() != before.GetBoots()+1 {
		t.Fatalf("boots after the finished soft reboot = %d, want %d", st.GetBoots(), before.GetBoots()+1)
	}
	if qs := queryStatus(t, b, spec.GetId()); qs != "running" {
		t.Fatalf("QEMU after the finished soft reboot is %q", qs)
	}
}

// typeOnSerial writes text to a VM's serial socket, which has no driver attached.
func typeOnSerial(t *testing.T, path, text string) {
	t.Helper()
	conn, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		t.Fatalf("connect to the serial socket: %v", err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, text); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // let QEMU read it before the connection closes
}

// waitQEMUStatus polls query-status on a QMP socket no driver holds until QEMU's run state is
// want, and lets go of the socket.
func waitQEMUStatus(t *testing.T, path, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mon, err := DialQMP(ctx, path)
	if err != nil {
		t.Fatalf("connect to QMP: %v", err)
	}
	defer mon.Close()
	var got string
	for ctx.Err() == nil {
		raw, err := mon.Run(ctx, "query-status", nil)
		if err != nil {
			t.Fatalf("query-status: %v", err)
		}
		var qs struct {
			Status string `json:"status"`
		}
		if err := json.Unmarshal(raw, &qs); err != nil {
			t.Fatal(err)
		}
		if got = qs.Status; got == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("QEMU's run state is %q, want %q", got, want)
}

// recordingMonitor answers every command and records it; it delivers no events. With hold
// set, commands wait until it is closed: QEMU answers a command only after the events its main
// loop emitted before it.
type recordingMonitor struct {
	mu   sync.Mutex
	cmds []string
	hold chan struct{}
}

func (m *recordingMonitor) Run(ctx context.Context, command string, _ any) (json.RawMessage, error) {
	if m.hold != nil {
		select {
		case <-m.hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cmds = append(m.cmds, command)
	return json.RawMessage(`{}`), nil
}
func (m *recordingMonitor) Events() <-chan qmp.Event { return nil }
func (m *recordingMonitor) Close() error             { return nil }
func (m *recordingMonitor) commands() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.cmds)
}

// TestSoftRebootRepeatedPowerOff: a guest that writes its power-off twice before its vCPU stops
// (QEMU reports SHUTDOWN, STOP, SHUTDOWN: seen under load with the boot-sector guest) is booted
// again once, and the VM stays RUNNING throughout: the second SHUTDOWN is the same power-off.
func TestSoftRebootRepeatedPowerOff(t *testing.T) {
	d := New()
	// The power-off's events all come before QEMU answers our system_reset (it stops the vCPU
	// and emits STOP in the main-loop pass that emits SHUTDOWN): held until they are applied.
	mon := &recordingMonitor{hold: make(chan struct{})}
	s := &session{mon: mon}
	v := &vm{id: "twice", state: hypervisorv1.State_STATE_RUNNING, sess: s, changed: make(chan struct{})}
	v.rec.SoftReboot = true
	off := qmp.Event{Event: "SHUTDOWN", Data: map[string]any{"guest": true, "reason": "guest-shutdown"}}
	for _, e := range []qmp.Event{{Event: "POWERDOWN"}, off, {Event: "STOP"}, off} {
		v.mu.Lock()
		d.applyLocked(v, s, e)
		st := v.state
		v.mu.Unlock()
		if st != hypervisorv1.State_STATE_RUNNING {
			t.Fatalf("after %s: state %s, want RUNNING", e.Event, st)
		}
	}
	close(mon.hold)
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(mon.commands(), []string{"system_reset", "cont", "set-action"}) {
		if time.Now().After(deadline) {
			t.Fatalf("QMP commands %v, want one system_reset, cont, set-action", mon.commands())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Our reset is the guest's reboot: one boot more, the VM RUNNING.
	v.mu.Lock()
	d.applyLocked(v, s, qmp.Event{Event: "RESET", Data: map[string]any{"guest": false, "reason": "host-qmp-system-reset"}})
	boots, st := v.rec.Boots, v.state
	v.mu.Unlock()
	if boots != 1 || st != hypervisorv1.State_STATE_RUNNING {
		t.Fatalf("after the reset: boots %d, state %s; want 1, RUNNING", boots, st)
	}
}
