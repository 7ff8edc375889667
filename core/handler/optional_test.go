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

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/core/plugin"
	"github.com/kubevisor/kubevisor/internal/syncbuf"
)

// testHVSet runs VMIs on the testdriver hypervisor.
var testHVSet = DriverSet{Hypervisor: testHV, Network: testNetwork, Storage: testStorage}

// withoutFeatures are fakeManifests whose testdriver hypervisor leaves the features out of its
// Capabilities (it still implements them).
func withoutFeatures(t *testing.T, drop ...basev1.Feature) []plugin.Manifest {
	t.Helper()
	ms := fakeManifests(t)
	args := []string{driver.KindHypervisor, "name=" + testHV}
	for _, f := range drop {
		args = append(args, "drop="+f.String())
	}
	for i, m := range ms {
		if m.Name == testHV {
			ms[i] = manifest(t, bins.testdriver, driver.KindHypervisor, testHV, args...)
		}
	}
	return ms
}

// killHypervisorPlugin kills the hypervisor's plugin process and waits for the host to start it
// again.
func killHypervisorPlugin(t *testing.T, h *Handler) {
	t.Helper()
	old := h.PluginStatus(driver.KindHypervisor)
	if !old.Running || old.Pid == 0 {
		t.Fatalf("hypervisor plugin: %+v", old)
	}
	if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the plugin restarted", 10*time.Second, func() error {
		if st := h.PluginStatus(driver.KindHypervisor); !st.Running || st.Pid == old.Pid {
			return fmt.Errorf("plugin status %+v", st)
		}
		return nil
	})
}

// TestConsoleUndeclared: the console of a VMI whose hypervisor driver does not declare
// FEATURE_HYPERVISOR_CONSOLE is Unimplemented, although the driver implements Console.
func TestConsoleUndeclared(t *testing.T) {
	e := newEnv(t, testHVSet, withoutFeatures(t, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE))
	h := e.start()
	vmi := testVMI("demo", "uid-noconsole", e.disk)
	mustRun(t, h, vmi)
	hv, err := h.host.Hypervisor(testHV)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := hv.(driver.Consoler); ok {
		t.Fatal("the host's client is a driver.Consoler")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = h.Console(ctx, vmi.UID, nil, &strings.Builder{})
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "FEATURE_HYPERVISOR_CONSOLE") {
		t.Fatalf("Console = %v, want Unimplemented naming FEATURE_HYPERVISOR_CONSOLE", err)
	}
}

// TestRecoverUndeclared: after a restart of a hypervisor driver that does not declare
// FEATURE_HYPERVISOR_RECOVER, the handler does not call Recover (which the driver implements and
// would answer RUNNING): the VM is gone as far as the handler can tell, and the VMI fails with
// ProcessGone.
func TestRecoverUndeclared(t *testing.T) {
	e := newEnv(t, testHVSet, withoutFeatures(t, basev1.Feature_FEATURE_HYPERVISOR_RECOVER))
	h := e.start()
	vmi := testVMI("demo", "uid-norecover", e.disk)
	mustRun(t, h, vmi)
	killHypervisorPlugin(t, h)
	e.rec.waitFor(t, vmi.UID, "failed with ProcessGone", 10*time.Second, func(st v1alpha1.VirtualMachineInstanceStatus) bool {
		return st.Phase == v1alpha1.Failed && st.Reason == driver.ReasonProcessGone
	})
	if vs, err := vmOf(h, testHV, vmi.UID); status.Code(err) != codes.NotFound {
		t.Errorf("the new driver process knows the VM (%v, %v): the handler recovered it", vs, err)
	}
}

// TestConsoleFollowsDriverRestart: a reader of a VMI's console (in nil) goes on getting the
// guest's output after the hypervisor driver's process was killed and the handler recovered
// the VM in the new one.
func TestConsoleFollowsDriverRestart(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	h := e.start()
	vmi := testVMI("demo", "uid-follow", e.disk)
	mustRun(t, h, vmi)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncbuf.Buffer{}
	done := make(chan error, 1)
	go func() { done <- h.Console(ctx, vmi.UID, nil, out) }()
	eventually(t, "the first boot on the console", 10*time.Second, func() error {
		if !strings.Contains(out.String(), "boot 1") {
			return fmt.Errorf("console: %q", out.String())
		}
		return nil
	})

	killHypervisorPlugin(t, h)
	eventually(t, "the VM recovered", 10*time.Second, func() error {
		vs, err := vmOf(h, fakeHV, vmi.UID)
		if err != nil {
			return err
		}
		if vs.GetState() != hypervisorv1.State_STATE_RUNNING {
			return fmt.Errorf("VM %v", vs)
		}
		return nil
	})
	hv, err := h.host.Hypervisor(fakeHV)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := driver.Optional[driver.Rebooter](ctx, hv)
	if !ok {
		t.Fatal("the fake hypervisor offers no Rebooter")
	}
	// The console may attach again a little after the VM is recovered: reboot until the
	// follower shows a later boot.
	eventually(t, "a boot after the restart on the console", 15*time.Second, func() error {
		if err := r.Reboot(ctx, string(vmi.UID)); err != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
		if !strings.Contains(out.String(), "boot 2") {
			return fmt.Errorf("console: %q", out.String())
		}
		return nil
	})
	select {
	case err := <-done:
		t.Fatalf("Console returned while the VM runs: %v", err)
	default:
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Console after its context was cancelled = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Console did not return after its context was cancelled")
	}
}
