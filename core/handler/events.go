package handler

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/backoff"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// steadyStream is how long an events stream must have stayed open for its end not to count
// as a failure to open it (whose retries back off).
const steadyStream = 5 * time.Second

// watchHypervisor follows a hypervisor driver's events for the life of the handler, one
// watcher per loaded hypervisor driver. The stream ends whenever the plugin process does; on
// every (re)open the handler re-adopts the VMs of the VMIs it runs on that driver (Recover),
// since a new driver process knows none of them. The VMIs of the other hypervisor drivers are
// not touched.
func (h *Handler) watchHypervisor(name string) {
	hv, err := h.host.Hypervisor(name)
	if err != nil {
		return
	}
	b := backoff.NewRetry(retry)
	for h.ctx.Err() == nil {
		opened := time.Now()
		sctx, cancel := context.WithCancel(h.ctx)
		errc := make(chan error, 1)
		go func() {
			errc <- hv.Events(sctx, "", func(ev *hypervisorv1.Event) error { return h.onEvent(name, ev) })
		}()
		err := h.recoverAll(sctx, name)
		if err != nil {
			cancel()
			err = errors.Join(err, <-errc)
		} else {
			err = <-errc
		}
		cancel()
		if h.ctx.Err() != nil {
			return
		}
		h.log.Debug("hypervisor events stream ended: reopening", "driver", name, "error", err)
		if time.Since(opened) > steadyStream {
			b.Reset()
		}
		b.Wait(h.ctx)
	}
}

// recoverAll re-adopts the VMs of every started VMI of hypervisor driver name, each under its
// VMI's lock, in parallel. It fails when the driver could not be reached for one of them.
func (h *Handler) recoverAll(ctx context.Context, name string) error {
	return h.eachStarted(ctx, func(ctx context.Context, e *entry, st *vmiState) error {
		if h.hypervisorName(st) != name {
			return nil // another driver's VM
		}
		hv, _, err := h.hypervisorFor(st)
		if err != nil {
			return nil // the VMI needs another driver: nothing this loop can do
		}
		vs, err := h.recoverVM(ctx, hv, st)
		if err != nil {
			if status.Code(err) == codes.Unavailable || ctx.Err() != nil {
				return err
			}
			h.log.Warn("VM not recovered", "uid", st.UID, "error", err)
			return nil
		}
		h.mu.Lock()
		h.setVM(e, vs)
		h.mu.Unlock()
		h.publish(e)
		return nil
	})
}

// resync asks the driver for every started VM's status every ResyncPeriod, in case an event
// was missed.
func (h *Handler) resync() {
	t := time.NewTicker(h.cfg.ResyncPeriod.Duration)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-t.C:
		}
		_ = h.eachStarted(h.ctx, func(ctx context.Context, e *entry, _ *vmiState) error {
			h.observe(ctx, e)
			h.publish(e)
			return nil
		})
	}
}

// eachStarted runs fn for every VMI whose VM was created, holding the VMI's lock, in
// parallel, and joins their errors.
func (h *Handler) eachStarted(ctx context.Context, fn func(ctx context.Context, e *entry, st *vmiState) error) error {
	h.mu.Lock()
	var uids []types.UID
	for uid, e := range h.vmis {
		if e.state != nil && e.state.Started {
			uids = append(uids, uid)
		}
	}
	h.mu.Unlock()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, uid := range uids {
		wg.Go(func() {
			unlock := h.locks.Lock(string(uid))
			defer unlock()
			h.mu.Lock()
			e := h.vmis[uid]
			var st *vmiState
			if e != nil {
				st = e.state
			}
			h.mu.Unlock()
			if st == nil || !st.Started {
				return // stopped meanwhile
			}
			if err := fn(ctx, e, st); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// onEvent applies an event of hypervisor driver name to the VMI it is about, when that VMI runs
// on that driver.
func (h *Handler) onEvent(name string, ev *hypervisorv1.Event) error {
	uid := types.UID(ev.GetId())
	h.mu.Lock()
	e := h.vmis[uid]
	if e == nil || e.state == nil || !e.state.began(stepHypervisor) || h.hypervisorName(e.state) != name {
		h.mu.Unlock()
		return nil
	}
	vm := &hypervisorv1.VMStatus{Id: ev.GetId()}
	if e.vm != nil {
		vm = proto.CloneOf(e.vm)
	}
	vm.State, vm.Reason, vm.Message = ev.GetState(), ev.GetReason(), ev.GetMessage()
	h.setVM(e, vm)
	h.mu.Unlock()
	h.log.Debug("VM event", "uid", uid, "type", ev.GetType().String(), "state", ev.GetState().String(), "reason", ev.GetReason())
	h.publish(e)
	if h.opts.OnEvent != nil {
		h.opts.OnEvent(uid, ev)
	}
	return nil
}
