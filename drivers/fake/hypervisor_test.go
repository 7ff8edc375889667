package fake_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/drivers/fake"
)

func configure(t *testing.T, d interface {
	Configure(context.Context, *basev1.ConfigureRequest) error
}, config string) {
	t.Helper()
	if err := d.Configure(t.Context(), &basev1.ConfigureRequest{Config: []byte(config)}); err != nil {
		t.Fatalf("Configure(%s): %v", config, err)
	}
}

func spec(id, runDir string) *domainv1.DomainSpec {
	return &domainv1.DomainSpec{Id: id, Memory: &domainv1.Memory{GuestBytes: 64 << 20}, RunDir: runDir}
}

// started returns a fake hypervisor configured with config and a VM started on it.
func started(t *testing.T, config string) (*fake.Hypervisor, *hypervisorv1.Handle) {
	t.Helper()
	h := fake.NewHypervisor()
	configure(t, h, config)
	handle, err := h.Create(t.Context(), spec("vm", t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(t.Context(), "vm"); err != nil {
		t.Fatal(err)
	}
	return h, handle
}

func expectCode(t *testing.T, err error, want codes.Code, contains string) {
	t.Helper()
	if status.Code(err) != want || !strings.Contains(status.Convert(err).Message(), contains) {
		t.Errorf("got %v, want %s containing %q", err, want, contains)
	}
}

func vmState(t *testing.T, h *fake.Hypervisor, id string) *hypervisorv1.VMStatus {
	t.Helper()
	st, err := h.Status(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestShutdownKnobs(t *testing.T) {
	for _, c := range []struct {
		name         string
		config       string
		pause        bool
		timeout      time.Duration
		wantGraceful bool
		wantReason   string
		minElapsed   time.Duration
	}{
		{"Default", ``, false, time.Second, true, driver.ReasonGuestShutdown, 0},
		{"IgnoreShutdown", `{"ignoreShutdown": true}`, false, 50 * time.Millisecond, false, driver.ReasonForcedShutdown, 50 * time.Millisecond},
		{"SlowGuestInTime", `{"shutdownDelay": "30ms"}`, false, time.Second, true, driver.ReasonGuestShutdown, 30 * time.Millisecond},
		{"SlowGuestTooSlow", `{"shutdownDelay": "1s"}`, false, 30 * time.Millisecond, false, driver.ReasonForcedShutdown, 30 * time.Millisecond},
		{"PausedGuest", ``, true, time.Second, true, driver.ReasonGuestShutdown, 0},
		{"TimeoutZero", ``, false, 0, false, driver.ReasonForcedShutdown, 0},
		{"PausedTimeoutZero", ``, true, 0, false, driver.ReasonForcedShutdown, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, _ := started(t, c.config)
			if c.pause {
				if err := h.Pause(t.Context(), "vm"); err != nil {
					t.Fatal(err)
				}
			}
			begin := time.Now()
			graceful, err := h.Shutdown(t.Context(), "vm", c.timeout)
			elapsed := time.Since(begin)
			if err != nil {
				t.Fatal(err)
			}
			st := vmState(t, h, "vm")
			if graceful != c.wantGraceful || st.GetState() != hypervisorv1.State_STATE_STOPPED || st.GetReason() != c.wantReason {
				t.Errorf("graceful=%v state %s reason %q, want graceful=%v STOPPED %q", graceful, st.GetState(), st.GetReason(), c.wantGraceful, c.wantReason)
			}
			if elapsed < c.minElapsed {
				t.Errorf("Shutdown returned after %s, before %s", elapsed, c.minElapsed)
			}
		})
	}
}

func TestShutdownConcurrentCallsWaitTogether(t *testing.T) {
	h, _ := started(t, `{"shutdownDelay": "30ms"}`)
	var wg sync.WaitGroup
	results := make([]bool, 3)
	for i := range results {
		wg.Go(func() {
			graceful, err := h.Shutdown(t.Context(), "vm", time.Second)
			if err != nil {
				t.Error(err)
			}
			results[i] = graceful
		})
	}
	wg.Wait()
	for i, g := range results {
		if !g {
			t.Errorf("Shutdown %d reported graceful=false", i)
		}
	}
}

func TestBootDelay(t *testing.T) {
	h := fake.NewHypervisor()
	configure(t, h, `{"bootDelay": "40ms"}`)
	if _, err := h.Create(t.Context(), spec("vm", "")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
	defer cancel()
	expectCode(t, h.Start(ctx, "vm"), codes.DeadlineExceeded, "")
	if st := vmState(t, h, "vm"); st.GetState() != hypervisorv1.State_STATE_CREATED {
		t.Errorf("after an abandoned boot the VM is %s, want CREATED", st.GetState())
	}
	begin := time.Now()
	if err := h.Start(t.Context(), "vm"); err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(begin); elapsed < 40*time.Millisecond {
		t.Errorf("Start took %s, want at least the boot delay", elapsed)
	}
	begin = time.Now()
	if err := h.Reboot(t.Context(), "vm"); err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(begin); elapsed < 40*time.Millisecond {
		t.Errorf("Reboot took %s, want at least the boot delay", elapsed)
	}
	if st := vmState(t, h, "vm"); st.GetBoots() != 2 {
		t.Errorf("boots = %d, want 2", st.GetBoots())
	}
}

func TestConfigureRejects(t *testing.T) {
	for _, config := range []string{`{"ignoreShutdwn": true}`, `{"bootDelay": 5}`, `{"bootDelay": "-1s"}`, `{} {}`, `[`} {
		err := fake.NewHypervisor().Configure(t.Context(), &basev1.ConfigureRequest{Config: []byte(config)})
		expectCode(t, err, codes.InvalidArgument, "config")
	}
}

func TestCreateValidation(t *testing.T) {
	h := fake.NewHypervisor()
	for _, c := range []struct {
		name  string
		spec  *domainv1.DomainSpec
		code  codes.Code
		field string
	}{
		{"NoMemory", &domainv1.DomainSpec{Id: "a"}, codes.InvalidArgument, "memory.guestBytes"},
		// Acceleration the node lacks is the node's state, not the spec's fault.
		{"Acceleration", &domainv1.DomainSpec{Id: "b", Memory: &domainv1.Memory{GuestBytes: 1}, Acceleration: domainv1.Acceleration_ACCELERATION_REQUIRED}, codes.FailedPrecondition, "acceleration"},
		{"NICModel", &domainv1.DomainSpec{Id: "c", Memory: &domainv1.Memory{GuestBytes: 1}, Nics: []*domainv1.NIC{{Name: "n", TapName: "tap0", Mac: "02:00:00:00:00:01", Model: "ne2k"}}}, codes.InvalidArgument, "nics[0].model"},
		{"RunDirMissing", spec("d", "/nonexistent/kubevisor/run"), codes.InvalidArgument, "runDir"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := h.Create(t.Context(), c.spec)
			expectCode(t, err, c.code, c.field)
		})
	}
}

func TestConsoleReplaysBootLogAndEchoes(t *testing.T) {
	h, _ := started(t, ``)
	if err := h.Reboot(t.Context(), "vm"); err != nil {
		t.Fatal(err)
	}
	type session struct {
		out  *lockedBuffer
		in   *io.PipeWriter
		done chan error
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	attach := func() session {
		r, w := io.Pipe()
		s := session{out: &lockedBuffer{}, in: w, done: make(chan error, 1)}
		go func() { s.done <- h.Console(ctx, "vm", r, s.out) }()
		t.Cleanup(func() { _ = w.Close() })
		return s
	}
	a, b := attach(), attach()
	waitFor(t, func() bool { return strings.Count(b.out.String(), fake.ConsoleMarker) == 2 })
	if _, err := io.WriteString(a.in, "root\n"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []session{a, b} {
		waitFor(t, func() bool { return strings.HasSuffix(s.out.String(), fake.ConsoleMarker+" root\n") })
		if !strings.Contains(s.out.String(), "boot 2") {
			t.Errorf("console lacks the second boot's log: %q", s.out.String())
		}
	}
	// Closing the input ends that console only.
	_ = a.in.Close()
	if err := <-a.done; err != nil {
		t.Errorf("Console after its input ended: %v", err)
	}
	if err := h.Kill(t.Context(), "vm"); err != nil {
		t.Fatal(err)
	}
	if err := <-b.done; err != nil {
		t.Errorf("Console after the VM stopped: %v", err)
	}
	expectCode(t, h.Console(t.Context(), "vm", nil, io.Discard), codes.FailedPrecondition, "not running")
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestRecover(t *testing.T) {
	t.Run("Running", func(t *testing.T) {
		h, handle := started(t, ``)
		if err := h.Pause(t.Context(), "vm"); err != nil {
			t.Fatal(err)
		}
		st, err := fake.NewHypervisor().Recover(t.Context(), handle)
		if err != nil || st.GetState() != hypervisorv1.State_STATE_PAUSED || st.GetBoots() != 1 {
			t.Errorf("Recover = %v, %v; want PAUSED with 1 boot", st, err)
		}
	})
	t.Run("NoRunDir", func(t *testing.T) {
		h := fake.NewHypervisor()
		handle, err := h.Create(t.Context(), spec("vm", ""))
		if err != nil {
			t.Fatal(err)
		}
		h2 := fake.NewHypervisor()
		st, err := h2.Recover(t.Context(), handle)
		if err != nil || st.GetState() != hypervisorv1.State_STATE_STOPPED || st.GetReason() != driver.ReasonProcessGone {
			t.Errorf("Recover = %v, %v; want STOPPED %s", st, err, driver.ReasonProcessGone)
		}
		if err := h2.Delete(t.Context(), "vm"); err != nil {
			t.Errorf("Delete of a VM recovered as gone: %v", err)
		}
	})
	t.Run("UnreadableState", func(t *testing.T) {
		_, err := fake.NewHypervisor().Recover(t.Context(), &hypervisorv1.Handle{Id: "vm", State: []byte("not json")})
		expectCode(t, err, codes.InvalidArgument, "handle.state")
		_, err = fake.NewHypervisor().Recover(t.Context(), &hypervisorv1.Handle{Id: "other", State: []byte(`{"id": "vm"}`)})
		expectCode(t, err, codes.InvalidArgument, "handle.state")
	})
	t.Run("SameProcess", func(t *testing.T) {
		h, handle := started(t, ``)
		st, err := h.Recover(t.Context(), handle)
		if err != nil || st.GetState() != hypervisorv1.State_STATE_RUNNING {
			t.Errorf("Recover in the same process = %v, %v; want RUNNING", st, err)
		}
	})
}

func TestMigrate(t *testing.T) {
	h, _ := started(t, ``)
	expectCode(t, h.Migrate(t.Context(), &hypervisorv1.MigrateRequest{Id: "vm"}), codes.InvalidArgument, "target_uri")
	expectCode(t, h.Migrate(t.Context(), &hypervisorv1.MigrateRequest{Id: "nope", TargetUri: "tcp:x:1"}), codes.NotFound, "nope")
	if err := h.Migrate(t.Context(), &hypervisorv1.MigrateRequest{Id: "vm", TargetUri: "tcp:x:1"}); err != nil {
		t.Fatal(err)
	}
	if st := vmState(t, h, "vm"); st.GetState() != hypervisorv1.State_STATE_STOPPED || st.GetReason() != driver.ReasonMigrated {
		t.Errorf("after Migrate: %v", st)
	}
	expectCode(t, h.Migrate(t.Context(), &hypervisorv1.MigrateRequest{Id: "vm", TargetUri: "tcp:x:1"}), codes.FailedPrecondition, "not running")
	info, err := h.MigrationStatus(t.Context(), "vm")
	if err != nil || info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED || info.GetRole() != hypervisorv1.MigrationRole_MIGRATION_ROLE_SOURCE {
		t.Errorf("MigrationStatus after Migrate = %v, %v; want a completed migration out", info, err)
	}
	expectCode(t, h.CancelMigration(t.Context(), "vm"), codes.FailedPrecondition, "migrated")
	_, err = h.MigrationStatus(t.Context(), "nope")
	expectCode(t, err, codes.NotFound, "nope")
}

func TestStateMachineRefusals(t *testing.T) {
	h := fake.NewHypervisor()
	if _, err := h.Create(t.Context(), spec("vm", "")); err != nil {
		t.Fatal(err)
	}
	expectCode(t, h.Pause(t.Context(), "vm"), codes.FailedPrecondition, "created")
	expectCode(t, h.Resume(t.Context(), "vm"), codes.FailedPrecondition, "created")
	expectCode(t, h.Reboot(t.Context(), "vm"), codes.FailedPrecondition, "created")
	if graceful, err := h.Shutdown(t.Context(), "vm", time.Second); err != nil || graceful {
		t.Errorf("Shutdown of a created VM = %v, %v, want false, nil", graceful, err)
	}
	_, err := h.Shutdown(t.Context(), "nope", time.Second)
	expectCode(t, err, codes.NotFound, "nope")
	expectCode(t, h.Kill(t.Context(), "nope"), codes.NotFound, "nope")
	expectCode(t, h.Start(t.Context(), "nope"), codes.NotFound, "nope")
}

// TestEventsFanOut checks that every stream gets the events it asked for, in order.
func TestEventsFanOut(t *testing.T) {
	h := fake.NewHypervisor()
	ctx, cancel := context.WithCancel(t.Context())
	type stream struct {
		mu     sync.Mutex
		events []string
		done   chan error
	}
	watch := func(id string) *stream {
		s := &stream{done: make(chan error, 1)}
		go func() {
			s.done <- h.Events(ctx, id, func(e *hypervisorv1.Event) error {
				s.mu.Lock()
				defer s.mu.Unlock()
				s.events = append(s.events, e.GetId()+":"+strings.TrimPrefix(e.GetType().String(), "EVENT_TYPE_"))
				return nil
			})
		}()
		return s
	}
	all1, all2, ofA := watch(""), watch(""), watch("a")
	get := func(s *stream) string {
		s.mu.Lock()
		defer s.mu.Unlock()
		return strings.Join(s.events, " ")
	}
	cycle := func(id string) {
		if err := h.Start(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if err := h.Kill(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"a", "b"} {
		if _, err := h.Create(t.Context(), spec(id, "")); err != nil {
			t.Fatal(err)
		}
	}
	// The streams register asynchronously: cycle a until every stream has seen it.
	waitFor(t, func() bool {
		cycle("a")
		time.Sleep(time.Millisecond)
		return strings.Contains(get(all1), "a:STOPPED") && strings.Contains(get(all2), "a:STOPPED") && strings.Contains(get(ofA), "a:STOPPED")
	})
	cycle("b")
	cycle("a")
	want := "b:STARTED b:STOPPED a:STARTED a:STOPPED"
	waitFor(t, func() bool {
		return strings.HasSuffix(get(all1), want) && strings.HasSuffix(get(all2), want) && strings.HasSuffix(get(ofA), "a:STOPPED a:STARTED a:STOPPED")
	})
	if strings.Contains(get(ofA), "b:") {
		t.Errorf("the stream of VM a got events of b: %s", get(ofA))
	}
	cancel()
	for _, s := range []*stream{all1, all2, ofA} {
		if err := <-s.done; err != nil {
			t.Errorf("Events after cancel: %v", err)
		}
	}
}

// TestConcurrentUse drives many VMs at once; run with -race.
func TestConcurrentUse(t *testing.T) {
	h := fake.NewHypervisor()
	configure(t, h, `{"shutdownDelay": "1ms"}`)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = h.Events(ctx, "", func(*hypervisorv1.Event) error { return nil }) }()
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			id := fmt.Sprintf("vm-%d", i)
			steps := []func() error{
				func() error { _, err := h.Create(t.Context(), spec(id, t.TempDir())); return err },
				func() error { return h.Start(t.Context(), id) },
				func() error { return h.Pause(t.Context(), id) },
				func() error { return h.Resume(t.Context(), id) },
				func() error { return h.Reboot(t.Context(), id) },
				func() error { _, err := h.Shutdown(t.Context(), id, time.Second); return err },
				func() error { return h.Delete(t.Context(), id) },
			}
			for j, step := range steps {
				if err := step(); err != nil {
					t.Errorf("%s step %d: %v", id, j, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestSimulatedEverywhere(t *testing.T) {
	type drv interface {
		Info(context.Context) (*basev1.InfoResponse, error)
		Fingerprint(context.Context, func(*basev1.FingerprintResponse) error) error
	}
	for _, d := range []drv{fake.NewHypervisor(), fake.NewNetwork(), fake.NewStorage(), fake.NewDevice()} {
		info, _ := d.Info(t.Context())
		if !strings.HasPrefix(info.GetDescription(), "simulated") {
			t.Errorf("%T: description %q does not say simulated", d, info.GetDescription())
		}
		ctx, cancel := context.WithCancel(t.Context())
		var fp *basev1.FingerprintResponse
		_ = d.Fingerprint(ctx, func(m *basev1.FingerprintResponse) error { fp = m; cancel(); return nil })
		if fp.GetAttributes()[fake.SimulatedAttribute] != "true" || fp.GetHealth() != basev1.Health_HEALTH_HEALTHY {
			t.Errorf("%T: fingerprint %v, want healthy and simulated=true", d, fp)
		}
	}
}

func configReq(config string) *basev1.ConfigureRequest {
	return &basev1.ConfigureRequest{Config: []byte(config)}
}

// TestHostDevicesShown: the simulated guest takes every host device, PCI function or not, and
// shows each in its record file and as a line of its boot log on the console.
func TestHostDevicesShown(t *testing.T) {
	h := fake.NewHypervisor()
	dir := t.TempDir()
	s := spec("vm", dir)
	s.HostDevices = []*domainv1.HostDevice{
		{Name: "sim", Resource: "example-sim", DeviceIds: []string{"sim-2"}, DeviceDriver: "sim",
			DeviceNodes: []*domainv1.HostDeviceNode{{Path: "/dev/null", HostPath: "/dev/null", Permissions: "rw"}},
			Env:         map[string]string{"SIM_DEVICES": "sim-2"}},
		{Name: "gpu", PciAddress: "0000:01:00.0", Resource: "gpu", DeviceIds: []string{"0000:01:00.0"}},
	}
	if _, err := h.Create(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	if err := h.Start(t.Context(), "vm"); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, fake.RecordFile))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Devices []fake.RecordedHostDevice `json:"devices"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	want := []fake.RecordedHostDevice{
		{Name: "sim", Resource: "example-sim", DeviceIDs: []string{"sim-2"}, DeviceDriver: "sim", DeviceNodes: []string{"/dev/null"}, Env: map[string]string{"SIM_DEVICES": "sim-2"}},
		{Name: "gpu", PCIAddress: "0000:01:00.0", Resource: "gpu", DeviceIDs: []string{"0000:01:00.0"}},
	}
	if !reflect.DeepEqual(rec.Devices, want) {
		t.Errorf("record devices = %+v, want %+v", rec.Devices, want)
	}
	out := &lockedBuffer{}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = h.Console(ctx, "vm", nil, out) }()
	waitFor(t, func() bool { return strings.Contains(out.String(), fake.ConsoleMarker) })
	for _, line := range []string{"hostdev sim resource=example-sim id=sim-2\r\n", "hostdev gpu resource=gpu id=0000:01:00.0 pci=0000:01:00.0\r\n"} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("boot log lacks %q:\n%s", line, out.String())
		}
	}
}

func TestMigrateDisks(t *testing.T) {
	h, _ := started(t, ``)
	disks := []*hypervisorv1.MigrateDisk{{Name: "containerdisk", TopOnly: true}, {Name: "emptydisk"}}
	expectCode(t, h.Migrate(t.Context(), &hypervisorv1.MigrateRequest{Id: "vm", TargetSocketPath: "/m.sock", Disks: disks}), codes.InvalidArgument, "target_disks_socket_path")
	if err := h.Migrate(t.Context(), &hypervisorv1.MigrateRequest{Id: "vm", TargetSocketPath: "/m.sock", TargetDisksSocketPath: "/d.sock", Disks: disks}); err != nil {
		t.Fatal(err)
	}
	info, err := h.MigrationStatus(t.Context(), "vm")
	if err != nil || info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED || len(info.GetDisks()) != 2 ||
		!info.GetDisks()[0].GetTopOnly() || !info.GetDisks()[1].GetReady() || info.GetDiskTransferredBytes() != 2<<20 {
		t.Errorf("MigrationStatus after a Migrate with two disks = %v, %v; want both copied", info, err)
	}
}
