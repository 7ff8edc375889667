package conformance

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// Hypervisor runs the conformance checks of a hypervisor driver as subtests of t: the checks
// of every driver, then
//
//	Lifecycle/CreateStartStatusShutdownDelete
//	Create/AlreadyExists, Create/InvalidSpec
//	Status/NotFound
//	Unknown/NotFound                    (every operation of an unknown id, optional ones declared)
//	Delete/Running, Delete/Unknown
//	Kill
//	Shutdown/Idempotent, Shutdown/TimeoutZero
//	Shutdown/Paused                     (FEATURE_HYPERVISOR_PAUSE)
//	Events/StartStop, Events/Sequence
//	Pause/PauseResume, Pause/NotRunning (FEATURE_HYPERVISOR_PAUSE)
//	Reboot/SecondBoot, Reboot/NotRunning (FEATURE_HYPERVISOR_REBOOT)
//	SoftReboot/NotRunning               (FEATURE_HYPERVISOR_SOFT_REBOOT; the VM suite boots a
//	                                    guest that answers it: SoftReboot/BootsAgain)
//	GuestAgent/NotRunning               (FEATURE_HYPERVISOR_GUEST_AGENT)
//	GuestExec/NotRunning, GuestExec/NoCommand
//	                                    (FEATURE_HYPERVISOR_GUEST_EXEC)
//	Console/Output, Console/EndsOnStop, Console/BeforeStart, Console/SeveralReaders
//	                                    (FEATURE_HYPERVISOR_CONSOLE; SeveralReaders needs WithConsoleMarker)
//	Recover/Running, Recover/Created, Recover/Stopped, Recover/Gone
//	                                    (FEATURE_HYPERVISOR_RECOVER, and WithRestart)
//
// The VMs it creates come from Options.Domain (DefaultDomain unless WithDomain) and are killed
// and deleted when their check ends. What each check asks is the contract of driver.Hypervisor
// and its optional interfaces.
func Hypervisor(t T, f HypervisorFactory, opts ...Option) {
	t.Helper()
	s := &hvSuite{
		suite: newSuite(t, basev1.Kind_KIND_HYPERVISOR, func(t T) driver.Driver { return nilIfNil(f(t)) }, opts),
		newHV: f,
	}
	s.baseChecks(t)
	t.Run("Lifecycle", func(t T) {
		t.Run("CreateStartStatusShutdownDelete", s.checkLifecycle)
	})
	t.Run("Create", func(t T) {
		t.Run("AlreadyExists", s.checkCreateAlreadyExists)
		t.Run("InvalidSpec", s.checkCreateInvalidSpec)
	})
	t.Run("Status", func(t T) {
		t.Run("NotFound", s.checkStatusNotFound)
	})
	t.Run("Unknown", func(t T) {
		t.Run("NotFound", s.checkUnknownNotFound)
	})
	t.Run("Delete", func(t T) {
		t.Run("Running", s.checkDeleteRunning)
		t.Run("Unknown", s.checkDeleteUnknown)
	})
	t.Run("Kill", s.checkKill)
	t.Run("Shutdown", func(t T) {
		t.Run("Idempotent", s.checkShutdownIdempotent)
		t.Run("TimeoutZero", s.checkShutdownTimeoutZero)
		t.Run("Paused", s.checkShutdownPaused)
	})
	t.Run("Events", func(t T) {
		t.Run("StartStop", s.checkEventsStartStop)
		t.Run("Sequence", s.checkEventsSequence)
	})
	t.Run("Pause", func(t T) {
		t.Run("PauseResume", s.checkPauseResume)
		t.Run("NotRunning", s.checkPauseNotRunning)
	})
	t.Run("Reboot", func(t T) {
		t.Run("SecondBoot", s.checkRebootSecondBoot)
		t.Run("NotRunning", s.checkRebootNotRunning)
	})
	t.Run("SoftReboot", func(t T) {
		t.Run("NotRunning", s.checkSoftRebootNotRunning)
	})
	t.Run("GuestAgent", func(t T) {
		t.Run("NotRunning", s.checkGuestAgentNotRunning)
	})
	t.Run("GuestExec", func(t T) {
		t.Run("NotRunning", s.checkGuestExecNotRunning)
		t.Run("NoCommand", s.checkGuestExecNoCommand)
	})
	t.Run("Console", func(t T) {
		t.Run("Output", s.checkConsoleOutput)
		t.Run("EndsOnStop", s.checkConsoleEndsOnStop)
		t.Run("BeforeStart", s.checkConsoleBeforeStart)
		t.Run("SeveralReaders", s.checkConsoleSeveralReaders)
	})
	t.Run("Recover", func(t T) {
		t.Run("Running", s.checkRecoverRunning)
		t.Run("Created", s.checkRecoverCreated)
		t.Run("Stopped", s.checkRecoverStopped)
		t.Run("Gone", s.checkRecoverGone)
	})
}

// nilIfNil turns a nil driver of a kind's interface into a nil driver.Driver.
func nilIfNil[D driver.Driver](d D) driver.Driver {
	if any(d) == nil {
		return nil
	}
	return d
}

type hvSuite struct {
	*suite
	newHV HypervisorFactory
}

// hypervisor returns the configured hypervisor under test.
func (s *hvSuite) hypervisor(t T) driver.Hypervisor {
	t.Helper()
	return s.driver(t).(driver.Hypervisor)
}

// testVM is a VM a check created, deleted when the check ends by whichever driver d is then.
type testVM struct {
	id     string
	handle *hypervisorv1.Handle
	d      driver.Hypervisor
}

// create creates a VM from Options.Domain.
func (s *hvSuite) create(t T, d driver.Hypervisor) *testVM {
	t.Helper()
	id := newID()
	spec := s.opts.Domain(id, t.TempDir())
	if spec.GetId() != id {
		t.Fatalf("the domain spec from WithDomain has id %q, want %q", spec.GetId(), id)
	}
	handle, err := d.Create(s.ctx(t), spec)
	if err != nil {
		t.Fatalf("Create: %s", describe(err))
	}
	vm := &testVM{id: id, handle: handle, d: d}
	t.Cleanup(func() { s.remove(t, vm) })
	return vm
}

