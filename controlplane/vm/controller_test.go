package vm

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// Generous: the machines that run these share two cores with compilers.
const (
	eventually = 60 * time.Second
	consistent = 3 * time.Second
	poll       = 100 * time.Millisecond
)

// testStartBackoff keeps crash-loop waits short enough for the test and long enough to be seen.
const testStartBackoff = time.Second

// TestController runs the VM controller in a real manager against a real API server. Nothing else
// runs: the test plays the VMI controller and the node handler by writing VMI status.phase.
func TestController(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	// The manager runs with only what the RBAC markers grant.
	cfg := env.ImpersonateWithMarkers(t, "vm-controller", "controller.go")
	envtest.StartManager(t, cfg, func(mgr ctrl.Manager) error {
		return SetupWithManager(mgr, Options{StartBackoff: testStartBackoff, MaxStartBackoff: 2 * testStartBackoff, SkipNameValidation: true})
	})
	h := &harness{c: env.Client}

	t.Run("Always", func(t *testing.T) {
		vm := h.createVM(t, "always", func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.RunStrategy = ptr.To(v1alpha1.RunStrategyAlways)
			vm.Spec.Template.ObjectMeta.Labels = map[string]string{"app": "web"}
		})
		vmi := h.waitVMI(t, vm, "created", func(*v1alpha1.VirtualMachineInstance) bool { return true })
		if ref := metav1.GetControllerOf(vmi); ref == nil || ref.UID != vm.UID || ref.Kind != "VirtualMachine" {
			t.Errorf("VMI controller ref = %+v, want the VM", ref)
		}
		if vmi.Labels[v1alpha1.VirtualMachineNameLabel] != vm.Name || vmi.Labels["app"] != "web" {
			t.Errorf("VMI labels = %v", vmi.Labels)
		}
		got := h.waitVM(t, vm, "Starting", func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.PrintableStatus == v1alpha1.VirtualMachineStatusStarting && vm.Status.Created && !vm.Status.Ready
		})
		if !controllerutil.ContainsFinalizer(got, Finalizer) {
			t.Errorf("finalizers = %v, want %s", got.Finalizers, Finalizer)
		}
		if got.Status.RunStrategy != v1alpha1.RunStrategyAlways || got.Status.DesiredGeneration != got.Generation || got.Status.ObservedGeneration != got.Generation {
			t.Errorf("status = %+v", got.Status)
		}

		envtest.SetVMIPhase(t, h.c, vmi, v1alpha1.Running, true)
		got = h.waitVM(t, vm, "Running and ready", func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.PrintableStatus == v1alpha1.VirtualMachineStatusRunning && vm.Status.Ready
		})
		if c := v1alpha1.FindCondition(got.Status.Conditions, v1alpha1.VirtualMachineReady); c == nil || c.Status != corev1.ConditionTrue || c.ObservedGeneration != got.Generation {
			t.Errorf("Ready condition = %+v", c)
		}

		// A failed VMI is replaced after the crash-loop back-off, and the failure is counted.
		envtest.SetVMIPhase(t, h.c, vmi, v1alpha1.Failed, false)
		second := h.waitVMI(t, vm, "replaced after Failed", func(n *v1alpha1.VirtualMachineInstance) bool { return n.UID != vmi.UID })
		got = h.waitVM(t, vm, "start failure counted", func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.StartFailure != nil && vm.Status.Created
		})
		if sf := got.Status.StartFailure; sf.ConsecutiveFailCount != 1 || sf.LastFailedVMIUID != vmi.UID {
			t.Errorf("startFailure = %+v, want 1 failure of %s", sf, vmi.UID)
		}
		// Running again forgets the failures; a VMI that succeeds is replaced as well under Always.
		envtest.SetVMIPhase(t, h.c, second, v1alpha1.Running, true)
		h.waitVM(t, vm, "failures forgotten", func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.StartFailure == nil && vm.Status.Ready
		})
		envtest.SetVMIPhase(t, h.c, second, v1alpha1.Succeeded, false)
		h.waitVMI(t, vm, "replaced after Succeeded", func(n *v1alpha1.VirtualMachineInstance) bool { return n.UID != second.UID && n.UID != vmi.UID })
		h.waitEvent(t, vm, v1alpha1.ReasonSuccessfulCreate)
		h.waitEvent(t, vm, v1alpha1.ReasonSuccessfulDelete)
		h.waitEvent(t, vm, v1alpha1.ReasonCrashLoopBackOff)
	})

	t.Run("RerunOnFailure", func(t *testing.T) {
		ok := h.createVM(t, "rerun-succeeds", func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.RunStrategy = ptr.To(v1alpha1.RunStrategyRerunOnFailure)
		})
		vmi := h.waitVMI(t, ok, "created", func(*v1alpha1.VirtualMachineInstance) bool { return true })
		envtest.SetVMIPhase(t, h.c, vmi, v1alpha1.Succeeded, false)
		h.waitVM(t, ok, "Stopped", func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.PrintableStatus == v1alpha1.VirtualMachineStatusStopped
		})
		h.consistentlyVMI(t, ok, "the Succeeded VMI stays", func(n *v1alpha1.VirtualMachineInstance) bool {
			return n != nil && n.UID == vmi.UID && n.Status.Phase == v1alpha1.Succeeded
		})

		failing := h.createVM(t, "rerun-fails", func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.RunStrategy = ptr.To(v1alpha1.RunStrategyRerunOnFailure)
		})
		vmi = h.waitVMI(t, failing, "created", func(*v1alpha1.VirtualMachineInstance) bool { return true })
		envtest.SetVMIPhase(t, h.c, vmi, v1alpha1.Failed, false)
		h.waitVMI(t, failing, "replaced after Failed", func(n *v1alpha1.VirtualMachineInstance) bool { return n.UID != vmi.UID })
	})

	t.Run("Once", func(t *testing.T) {
		vm := h.createVM(t, "once", func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.RunStrategy = ptr.To(v1alpha1.RunStrategyOnce)
		})
		vmi := h.waitVMI(t, vm, "created", func(*v1alpha1.VirtualMachineInstance) bool { return true })
		envtest.SetVMIPhase(t, h.c, vmi, v1alpha1.Running, true)
		h.waitVM(t, vm, "Running", func(vm *v1alpha1.VirtualMachine) bool { return vm.Status.Ready })
		envtest.SetVMIPhase(t, h.c, vmi, v1alpha1.Failed, false)
		h.waitVM(t, vm, "Stopped", func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.PrintableStatus == v1alpha1.VirtualMachineStatusStopped && !vm.Status.Ready && vm.Status.StartFailure == nil
		})
		h.consistentlyVMI(t, vm, "the Failed VMI stays, nothing reruns", func(n *v1alpha1.VirtualMachineInstance) bool {
			return n != nil && n.UID == vmi.UID
		})
	})

	t.Run("Halted", func(t *testing.T) {
		vm := h.createVM(t, "halted", func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.RunStrategy = ptr.To(v1alpha1.RunStrategyAlways)
		})
		vmi := h.waitVMI(t, vm, "created", func(*v1alpha1.VirtualMachineInstance) bool { return true })
		envtest.SetVMIPhase(t, h.c, vmi, v1alpha1.Running, true)
		h.waitVM(t, vm, "Running", func(vm *v1alpha1.VirtualMachine) bool { return vm.Status.Ready })
		envtest.Update(t, h.c, vm, func(vm *v1alpha1.VirtualMachine) { vm.Spec.RunStrategy = ptr.To(v1alpha1.RunStrategyHalted) })
		h.waitNoVMI(t, vm)
		got := h.waitVM(t, vm, "Stopped", func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.PrintableStatus == v1alpha1.VirtualMachineStatusStopped && !vm.Status.Created && !vm.Status.Ready
		})
		if c := v1alpha1.FindCondition(got.Status.Conditions, v1alpha1.VirtualMachineReady); c == nil || c.Status != corev1.ConditionFalse || c.Reason != ReasonVMINotExists {
			t.Errorf("Ready condition = %+v", c)
		}
		if got.Status.RunStrategy != v1alpha1.RunStrategyHalted {
			t.Errorf("status.runStrategy = %q", got.Status.RunStrategy)
		}
		h.consistentlyVMI(t, vm, "no VMI", func(n *v1alpha1.VirtualMachineInstance) bool { return n == nil })
	})

	t.Run("Manual", func(t *testing.T) {
		vm := h.createVM(t, "manual", func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.RunStrategy = ptr.To(v1alpha1.RunStrategyManual)
		})
		h.waitVM(t, vm, "Stopped", func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.PrintableStatus == v1alpha1.VirtualMachineStatusStopped
		})
		h.consistentlyVMI(t, vm, "no VMI without a request", func(n *v1alpha1.VirtualMachineInstance) bool { return n == nil })

		h.request(t, vm, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest})
		vmi := h.waitVMI(t, vm, "started on request", func(*v1alpha1.VirtualMachineInstance) bool { return true })
		h.waitVM(t, vm, "start request consumed", func(vm *v1alpha1.VirtualMachine) bool { return len(vm.Status.StateChangeRequests) == 0 })
		envtest.SetVMIPhase(t, h.c, vmi, v1alpha1.Running, true)
		h.waitVM(t, vm, "Running", func(vm *v1alpha1.VirtualMachine) bool { return vm.Status.Ready })

		uid := vmi.UID
		h.request(t, vm, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest, UID: &uid})
		h.waitNoVMI(t, vm)
		h.waitVM(t, vm, "stopped on request", func(vm *v1alpha1.VirtualMachine) bool {
			return len(vm.Status.StateChangeRequests) == 0 && vm.Status.PrintableStatus == v1alpha1.VirtualMachineStatusStopped
		})
		h.consistentlyVMI(t, vm, "stays stopped", func(n *v1alpha1.VirtualMachineInstance) bool { return n == nil })

		// A VMI that stops by itself stays stopped under Manual; Start replaces it.
		h.request(t, vm, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest})
		vmi = h.waitVMI(t, vm, "started again", func(*v1alpha1.VirtualMachineInstance) bool { return true })
		// Until the request is consumed, a finished VMI is what it asks to replace: wait, or the
		// controller rightly deletes the VMI the test is about to finish.
		h.waitVM(t, vm, "second start request consumed", func(vm *v1alpha1.VirtualMachine) bool { return len(vm.Status.StateChangeRequests) == 0 })
		envtest.SetVMIPhase(t, h.c, vmi, v1alpha1.Succeeded, false)
		h.consistentlyVMI(t, vm, "finished VMI stays", func(n *v1alpha1.VirtualMachineInstance) bool { return n != nil && n.UID == vmi.UID })
		h.request(t, vm, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest})
		h.waitVMI(t, vm, "finished VMI replaced on Start", func(n *v1alpha1.VirtualMachineInstance) bool { return n.UID != vmi.UID })
	})

	t.Run("Running", func(t *testing.T) {
		vm := h.createVM(t, "running", func(vm *v1alpha1.VirtualMachine) { vm.Spec.Running = ptr.To(true) })
		vmi := h.waitVMI(t, vm, "created for running=true", func(*v1alpha1.VirtualMachineInstance) bool { return true })
		h.waitVM(t, vm, "runStrategy Always", func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.RunStrategy == v1alpha1.RunStrategyAlways
		})
		envtest.SetVMIPhase(t, h.c, vmi, v1alpha1.Failed, false)
		vmi = h.waitVMI(t, vm, "restarted", func(n *v1alpha1.VirtualMachineInstance) bool { return n.UID != vmi.UID })
		envtest.Update(t, h.c, vm, func(vm *v1alpha1.VirtualMachine) { vm.Spec.Running = ptr.To(false) })
		h.waitNoVMI(t, vm)
		h.waitVM(t, vm, "Stopped", func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.PrintableStatus == v1alpha1.VirtualMachineStatusStopped && vm.Status.RunStrategy == v1alpha1.RunStrategyHalted
		})
	})

	t.Run("RunningAndRunStrategy", func(t *testing.T) {
		// The CRD's CEL rule refuses both at once, so such a VM never reaches the controller
		// through the API; Decide's table covers the Failure condition it would get.
		vm := newTestVM(h.namespace(t), "both")
		vm.Spec.Running = ptr.To(true)
		vm.Spec.RunStrategy = ptr.To(v1alpha1.RunStrategyAlways)
		err := h.c.Create(context.Background(), vm)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "mutually exclusive") {
			t.Fatalf("create with running and runStrategy: %v, want Invalid ... mutually exclusive", err)
		}
		h.consistentlyVMI(t, vm, "no VMI", func(n *v1alpha1.VirtualMachineInstance) bool { return n == nil })
	})

	t.Run("what keeps the VMI from starting: ErrImagePull, then ErrorPvcNotFound, with the VMI's message in Ready", func(t *testing.T) {
		vm := h.createVM(t, "no-image", func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.RunStrategy = ptr.To(v1alpha1.RunStrategyAlways)
		})
		vmi := h.waitVMI(t, vm, "created", func(*v1alpha1.VirtualMachineInstance) bool { return true })
		const msg = "launcher pod p: container volume-root (containerDisk volume root, image registry.invalid/disk:v1): ErrImagePull: not found"
		for _, c := range []struct {
			reason string
			want   v1alpha1.VirtualMachinePrintableStatus
		}{
			{v1alpha1.ReasonErrImagePull, v1alpha1.VirtualMachineStatusErrImagePull},
			{v1alpha1.ReasonFailedPvcNotFound, v1alpha1.VirtualMachineStatusPvcNotFound},
		} {
			// As the VMI controller writes it while the launcher pod cannot start.
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				cur := &v1alpha1.VirtualMachineInstance{}
				if err := h.c.Get(context.Background(), client.ObjectKeyFromObject(vmi), cur); err != nil {
					return err
				}
				cur.Status.Phase = v1alpha1.Scheduling
				cur.Status.Conditions = []v1alpha1.VirtualMachineInstanceCondition{{
					Type: v1alpha1.VirtualMachineInstanceReady, Status: corev1.ConditionFalse, Reason: c.reason, Message: msg, LastTransitionTime: metav1.Now(),
				}}
				return h.c.Status().Update(context.Background(), cur)
			})
			if err != nil {
				t.Fatal(err)
			}
			h.waitVM(t, vm, string(c.want)+" with the VMI's reason and message in Ready", func(vm *v1alpha1.VirtualMachine) bool {
				r := v1alpha1.FindCondition(vm.Status.Conditions, v1alpha1.VirtualMachineReady)
				return vm.Status.PrintableStatus == c.want && r != nil && r.Status == corev1.ConditionFalse && r.Reason == c.reason && r.Message == msg
			})
		}
	})

	t.Run("Delete", func(t *testing.T) {
		vm := h.createVM(t, "deleted", func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.RunStrategy = ptr.To(v1alpha1.RunStrategyAlways)
		})
		vmi := h.waitVMI(t, vm, "created", func(*v1alpha1.VirtualMachineInstance) bool { return true })
		// A finalizer on the VMI (the handler's teardown) holds the VM in Terminating.
		envtest.Update(t, h.c, vmi, func(v *v1alpha1.VirtualMachineInstance) { controllerutil.AddFinalizer(v, v1alpha1.TeardownFinalizer) })
		h.waitVM(t, vm, "finalizer", func(vm *v1alpha1.VirtualMachine) bool { return controllerutil.ContainsFinalizer(vm, Finalizer) })
		if err := h.c.Delete(context.Background(), vm); err != nil {
			t.Fatal(err)
		}
		h.waitVM(t, vm, "Terminating", func(vm *v1alpha1.VirtualMachine) bool {
			return vm.Status.PrintableStatus == v1alpha1.VirtualMachineStatusTerminating
		})
		h.waitVMI(t, vm, "VMI deleting", func(n *v1alpha1.VirtualMachineInstance) bool { return n.DeletionTimestamp != nil })
		envtest.Update(t, h.c, vmi, func(v *v1alpha1.VirtualMachineInstance) {
			controllerutil.RemoveFinalizer(v, v1alpha1.TeardownFinalizer)
		})
		h.waitNoVMI(t, vm)
		h.eventually(t, "VM gone", func() (bool, error) {
			err := h.c.Get(context.Background(), client.ObjectKeyFromObject(vm), &v1alpha1.VirtualMachine{})
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		})
	})
}

