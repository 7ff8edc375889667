package handler

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/core/plugin"
)

// twoSet is a node with two hypervisor drivers: the fake (the default) and the testdriver's
// fake-hv, two plugin processes.
var twoSet = DriverSet{Hypervisors: []string{fakeHV, testHV}, Network: testNetwork, Storage: testStorage}

// twoManifests are fakeManifests with fake-hv declaring no pause (which it still implements),
// so that the capabilities a VMI is checked against are visibly its own driver's.
func twoManifests(t *testing.T) []plugin.Manifest {
	ms := fakeManifests(t)
	for i := range ms {
		if ms[i].Name == testHV {
			ms[i].Args = append(ms[i].Args, "drop=FEATURE_HYPERVISOR_PAUSE")
		}
	}
	return ms
}

// vmiOn is testVMI run by hypervisor driver hv, as the control plane says it in the status
// ("" for a VMI that names none).
func vmiOn(e *env, name, hv string) *v1alpha1.VirtualMachineInstance {
	vmi := testVMI(name, types.UID("uid-"+name), e.disk)
	vmi.Status.HypervisorDriver = hv
	return vmi
}

// requireOn fails the test unless the VM of vmi is running (after one boot) in hypervisor
// driver on, and is unknown to driver other.
func requireOn(t *testing.T, h *Handler, vmi *v1alpha1.VirtualMachineInstance, on, other string) {
	t.Helper()
	vs, err := vmOf(h, on, vmi.UID)
	if err != nil || vs.GetState() != hypervisorv1.State_STATE_RUNNING || vs.GetBoots() != 1 {
		t.Errorf("VMI %s in driver %s: %v, %v; want running after 1 boot", vmi.Name, on, vs, err)
	}
	if _, err := vmOf(h, other, vmi.UID); status.Code(err) != codes.NotFound {
		t.Errorf("VMI %s in driver %s: %v, want NotFound", vmi.Name, other, err)
	}
	if st := h.entryState(vmi.UID); st == nil || st.Drivers.Hypervisor != on {
		t.Errorf("VMI %s: state %+v, want hypervisor driver %s", vmi.Name, st, on)
	}
}

// TestTwoHypervisorDrivers: one node loads two hypervisor drivers; each VMI runs with the one
// its status names (the default for none), checked against that driver's capabilities; a VMI
// naming a driver the node does not load fails saying so and leaves nothing; one driver's
// plugin SIGKILLed loses none of its VMs (re-adopted by the new process, never started again)
// and disturbs none of the other driver's (same process, status never left Running, events
// still flowing).
func TestTwoHypervisorDrivers(t *testing.T) {
	e := newEnv(t, twoSet, twoManifests(t))
	h := e.start()
	for _, ds := range h.Drivers() {
		if !ds.Loaded {
			t.Fatalf("driver %s not loaded: %s", ds.Name, ds.Error)
		}
	}
	a := vmiOn(e, "a", fakeHV)
	b := vmiOn(e, "b", testHV)
	c := vmiOn(e, "c", "") // the default: fake
	for _, vmi := range []*v1alpha1.VirtualMachineInstance{a, b, c} {
		mustRun(t, h, vmi)
	}
	requireOn(t, h, a, fakeHV, testHV)
	requireOn(t, h, b, testHV, fakeHV)
	requireOn(t, h, c, fakeHV, testHV)

	// Capabilities are the VMI's own driver's.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Pause(ctx, b.UID); status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), `"`+testHV+`"`) {
		t.Errorf("Pause of a VMI on %s (no FEATURE_HYPERVISOR_PAUSE) = %v, want Unimplemented naming it", testHV, err)
	}

	// A driver the node does not load.
	x := vmiOn(e, "x", "libvirt")
	st, err := doSync(t, h, x)
	if err == nil {
		t.Fatal("Sync of a VMI on driver libvirt: no error")
	}
	cond := Condition(st, v1alpha1.VirtualMachineInstanceSynchronized)
	if cond == nil || cond.Reason != ReasonDriverNotFound || !strings.Contains(cond.Message, `hypervisor driver "libvirt" is not one this node runs`) ||
		!strings.Contains(cond.Message, `"fake", "fake-hv"`) {
		t.Errorf("Synchronized = %+v, want %s naming libvirt and the node's drivers", cond, ReasonDriverNotFound)
	}
	requireNothingLeft(t, h, x.UID)

	// SIGKILL fake-hv's plugin.
	fakePid := h.DriverPluginStatus(fakeHV).Pid
	old := h.DriverPluginStatus(testHV)
	if !old.Running || old.Pid == 0 || old.Pid == fakePid {
		t.Fatalf("plugin %s: %+v (fake's pid %d)", testHV, old, fakePid)
	}
	if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, testHV+" restarted", 10*time.Second, func() error {
		if st := h.DriverPluginStatus(testHV); !st.Running || st.Pid == old.Pid || st.Restarts != 1 {
			return fmt.Errorf("plugin status %+v", st)
		}
		return nil
	})
	eventually(t, "VMI b recovered by the new "+testHV, 10*time.Second, func() error {
		vs, err := vmOf(h, testHV, b.UID)
		if err != nil {
			return err
		}
		if vs.GetState() != hypervisorv1.State_STATE_RUNNING || vs.GetBoots() != 1 {
			return fmt.Errorf("VM %v: want running after 1 boot", vs)
		}
		return nil
	})
	if st := h.DriverPluginStatus(fakeHV); st.Pid != fakePid || st.Restarts != 0 {
		t.Errorf("plugin %s after %s's kill: %+v, want pid %d, no restart", fakeHV, testHV, st, fakePid)
	}
	for _, vmi := range []*v1alpha1.VirtualMachineInstance{a, b, c} {
		mustRun(t, h, vmi) // and not started again
		requireNeverFailed(t, e.rec, vmi.UID)
	}
	requireOn(t, h, a, fakeHV, testHV)
	requireOn(t, h, b, testHV, fakeHV)
	requireOn(t, h, c, fakeHV, testHV)

	// The fake's events still reach a's status.
	if err := h.Pause(ctx, a.UID); err != nil {
		t.Fatalf("Pause of a: %v", err)
	}
	e.rec.waitFor(t, a.UID, "paused", 5*time.Second, func(st v1alpha1.VirtualMachineInstanceStatus) bool {
		c := Condition(st, v1alpha1.VirtualMachineInstancePaused)
		return c != nil && c.Status == corev1.ConditionTrue
	})
	if err := h.Unpause(ctx, a.UID); err != nil {
		t.Fatalf("Unpause of a: %v", err)
	}

	// Stopping b leaves a and c running.
	if final, err := h.Stop(ctx, b, time.Second); err != nil || final.Phase != v1alpha1.Succeeded {
		t.Fatalf("Stop b = %s, %v", final.Phase, err)
	}
	requireNothingLeft(t, h, b.UID)
	requireOn(t, h, c, fakeHV, testHV)
	for _, vmi := range []*v1alpha1.VirtualMachineInstance{a, c} {
		if final, err := h.Stop(ctx, vmi, time.Second); err != nil || final.Phase != v1alpha1.Succeeded {
			t.Errorf("Stop %s = %s, %v", vmi.Name, final.Phase, err)
		}
		requireNothingLeft(t, h, vmi.UID)
	}
}