// createStarted creates a VM and starts it.
func (s *hvSuite) createStarted(t T, d driver.Hypervisor) *testVM {
	t.Helper()
	vm := s.create(t, d)
	if err := d.Start(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Start of a created VM: %s", describe(err))
	}
	return vm
}

// remove kills and deletes a VM at the end of a check.
func (s *hvSuite) remove(t T, vm *testVM) {
	ctx, cancel := s.cleanupCtx()
	defer cancel()
	if err := vm.d.Kill(ctx, vm.id); err != nil && status.Code(err) != codes.NotFound {
		t.Logf("cleanup: Kill %s: %s", vm.id, describe(err))
	}
	if err := vm.d.Delete(ctx, vm.id); err != nil {
		t.Logf("cleanup: Delete %s: %s", vm.id, describe(err))
	}
}

// status returns the status of a VM, failing the check if Status fails.
func (s *hvSuite) status(t T, d driver.Hypervisor, id string) *hypervisorv1.VMStatus {
	t.Helper()
	st, err := d.Status(s.ctx(t), id)
	if err != nil {
		t.Fatalf("Status: %s", describe(err))
	}
	if st.GetId() != id {
		t.Errorf("Status of VM %q reports id %q", id, st.GetId())
	}
	return st
}

// expectState fails the check unless the VM is in state want; it returns the status.
func (s *hvSuite) expectState(t T, d driver.Hypervisor, id string, want hypervisorv1.State, after string) *hypervisorv1.VMStatus {
	t.Helper()
	st := s.status(t, d, id)
	if st.GetState() != want {
		t.Errorf("after %s the VM is %s (reason %q, message %q), want %s", after, st.GetState(), st.GetReason(), st.GetMessage(), want)
	}
	return st
}

// checkLifecycle: a VM goes created → running → stopped → gone, and Start is idempotent.
func (s *hvSuite) checkLifecycle(t T) {
	d := s.hypervisor(t)
	vm := s.create(t, d)
	switch {
	case vm.handle == nil:
		t.Errorf("Create returned no handle")
	case vm.handle.GetId() != vm.id:
		t.Errorf("Create returned a handle of VM %q, want %q", vm.handle.GetId(), vm.id)
	}
	st := s.expectState(t, d, vm.id, hypervisorv1.State_STATE_CREATED, "Create")
	if st.GetBoots() != 0 {
		t.Errorf("a created VM reports %d boots, want 0", st.GetBoots())
	}

	if err := d.Start(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Start of a created VM: %s", describe(err))
	}
	st = s.expectState(t, d, vm.id, hypervisorv1.State_STATE_RUNNING, "Start")
	boots := st.GetBoots()
	if boots < 1 {
		t.Errorf("a started VM reports %d boots, want at least 1", boots)
	}
	if st.GetStartedAt() == nil {
		t.Logf("note: a running VM reports no started_at")
	}

	if err := d.Start(s.ctx(t), vm.id); err != nil {
		t.Errorf("Start of a running VM: %s, want success", describe(err))
	}
	st = s.expectState(t, d, vm.id, hypervisorv1.State_STATE_RUNNING, "a second Start")
	if st.GetBoots() != boots {
		t.Errorf("a second Start of a running VM changed boots from %d to %d: it must not boot it again", boots, st.GetBoots())
	}

	graceful, err := d.Shutdown(s.ctx(t), vm.id, s.opts.ShutdownTimeout)
	if err != nil {
		t.Fatalf("Shutdown: %s", describe(err))
	}
	t.Logf("Shutdown graceful=%v", graceful)
	s.expectState(t, d, vm.id, hypervisorv1.State_STATE_STOPPED, "Shutdown returned")

	if err := d.Delete(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Delete of a stopped VM: %s", describe(err))
	}
	_, err = d.Status(s.ctx(t), vm.id)
	expectCode(t, err, codes.NotFound, "Status of a deleted VM")
}

// checkCreateAlreadyExists: creating an id twice is AlreadyExists and leaves the VM as it was.
func (s *hvSuite) checkCreateAlreadyExists(t T) {
	d := s.hypervisor(t)
	vm := s.createStarted(t, d)
	_, err := d.Create(s.ctx(t), s.opts.Domain(vm.id, t.TempDir()))
	expectCode(t, err, codes.AlreadyExists, "Create of an id that exists")
	s.expectState(t, d, vm.id, hypervisorv1.State_STATE_RUNNING, "a second Create of a running VM's id")
}

// checkCreateInvalidSpec: a spec that breaks domain.Validate is InvalidArgument naming the
// field, and creates nothing.
func (s *hvSuite) checkCreateInvalidSpec(t T) {
	d := s.hypervisor(t)
	// Each case breaks one rule of domain.Validate and returns the field paths of which the
	// error must name one.
	cases := []struct {
		name   string
		mutate func(spec *domainv1.DomainSpec) []string
	}{
		{"no memory", func(spec *domainv1.DomainSpec) []string {
			spec.Memory = nil
			return []string{"memory.guestBytes", "memory.guest_bytes"}
		}},
		{"a relative disk path", func(spec *domainv1.DomainSpec) []string {
			spec.Disks = append(spec.Disks, &domainv1.Disk{Name: "conformance-relative", Path: "relative/disk.img"})
			return []string{fmt.Sprintf("disks[%d].path", len(spec.Disks)-1)}
		}},
		{"a multicast MAC", func(spec *domainv1.DomainSpec) []string {
			spec.Nics = append(spec.Nics, &domainv1.NIC{Name: "conformance-multicast", TapName: "tapconformance", Mac: "03:00:00:00:00:01"})
			return []string{fmt.Sprintf("nics[%d].mac", len(spec.Nics)-1)}
		}},
		{"no id", func(spec *domainv1.DomainSpec) []string {
			spec.Id = ""
			return nil
		}},
	}
	for _, c := range cases {
		id := newID()
		spec := s.opts.Domain(id, t.TempDir())
		fields := c.mutate(spec)
		handle, err := d.Create(s.ctx(t), spec)
		if err == nil {
			t.Cleanup(func() { s.remove(t, &testVM{id: id, handle: handle, d: d}) })
		}
		what := "Create of a spec with " + c.name
		if expectCode(t, err, codes.InvalidArgument, what) && len(fields) > 0 {
			expectMessageNames(t, err, what, fields...)
		}
		if spec.GetId() != "" {
			_, err := d.Status(s.ctx(t), id)
			expectCode(t, err, codes.NotFound, "Status after a rejected "+what)
		}
	}
}