// harness holds the test's API client and helpers that poll rather than sleep.
type harness struct {
	c client.Client
}

func (h *harness) namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "vm-"}}
	if err := h.c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func newTestVM(ns, name string) *v1alpha1.VirtualMachine {
	return &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1alpha1.VirtualMachineSpec{Template: &v1alpha1.VirtualMachineInstanceTemplateSpec{}},
	}
}

func (h *harness) createVM(t *testing.T, name string, mutate func(*v1alpha1.VirtualMachine)) *v1alpha1.VirtualMachine {
	t.Helper()
	vm := newTestVM(h.namespace(t), name)
	mutate(vm)
	if err := h.c.Create(context.Background(), vm); err != nil {
		t.Fatalf("create VM: %v", err)
	}
	return vm
}

func (h *harness) eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), poll, eventually, true, func(context.Context) (bool, error) { return cond() })
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func (h *harness) waitVM(t *testing.T, vm *v1alpha1.VirtualMachine, what string, cond func(*v1alpha1.VirtualMachine) bool) *v1alpha1.VirtualMachine {
	t.Helper()
	got := &v1alpha1.VirtualMachine{}
	err := wait.PollUntilContextTimeout(context.Background(), poll, eventually, true, func(ctx context.Context) (bool, error) {
		if err := h.c.Get(ctx, client.ObjectKeyFromObject(vm), got); err != nil {
			return false, err
		}
		return cond(got), nil
	})
	if err != nil {
		t.Fatalf("waiting for VM %s: %s: %v; last status %+v", vm.Name, what, err, got.Status)
	}
	return got
}

