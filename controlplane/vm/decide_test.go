package vm

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

var (
	testNow     = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	testBackoff = Backoff{Initial: 10 * time.Second, Max: 5 * time.Minute}
)

type vmOpt func(*v1alpha1.VirtualMachine)

func strategy(s v1alpha1.VirtualMachineRunStrategy) vmOpt {
	return func(vm *v1alpha1.VirtualMachine) { vm.Spec.RunStrategy = &s }
}

func running(b bool) vmOpt { return func(vm *v1alpha1.VirtualMachine) { vm.Spec.Running = &b } }

func requests(rs ...v1alpha1.VirtualMachineStateChangeRequest) vmOpt {
	return func(vm *v1alpha1.VirtualMachine) { vm.Status.StateChangeRequests = rs }
}

func startFailure(n int, uid types.UID, retryIn time.Duration) vmOpt {
	return func(vm *v1alpha1.VirtualMachine) {
		t := metav1.NewTime(testNow.Add(retryIn))
		vm.Status.StartFailure = &v1alpha1.VirtualMachineStartFailure{ConsecutiveFailCount: n, LastFailedVMIUID: uid, RetryAfterTimestamp: &t}
	}
}

func deleting(vm *v1alpha1.VirtualMachine) {
	t := metav1.NewTime(testNow)
	vm.DeletionTimestamp = &t
}

func newVM(opts ...vmOpt) *v1alpha1.VirtualMachine {
	vm := &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "vm-uid", Generation: 3},
		Spec:       v1alpha1.VirtualMachineSpec{Template: &v1alpha1.VirtualMachineInstanceTemplateSpec{}},
	}
	for _, o := range opts {
		o(vm)
	}
	return vm
}

type vmiOpt func(*v1alpha1.VirtualMachineInstance)

func vmiDeleting(vmi *v1alpha1.VirtualMachineInstance) {
	t := metav1.NewTime(testNow)
	vmi.DeletionTimestamp = &t
}

func vmiReady(vmi *v1alpha1.VirtualMachineInstance) {
	vmi.Status.Conditions = append(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceCondition{
		Type: v1alpha1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue})
}

func vmiCondition(t v1alpha1.VirtualMachineInstanceConditionType, s corev1.ConditionStatus, reason string) vmiOpt {
	return func(vmi *v1alpha1.VirtualMachineInstance) {
		vmi.Status.Conditions = append(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceCondition{Type: t, Status: s, Reason: reason})
	}
}

func newVMI(phase v1alpha1.VirtualMachineInstancePhase, opts ...vmiOpt) *v1alpha1.VirtualMachineInstance {
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "vmi-uid",
			Annotations: map[string]string{generationAnnotation: "2"}},
		Status: v1alpha1.VirtualMachineInstanceStatus{Phase: phase},
	}
	for _, o := range opts {
		o(vmi)
	}
	return vmi
}

func start() v1alpha1.VirtualMachineStateChangeRequest {
	return v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest}
}

func stop(uid types.UID) v1alpha1.VirtualMachineStateChangeRequest {
	r := v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest}
	if uid != "" {
		r.UID = &uid
	}
	return r
}