// checkStatusNotFound: Status of an unknown id is NotFound.
func (s *hvSuite) checkStatusNotFound(t T) {
	d := s.hypervisor(t)
	_, err := d.Status(s.ctx(t), newID())
	expectCode(t, err, codes.NotFound, "Status of an unknown VM")
}

// checkUnknownNotFound: every operation of an unknown id but Create and Delete is NotFound, the
// optional ones the driver declares too.
func (s *hvSuite) checkUnknownNotFound(t T) {
	d := s.hypervisor(t)
	ctx := s.ctx(t)
	id := newID()
	expectCode(t, d.Start(ctx, id), codes.NotFound, "Start of an unknown VM")
	_, err := d.Shutdown(ctx, id, s.opts.ShutdownTimeout)
	expectCode(t, err, codes.NotFound, "Shutdown of an unknown VM")
	expectCode(t, d.Kill(ctx, id), codes.NotFound, "Kill of an unknown VM")
	if p, ok := driver.Optional[driver.Pauser](ctx, d); ok {
		expectCode(t, p.Pause(ctx, id), codes.NotFound, "Pause of an unknown VM")
		expectCode(t, p.Resume(ctx, id), codes.NotFound, "Resume of an unknown VM")
	}
	if r, ok := driver.Optional[driver.Rebooter](ctx, d); ok {
		expectCode(t, r.Reboot(ctx, id), codes.NotFound, "Reboot of an unknown VM")
	}
	if r, ok := driver.Optional[driver.SoftRebooter](ctx, d); ok {
		expectCode(t, r.SoftReboot(ctx, id), codes.NotFound, "SoftReboot of an unknown VM")
	}
	if g, ok := driver.Optional[driver.GuestAgent](ctx, d); ok {
		_, err := g.GuestAgentInfo(ctx, id)
		expectCode(t, err, codes.NotFound, "GuestAgentInfo of an unknown VM")
	}
	if g, ok := driver.Optional[driver.GuestExecer](ctx, d); ok {
		_, err := g.GuestAgentPing(ctx, id)
		expectCode(t, err, codes.NotFound, "GuestAgentPing of an unknown VM")
		_, err = g.GuestAgentExec(ctx, id, []string{"true"}, time.Second)
		expectCode(t, err, codes.NotFound, "GuestAgentExec of an unknown VM")
	}
	if c, ok := driver.Optional[driver.Consoler](ctx, d); ok {
		cctx, cancel := context.WithTimeout(ctx, eventWithin)
		err := c.Console(cctx, id, nil, io.Discard)
		cancel()
		expectCode(t, err, codes.NotFound, "Console of an unknown VM")
	}
	if m, ok := driver.Optional[driver.Migrator](ctx, d); ok {
		expectCode(t, m.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: id, TargetSocketPath: "/nonexistent/migration.sock"}), codes.NotFound, "Migrate of an unknown VM")
		_, err := m.MigrationStatus(ctx, id)
		expectCode(t, err, codes.NotFound, "MigrationStatus of an unknown VM")
		expectCode(t, m.CancelMigration(ctx, id), codes.NotFound, "CancelMigration of an unknown VM")
	}
}

// checkDeleteRunning: deleting a running VM is FailedPrecondition and leaves it running.
func (s *hvSuite) checkDeleteRunning(t T) {
	d := s.hypervisor(t)
	vm := s.createStarted(t, d)
	err := d.Delete(s.ctx(t), vm.id)
	expectCode(t, err, codes.FailedPrecondition, "Delete of a running VM")
	s.expectState(t, d, vm.id, hypervisorv1.State_STATE_RUNNING, "a refused Delete")
}

// checkDeleteUnknown: deleting an unknown id succeeds.
func (s *hvSuite) checkDeleteUnknown(t T) {
	d := s.hypervisor(t)
	err := d.Delete(s.ctx(t), newID())
	expectCode(t, err, codes.OK, "Delete of an unknown VM")
}

// checkKill: Kill stops a running VM at once and succeeds on a stopped one.
func (s *hvSuite) checkKill(t T) {
	d := s.hypervisor(t)
	vm := s.createStarted(t, d)
	if err := d.Kill(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Kill of a running VM: %s", describe(err))
	}
	s.expectState(t, d, vm.id, hypervisorv1.State_STATE_STOPPED, "Kill returned")
	expectCode(t, d.Kill(s.ctx(t), vm.id), codes.OK, "Kill of a stopped VM")
	expectCode(t, d.Delete(s.ctx(t), vm.id), codes.OK, "Delete of a killed VM")
}

// checkShutdownIdempotent: Shutdown of a stopped VM succeeds with graceful false, and so does
// Shutdown of a created one, which stays created.
func (s *hvSuite) checkShutdownIdempotent(t T) {
	d := s.hypervisor(t)
	vm := s.createStarted(t, d)
	for i := 1; i <= 2; i++ {
		graceful, err := d.Shutdown(s.ctx(t), vm.id, s.opts.ShutdownTimeout)
		if err != nil {
			t.Fatalf("Shutdown, call %d: %s", i, describe(err))
		}
		s.expectState(t, d, vm.id, hypervisorv1.State_STATE_STOPPED, fmt.Sprintf("Shutdown call %d returned", i))
		if i == 2 && graceful {
			t.Errorf("Shutdown of a stopped VM returned graceful=true, want false: nothing powered off")
		}
	}
	created := s.create(t, d)
	graceful, err := d.Shutdown(s.ctx(t), created.id, s.opts.ShutdownTimeout)
	switch {
	case err != nil:
		t.Errorf("Shutdown of a created VM: %s, want success", describe(err))
	case graceful:
		t.Errorf("Shutdown of a created VM returned graceful=true, want false")
	}
	s.expectState(t, d, created.id, hypervisorv1.State_STATE_CREATED, "Shutdown of a created VM")
}

