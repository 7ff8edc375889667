package handler

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// The VMI actions of the subresource API (core/nodeapi): each fails with a gRPC status whose
// code says why, which the stream endpoint turns into its HTTP code:
//
//	NotFound            the handler does not run the VMI
//	FailedPrecondition  the VM is not in a state for it (not running; already paused; not paused)
//	Unimplemented       the VMI's hypervisor driver does not declare the ability
//	other               the driver failed
//
// After the driver did it, the handler asks the driver for the VM's status and publishes it, so
// that the VMI's status (phase, Paused condition) shows the change at once; the driver's event
// of the change would publish the same a moment later.

// Pause freezes a running VMI's vCPUs (driver.Pauser). The VMI's status gets the Paused
// condition, written by the same status derivation as any pause the driver reports.
func (h *Handler) Pause(ctx context.Context, uid types.UID) error {
	return h.act(ctx, uid, "pause", hypervisorv1.State_STATE_RUNNING, func(ctx context.Context, hv driver.Hypervisor) (func(context.Context, string) error, error) {
		p, ok := driver.Optional[driver.Pauser](ctx, hv)
		if !ok {
			return nil, h.unoffered(uid, "pause (it does not declare FEATURE_HYPERVISOR_PAUSE)")
		}
		return p.Pause, nil
	})
}

// Unpause continues a paused VMI (driver.Pauser); a VMI that is not paused is
// FailedPrecondition.
func (h *Handler) Unpause(ctx context.Context, uid types.UID) error {
	return h.act(ctx, uid, "unpause", hypervisorv1.State_STATE_PAUSED, func(ctx context.Context, hv driver.Hypervisor) (func(context.Context, string) error, error) {
		p, ok := driver.Optional[driver.Pauser](ctx, hv)
		if !ok {
			return nil, h.unoffered(uid, "unpause (it does not declare FEATURE_HYPERVISOR_PAUSE)")
		}
		return p.Resume, nil
	})
}

// Reset resets a running VMI's VM, as the reset button of a machine does (driver.Rebooter).
func (h *Handler) Reset(ctx context.Context, uid types.UID) error {
	return h.act(ctx, uid, "reset", hypervisorv1.State_STATE_RUNNING, func(ctx context.Context, hv driver.Hypervisor) (func(context.Context, string) error, error) {
		r, ok := driver.Optional[driver.Rebooter](ctx, hv)
		if !ok {
			return nil, h.unoffered(uid, "reset (it does not declare FEATURE_HYPERVISOR_REBOOT)")
		}
		return r.Reboot, nil
	})
}

// SoftReboot asks a running VMI's guest to restart (driver.SoftRebooter); it returns without
// waiting for the guest.
func (h *Handler) SoftReboot(ctx context.Context, uid types.UID) error {
	return h.act(ctx, uid, "softreboot", hypervisorv1.State_STATE_RUNNING, func(ctx context.Context, hv driver.Hypervisor) (func(context.Context, string) error, error) {
		r, ok := driver.Optional[driver.SoftRebooter](ctx, hv)
		if !ok {
			return nil, h.unoffered(uid, "a soft reboot (it does not declare FEATURE_HYPERVISOR_SOFT_REBOOT)")
		}
		return r.SoftReboot, nil
	})
}

// ability gives the driver's operation of an action, or the Unimplemented error saying the
// driver does not declare it.
type ability func(ctx context.Context, hv driver.Hypervisor) (func(ctx context.Context, id string) error, error)

// act runs the action's operation on the VM of VMI uid when the VM is in state want, then
// publishes the VM's status.
func (h *Handler) act(ctx context.Context, uid types.UID, what string, want hypervisorv1.State, op ability) error {
	e, hv, err := h.startedVM(uid)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	do, err := op(ctx, hv)
	if err != nil {
		return err
	}
	if err := h.vmIn(ctx, hv, uid, want); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := do(ctx, string(uid)); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	h.observe(ctx, e)
	h.publish(e)
	h.log.Info("VMI action", "action", what, "uid", uid)
	return nil
}

// startedVM returns the entry and the hypervisor driver of VMI uid: NotFound when the handler
// does not run the VMI, FailedPrecondition when its VM has not started or it is stopping.
func (h *Handler) startedVM(uid types.UID) (*entry, driver.Hypervisor, error) {
	h.mu.Lock()
	e := h.vmis[uid]
	var st *vmiState
	stopping := false
	if e != nil {
		st, stopping = e.state, e.stopping
	}
	h.mu.Unlock()
	if st == nil {
		return nil, nil, status.Errorf(codes.NotFound, "VMI %s does not run on this node", uid)
	}
	hv, _, err := h.hypervisorFor(st)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case stopping:
		return nil, nil, status.Error(codes.FailedPrecondition, "the VMI is stopping")
	case !st.Started:
		return nil, nil, status.Error(codes.FailedPrecondition, "the VMI is not running: its VM has not started")
	}
	return e, hv, nil
}

// vmIn returns nil when the VM of VMI uid is in one of the states want, FailedPrecondition
// naming its state otherwise.
func (h *Handler) vmIn(ctx context.Context, hv driver.Hypervisor, uid types.UID, want ...hypervisorv1.State) error {
	vs, err := hv.Status(ctx, string(uid))
	if err != nil {
		return fmt.Errorf("VM status: %w", err)
	}
	if slices.Contains(want, vs.GetState()) {
		return nil
	}
	words := make([]string, len(want))
	for i, w := range want {
		words[i] = driver.StateWord(w)
	}
	return status.Errorf(codes.FailedPrecondition, "the VMI's VM is %s, not %s", driver.StateWord(vs.GetState()), strings.Join(words, " or "))
}

// unoffered is the Unimplemented error of an ability that the hypervisor driver of VMI uid
// (the one hypervisorFor gave) does not declare.
func (h *Handler) unoffered(uid types.UID, what string) error {
	return status.Errorf(codes.Unimplemented, "hypervisor driver %q does not offer %s", h.hypervisorName(h.entryState(uid)), what)
}