func TestDecide(t *testing.T) {
	const (
		Always = v1alpha1.RunStrategyAlways
		Rerun  = v1alpha1.RunStrategyRerunOnFailure
		Once   = v1alpha1.RunStrategyOnce
		Manual = v1alpha1.RunStrategyManual
		Halted = v1alpha1.RunStrategyHalted
	)
	tests := []struct {
		name      string
		vm        *v1alpha1.VirtualMachine
		vmi       *v1alpha1.VirtualMachineInstance
		foreign   bool
		action    Action
		printable v1alpha1.VirtualMachinePrintableStatus
		// requests is how many state change requests remain.
		requests int
		// failCount is status.startFailure.consecutiveFailCount (0: no start failure).
		failCount    int
		requeue      bool
		ready        bool
		removeFinal  bool
		failureCause string
	}{
		// Always
		{name: "Always/no VMI creates", vm: newVM(strategy(Always)), action: ActionCreate, printable: "Stopped"},
		{name: "Always/pending VMI is starting", vm: newVM(strategy(Always)), vmi: newVMI(v1alpha1.Pending), printable: "Starting"},
		{name: "Always/no phase yet is starting", vm: newVM(strategy(Always)), vmi: newVMI(""), printable: "Starting"},
		{name: "Always/running ready VMI", vm: newVM(strategy(Always)), vmi: newVMI(v1alpha1.Running, vmiReady), printable: "Running", ready: true},
		{name: "Always/failed VMI is deleted and counted", vm: newVM(strategy(Always)), vmi: newVMI(v1alpha1.Failed),
			action: ActionDelete, printable: "CrashLoopBackOff", failCount: 1},
		{name: "Always/succeeded VMI is deleted, not counted", vm: newVM(strategy(Always)), vmi: newVMI(v1alpha1.Succeeded),
			action: ActionDelete, printable: "Stopped"},
		{name: "Always/failed VMI already counted is not counted twice", vm: newVM(strategy(Always), startFailure(2, "vmi-uid", 20*time.Second)),
			vmi: newVMI(v1alpha1.Failed), action: ActionDelete, printable: "CrashLoopBackOff", failCount: 2},
		{name: "Always/back-off pending waits", vm: newVM(strategy(Always), startFailure(2, "old", 5*time.Second)),
			printable: "CrashLoopBackOff", failCount: 2, requeue: true},
		{name: "Always/back-off passed creates", vm: newVM(strategy(Always), startFailure(2, "old", -time.Second)),
			action: ActionCreate, printable: "Stopped", failCount: 2},
		{name: "Always/running VMI after failures resets the count", vm: newVM(strategy(Always), startFailure(2, "old", -time.Second)),
			vmi: newVMI(v1alpha1.Running), printable: "Running"},
		{name: "Always/deleting VMI waits", vm: newVM(strategy(Always)), vmi: newVMI(v1alpha1.Running, vmiDeleting), printable: "Stopping"},
		{name: "Always/restart is stop then start", vm: newVM(strategy(Always), requests(stop("vmi-uid"), start())),
			vmi: newVMI(v1alpha1.Running), action: ActionDelete, printable: "Stopping", requests: 2},
		{name: "Always/restart once the VMI is gone", vm: newVM(strategy(Always), requests(stop("vmi-uid"), start())),
			action: ActionCreate, printable: "Stopped"},
		{name: "Always/paused VMI", vm: newVM(strategy(Always)),
			vmi: newVMI(v1alpha1.Running, vmiCondition(v1alpha1.VirtualMachineInstancePaused, corev1.ConditionTrue, v1alpha1.ReasonPaused)), printable: "Paused"},
		{name: "Always/migrating VMI", vm: newVM(strategy(Always)),
			vmi: newVMI(v1alpha1.Running, func(v *v1alpha1.VirtualMachineInstance) {
				v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{}
			}), printable: "Migrating"},
		{name: "Always/unschedulable VMI", vm: newVM(strategy(Always)),
			vmi:       newVMI(v1alpha1.Scheduling, vmiCondition(v1alpha1.VirtualMachineInstanceReady, corev1.ConditionFalse, v1alpha1.ReasonUnschedulable)),
			printable: "ErrorUnschedulable"},
		{name: "Always/provisioning VMI", vm: newVM(strategy(Always)),
			vmi: newVMI(v1alpha1.Pending, vmiCondition(v1alpha1.VirtualMachineInstanceProvisioning, corev1.ConditionTrue, "")), printable: "Provisioning"},
		{name: "Always/unknown VMI", vm: newVM(strategy(Always)), vmi: newVMI(v1alpha1.Unknown), printable: "Unknown"},

		// RerunOnFailure
		{name: "RerunOnFailure/no VMI creates", vm: newVM(strategy(Rerun)), action: ActionCreate, printable: "Stopped"},
		{name: "RerunOnFailure/failed VMI is deleted", vm: newVM(strategy(Rerun)), vmi: newVMI(v1alpha1.Failed),
			action: ActionDelete, printable: "CrashLoopBackOff", failCount: 1},
		{name: "RerunOnFailure/succeeded VMI stays", vm: newVM(strategy(Rerun)), vmi: newVMI(v1alpha1.Succeeded), printable: "Stopped"},
		{name: "RerunOnFailure/back-off pending waits", vm: newVM(strategy(Rerun), startFailure(1, "old", time.Second)),
			printable: "CrashLoopBackOff", failCount: 1, requeue: true},

		// Once
		{name: "Once/no VMI creates", vm: newVM(strategy(Once)), action: ActionCreate, printable: "Stopped"},
		{name: "Once/running VMI", vm: newVM(strategy(Once)), vmi: newVMI(v1alpha1.Running), printable: "Running"},
		{name: "Once/failed VMI stays", vm: newVM(strategy(Once)), vmi: newVMI(v1alpha1.Failed), printable: "Stopped"},
		{name: "Once/succeeded VMI stays", vm: newVM(strategy(Once)), vmi: newVMI(v1alpha1.Succeeded), printable: "Stopped"},

		// Manual
		{name: "Manual/no VMI, no request", vm: newVM(strategy(Manual)), printable: "Stopped"},
		{name: "Manual/running VMI stays", vm: newVM(strategy(Manual)), vmi: newVMI(v1alpha1.Running), printable: "Running"},
		{name: "Manual/failed VMI stays", vm: newVM(strategy(Manual)), vmi: newVMI(v1alpha1.Failed), printable: "Stopped"},
		{name: "Manual/start creates and is consumed", vm: newVM(strategy(Manual), requests(start())), action: ActionCreate, printable: "Stopped"},
		{name: "Manual/start with a running VMI is consumed", vm: newVM(strategy(Manual), requests(start())), vmi: newVMI(v1alpha1.Running), printable: "Running"},
		{name: "Manual/start replaces a finished VMI", vm: newVM(strategy(Manual), requests(start())), vmi: newVMI(v1alpha1.Succeeded),
			action: ActionDelete, printable: "Stopped", requests: 1},
		{name: "Manual/stop deletes and waits", vm: newVM(strategy(Manual), requests(stop(""))), vmi: newVMI(v1alpha1.Running),
			action: ActionDelete, printable: "Stopping", requests: 1},
		{name: "Manual/stop in progress waits", vm: newVM(strategy(Manual), requests(stop(""))), vmi: newVMI(v1alpha1.Running, vmiDeleting),
			printable: "Stopping", requests: 1},
		{name: "Manual/stop done is consumed", vm: newVM(strategy(Manual), requests(stop(""))), printable: "Stopped"},
		{name: "Manual/stop for another VMI is dropped", vm: newVM(strategy(Manual), requests(stop("other"))), vmi: newVMI(v1alpha1.Running),
			printable: "Running"},
		{name: "Manual/no crash-loop counting", vm: newVM(strategy(Manual)), vmi: newVMI(v1alpha1.Failed), printable: "Stopped"},

		// Halted
		{name: "Halted/no VMI", vm: newVM(strategy(Halted)), printable: "Stopped"},
		{name: "Halted/running VMI is deleted", vm: newVM(strategy(Halted)), vmi: newVMI(v1alpha1.Running), action: ActionDelete, printable: "Stopping"},
		{name: "Halted/finished VMI is deleted", vm: newVM(strategy(Halted)), vmi: newVMI(v1alpha1.Succeeded), action: ActionDelete, printable: "Stopped"},
		{name: "Halted/start request is dropped", vm: newVM(strategy(Halted), requests(start())), printable: "Stopped"},
		{name: "Halted/clears start failures", vm: newVM(strategy(Halted), startFailure(3, "old", time.Minute)), printable: "Stopped"},
		{name: "no strategy is Halted", vm: newVM(), vmi: newVMI(v1alpha1.Running), action: ActionDelete, printable: "Stopping"},

		// running
		{name: "running=true is Always", vm: newVM(running(true)), action: ActionCreate, printable: "Stopped"},
		{name: "running=true restarts a failed VMI", vm: newVM(running(true)), vmi: newVMI(v1alpha1.Failed), action: ActionDelete,
			printable: "CrashLoopBackOff", failCount: 1},
		{name: "running=false is Halted", vm: newVM(running(false)), vmi: newVMI(v1alpha1.Running), action: ActionDelete, printable: "Stopping"},
		{name: "running and runStrategy starts nothing", vm: newVM(running(true), strategy(Always)), printable: "Stopped",
			failureCause: ReasonRunStrategyConflict},
		{name: "running and runStrategy stops nothing", vm: newVM(running(false), strategy(Halted)), vmi: newVMI(v1alpha1.Running),
			printable: "Running", failureCause: ReasonRunStrategyConflict},

		// foreign VMI and deletion
		{name: "foreign VMI is left alone", vm: newVM(strategy(Always)), foreign: true, printable: "Stopped", failureCause: ReasonVMINotOwned},
		{name: "deleting VM deletes its VMI", vm: newVM(strategy(Always), deleting), vmi: newVMI(v1alpha1.Running),
			action: ActionDelete, printable: "Terminating"},
		{name: "deleting VM waits for its VMI", vm: newVM(strategy(Always), deleting), vmi: newVMI(v1alpha1.Running, vmiDeleting),
			printable: "Terminating"},
		{name: "deleting VM without VMI drops the finalizer", vm: newVM(strategy(Always), deleting), printable: "Terminating", removeFinal: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vmBefore := tt.vm.DeepCopy()
			d := Decide(tt.vm, tt.vmi, tt.foreign, testNow, testBackoff)
			if d.Action != tt.action {
				t.Errorf("action = %v, want %v", d.Action, tt.action)
			}
			if d.Status.PrintableStatus != tt.printable {
				t.Errorf("printableStatus = %q, want %q", d.Status.PrintableStatus, tt.printable)
			}
			if got := len(d.Status.StateChangeRequests); got != tt.requests {
				t.Errorf("%d state change requests remain, want %d", got, tt.requests)
			}
			gotFail := 0
			if d.Status.StartFailure != nil {
				gotFail = d.Status.StartFailure.ConsecutiveFailCount
			}
			if gotFail != tt.failCount {
				t.Errorf("consecutiveFailCount = %d, want %d", gotFail, tt.failCount)
			}
			if (d.RequeueAfter > 0) != tt.requeue {
				t.Errorf("requeueAfter = %v, want requeue %v", d.RequeueAfter, tt.requeue)
			}
			if d.Status.Ready != tt.ready {
				t.Errorf("ready = %v, want %v", d.Status.Ready, tt.ready)
			}
			if d.Status.Created != (tt.vmi != nil) {
				t.Errorf("created = %v with VMI %v", d.Status.Created, tt.vmi != nil)
			}
			if d.RemoveFinalizer != tt.removeFinal {
				t.Errorf("removeFinalizer = %v, want %v", d.RemoveFinalizer, tt.removeFinal)
			}
			if d.Action != ActionNone && d.Reason == "" {
				t.Error("an action without an event reason")
			}
			failure := v1alpha1.FindCondition(d.Status.Conditions, v1alpha1.VirtualMachineFailure)
			switch {
			case tt.failureCause == "" && failure != nil:
				t.Errorf("unexpected Failure condition %+v", failure)
			case tt.failureCause != "" && (failure == nil || failure.Reason != tt.failureCause || failure.Status != corev1.ConditionTrue):
				t.Errorf("Failure condition = %+v, want True/%s", failure, tt.failureCause)
			}
			ready := v1alpha1.FindCondition(d.Status.Conditions, v1alpha1.VirtualMachineReady)
			if ready == nil || ready.ObservedGeneration != tt.vm.Generation || (ready.Status == corev1.ConditionTrue) != tt.ready {
				t.Errorf("Ready condition = %+v, want status %v at generation %d", ready, tt.ready, tt.vm.Generation)
			}
			if d.Status.DesiredGeneration != tt.vm.Generation {
				t.Errorf("desiredGeneration = %d", d.Status.DesiredGeneration)
			}
			if tt.vmi != nil && d.Status.ObservedGeneration != 2 {
				t.Errorf("observedGeneration = %d, want the VMI's 2", d.Status.ObservedGeneration)
			}
			if tt.vm.Status.StateChangeRequests != nil && len(tt.vm.Status.StateChangeRequests) != len(vmBefore.Status.StateChangeRequests) {
				t.Error("Decide modified its input")
			}
		})
	}
}