func (h *harness) getVMI(ctx context.Context, vm *v1alpha1.VirtualMachine) (*v1alpha1.VirtualMachineInstance, error) {
	vmi := &v1alpha1.VirtualMachineInstance{}
	err := h.c.Get(ctx, client.ObjectKeyFromObject(vm), vmi)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return vmi, err
}

func (h *harness) waitVMI(t *testing.T, vm *v1alpha1.VirtualMachine, what string, cond func(*v1alpha1.VirtualMachineInstance) bool) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	var got *v1alpha1.VirtualMachineInstance
	err := wait.PollUntilContextTimeout(context.Background(), poll, eventually, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = h.getVMI(ctx, vm)
		return err == nil && got != nil && cond(got), err
	})
	if err != nil {
		t.Fatalf("waiting for the VMI of %s: %s: %v", vm.Name, what, err)
	}
	return got
}

func (h *harness) waitNoVMI(t *testing.T, vm *v1alpha1.VirtualMachine) {
	t.Helper()
	h.eventually(t, "VMI of "+vm.Name+" to be gone", func() (bool, error) {
		vmi, err := h.getVMI(context.Background(), vm)
		return vmi == nil, err
	})
}

// consistentlyVMI checks cond on the VM's VMI (nil when none) for a few seconds.
func (h *harness) consistentlyVMI(t *testing.T, vm *v1alpha1.VirtualMachine, what string, cond func(*v1alpha1.VirtualMachineInstance) bool) {
	t.Helper()
	for end := time.Now().Add(consistent); time.Now().Before(end); time.Sleep(poll) {
		vmi, err := h.getVMI(context.Background(), vm)
		if err != nil {
			t.Fatal(err)
		}
		if !cond(vmi) {
			t.Fatalf("VMI of %s: %s: not so: %+v", vm.Name, what, vmi)
		}
	}
}