// TestTwoHypervisorDriversHandlerRestart: after a handler restart (its plugins reattached, then
// its plugins gone too) each VM is re-adopted from its state by its own driver, even when the
// configuration's order of the drivers (the default) changed meanwhile.
func TestTwoHypervisorDriversHandlerRestart(t *testing.T) {
	e := newEnv(t, twoSet, twoManifests(t))
	h1 := e.start()
	a, b := vmiOn(e, "a", fakeHV), vmiOn(e, "b", testHV)
	mustRun(t, h1, a)
	mustRun(t, h1, b)
	pids := map[string]int{fakeHV: h1.DriverPluginStatus(fakeHV).Pid, testHV: h1.DriverPluginStatus(testHV).Pid}
	if err := h1.Detach(); err != nil {
		t.Fatal(err)
	}

	e.cfg.Drivers = DriverSet{Hypervisors: []string{testHV, fakeHV}, Network: testNetwork, Storage: testStorage}
	for i, end := range []string{"detach", "close"} {
		e.rec = newRecorder()
		e.opts.OnStatus = e.rec.record
		h := e.start()
		for name, pid := range pids {
			st := h.DriverPluginStatus(name)
			if i == 0 && (!st.Reattached || st.Pid != pid) {
				t.Errorf("after a detach, plugin %s: %+v, want reattached to pid %d", name, st, pid)
			}
			if i == 1 && (st.Reattached || st.Pid == pid) {
				t.Errorf("after a close, plugin %s: %+v, want a new process", name, st)
			}
		}
		for _, vmi := range []*v1alpha1.VirtualMachineInstance{a, b} {
			e.rec.waitFor(t, vmi.UID, "Running after the "+end, 10*time.Second, func(st v1alpha1.VirtualMachineInstanceStatus) bool {
				return st.Phase == v1alpha1.Running
			})
			requireNeverFailed(t, e.rec, vmi.UID)
		}
		requireOn(t, h, a, fakeHV, testHV)
		requireOn(t, h, b, testHV, fakeHV)
		if i == 0 {
			if err := h.Close(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for _, vmi := range []*v1alpha1.VirtualMachineInstance{a, b} {
			if final, err := h.Stop(ctx, vmi, time.Second); err != nil || final.Phase != v1alpha1.Succeeded {
				t.Errorf("Stop %s = %s, %v", vmi.Name, final.Phase, err)
			}
			requireNothingLeft(t, h, vmi.UID)
		}
		cancel()
	}
}

// TestHypervisorDriverNotLoaded: a configured hypervisor driver that is not installed fails
// only the VMIs that name it, with its reason; the other driver runs its VMIs.
func TestHypervisorDriverNotLoaded(t *testing.T) {
	e := newEnv(t, DriverSet{Hypervisors: []string{fakeHV, "libvirt"}, Network: testNetwork, Storage: testStorage}, fakeManifests(t))
	h := e.start()
	mustRun(t, h, vmiOn(e, "a", ""))
	x := vmiOn(e, "x", "libvirt")
	st, err := doSync(t, h, x)
	cond := Condition(st, v1alpha1.VirtualMachineInstanceSynchronized)
	if err == nil || cond == nil || cond.Reason != ReasonDriverNotFound || !strings.Contains(cond.Message, `hypervisor driver "libvirt" is not installed`) {
		t.Errorf("Sync on an uninstalled driver = %v, Synchronized %+v", err, cond)
	}
	requireNothingLeft(t, h, x.UID)
	if ds := h.Drivers(); len(ds) != 4 || ds[0].Kind != driver.KindHypervisor || ds[1].Name != "libvirt" || ds[1].Loaded || ds[1].Error == "" {
		t.Errorf("Drivers() = %+v", ds)
	}
}
