package handler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// testSandbox is a Sandbox of the tests: Open returns spec, or err when it is set; end ends it.
type testSandbox struct {
	spec SandboxSpec
	err  error

	exited chan struct{}
	once   sync.Once

	mu     sync.Mutex
	why    string
	opens  int
	closes int
}

func newTestSandbox(spec SandboxSpec) *testSandbox {
	return &testSandbox{spec: spec, exited: make(chan struct{})}
}

func (s *testSandbox) Open(context.Context) (SandboxSpec, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opens++
	return s.spec, s.err
}

func (s *testSandbox) Exited() <-chan struct{} { return s.exited }

func (s *testSandbox) ExitReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.why
}

func (s *testSandbox) Close(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closes++
	return nil
}

// end ends the sandbox, saying why.
func (s *testSandbox) end(why string) {
	s.once.Do(func() {
		s.mu.Lock()
		s.why = why
		s.mu.Unlock()
		close(s.exited)
	})
}

func (s *testSandbox) counts() (opens, closes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opens, s.closes
}

// sandboxesOf gives the sandboxes of sbs, by VMI UID; a VMI not in sbs has none.
func sandboxesOf(sbs map[types.UID]*testSandbox) Sandboxes {
	return SandboxesFunc(func(vmi *v1alpha1.VirtualMachineInstance) Sandbox {
		if sb := sbs[vmi.UID]; sb != nil {
			return sb
		}
		return nil
	})
}

// TestSandboxNotReadyAndSandboxExited: a sandbox that cannot be opened fails the sync with
// SandboxNotReady and leaves nothing; a sandbox that ends under a running VM fails the VMI with
// LauncherExited, and Stop closes it, once.
func TestSandboxNotReadyAndSandboxExited(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	notReady := newTestSandbox(SandboxSpec{})
	notReady.err = errors.New("the launcher pod is not running")
	exits := newTestSandbox(SandboxSpec{NetNSPath: "/run/netns/none"})
	e.opts.Sandboxes = sandboxesOf(map[types.UID]*testSandbox{"uid-no-sandbox": notReady, "uid-sandbox-exits": exits})
	h := e.start()
	st, err := doSync(t, h, testVMI("a", "uid-no-sandbox", e.disk))
	if c := Condition(st, v1alpha1.VirtualMachineInstanceSynchronized); err == nil || c == nil || c.Reason != ReasonSandboxNotReady {
		t.Errorf("Sync = %v, %+v", err, c)
	}
	requireNothingLeft(t, h, "uid-no-sandbox")
	if _, closes := notReady.counts(); closes != 0 {
		t.Errorf("a failed sync closed the sandbox (%d times): only Stop does", closes)
	}

	vmi := testVMI("b", "uid-sandbox-exits", e.disk)
	mustRun(t, h, vmi)
	exits.end("the launcher was killed")
	e.rec.waitFor(t, vmi.UID, "Failed", 5*time.Second, func(st v1alpha1.VirtualMachineInstanceStatus) bool {
		return st.Phase == v1alpha1.Failed && st.Reason == ReasonSandboxExited
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if final, err := h.Stop(ctx, vmi, time.Second); err != nil || final.Phase != v1alpha1.Failed || final.Reason != ReasonSandboxExited {
		t.Errorf("Stop = %s (%s), %v", final.Phase, final.Reason, err)
	}
	requireNothingLeft(t, h, vmi.UID)
	if opens, closes := exits.counts(); opens != 1 || closes != 1 {
		t.Errorf("sandbox opened %d, closed %d times; want 1, 1", opens, closes)
	}
}

// TestSandboxEndExplainsTheVMsEnd: the hypervisor driver sees a VM's process go a moment before
// the end of the sandbox holding it is noticed: the VMI fails with LauncherExited all the same,
// never passing through the VM's own reason. A VM that ends while its sandbox lives fails with
// its own reason once sandboxSettle has passed.
func TestSandboxEndExplainsTheVMsEnd(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	killed, lives := newTestSandbox(SandboxSpec{}), newTestSandbox(SandboxSpec{})
	e.opts.Sandboxes = sandboxesOf(map[types.UID]*testSandbox{"uid-killed-with": killed, "uid-sandbox-lives": lives})
	h := e.start()
	hv, err := h.host.Hypervisor(fakeHV)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	with := testVMI("with", "uid-killed-with", e.disk)
	mustRun(t, h, with)
	if err := hv.Kill(ctx, string(with.UID)); err != nil {
		t.Fatal(err)
	}
	// The driver has seen the VM go, and its event reached the handler; the sandbox's end is
	// noticed later.
	eventually(t, "the VM stopped", 5*time.Second, func() error {
		if vs, err := hv.Status(ctx, string(with.UID)); err != nil || vs.GetState() != hypervisorv1.State_STATE_STOPPED {
			return fmt.Errorf("VM %v, %v", vs, err)
		}
		return nil
	})
	time.Sleep(sandboxSettle / 4)
	killed.end("the launcher was killed")
	e.rec.waitFor(t, with.UID, "Failed for the sandbox", 5*time.Second, func(st v1alpha1.VirtualMachineInstanceStatus) bool {
		return st.Phase == v1alpha1.Failed && st.Reason == ReasonSandboxExited
	})
	if got := reasonsOf(e.rec, with.UID, v1alpha1.Failed); slices.ContainsFunc(got, func(r string) bool { return r != ReasonSandboxExited }) {
		t.Errorf("the VMI was Failed with reasons %q, want only %s", got, ReasonSandboxExited)
	}

	alone := testVMI("alone", "uid-sandbox-lives", e.disk)
	mustRun(t, h, alone)
	if err := hv.Kill(ctx, string(alone.UID)); err != nil {
		t.Fatal(err)
	}
	e.rec.waitFor(t, alone.UID, "Failed", sandboxSettle+5*time.Second, func(st v1alpha1.VirtualMachineInstanceStatus) bool {
		return st.Phase == v1alpha1.Failed && st.Reason == driver.ReasonKilled
	})
	for _, vmi := range []*v1alpha1.VirtualMachineInstance{with, alone} {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := h.Stop(sctx, vmi, time.Second); err != nil {
			t.Errorf("Stop %s: %v", vmi.Name, err)
		}
		cancel()
		requireNothingLeft(t, h, vmi.UID)
	}
}

// reasonsOf returns the reasons the VMI's recorded statuses of a phase had.
func reasonsOf(rec *recorder, uid types.UID, phase v1alpha1.VirtualMachineInstancePhase) []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var out []string
	for _, st := range rec.seen[uid] {
		if st.Phase == phase {
			out = append(out, st.Reason)
		}
	}
	return out
}
