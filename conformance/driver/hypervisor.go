package conformance

import (
	"context"
	"fmt"
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
//	Delete/Running, Delete/Unknown
//	Kill
//	Shutdown/Idempotent
//	Events/StartStop
//	Pause/PauseResume                   (FEATURE_HYPERVISOR_PAUSE)
//	Reboot/SecondBoot                   (FEATURE_HYPERVISOR_REBOOT)
//	Console/Output, Console/EndsOnStop  (FEATURE_HYPERVISOR_CONSOLE)
//	Recover/Running, Recover/Gone       (FEATURE_HYPERVISOR_RECOVER, and WithRestart)
//
// The VMs it creates come from Options.Domain (DefaultDomain unless WithDomain) and are killed
// and deleted when their check ends.
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
	t.Run("Delete", func(t T) {
		t.Run("Running", s.checkDeleteRunning)
		t.Run("Unknown", s.checkDeleteUnknown)
	})
	t.Run("Kill", s.checkKill)
	t.Run("Shutdown", func(t T) {
		t.Run("Idempotent", s.checkShutdownIdempotent)
	})
	t.Run("Events", func(t T) {
		t.Run("StartStop", s.checkEventsStartStop)
	})
	t.Run("Pause", func(t T) {
		t.Run("PauseResume", s.checkPauseResume)
	})
	t.Run("Reboot", func(t T) {
		t.Run("SecondBoot", s.checkRebootSecondBoot)
	})
	t.Run("Console", func(t T) {
		t.Run("Output", s.checkConsoleOutput)
		t.Run("EndsOnStop", s.checkConsoleEndsOnStop)
	})
	t.Run("Recover", func(t T) {
		t.Run("Running", s.checkRecoverRunning)
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

// checkShutdownIdempotent: Shutdown of a stopped VM succeeds.
func (s *hvSuite) checkShutdownIdempotent(t T) {
	d := s.hypervisor(t)
	vm := s.createStarted(t, d)
	for i := 1; i <= 2; i++ {
		if _, err := d.Shutdown(s.ctx(t), vm.id, s.opts.ShutdownTimeout); err != nil {
			t.Fatalf("Shutdown, call %d: %s", i, describe(err))
		}
		s.expectState(t, d, vm.id, hypervisorv1.State_STATE_STOPPED, fmt.Sprintf("Shutdown call %d returned", i))
	}
}

// checkEventsStartStop: Events streams a VM's start and stop to every stream that asked for
// all VMs or for that VM, and nothing of other VMs to the latter; it returns nil once its
// context is done.
func (s *hvSuite) checkEventsStartStop(t T) {
	d := s.hypervisor(t)
	x, y := s.create(t, d), s.create(t, d)
	ofX := s.watchEvents(t, d, x.id)
	all := s.watchEvents(t, d, "")

	// A stream is live only once the driver has registered it, which the caller cannot see:
	// cycle x through start and kill until both streams report it stopped.
	ctx := s.ctx(t)
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		if err := d.Start(ctx, x.id); err != nil {
			t.Fatalf("Start: %s", describe(err))
		}
		if err := d.Kill(ctx, x.id); err != nil {
			t.Fatalf("Kill: %s", describe(err))
		}
		waitCtx, cancel := context.WithTimeout(ctx, wait)
		stopped := func(e *hypervisorv1.Event) bool {
			return e.GetId() == x.id && e.GetState() == hypervisorv1.State_STATE_STOPPED
		}
		a, b := ofX.find(waitCtx, 0, stopped), all.find(waitCtx, 0, stopped)
		cancel()
		if a >= 0 && b >= 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the Events streams reported nothing for a VM started and killed %d times (stream of that VM: %d events, stream of all VMs: %d events)", attempt, ofX.len(), all.len())
		}
		wait = min(2*wait, 5*time.Second)
	}

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
}