// checkShutdownTimeoutZero: Shutdown with a timeout of 0 stops the VM forcibly at once.
func (s *hvSuite) checkShutdownTimeoutZero(t T) {
	d := s.hypervisor(t)
	vm := s.createStarted(t, d)
	start := time.Now()
	graceful, err := d.Shutdown(s.ctx(t), vm.id, 0)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Shutdown with timeout 0: %s", describe(err))
	}
	if graceful {
		t.Errorf("Shutdown with timeout 0 returned graceful=true, want false: without grace the VM is forced off")
	}
	if took > shutdownZeroWithin {
		t.Errorf("Shutdown with timeout 0 took %s, more than %s: it must stop the VM at once", took.Round(time.Millisecond), shutdownZeroWithin)
	}
	st := s.expectState(t, d, vm.id, hypervisorv1.State_STATE_STOPPED, "Shutdown with timeout 0 returned")
	if st.GetReason() != driver.ReasonForcedShutdown {
		t.Errorf("after Shutdown with timeout 0 the reason is %q, want %q", st.GetReason(), driver.ReasonForcedShutdown)
	}
}

// shutdownZeroWithin is how soon Shutdown with a timeout of 0 must return.
const shutdownZeroWithin = 15 * time.Second

// checkShutdownPaused: Shutdown of a paused VM resumes it first (RESUMED, before the VM stops)
// and returns once it is stopped.
func (s *hvSuite) checkShutdownPaused(t T) {
	d := s.hypervisor(t)
	requireFeature(t, s.capabilities(t, d), basev1.Feature_FEATURE_HYPERVISOR_PAUSE)
	p := optional[driver.Pauser](t, d, basev1.Feature_FEATURE_HYPERVISOR_PAUSE)
	vm := s.create(t, d)
	l := s.watchEvents(t, d, vm.id)
	s.liven(t, d, vm.id, l)
	if err := d.Start(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Start: %s", describe(err))
	}
	if err := p.Pause(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Pause: %s", describe(err))
	}
	mark := l.len()
	if _, err := d.Shutdown(s.ctx(t), vm.id, s.opts.ShutdownTimeout); err != nil {
		t.Fatalf("Shutdown of a paused VM: %s", describe(err))
	}
	s.expectState(t, d, vm.id, hypervisorv1.State_STATE_STOPPED, "Shutdown of a paused VM returned")
	ctx, cancel := context.WithTimeout(s.ctx(t), s.eventWait())
	defer cancel()
	stopped := l.find(ctx, mark, isEnd)
	if stopped < 0 {
		t.Fatalf("Shutdown of a paused VM: no event ends the run; got %s", l.describe(mark))
	}
	if !slices.ContainsFunc(l.snapshot()[mark:stopped], func(e *hypervisorv1.Event) bool {
		return e.GetType() == hypervisorv1.EventType_EVENT_TYPE_RESUMED
	}) {
		t.Errorf("Shutdown of a paused VM: no RESUMED event before it stopped (a paused guest cannot power off: resume it first); got %s", l.describe(mark))
	}
}

// eventWait is how long a check waits for an event: eventWithin, at most Options.Timeout.
func (s *hvSuite) eventWait() time.Duration { return min(eventWithin, s.opts.Timeout) }

// eventWithin is how soon after the operation that causes it an event must be on the stream.
const eventWithin = 10 * time.Second

// isEnd reports whether e ends a run: its state is STOPPED or CRASHED.
func isEnd(e *hypervisorv1.Event) bool {
	return e.GetState() == hypervisorv1.State_STATE_STOPPED || e.GetState() == hypervisorv1.State_STATE_CRASHED
}

// checkEventsStartStop: Events streams a VM's start and stop to every stream that asked for
// all VMs or for that VM, and nothing of other VMs to the latter; it returns nil once its
// context is done.
func (s *hvSuite) checkEventsStartStop(t T) {
	d := s.hypervisor(t)
	x, y := s.create(t, d), s.create(t, d)
	ofX := s.watchEvents(t, d, x.id)
	all := s.watchEvents(t, d, "")
	s.liven(t, d, x.id, ofX, all)
	ctx := s.ctx(t)

	markX, markAll := ofX.len(), all.len()
	if err := d.Start(ctx, x.id); err != nil {
		t.Fatalf("Start: %s", describe(err))
	}
	if err := d.Start(ctx, y.id); err != nil {
		t.Fatalf("Start: %s", describe(err))
	}
	started := ofX.find(ctx, markX, func(e *hypervisorv1.Event) bool {
		return e.GetId() == x.id && e.GetType() == hypervisorv1.EventType_EVENT_TYPE_STARTED && e.GetState() == hypervisorv1.State_STATE_RUNNING
	})
	if started < 0 {
		t.Fatalf("after Start, no event of type STARTED with state RUNNING on the stream of the VM; got %s", ofX.describe(markX))
	}
	if _, err := d.Shutdown(ctx, x.id, s.opts.ShutdownTimeout); err != nil {
		t.Fatalf("Shutdown: %s", describe(err))
	}
	if ofX.find(ctx, started+1, func(e *hypervisorv1.Event) bool {
		return e.GetId() == x.id && e.GetState() == hypervisorv1.State_STATE_STOPPED
	}) < 0 {
		t.Errorf("after Shutdown, no event with state STOPPED on the stream of the VM; got %s", ofX.describe(markX))
	}
	if all.find(ctx, markAll, func(e *hypervisorv1.Event) bool {
		return e.GetId() == y.id && e.GetType() == hypervisorv1.EventType_EVENT_TYPE_STARTED
	}) < 0 {
		t.Errorf("after Start of a second VM, no STARTED event for it on the stream of all VMs; got %s", all.describe(markAll))
	}
	if err := d.Kill(ctx, y.id); err != nil {
		t.Fatalf("Kill: %s", describe(err))
	}
	if all.find(ctx, markAll, func(e *hypervisorv1.Event) bool {
		return e.GetId() == y.id && e.GetState() == hypervisorv1.State_STATE_STOPPED
	}) < 0 {
		t.Errorf("after Kill of a second VM, no event with state STOPPED for it on the stream of all VMs; got %s", all.describe(markAll))
	}
	for _, e := range ofX.snapshot() {
		if e.GetId() != x.id {
			t.Errorf("the stream of VM %s got an event of VM %q: %v", x.id, e.GetId(), e)
		}
	}
	for _, l := range []*eventLog{ofX, all} {
		if err := l.stop(s.opts.Timeout); err != nil {
			t.Errorf("Events after its context was cancelled: %v", err)
		}
	}
}