// TestPrintableStatusBeforeRunning checks the values a VM takes from what keeps its VMI from
// running, and their precedence (KubeVirt's), from the conditions the VMI controller writes.
func TestPrintableStatusBeforeRunning(t *testing.T) {
	notReady := func(reason string) vmiOpt {
		return vmiCondition(v1alpha1.VirtualMachineInstanceReady, corev1.ConditionFalse, reason)
	}
	noPod := func(reason string) vmiOpt {
		return vmiCondition(v1alpha1.VirtualMachineInstanceLauncherPodCreated, corev1.ConditionFalse, reason)
	}
	unschedulable := vmiCondition("PodScheduled", corev1.ConditionFalse, v1alpha1.ReasonUnschedulable)
	provisioning := vmiCondition(v1alpha1.VirtualMachineInstanceProvisioning, corev1.ConditionTrue, "")
	tests := []struct {
		name string
		vm   *v1alpha1.VirtualMachine
		vmi  *v1alpha1.VirtualMachineInstance
		want v1alpha1.VirtualMachinePrintableStatus
	}{
		{name: "claim missing, no pod", vmi: newVMI(v1alpha1.Pending, noPod(v1alpha1.ReasonFailedPvcNotFound), notReady(v1alpha1.ReasonFailedPvcNotFound)),
			want: "ErrorPvcNotFound"},
		{name: "claim missing, LauncherPodCreated alone says so", vmi: newVMI(v1alpha1.Pending, noPod(v1alpha1.ReasonFailedPvcNotFound)), want: "ErrorPvcNotFound"},
		{name: "claim deleted after the pod was created", vmi: newVMI(v1alpha1.Scheduling, notReady(v1alpha1.ReasonFailedPvcNotFound)), want: "ErrorPvcNotFound"},
		{name: "claim missing comes before unschedulable", vmi: newVMI(v1alpha1.Scheduling, unschedulable, notReady(v1alpha1.ReasonFailedPvcNotFound)),
			want: "ErrorPvcNotFound"},
		{name: "claim not bound", vmi: newVMI(v1alpha1.Scheduling, notReady(v1alpha1.ReasonWaitingForVolumeBinding)), want: "WaitingForVolumeBinding"},
		{name: "unschedulable comes before a claim not bound", vmi: newVMI(v1alpha1.Scheduling, unschedulable, notReady(v1alpha1.ReasonWaitingForVolumeBinding)),
			want: "ErrorUnschedulable"},
		{name: "provisioning comes before a claim not bound", vmi: newVMI(v1alpha1.Pending, provisioning, notReady(v1alpha1.ReasonWaitingForVolumeBinding)),
			want: "Provisioning"},
		{name: "image cannot be pulled", vmi: newVMI(v1alpha1.Scheduling, notReady(v1alpha1.ReasonErrImagePull)), want: "ErrImagePull"},
		{name: "image pull backing off", vmi: newVMI(v1alpha1.Scheduling, notReady(v1alpha1.ReasonImagePullBackOff)), want: "ImagePullBackOff"},
		{name: "unschedulable comes before an image", vmi: newVMI(v1alpha1.Scheduling, unschedulable, notReady(v1alpha1.ReasonErrImagePull)),
			want: "ErrorUnschedulable"},
		{name: "a True condition with the reason is no problem", vmi: newVMI(v1alpha1.Scheduling,
			vmiCondition(v1alpha1.VirtualMachineInstanceReady, corev1.ConditionTrue, v1alpha1.ReasonErrImagePull)), want: "Starting"},
		{name: "the reason on another condition is not the controller's", vmi: newVMI(v1alpha1.Scheduling,
			vmiCondition(v1alpha1.VirtualMachineInstanceSynchronized, corev1.ConditionFalse, v1alpha1.ReasonErrImagePull)), want: "Starting"},
		{name: "pod not running yet, nothing wrong", vmi: newVMI(v1alpha1.Scheduling, notReady(v1alpha1.ReasonGuestNotRunning)), want: "Starting"},
		{name: "running wins over a stale image problem", vmi: newVMI(v1alpha1.Running, notReady(v1alpha1.ReasonErrImagePull)), want: "Running"},
		{name: "a VMI being deleted is stopping", vmi: newVMI(v1alpha1.Scheduling, vmiDeleting, notReady(v1alpha1.ReasonErrImagePull)), want: "Stopping"},
		{name: "a final VMI is stopped", vm: newVM(strategy(v1alpha1.RunStrategyOnce)), vmi: newVMI(v1alpha1.Failed, notReady(v1alpha1.ReasonErrImagePull)),
			want: "Stopped"},
		{name: "a deleted VM is terminating", vm: newVM(strategy(v1alpha1.RunStrategyAlways), deleting),
			vmi: newVMI(v1alpha1.Pending, noPod(v1alpha1.ReasonFailedPvcNotFound)), want: "Terminating"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vm := tt.vm
			if vm == nil {
				vm = newVM(strategy(v1alpha1.RunStrategyAlways))
			}
			d := Decide(vm, tt.vmi, false, testNow, testBackoff)
			if d.Status.PrintableStatus != tt.want {
				t.Errorf("printableStatus = %q, want %q (VMI phase %s, conditions %+v)", d.Status.PrintableStatus, tt.want, tt.vmi.Status.Phase, tt.vmi.Status.Conditions)
			}
		})
	}
}

