package handler

import (
	"context"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/backoff"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// Console copies a running VMI's serial console to out and in to it, until ctx is done or the
// VM stops (the hypervisor driver's Console). With in nil it attaches again after a restart of
// the driver process, which ends the driver's console (see follow). A driver that does not
// declare FEATURE_HYPERVISOR_CONSOLE is Unimplemented, without a call.
func (h *Handler) Console(ctx context.Context, uid types.UID, in io.Reader, out io.Writer) error {
	hv, _, err := h.hypervisorFor(h.entryState(uid))
	if err != nil {
		return err
	}
	c, ok := driver.Optional[driver.Consoler](ctx, hv)
	if !ok {
		return status.Error(codes.Unimplemented, "the hypervisor driver offers no console (it does not declare FEATURE_HYPERVISOR_CONSOLE)")
	}
	return h.follow(ctx, hv, c, uid, in, out)
}

// follow attaches c to the console of VMI uid, and, when in is nil, attaches again whenever the
// driver's console ends while the VM still runs: the driver process restarted (the driver's
// Console ends with its process), and the new process, once it has recovered the VM, serves the
// console again from what the guest printed since. It returns nil when ctx is done or the VM
// stopped after it was attached; an error when the first attach fails for another reason than
// the driver being away (FailedPrecondition before Start, say).
func (h *Handler) follow(ctx context.Context, hv driver.Hypervisor, c driver.Consoler, uid types.UID, in io.Reader, out io.Writer) error {
	id := string(uid)
	if in != nil {
		// Input cannot be handed to a second attach: a reader of the first may hold it.
		return c.Console(ctx, id, in, out)
	}
	attached := false
	b := backoff.NewRetry(retry)
	for {
		err := c.Console(ctx, id, nil, out)
		if ctx.Err() != nil {
			return nil
		}
		switch code := status.Code(err); {
		case err == nil:
			attached = true
		case code == codes.Unavailable || code == codes.NotFound:
			// The driver is away, or back without the VM yet.
		case attached && code == codes.FailedPrecondition:
			return nil // the VM stopped meanwhile
		default:
			return err
		}
		if !h.vmRuns(ctx, hv, uid) {
			if attached {
				return nil
			}
			return err
		}
		h.log.Debug("console ended while the VM runs: attaching again", "uid", uid, "error", err)
		if !b.Wait(ctx) {
			return nil
		}
	}
}

// vmRuns reports whether the VM of VMI uid still runs, or may: its driver does not answer, or
// does not know the VM yet after a restart, while the handler last saw it running.
func (h *Handler) vmRuns(ctx context.Context, hv driver.Hypervisor, uid types.UID) bool {
	h.mu.Lock()
	e := h.vmis[uid]
	var last *hypervisorv1.VMStatus
	known := e != nil && e.state != nil
	if e != nil {
		last = e.vm
	}
	h.mu.Unlock()
	if !known {
		return false
	}
	vs, err := hv.Status(ctx, string(uid))
	switch status.Code(err) {
	case codes.OK:
		return vmActive(vs.GetState())
	case codes.NotFound, codes.Unavailable:
		return last == nil || vmActive(last.GetState())
	}
	return false
}

func vmActive(s hypervisorv1.State) bool {
	switch s {
	case hypervisorv1.State_STATE_RUNNING, hypervisorv1.State_STATE_PAUSED, hypervisorv1.State_STATE_SHUTTING_DOWN:
		return true
	}
	return false
}