// liven waits until the Events streams are live, which only the driver knows: it cycles the
// created VM id through Start and Kill until every stream has reported it stopped. The VM is
// stopped when it returns.
func (s *hvSuite) liven(t T, d driver.Hypervisor, id string, logs ...*eventLog) {
	t.Helper()
	ctx := s.ctx(t)
	wait := 50 * time.Millisecond
	stopped := func(e *hypervisorv1.Event) bool {
		return e.GetId() == id && e.GetState() == hypervisorv1.State_STATE_STOPPED
	}
	for attempt := 1; ; attempt++ {
		if err := d.Start(ctx, id); err != nil {
			t.Fatalf("Start: %s", describe(err))
		}
		if err := d.Kill(ctx, id); err != nil {
			t.Fatalf("Kill: %s", describe(err))
		}
		waitCtx, cancel := context.WithTimeout(ctx, wait)
		live := true
		for _, l := range logs {
			live = l.find(waitCtx, 0, stopped) >= 0 && live
		}
		cancel()
		if live {
			return
		}
		if ctx.Err() != nil {
			var counts []string
			for _, l := range logs {
				counts = append(counts, fmt.Sprint(l.len()))
			}
			t.Fatalf("the Events streams reported nothing for a VM started and killed %d times (events per stream: %s)", attempt, strings.Join(counts, ", "))
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// checkEventsSequence: each operation reports the events of the contract, each with the VM's
// state after it and a reason, and a run ends with one event of type STOPPED after which
// nothing follows until the next Start.
func (s *hvSuite) checkEventsSequence(t T) {
	d := s.hypervisor(t)
	vm := s.create(t, d)
	l := s.watchEvents(t, d, vm.id)
	s.liven(t, d, vm.id, l)
	ctx := s.ctx(t)
	typeIs := func(typ hypervisorv1.EventType, state hypervisorv1.State) func(*hypervisorv1.Event) bool {
		return func(e *hypervisorv1.Event) bool { return e.GetType() == typ && e.GetState() == state }
	}
	// expect waits for an event from mark that matches, and returns the index after it.
	expect := func(what string, mark int, match func(*hypervisorv1.Event) bool) int {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, s.eventWait())
		defer cancel()
		i := l.find(wctx, mark, match)
		if i < 0 {
			t.Fatalf("after %s, no such event; got %s", what, l.describe(mark))
		}
		return i + 1
	}
	// expectEnd checks the end of a run from mark: one STOPPED event in state STOPPED with one
	// of the reasons, before it only SHUTTING_DOWN and the events of what, and nothing after it.
	expectEnd := func(what string, mark int, allowed []hypervisorv1.EventType, reasons ...string) int {
		t.Helper()
		end := expect(what, mark, isEnd) - 1
		events := l.snapshot()
		e := events[end]
		if e.GetType() != hypervisorv1.EventType_EVENT_TYPE_STOPPED || e.GetState() != hypervisorv1.State_STATE_STOPPED {
			t.Errorf("after %s the run ends with %s in state %s, want STOPPED in state STOPPED", what, e.GetType(), e.GetState())
		}
		if !slices.Contains(reasons, e.GetReason()) {
			t.Errorf("after %s the run ends with reason %q, want one of %q", what, e.GetReason(), reasons)
		}
		for _, b := range events[mark:end] {
			if b.GetType() != hypervisorv1.EventType_EVENT_TYPE_SHUTDOWN && !slices.Contains(allowed, b.GetType()) {
				t.Errorf("after %s, before the end of the run: %s (state %s), want only %v or SHUTDOWN", what, b.GetType(), b.GetState(), allowed)
			}
		}
		s.sleepCheck(t, 200*time.Millisecond)
		if n := l.len(); n > end+1 {
			t.Errorf("after %s, events follow the end of the run: %s", what, l.describe(end+1))
		}
		return end + 1
	}

	mark := l.len()
	if err := d.Start(ctx, vm.id); err != nil {
		t.Fatalf("Start: %s", describe(err))
	}
	mark = expect("Start", mark, typeIs(hypervisorv1.EventType_EVENT_TYPE_STARTED, hypervisorv1.State_STATE_RUNNING))
	if p, ok := driver.Optional[driver.Pauser](ctx, d); ok {
		if err := p.Pause(ctx, vm.id); err != nil {
			t.Fatalf("Pause: %s", describe(err))
		}
		mark = expect("Pause", mark, typeIs(hypervisorv1.EventType_EVENT_TYPE_PAUSED, hypervisorv1.State_STATE_PAUSED))
		if err := p.Resume(ctx, vm.id); err != nil {
			t.Fatalf("Resume: %s", describe(err))
		}
		mark = expect("Resume", mark, typeIs(hypervisorv1.EventType_EVENT_TYPE_RESUMED, hypervisorv1.State_STATE_RUNNING))
	}
	if err := d.Kill(ctx, vm.id); err != nil {
		t.Fatalf("Kill: %s", describe(err))
	}
	mark = expectEnd("Kill", mark, nil, driver.ReasonKilled)

	if err := d.Start(ctx, vm.id); err != nil {
		t.Fatalf("Start: %s", describe(err))
	}
	mark = expect("a second Start", mark, typeIs(hypervisorv1.EventType_EVENT_TYPE_STARTED, hypervisorv1.State_STATE_RUNNING))
	if _, err := d.Shutdown(ctx, vm.id, s.opts.ShutdownTimeout); err != nil {
		t.Fatalf("Shutdown: %s", describe(err))
	}
	expect("Shutdown", mark, typeIs(hypervisorv1.EventType_EVENT_TYPE_POWERDOWN_REQUESTED, hypervisorv1.State_STATE_SHUTTING_DOWN))
	expectEnd("Shutdown", mark, []hypervisorv1.EventType{hypervisorv1.EventType_EVENT_TYPE_POWERDOWN_REQUESTED},
		driver.ReasonGuestShutdown, driver.ReasonForcedShutdown)
	for _, e := range l.snapshot() {
		if e.GetState() == hypervisorv1.State_STATE_UNSPECIFIED || e.GetReason() == "" {
			t.Errorf("event %s has state %s and reason %q: every event carries the VM's state after it and a reason", e.GetType(), e.GetState(), e.GetReason())
		}
	}
}

// sleepCheck waits d or until the check's context is done.
func (s *hvSuite) sleepCheck(t T, d time.Duration) {
	select {
	case <-time.After(d):
	case <-s.ctx(t).Done():
	}
}

// eventLog collects the events of one Events call running in the background.
type eventLog struct {
	mu     sync.Mutex
	events []*hypervisorv1.Event
	notify chan struct{}
	cancel context.CancelFunc
	done   chan error
}

// watchEvents starts an Events call; it is stopped when the check ends.
func (s *hvSuite) watchEvents(t T, d driver.Hypervisor, id string) *eventLog {
	ctx, cancel := context.WithCancel(t.Context())
	l := &eventLog{notify: make(chan struct{}, 1), cancel: cancel, done: make(chan error, 1)}
	go func() {
		l.done <- d.Events(ctx, id, func(e *hypervisorv1.Event) error {
			l.mu.Lock()
			l.events = append(l.events, e)
			l.mu.Unlock()
			select {
			case l.notify <- struct{}{}:
			default:
			}
			return nil
		})
	}()
	t.Cleanup(func() { _ = l.stop(s.opts.Timeout) })
	return l
}

func (l *eventLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events)
}

func (l *eventLog) snapshot() []*hypervisorv1.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*hypervisorv1.Event(nil), l.events...)
}

