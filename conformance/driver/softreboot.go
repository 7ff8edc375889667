package conformance

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// checkSoftRebootNotRunning: SoftReboot of a VM that is not running (created, paused) is
// FailedPrecondition and changes nothing.
func (s *hvSuite) checkSoftRebootNotRunning(t T) {
	d := s.hypervisor(t)
	requireFeature(t, s.capabilities(t, d), basev1.Feature_FEATURE_HYPERVISOR_SOFT_REBOOT)
	r := optional[driver.SoftRebooter](t, d, basev1.Feature_FEATURE_HYPERVISOR_SOFT_REBOOT)
	s.refusedUnlessRunning(t, d, "SoftReboot", r.SoftReboot)
}

// checkGuestAgentNotRunning: GuestAgentInfo of a VM that is not running (created, paused) is
// FailedPrecondition and changes nothing.
func (s *hvSuite) checkGuestAgentNotRunning(t T) {
	d := s.hypervisor(t)
	requireFeature(t, s.capabilities(t, d), basev1.Feature_FEATURE_HYPERVISOR_GUEST_AGENT)
	g := optional[driver.GuestAgent](t, d, basev1.Feature_FEATURE_HYPERVISOR_GUEST_AGENT)
	s.refusedUnlessRunning(t, d, "GuestAgentInfo", func(ctx context.Context, id string) error {
		_, err := g.GuestAgentInfo(ctx, id)
		return err
	})
}

// checkGuestExecNotRunning: GuestAgentPing and GuestAgentExec of a VM that is not running
// (created, paused) are FailedPrecondition and change nothing.
func (s *hvSuite) checkGuestExecNotRunning(t T) {
	d := s.hypervisor(t)
	requireFeature(t, s.capabilities(t, d), basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC)
	g := optional[driver.GuestExecer](t, d, basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC)
	s.refusedUnlessRunning(t, d, "GuestAgentPing", func(ctx context.Context, id string) error {
		_, err := g.GuestAgentPing(ctx, id)
		return err
	})
	s.refusedUnlessRunning(t, d, "GuestAgentExec", func(ctx context.Context, id string) error {
		_, err := g.GuestAgentExec(ctx, id, []string{"true"}, time.Second)
		return err
	})
}

// checkGuestExecNoCommand: GuestAgentExec without a command is InvalidArgument, the VM running.
func (s *hvSuite) checkGuestExecNoCommand(t T) {
	d := s.hypervisor(t)
	requireFeature(t, s.capabilities(t, d), basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC)
	g := optional[driver.GuestExecer](t, d, basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC)
	vm := s.createStarted(t, d)
	for _, cmd := range [][]string{nil, {""}} {
		_, err := g.GuestAgentExec(s.ctx(t), vm.id, cmd, time.Second)
		expectCode(t, err, codes.InvalidArgument, fmt.Sprintf("GuestAgentExec of command %q", cmd))
	}
	s.expectState(t, d, vm.id, hypervisorv1.State_STATE_RUNNING, "a refused GuestAgentExec")
}

// checkSoftRebootBootsAgain: the guest, asked by SoftReboot, shuts down and boots again in the
// same VM process: the ready marker once more, one boot more, RUNNING with reason GuestReset,
// and on the way no SHUTDOWN, STOPPED or CRASHED event (a RESET event has reason GuestReset).
func (s *vmSuite) checkSoftRebootBootsAgain(t T) {
	_, caps := s.hypervisor(t)
	requireFeature(t, caps, basev1.Feature_FEATURE_HYPERVISOR_SOFT_REBOOT)
	vm := s.boot(t, "")
	r := optional[driver.SoftRebooter](t, vm.d, basev1.Feature_FEATURE_HYPERVISOR_SOFT_REBOOT)
	before := s.status(t, vm)
	ready := vm.console.out.Count(s.guest.ReadyMarker)

	ctx, cancel := context.WithCancel(s.ctx(t))
	var (
		mu     sync.Mutex
		events []*hypervisorv1.Event
	)
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		_ = vm.d.Events(ctx, vm.id, func(e *hypervisorv1.Event) error {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, e)
			return nil
		})
	}()
	defer func() { cancel(); <-watching }()

	if err := r.SoftReboot(s.ctx(t), vm.id); err != nil {
		t.Fatalf("SoftReboot: %s", describe(err))
	}
	within := s.opts.ShutdownTimeout + s.guest.BootTimeout
	if err := vm.console.out.WaitFor(s.ctx(t), s.guest.ReadyMarker, ready+1, within); err != nil {
		t.Fatalf("the guest did not boot again after SoftReboot: %v", err)
	}
	st := s.expectState(t, vm, hypervisorv1.State_STATE_RUNNING, "the soft reboot")
	if st.GetBoots() != before.GetBoots()+1 {
		t.Errorf("after SoftReboot the VM reports %d boots, want %d", st.GetBoots(), before.GetBoots()+1)
	}
	if st.GetPid() != before.GetPid() {
		t.Errorf("after SoftReboot the VM process is pid %d, want the same process (%d)", st.GetPid(), before.GetPid())
	}
	// The status says why the VM last changed: the guest's reset. (The event stream started
	// just before SoftReboot may not have been attached yet when the reset came, so the RESET
	// event is checked only when it was seen.)
	if st.GetReason() != driver.ReasonGuestReset {
		t.Errorf("after SoftReboot the VM's reason is %q, want %q", st.GetReason(), driver.ReasonGuestReset)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range events {
		switch e.GetType() {
		case hypervisorv1.EventType_EVENT_TYPE_SHUTDOWN, hypervisorv1.EventType_EVENT_TYPE_STOPPED, hypervisorv1.EventType_EVENT_TYPE_CRASHED:
			t.Errorf("during a soft reboot the driver reported %s (%s): the VM must go on running", e.GetType(), e.GetReason())
		case hypervisorv1.EventType_EVENT_TYPE_RESET:
			if e.GetReason() != driver.ReasonGuestReset {
				t.Errorf("the soft reboot's RESET event has reason %q, want %q", e.GetReason(), driver.ReasonGuestReset)
			}
		}
	}
}
