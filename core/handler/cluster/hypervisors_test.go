package cluster

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// onDriver is the launcher pod label of a class of hypervisor driver name.
func onDriver(name string) map[string]string {
	return map[string]string{v1alpha1.HypervisorDriverLabel: name}
}

// TestAgentTwoHypervisorDrivers: a node runs two hypervisor drivers (the fake and the
// testdriver's fake-hv, two plugin processes); each VMI runs with the driver its launcher pod
// names; a VMI whose pod names a driver the node does not run is failed in its status naming it;
// SIGKILL of one driver's plugin leaves every VMI Running, and the other driver's plugin
// process as it was; the VMI of the killed driver is stopped through the new process, leaving
// the other's running.
func TestAgentTwoHypervisorDrivers(t *testing.T) {
	n := newAgentNodeWith(t, false, "fake-hv")
	ctx := context.Background()

	a, b, x := n.vmi("a"), n.vmi("b"), n.vmi("x")
	podA := n.launcherPod(a, onDriver("fake"))
	podB := n.launcherPod(b, onDriver("fake-hv"))
	n.launcherPod(x, onDriver("libvirt"))
	for _, name := range []string{"a", "b"} {
		n.waitVMI(name, "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })
	}
	for uid, want := range map[types.UID]string{a.UID: "fake", b.UID: "fake-hv"} {
		if got, ok := n.h.HypervisorDriver(uid); !ok || got != want {
			t.Errorf("VMI %s runs on driver %q (%v), want %q", uid, got, ok, want)
		}
	}
	n.waitVMI("x", "Synchronized=False naming libvirt", func(v *v1alpha1.VirtualMachineInstance) bool {
		c := condition(v, v1alpha1.VirtualMachineInstanceSynchronized)
		return c != nil && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, `"libvirt"`)
	})

	fake, old := n.h.DriverPluginStatus("fake"), n.h.DriverPluginStatus("fake-hv")
	if !old.Running || old.Pid == 0 || old.Pid == fake.Pid {
		t.Fatalf("plugins: fake %+v, fake-hv %+v", fake, old)
	}
	if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		st := n.h.DriverPluginStatus("fake-hv")
		if st.Running && st.Pid != old.Pid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fake-hv not restarted: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Over a few of the agent's and the handler's resyncs, both VMIs stay Running and Ready.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		for _, name := range []string{"a", "b"} {
			v := n.waitVMI(name, "found", func(*v1alpha1.VirtualMachineInstance) bool { return true })
			if c := condition(v, v1alpha1.VirtualMachineInstanceReady); v.Status.Phase != v1alpha1.Running || c == nil || c.Status != corev1.ConditionTrue {
				t.Fatalf("VMI %s after fake-hv's kill: phase %s, Ready %+v", name, v.Status.Phase, c)
			}
		}
	}
	if st := n.h.DriverPluginStatus("fake"); st.Pid != fake.Pid || st.Restarts != 0 {
		t.Errorf("fake after fake-hv's kill: %+v, want pid %d, no restart", st, fake.Pid)
	}

	// b, whose VM the new fake-hv process re-adopted, stops; a keeps running.
	if err := n.c.Delete(ctx, podB); err != nil {
		t.Fatal(err)
	}
	n.waitVMI("b", "Succeeded", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Succeeded })
	n.waitHandlerForgets(b.UID)
	got := n.waitVMI("a", "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })
	if c := condition(got, v1alpha1.VirtualMachineInstanceReady); c == nil || c.Status != corev1.ConditionTrue {
		t.Errorf("VMI a after b stopped: Ready %+v", c)
	}
	if err := n.c.Delete(ctx, podA); err != nil {
		t.Fatal(err)
	}
	n.waitVMI("a", "Succeeded", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Succeeded })
}