// find waits for an event at index from or later that matches and returns its index, or -1
// when ctx is done first or the stream ends.
func (l *eventLog) find(ctx context.Context, from int, match func(*hypervisorv1.Event) bool) int {
	for {
		events := l.snapshot()
		for i := from; i < len(events); i++ {
			if match(events[i]) {
				return i
			}
		}
		from = max(from, len(events))
		select {
		case <-l.notify:
		case err := <-l.done:
			l.done <- err
			// The stream ended; look once more at what it sent before.
			events = l.snapshot()
			for i := from; i < len(events); i++ {
				if match(events[i]) {
					return i
				}
			}
			return -1
		case <-ctx.Done():
			return -1
		}
	}
}

// describe lists the events from index from, for an error message.
func (l *eventLog) describe(from int) string {
	events := l.snapshot()
	if from >= len(events) {
		return "no event"
	}
	var parts []string
	for _, e := range events[from:] {
		parts = append(parts, fmt.Sprintf("%s(state %s, reason %q)", e.GetType(), e.GetState(), e.GetReason()))
	}
	return strings.Join(parts, ", ")
}

// stop cancels the call and returns its error, or an error if it does not return in time.
func (l *eventLog) stop(timeout time.Duration) error {
	l.cancel()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-l.done:
		l.done <- err
		if err != nil {
			return fmt.Errorf("returned %s, want nil", describe(err))
		}
		return nil
	case <-timer.C:
		return fmt.Errorf("did not return within %s", timeout)
	}
}

// checkPauseResume: Pause and Resume move a running VM to paused and back, each succeeding in
// the state it asks for, without a new boot.
func (s *hvSuite) checkPauseResume(t T) {
	d := s.hypervisor(t)
	requireFeature(t, s.capabilities(t, d), basev1.Feature_FEATURE_HYPERVISOR_PAUSE)
	p := optional[driver.Pauser](t, d, basev1.Feature_FEATURE_HYPERVISOR_PAUSE)
	vm := s.createStarted(t, d)
	boots := s.status(t, d, vm.id).GetBoots()
	for i := 1; i <= 2; i++ {
		if err := p.Pause(s.ctx(t), vm.id); err != nil {
			t.Fatalf("Pause, call %d: %s", i, describe(err))
		}
		s.expectState(t, d, vm.id, hypervisorv1.State_STATE_PAUSED, fmt.Sprintf("Pause call %d", i))
	}
	for i := 1; i <= 2; i++ {
		if err := p.Resume(s.ctx(t), vm.id); err != nil {
			t.Fatalf("Resume, call %d: %s", i, describe(err))
		}
		s.expectState(t, d, vm.id, hypervisorv1.State_STATE_RUNNING, fmt.Sprintf("Resume call %d", i))
	}
	if got := s.status(t, d, vm.id).GetBoots(); got != boots {
		t.Errorf("Pause and Resume changed boots from %d to %d", boots, got)
	}
}

// checkPauseNotRunning: Pause and Resume of a VM that is neither running nor paused (created,
// stopped) are FailedPrecondition.
func (s *hvSuite) checkPauseNotRunning(t T) {
	d := s.hypervisor(t)
	requireFeature(t, s.capabilities(t, d), basev1.Feature_FEATURE_HYPERVISOR_PAUSE)
	p := optional[driver.Pauser](t, d, basev1.Feature_FEATURE_HYPERVISOR_PAUSE)
	vm := s.create(t, d)
	expectCode(t, p.Pause(s.ctx(t), vm.id), codes.FailedPrecondition, "Pause of a created VM")
	expectCode(t, p.Resume(s.ctx(t), vm.id), codes.FailedPrecondition, "Resume of a created VM")
	if err := d.Start(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Start: %s", describe(err))
	}
	if err := d.Kill(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Kill: %s", describe(err))
	}
	expectCode(t, p.Pause(s.ctx(t), vm.id), codes.FailedPrecondition, "Pause of a stopped VM")
	expectCode(t, p.Resume(s.ctx(t), vm.id), codes.FailedPrecondition, "Resume of a stopped VM")
	s.expectState(t, d, vm.id, hypervisorv1.State_STATE_STOPPED, "a refused Pause and Resume")
}

// checkRebootNotRunning: Reboot of a VM that is not running (created, paused) is
// FailedPrecondition and changes nothing.
func (s *hvSuite) checkRebootNotRunning(t T) {
	d := s.hypervisor(t)
	caps := s.capabilities(t, d)
	requireFeature(t, caps, basev1.Feature_FEATURE_HYPERVISOR_REBOOT)
	r := optional[driver.Rebooter](t, d, basev1.Feature_FEATURE_HYPERVISOR_REBOOT)
	s.refusedUnlessRunning(t, d, "Reboot", r.Reboot)
}

