package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// stepsNode is a handler with only a state directory, for the runner's tests: its steps call no
// driver.
func stepsNode(t *testing.T) (*Handler, *vmiState) {
	t.Helper()
	dir := t.TempDir()
	h := &Handler{log: hclog.NewNullLogger(), states: stateStore{dir: dir}}
	st := &vmiState{Version: stateVersion, UID: "uid-steps", Name: "steps",
		RunDir: filepath.Join(dir, "run"), WorkDir: filepath.Join(dir, "work")}
	return h, st
}

// savedSteps reads the steps of the state on disk.
func savedSteps(t *testing.T, h *Handler, st *vmiState) []string {
	t.Helper()
	b, err := os.ReadFile(h.states.path(st.UID))
	if err != nil {
		t.Fatal(err)
	}
	var saved vmiState
	if err := json.Unmarshal(b, &saved); err != nil {
		t.Fatal(err)
	}
	return saved.Steps
}

// TestRunStepsRecordsAndUndoesInReverse: each step with an undo is on disk before its do runs;
// a failing step stops the run with its reason; undoing, from the state read back from disk as
// a restarted handler would, runs the recorded steps' undos last first, skips steps without an
// undo and names it does not know, and keeps a step whose undo failed.
func TestRunStepsRecordsAndUndoesInReverse(t *testing.T) {
	h, st := stepsNode(t)
	var calls []string
	// mk makes a step whose do fails with doErr; with undo set, it has an undo failing with
	// undoErr.
	mk := func(name string, doErr error, undo bool, undoErr error) step {
		s := step{name: name, reason: "Failed-" + name}
		s.do = func(*syncRun, context.Context) error {
			calls = append(calls, "do "+name)
			if undo && !slices.Contains(savedSteps(t, h, st), name) {
				t.Errorf("step %s runs before it is saved in the state", name)
			}
			return doErr
		}
		if undo {
			s.undo = func(*Handler, context.Context, *vmiState) error {
				calls = append(calls, "undo "+name)
				return undoErr
			}
		}
		return s
	}
	undoFails := errors.New("undo fails")
	skipped := mk("skipped", nil, true, nil)
	skipped.skip = func(*syncRun) bool { return true }
	steps := []step{
		mk("a", nil, true, nil),
		mk("b", nil, false, nil),
		skipped,
		mk("c", nil, true, undoFails),
		mk("d", nil, true, nil),
		mk("e", status.Error(codes.Internal, "the driver says no"), true, nil),
		mk("f", nil, true, nil),
	}

	err := h.runSteps(context.Background(), &syncRun{h: h, st: st}, steps)
	var re *reasonError
	if !errors.As(err, &re) || re.reason != "Failed-e" {
		t.Fatalf("runSteps = %v, want the failing step's reason Failed-e", err)
	}
	if want := []string{"do a", "do b", "do c", "do d", "do e"}; !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
	onDisk := savedSteps(t, h, st)
	if want := []string{"a", "c", "d", "e"}; !slices.Equal(onDisk, want) {
		t.Errorf("recorded steps %v, want %v (those with an undo that began)", onDisk, want)
	}

	// A restarted handler has only the state on disk, here with a step of a later version.
	calls = nil
	restored := &vmiState{UID: st.UID, Steps: append(slices.Clone(onDisk), "from-the-future")}
	left, err := h.undoSteps(context.Background(), restored, steps)
	if want := []string{"undo e", "undo d", "undo c", "undo a"}; !slices.Equal(calls, want) {
		t.Errorf("undo calls %v, want %v", calls, want)
	}
	if !errors.Is(err, undoFails) || !strings.Contains(err.Error(), "c: undo fails") {
		t.Errorf("undoSteps error %v, want c's", err)
	}
	if !slices.Equal(left, []string{"c"}) {
		t.Errorf("steps left %v, want [c]", left)
	}
}

// TestRunStepsStateWriteFailureIsInternal: when the state cannot be saved before a step, the
// step does not run and the failure is the handler's (ReasonInternal), not the step's.
func TestRunStepsStateWriteFailureIsInternal(t *testing.T) {
	h, st := stepsNode(t)
	h.states.dir = filepath.Join(h.states.dir, "gone")
	ran := false
	steps := []step{{
		name: stepStorage, reason: ReasonStorageFailed,
		do:   func(*syncRun, context.Context) error { ran = true; return nil },
		undo: func(*Handler, context.Context, *vmiState) error { return nil },
	}}
	err := h.runSteps(context.Background(), &syncRun{h: h, st: st}, steps)
	var re *reasonError
	if !errors.As(err, &re) || re.reason != ReasonInternal || !strings.Contains(err.Error(), "save state") {
		t.Errorf("runSteps = %v, want %s saying the state was not saved", err, ReasonInternal)
	}
	if ran {
		t.Error("the step ran though its record was not saved")
	}
}

// TestClassify: a reason given stays; a driver's error (a gRPC status, wrapped or not) is the
// step's failure; any other error is the handler's own.
func TestClassify(t *testing.T) {
	grpcErr := status.Error(codes.FailedPrecondition, "no such disk")
	for _, tt := range []struct {
		name string
		err  error
		want string
	}{
		{"driver error", grpcErr, ReasonStorageFailed},
		{"wrapped driver error", fmt.Errorf("resource %q: %w", "kvm", grpcErr), ReasonStorageFailed},
		{"driver unavailable", status.Error(codes.Unavailable, `driver "local" is not running`), ReasonStorageFailed},
		{"given a reason", failed(ReasonDomainFailed, errors.New("bad spec")), ReasonDomainFailed},
		{"internal", internal(errors.New("disk full")), ReasonInternal},
		{"unknown", errors.New("something else"), ReasonInternal},
		{"context", context.DeadlineExceeded, ReasonInternal},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := classify(ReasonStorageFailed, tt.err); got.reason != tt.want || got.err == nil {
				t.Errorf("classify = %q (%v), want %q", got.reason, got.err, tt.want)
			}
		})
	}
}

// TestSyncStateWriteFailureIsInternal: a sync whose state cannot be written fails with
// ReasonInternal (not as the storage step), and nothing of it is left in the drivers.
func TestSyncStateWriteFailureIsInternal(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	h := e.start()
	vmis := filepath.Join(e.cfg.StateDir, "vmis")
	if err := os.RemoveAll(vmis); err != nil {
		t.Fatal(err)
	}
	vmi := testVMI("nostate", "uid-no-state", e.disk)
	st, err := doSync(t, h, vmi)
	c := Condition(st, v1alpha1.VirtualMachineInstanceSynchronized)
	if err == nil || c == nil || c.Status != corev1.ConditionFalse || c.Reason != ReasonInternal || !strings.Contains(c.Message, "save state") {
		t.Fatalf("Sync = %v, Synchronized %+v; want %s saying the state was not saved", err, c, ReasonInternal)
	}
	if err := os.Mkdir(vmis, 0o700); err != nil {
		t.Fatal(err)
	}
	requireNothingLeft(t, h, vmi.UID)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.Stop(ctx, vmi, time.Second); err != nil {
		t.Errorf("Stop: %v", err)
	}
}
