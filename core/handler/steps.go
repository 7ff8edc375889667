package handler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// step is one stage of a VMI's sync. runSteps runs the steps of a sync in order; a step with an
// undo is recorded in the VMI's state (vmiState.Steps), and the state saved, before its do
// runs, so that what it makes is undone whatever happens during the call. undoSteps undoes the
// recorded steps, last first, from the saved state alone: after a handler restart it is all
// there is. Adding a stage to the sync is adding a step to its list (syncSteps).
type step struct {
	// name is the step's name in vmiState.Steps. A recorded name is never renamed: states on
	// disk name it.
	name string
	// reason is the Synchronized=False reason of a driver's error from do (classify).
	reason string
	// skip, when set, says whether the step has nothing to do in this sync; a skipped step is
	// not recorded.
	skip func(r *syncRun) bool
	// do runs the step, leaving what the next steps use in r. An error it gives a reason
	// (failed, internal) keeps it; a driver's error gets the step's reason.
	do func(r *syncRun, ctx context.Context) error
	// undo removes what do made, from the VMI's state; nil when there is nothing to remove. It
	// must be safe for a step that did nothing, or half of it (Release of what was never
	// prepared, Teardown after a half Setup, Delete of an unknown VM).
	undo func(h *Handler, ctx context.Context, st *vmiState) error
}

// syncSteps are the steps of a sync, in order (pipeline.go has each step's do and undo).
var syncSteps = []step{
	{name: stepStorage, reason: ReasonStorageFailed, do: (*syncRun).prepareStorage, undo: (*Handler).releaseStorage},
	{name: stepNetwork, reason: ReasonNetworkFailed, do: (*syncRun).setupNetwork, undo: (*Handler).teardownNetwork},
	// The device contract has no release: allocations end with the sandbox.
	{name: stepDevices, reason: ReasonDeviceFailed, skip: (*syncRun).noDevices, do: (*syncRun).allocateDevices},
	{name: stepDomain, reason: ReasonDomainFailed, do: (*syncRun).buildDomain},
	{name: stepHypervisor, reason: ReasonCreateFailed, do: (*syncRun).createVM, undo: (*Handler).removeVM},
	// After Create, whose driver may make files in the run directory, before the VM process
	// opens any. The labels go with the files.
	{name: stepSELinux, reason: ReasonSELinuxLabelFailed, skip: (*syncRun).noSELinux, do: (*syncRun).labelFiles},
	{name: stepOwner, reason: ReasonOwnerFailed, skip: (*syncRun).noOwner, do: (*syncRun).ownFiles},
	{name: stepStart, reason: ReasonStartFailed, do: (*syncRun).startVM},
}

// runSteps runs steps for r's VMI, in order, and returns the first failure with its reason
// (classify). A failed write of the state is the handler's own failure (ReasonInternal).
func (h *Handler) runSteps(ctx context.Context, r *syncRun, steps []step) error {
	for _, s := range steps {
		if s.skip != nil && s.skip(r) {
			continue
		}
		if s.undo != nil {
			if err := r.record(func(st *vmiState) { st.begin(s.name) }); err != nil {
				return err
			}
		}
		if err := s.do(r, ctx); err != nil {
			return classify(s.reason, err)
		}
		if r.timeline != nil {
			r.timeline.mark(s.name, time.Now())
		}
	}
	return nil
}

// record changes the VMI's state, under the lock publish reads it under, and saves it. A failed
// write is the handler's own failure (ReasonInternal).
func (r *syncRun) record(change func(st *vmiState)) error {
	r.h.mu.Lock()
	change(r.st)
	r.h.mu.Unlock()
	if err := r.h.states.save(r.st); err != nil {
		return internal(err)
	}
	return nil
}

// undoSteps undoes the steps recorded in st, last first, each by the undo of the step of that
// name in steps. It returns the recorded steps whose undo failed, in order, and their errors. A
// name steps does not have (recorded by another version of the handler) is left out with a
// warning: this handler cannot undo it.
func (h *Handler) undoSteps(ctx context.Context, st *vmiState, steps []step) ([]string, error) {
	var left []string
	var errs []error
	for _, name := range slices.Backward(st.Steps) {
		i := slices.IndexFunc(steps, func(s step) bool { return s.name == name })
		if i < 0 {
			h.log.Warn("the VMI's state names a step this handler does not know: not undone", "uid", st.UID, "step", name)
			continue
		}
		if steps[i].undo == nil {
			continue
		}
		if err := steps[i].undo(h, ctx, st); err != nil {
			left = append(left, name)
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	slices.Reverse(left)
	return left, errors.Join(errs...)
}