// refusedUnlessRunning checks that op, the operation called name, is FailedPrecondition for a
// created VM and, when the driver can pause, for a paused one, and changes neither its state
// nor its boots.
func (s *hvSuite) refusedUnlessRunning(t T, d driver.Hypervisor, name string, op func(ctx context.Context, id string) error) {
	t.Helper()
	vm := s.create(t, d)
	expectCode(t, op(s.ctx(t), vm.id), codes.FailedPrecondition, name+" of a created VM")
	s.expectState(t, d, vm.id, hypervisorv1.State_STATE_CREATED, "a refused "+name)
	p, ok := driver.Optional[driver.Pauser](s.ctx(t), d)
	if !ok {
		return
	}
	if err := d.Start(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Start: %s", describe(err))
	}
	if err := p.Pause(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Pause: %s", describe(err))
	}
	boots := s.status(t, d, vm.id).GetBoots()
	expectCode(t, op(s.ctx(t), vm.id), codes.FailedPrecondition, name+" of a paused VM")
	if st := s.expectState(t, d, vm.id, hypervisorv1.State_STATE_PAUSED, "a refused "+name); st.GetBoots() != boots {
		t.Errorf("a refused %s changed boots from %d to %d", name, boots, st.GetBoots())
	}
}

// checkRebootSecondBoot: Reboot boots a running VM again; it goes on running.
func (s *hvSuite) checkRebootSecondBoot(t T) {
	d := s.hypervisor(t)
	requireFeature(t, s.capabilities(t, d), basev1.Feature_FEATURE_HYPERVISOR_REBOOT)
	r := optional[driver.Rebooter](t, d, basev1.Feature_FEATURE_HYPERVISOR_REBOOT)
	vm := s.createStarted(t, d)
	boots := s.status(t, d, vm.id).GetBoots()
	if err := r.Reboot(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Reboot: %s", describe(err))
	}
	// The new boot may be reported a little after Reboot returns.
	var st *hypervisorv1.VMStatus
	ctx := s.ctx(t)
	if !poll(ctx, func() bool {
		if cur, err := d.Status(ctx, vm.id); err == nil {
			st = cur
		}
		return st.GetBoots() > boots && st.GetState() == hypervisorv1.State_STATE_RUNNING
	}) {
		t.Errorf("after Reboot the VM is %s with %d boots, want RUNNING with more than %d", st.GetState(), st.GetBoots(), boots)
	}
}

// tail returns the end of s for an error message.
func tail(s string) string {
	const n = 400
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return fmt.Sprintf("%q", s)
}

// checkConsoleOutput: the console of a started VM attaches, shows Options.ConsoleMarker when
// set, and detaches with nil when its context is done.
func (s *hvSuite) checkConsoleOutput(t T) {
	d := s.hypervisor(t)
	requireFeature(t, s.capabilities(t, d), basev1.Feature_FEATURE_HYPERVISOR_CONSOLE)
	c := optional[driver.Consoler](t, d, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE)
	vm := s.createStarted(t, d)
	cs := attachConsole(t, c, vm.id)
	if marker := s.opts.ConsoleMarker; marker != "" {
		found := poll(s.ctx(t), func() bool {
			select {
			case err := <-cs.done:
				cs.done <- err
				return true
			default:
			}
			return strings.Contains(cs.out.String(), marker)
		})
		if ended, err := cs.wait(0); ended {
			t.Fatalf("Console returned before the marker %q was seen: %s; output: %s", marker, describe(err), tail(cs.out.String()))
		}
		if !found {
			t.Fatalf("the console did not show %q within %s; output: %s", marker, s.opts.Timeout, tail(cs.out.String()))
		}
	} else {
		t.Logf("no console marker given (WithConsoleMarker): only attaching and detaching are checked")
		if ended, err := cs.wait(100 * time.Millisecond); ended {
			t.Fatalf("Console of a running VM returned at once: %s", describe(err))
		}
	}
	cs.cancel()
	ended, err := cs.wait(s.opts.Timeout)
	switch {
	case !ended:
		t.Errorf("Console did not return within %s of its context being cancelled", s.opts.Timeout)
	case err != nil:
		t.Errorf("Console after its context was cancelled: %s, want nil", describe(err))
	}
}

// checkConsoleEndsOnStop: a console returns nil when its VM stops.
func (s *hvSuite) checkConsoleEndsOnStop(t T) {
	d := s.hypervisor(t)
	requireFeature(t, s.capabilities(t, d), basev1.Feature_FEATURE_HYPERVISOR_CONSOLE)
	c := optional[driver.Consoler](t, d, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE)
	vm := s.createStarted(t, d)
	cs := attachConsole(t, c, vm.id)
	if ended, err := cs.wait(100 * time.Millisecond); ended {
		t.Fatalf("Console of a running VM returned at once: %s", describe(err))
	}
	if err := d.Kill(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Kill: %s", describe(err))
	}
	ended, err := cs.wait(s.opts.Timeout)
	switch {
	case !ended:
		t.Errorf("Console did not return within %s of its VM being killed", s.opts.Timeout)
	case err != nil:
		t.Errorf("Console after its VM was killed: %s, want nil", describe(err))
	}
}

// checkConsoleBeforeStart: the console of a VM that has not started is FailedPrecondition: the
// host attaches after Start.
func (s *hvSuite) checkConsoleBeforeStart(t T) {
	d := s.hypervisor(t)
	requireFeature(t, s.capabilities(t, d), basev1.Feature_FEATURE_HYPERVISOR_CONSOLE)
	c := optional[driver.Consoler](t, d, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE)
	vm := s.create(t, d)
	ctx, cancel := context.WithTimeout(s.ctx(t), eventWithin)
	defer cancel()
	err := c.Console(ctx, vm.id, nil, io.Discard)
	if ctx.Err() != nil {
		t.Fatalf("Console of a created VM did not return within %s: want FailedPrecondition at once", eventWithin)
	}
	expectCode(t, err, codes.FailedPrecondition, "Console of a created VM")
}

// checkConsoleSeveralReaders: two consoles of one VM read at once; the second, attached after
// Options.ConsoleMarker was printed, gets it from the driver's backlog.
func (s *hvSuite) checkConsoleSeveralReaders(t T) {
	d := s.hypervisor(t)
	requireFeature(t, s.capabilities(t, d), basev1.Feature_FEATURE_HYPERVISOR_CONSOLE)
	marker := s.opts.ConsoleMarker
	if marker == "" {
		t.Skipf("no console marker given (WithConsoleMarker): the check needs output to see twice")
	}
	c := optional[driver.Consoler](t, d, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE)
	vm := s.createStarted(t, d)
	first := attachConsole(t, c, vm.id)
	if err := first.out.WaitFor(s.ctx(t), marker, 1, s.opts.Timeout); err != nil {
		t.Fatalf("the console did not show %q: %v", marker, err)
	}
	second := attachConsole(t, c, vm.id)
	if err := second.out.WaitFor(s.ctx(t), marker, 1, eventWithin); err != nil {
		t.Errorf("a second console attached after %q was printed does not show it: the driver replays its recent output to a new console first: %v", marker, err)
	}
	for i, cs := range []*consoleSession{first, second} {
		if ended, err := cs.wait(0); ended {
			t.Errorf("console %d of two ended while the VM runs: %s", i+1, describe(err))
		}
	}
}