func TestDecideCrashLoopBackoffGrows(t *testing.T) {
	vm := newVM(strategy(v1alpha1.RunStrategyAlways))
	var last time.Duration
	for i := 1; i <= 8; i++ {
		vmi := newVMI(v1alpha1.Failed)
		vmi.UID = types.UID(string(rune('a' + i)))
		d := Decide(vm, vmi, false, testNow, testBackoff)
		sf := d.Status.StartFailure
		if sf == nil || sf.ConsecutiveFailCount != i || sf.LastFailedVMIUID != vmi.UID {
			t.Fatalf("failure %d: startFailure = %+v", i, sf)
		}
		wait := sf.RetryAfterTimestamp.Sub(testNow)
		if wait < last || wait > testBackoff.Max {
			t.Fatalf("failure %d: wait %v after %v (max %v)", i, wait, last, testBackoff.Max)
		}
		last = wait
		vm.Status = d.Status
	}
	if last != testBackoff.Max {
		t.Errorf("back-off ends at %v, want the cap %v", last, testBackoff.Max)
	}
}

func TestDecideKeepsTransitionTime(t *testing.T) {
	vm := newVM(strategy(v1alpha1.RunStrategyHalted))
	d := Decide(vm, nil, false, testNow, testBackoff)
	vm.Status = d.Status
	d = Decide(vm, nil, false, testNow.Add(time.Hour), testBackoff)
	if c := v1alpha1.FindCondition(d.Status.Conditions, v1alpha1.VirtualMachineReady); c == nil || !c.LastTransitionTime.Time.Equal(testNow) {
		t.Errorf("Ready condition %+v: transition time moved though the status did not change", c)
	}
}