// request appends a state change request through the status subresource, as the subresource API does.
func (h *harness) request(t *testing.T, vm *v1alpha1.VirtualMachine, r v1alpha1.VirtualMachineStateChangeRequest) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &v1alpha1.VirtualMachine{}
		if err := h.c.Get(context.Background(), client.ObjectKeyFromObject(vm), cur); err != nil {
			return err
		}
		cur.Status.StateChangeRequests = append(cur.Status.StateChangeRequests, r)
		return h.c.Status().Update(context.Background(), cur)
	})
	if err != nil {
		t.Fatalf("request %s on VM %s: %v", r.Action, vm.Name, err)
	}
}

// waitEvent waits for an event about vm with the given reason.
func (h *harness) waitEvent(t *testing.T, vm *v1alpha1.VirtualMachine, reason string) {
	t.Helper()
	var seen []string
	err := wait.PollUntilContextTimeout(context.Background(), poll, eventually, true, func(ctx context.Context) (bool, error) {
		events := &eventsv1.EventList{}
		if err := h.c.List(ctx, events, client.InNamespace(vm.Namespace)); err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range events.Items {
			if e.Regarding.UID == vm.UID || (e.Regarding.UID == "" && e.Regarding.Name == vm.Name) {
				seen = append(seen, e.Reason)
				if e.Reason == reason {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("waiting for a %s event about VM %s: %v (seen %v)", reason, vm.Name, err, seen)
	}
}