// restarted restarts the driver process with Options.Restart, skipping the check without it.
func (s *hvSuite) restarted(t T) driver.Hypervisor {
	t.Helper()
	d := s.opts.Restart(t)
	if d == nil {
		t.Fatalf("the restart hook returned no driver")
	}
	s.configure(t, d)
	return d
}

// requireRecover skips a Recover check unless the driver declares the feature and a restart
// hook is given.
func (s *hvSuite) requireRecover(t T, d driver.Hypervisor) {
	t.Helper()
	requireFeature(t, s.capabilities(t, d), basev1.Feature_FEATURE_HYPERVISOR_RECOVER)
	if s.opts.Restart == nil {
		t.Skipf("no restart hook given (WithRestart): Recover needs a new driver process")
	}
}

// checkRecoverRunning: a new driver process re-adopts a running VM from its handle and can
// then stop and delete it.
func (s *hvSuite) checkRecoverRunning(t T) {
	d := s.hypervisor(t)
	s.requireRecover(t, d)
	vm := s.createStarted(t, d)

	d2 := s.restarted(t)
	vm.d = d2
	r := optional[driver.Recoverer](t, d2, basev1.Feature_FEATURE_HYPERVISOR_RECOVER)
	st, err := r.Recover(s.ctx(t), vm.handle)
	if err != nil {
		t.Fatalf("Recover of a running VM: %s", describe(err))
	}
	if st.GetId() != vm.id || st.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Errorf("Recover of a running VM reports VM %q %s (reason %q), want %q RUNNING", st.GetId(), st.GetState(), st.GetReason(), vm.id)
	}
	s.expectState(t, d2, vm.id, hypervisorv1.State_STATE_RUNNING, "Recover")
	if err := d2.Kill(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Kill of a recovered VM: %s", describe(err))
	}
	s.expectState(t, d2, vm.id, hypervisorv1.State_STATE_STOPPED, "Kill of a recovered VM")
	expectCode(t, d2.Delete(s.ctx(t), vm.id), codes.OK, "Delete of a recovered VM")
}

// checkRecoverCreated: a new driver process reports a VM that was created and never started as
// created, with no boot, and can start it.
func (s *hvSuite) checkRecoverCreated(t T) {
	d := s.hypervisor(t)
	s.requireRecover(t, d)
	vm := s.create(t, d)

	d2 := s.restarted(t)
	vm.d = d2
	r := optional[driver.Recoverer](t, d2, basev1.Feature_FEATURE_HYPERVISOR_RECOVER)
	st, err := r.Recover(s.ctx(t), vm.handle)
	if err != nil {
		t.Fatalf("Recover of a created VM: %s", describe(err))
	}
	if st.GetState() != hypervisorv1.State_STATE_CREATED || st.GetBoots() != 0 {
		t.Errorf("Recover of a VM created and never started reports it %s with %d boots (reason %q), want CREATED with 0", st.GetState(), st.GetBoots(), st.GetReason())
	}
	if err := d2.Start(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Start of a recovered created VM: %s", describe(err))
	}
	s.expectState(t, d2, vm.id, hypervisorv1.State_STATE_RUNNING, "Start of a recovered created VM")
}

// checkRecoverStopped: a new driver process reports a VM that was stopped (killed) before the
// restart as stopped, and can delete it.
func (s *hvSuite) checkRecoverStopped(t T) {
	d := s.hypervisor(t)
	s.requireRecover(t, d)
	vm := s.createStarted(t, d)
	if err := d.Kill(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Kill: %s", describe(err))
	}

	d2 := s.restarted(t)
	vm.d = d2
	r := optional[driver.Recoverer](t, d2, basev1.Feature_FEATURE_HYPERVISOR_RECOVER)
	st, err := r.Recover(s.ctx(t), vm.handle)
	if err != nil {
		t.Fatalf("Recover of a stopped VM: %s; a VM whose process is gone must be reported as stopped", describe(err))
	}
	if st.GetState() != hypervisorv1.State_STATE_STOPPED || st.GetPid() != 0 {
		t.Errorf("Recover of a stopped VM reports it %s with pid %d (reason %q), want STOPPED without a pid", st.GetState(), st.GetPid(), st.GetReason())
	}
	s.expectState(t, d2, vm.id, hypervisorv1.State_STATE_STOPPED, "Recover of a stopped VM")
	expectCode(t, d2.Delete(s.ctx(t), vm.id), codes.OK, "Delete of a recovered stopped VM")
}

// checkRecoverGone: Recover of a VM that is gone reports it stopped, not an error.
func (s *hvSuite) checkRecoverGone(t T) {
	d := s.hypervisor(t)
	s.requireRecover(t, d)
	vm := s.createStarted(t, d)
	if err := d.Kill(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Kill: %s", describe(err))
	}
	if err := d.Delete(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Delete: %s", describe(err))
	}

	d2 := s.restarted(t)
	vm.d = d2
	r := optional[driver.Recoverer](t, d2, basev1.Feature_FEATURE_HYPERVISOR_RECOVER)
	st, err := r.Recover(s.ctx(t), vm.handle)
	if err != nil {
		t.Fatalf("Recover of a deleted VM: %s; a VM that is gone must be reported as stopped", describe(err))
	}
	if st.GetState() != hypervisorv1.State_STATE_STOPPED {
		t.Errorf("Recover of a deleted VM reports it %s (reason %q), want STOPPED", st.GetState(), st.GetReason())
	}
	// The driver knows the VM again, so that the host can finish removing it.
	s.expectState(t, d2, vm.id, hypervisorv1.State_STATE_STOPPED, "Recover of a deleted VM")
	expectCode(t, d2.Delete(s.ctx(t), vm.id), codes.OK, "Delete of a recovered deleted VM")
}