func TestBackoffDelay(t *testing.T) {
	b := Backoff{Initial: time.Second, Max: 10 * time.Second}
	for n, want := range map[int]time.Duration{0: 0, 1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 5: 10 * time.Second, 100: 10 * time.Second} {
		if got := b.Delay(n); got != want {
			t.Errorf("Delay(%d) = %v, want %v", n, got, want)
		}
	}
}

func TestNewVMI(t *testing.T) {
	vm := newVM(strategy(v1alpha1.RunStrategyAlways))
	vm.Spec.Template.ObjectMeta.Labels = map[string]string{"app": "web"}
	vm.Spec.Template.Spec.Hostname = "guest"
	vmi, err := NewVMI(vm)
	if err != nil {
		t.Fatal(err)
	}
	if vmi.Name != vm.Name || vmi.Namespace != vm.Namespace {
		t.Errorf("VMI %s/%s, want the VM's name", vmi.Namespace, vmi.Name)
	}
	if vmi.Labels["app"] != "web" || vmi.Labels[v1alpha1.VirtualMachineNameLabel] != vm.Name {
		t.Errorf("labels = %v", vmi.Labels)
	}
	if vmi.Annotations[generationAnnotation] != "3" {
		t.Errorf("annotations = %v", vmi.Annotations)
	}
	if vmi.Spec.Hostname != "guest" {
		t.Errorf("spec not from the template: %+v", vmi.Spec)
	}
	ref := metav1.GetControllerOf(vmi)
	if ref == nil || ref.UID != vm.UID || ref.Kind != "VirtualMachine" || !ptr.Deref(ref.BlockOwnerDeletion, false) {
		t.Errorf("controller ref = %+v", ref)
	}
	if vm.Spec.Template.ObjectMeta.Labels[v1alpha1.VirtualMachineNameLabel] != "" {
		t.Error("NewVMI changed the VM's template")
	}
	vm.Spec.Template = nil
	if _, err := NewVMI(vm); err == nil {
		t.Error("no error without a template")
	}
}
