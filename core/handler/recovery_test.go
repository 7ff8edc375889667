package handler

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// runThree starts three VMIs and returns them with their VMs' boot counts.
func runThree(t *testing.T, e *env, h *Handler) []*v1alpha1.VirtualMachineInstance {
	t.Helper()
	var vmis []*v1alpha1.VirtualMachineInstance
	for i := range 3 {
		vmi := testVMI(fmt.Sprintf("vm-%d", i), types.UID(fmt.Sprintf("uid-recover-%d", i)), e.disk)
		mustRun(t, h, vmi)
		vmis = append(vmis, vmi)
	}
	return vmis
}

// vmOf asks the hypervisor driver for a VM directly.
func vmOf(h *Handler, name string, uid types.UID) (*hypervisorv1.VMStatus, error) {
	hv, err := h.host.Hypervisor(name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return hv.Status(ctx, string(uid))
}

// requireNeverFailed fails the test when a VMI's recorded statuses ever left Running or lost
// Ready once it ran.
func requireNeverFailed(t *testing.T, rec *recorder, uid types.UID) {
	t.Helper()
	got := rec.phases(uid)
	if len(got) > 0 && got[0] == v1alpha1.Scheduled {
		got = got[1:]
	}
	if !equalPhases(got, v1alpha1.Running) {
		t.Errorf("VMI %s went through phases %v, want only Running once it ran", uid, rec.phases(uid))
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	ran := false
	for i, st := range rec.seen[uid] {
		ran = ran || st.Phase == v1alpha1.Running
		if c := Condition(st, v1alpha1.VirtualMachineInstanceReady); ran && (c == nil || c.Status != corev1.ConditionTrue) {
			t.Errorf("VMI %s status #%d: Ready = %+v", uid, i, c)
		}
	}
}

// TestRecoverAfterHypervisorPluginKilled: three VMs run on the fake hypervisor; its plugin
// process is killed with SIGKILL; the plugin host starts it again; the handler re-adopts the
// VMs from their handles (the fake's Recover reads each VM's record in its run directory).
// The VMs were never started again, their status never left Running, and events flow again.
func TestRecoverAfterHypervisorPluginKilled(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	h := e.start()
	vmis := runThree(t, e, h)

	old := h.PluginStatus(driver.KindHypervisor)
	if !old.Running || old.Pid == 0 {
		t.Fatalf("hypervisor plugin: %+v", old)
	}
	if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the plugin restarted", 10*time.Second, func() error {
		st := h.PluginStatus(driver.KindHypervisor)
		if !st.Running || st.Pid == old.Pid || st.Restarts != 1 {
			return fmt.Errorf("plugin status %+v", st)
		}
		return nil
	})
	// The new process knows the VMs once the handler recovered them.
	for _, vmi := range vmis {
		eventually(t, "VM "+string(vmi.UID)+" recovered", 10*time.Second, func() error {
			vs, err := vmOf(h, fakeHV, vmi.UID)
			if err != nil {
				return err
			}
			if vs.GetState() != hypervisorv1.State_STATE_RUNNING || vs.GetBoots() != 1 {
				return fmt.Errorf("VM %v: want running after 1 boot", vs)
			}
			return nil
		})
	}
	// Events reach the status again: the stream was reopened on the new process.
	hv, _ := h.host.Hypervisor(fakeHV)
	if err := mustPauser(t, hv).Pause(context.Background(), string(vmis[0].UID)); err != nil {
		t.Fatal(err)
	}
	e.rec.waitFor(t, vmis[0].UID, "paused after the restart", 5*time.Second, func(st v1alpha1.VirtualMachineInstanceStatus) bool {
		c := Condition(st, v1alpha1.VirtualMachineInstancePaused)
		return c != nil && c.Status == corev1.ConditionTrue
	})
	if err := mustPauser(t, hv).Resume(context.Background(), string(vmis[0].UID)); err != nil {
		t.Fatal(err)
	}
	e.rec.waitFor(t, vmis[0].UID, "resumed", 5*time.Second, func(st v1alpha1.VirtualMachineInstanceStatus) bool {
		return Condition(st, v1alpha1.VirtualMachineInstancePaused) == nil
	})
	for _, vmi := range vmis[1:] {
		requireNeverFailed(t, e.rec, vmi.UID)
		// Sync does not start it again either.
		mustRun(t, h, vmi)
	}
	if got := e.rec.phases(vmis[0].UID); !equalPhases(got, v1alpha1.Scheduled, v1alpha1.Running) {
		t.Errorf("paused VMI went through phases %v", got)
	}
	for _, vmi := range vmis {
		if vs, err := vmOf(h, fakeHV, vmi.UID); err != nil || vs.GetBoots() != 1 {
			t.Errorf("VM %s: %v %v, want 1 boot", vmi.UID, vs, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := h.Stop(ctx, vmi, time.Second); err != nil {
			t.Errorf("Stop: %v", err)
		}
		cancel()
		requireNothingLeft(t, h, vmi.UID)
	}
}

// TestRecoverAfterHandlerRestart: three VMs run; the handler detaches (as a handler process
// that exits or is upgraded does); a new handler on the same state directory reattaches to the
// plugins and re-adopts the VMs from the persisted state. None is started again.
func TestRecoverAfterHandlerRestart(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	h1 := e.start()
	vmis := runThree(t, e, h1)
	pid := h1.PluginStatus(driver.KindHypervisor).Pid
	if err := h1.Detach(); err != nil {
		t.Fatal(err)
	}

	e.rec = newRecorder()
	e.opts.OnStatus = e.rec.record
	h2 := e.start()
	if st := h2.PluginStatus(driver.KindHypervisor); !st.Reattached || st.Pid != pid {
		t.Errorf("hypervisor plugin after the restart: %+v, want reattached to pid %d", st, pid)
	}
	if got := h2.VMIs(); len(got) != 3 {
		t.Fatalf("VMIs after the restart = %v", got)
	}
	for _, vmi := range vmis {
		e.rec.waitFor(t, vmi.UID, "Running after the restart", 10*time.Second, func(st v1alpha1.VirtualMachineInstanceStatus) bool {
			return st.Phase == v1alpha1.Running
		})
		st := mustRun(t, h2, vmi)
		if c := Condition(st, v1alpha1.VirtualMachineInstanceReady); c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("Ready = %+v", c)
		}
		if vs, err := vmOf(h2, fakeHV, vmi.UID); err != nil || vs.GetBoots() != 1 {
			t.Errorf("VM %s: %v %v, want 1 boot", vmi.UID, vs, err)
		}
		requireNeverFailed(t, e.rec, vmi.UID)
	}

	// And a handler restart with the hypervisor plugin gone too (the node's processes were
	// restarted, the VMs' records kept): a new plugin process, the VMs recovered from their
	// handles.
	if err := h2.Close(); err != nil {
		t.Fatal(err)
	}
	e.rec = newRecorder()
	e.opts.OnStatus = e.rec.record
	h3 := e.start()
	if st := h3.PluginStatus(driver.KindHypervisor); st.Reattached || st.Pid == pid {
		t.Errorf("hypervisor plugin: %+v, want a new process", st)
	}
	for _, vmi := range vmis {
		e.rec.waitFor(t, vmi.UID, "Running after the second restart", 10*time.Second, func(st v1alpha1.VirtualMachineInstanceStatus) bool {
			return st.Phase == v1alpha1.Running
		})
		if vs, err := vmOf(h3, fakeHV, vmi.UID); err != nil || vs.GetBoots() != 1 {
			t.Errorf("VM %s: %v %v, want 1 boot", vmi.UID, vs, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if final, err := h3.Stop(ctx, vmi, time.Second); err != nil || final.Phase != v1alpha1.Succeeded {
			t.Errorf("Stop = %s, %v", final.Phase, err)
		}
		cancel()
		requireNothingLeft(t, h3, vmi.UID)
	}
}
