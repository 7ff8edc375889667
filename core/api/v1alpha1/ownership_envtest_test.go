package v1alpha1_test

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// apiServer applies VMI status to a real API server as one writer or another.
type apiServer struct {
	t *testing.T
	c client.Client
}

func (a apiServer) create(name string) *v1alpha1.VirtualMachineInstance {
	a.t.Helper()
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	if err := a.c.Create(context.Background(), vmi); err != nil {
		a.t.Fatal(err)
	}
	return vmi
}

// apply writes st as the status of vmi under manager, forced or not.
func (a apiServer) apply(vmi *v1alpha1.VirtualMachineInstance, manager string, force bool, st v1alpha1.VirtualMachineInstanceStatus) error {
	a.t.Helper()
	body, err := v1alpha1.StatusApply(vmi, &st, "")
	if err != nil {
		a.t.Fatal(err)
	}
	opts := []client.SubResourceApplyOption{client.FieldOwner(manager)}
	if force {
		opts = append(opts, client.ForceOwnership)
	}
	return a.c.Status().Apply(context.Background(), client.ApplyConfigurationFromUnstructured(body), opts...)
}

func (a apiServer) must(err error) {
	a.t.Helper()
	if err != nil {
		a.t.Fatal(err)
	}
}

func (a apiServer) get(vmi *v1alpha1.VirtualMachineInstance) v1alpha1.VirtualMachineInstanceStatus {
	a.t.Helper()
	got := &v1alpha1.VirtualMachineInstance{}
	a.must(a.c.Get(context.Background(), client.ObjectKeyFromObject(vmi), got))
	return got.Status
}

// TestStatusOwnership checks against a real API server what the writers of VMI status rely on:
// a writer's apply cannot change or remove a field or condition another owns (it gets a
// conflict, the field stays), leaves the others' fields alone, and no write, forced or not,
// moves the phase back or changes a final phase or its reason (CanMoveTo is the same rule).
func TestStatusOwnership(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	a := apiServer{t: t, c: env.Client}
	controller, handler, migration := v1alpha1.VMIControllerFieldManager, v1alpha1.HandlerFieldManager("node-1"), v1alpha1.MigrationControllerFieldManager

	t.Run("a writer cannot clobber another's fields", func(t *testing.T) {
		a := apiServer{t: t, c: a.c}
		vmi := a.create("owners")
		podScheduled := v1alpha1.VirtualMachineInstanceCondition{Type: "PodScheduled", Status: corev1.ConditionTrue}
		a.must(a.apply(vmi, controller, false, v1alpha1.VirtualMachineInstanceStatus{
			HypervisorClassName: "qemu", NodeName: "node-1", Conditions: []v1alpha1.VirtualMachineInstanceCondition{podScheduled},
		}))
		synced := v1alpha1.VirtualMachineInstanceCondition{Type: v1alpha1.VirtualMachineInstanceSynchronized, Status: corev1.ConditionFalse, Reason: v1alpha1.ReasonSyncFailed}
		a.must(a.apply(vmi, handler, false, v1alpha1.VirtualMachineInstanceStatus{
			Conditions: []v1alpha1.VirtualMachineInstanceCondition{synced},
			Interfaces: []v1alpha1.VirtualMachineInstanceNetworkInterface{{Name: "default", IP: "10.0.0.1"}},
		}))
		a.must(a.apply(vmi, migration, false, v1alpha1.VirtualMachineInstanceStatus{
			MigrationState: &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: "m1", TargetNode: "node-2"},
		}))

		// Another writer's field, and another writer's condition: a conflict, nothing changes.
		for what, st := range map[string]v1alpha1.VirtualMachineInstanceStatus{
			"the controller's field":     {HypervisorClassName: "other"},
			"the controller's condition": {Conditions: []v1alpha1.VirtualMachineInstanceCondition{{Type: "PodScheduled", Status: corev1.ConditionFalse}}},
			"the migration's field":      {MigrationState: &v1alpha1.VirtualMachineInstanceMigrationState{TargetNode: "node-3"}},
		} {
			if err := a.apply(vmi, handler, false, st); !v1alpha1.IsFieldConflict(err) {
				t.Errorf("the handler writing %s: %v, want a field conflict", what, err)
			}
		}
		if err := a.apply(vmi, controller, false, v1alpha1.VirtualMachineInstanceStatus{
			HypervisorClassName: "qemu", NodeName: "node-1", Conditions: []v1alpha1.VirtualMachineInstanceCondition{podScheduled, {Type: v1alpha1.VirtualMachineInstanceSynchronized, Status: corev1.ConditionTrue}},
		}); !v1alpha1.IsFieldConflict(err) {
			t.Errorf("the controller writing the handler's condition: %v, want a field conflict", err)
		}
		// A resourceVersion in the apply is a precondition: a conflict, but not a field's.
		body, err := v1alpha1.StatusApply(vmi, &v1alpha1.VirtualMachineInstanceStatus{HypervisorClassName: "qemu"}, vmi.ResourceVersion)
		a.must(err)
		err = a.c.Status().Apply(context.Background(), client.ApplyConfigurationFromUnstructured(body), client.FieldOwner(controller))
		if !apierrors.IsConflict(err) || v1alpha1.IsFieldConflict(err) {
			t.Errorf("an apply on a stale resourceVersion: %v, want a conflict that is not a field's", err)
		}
		// Each writer's own apply, which leaves the others' fields out, removes none of them.
		a.must(a.apply(vmi, controller, false, v1alpha1.VirtualMachineInstanceStatus{HypervisorClassName: "qemu", NodeName: "node-1"}))
		a.must(a.apply(vmi, handler, false, v1alpha1.VirtualMachineInstanceStatus{Conditions: []v1alpha1.VirtualMachineInstanceCondition{synced}}))
		st := a.get(vmi)
		if st.HypervisorClassName != "qemu" || st.NodeName != "node-1" || st.MigrationState == nil || st.MigrationState.TargetNode != "node-2" ||
			v1alpha1.InstanceCondition(st.Conditions, v1alpha1.VirtualMachineInstanceSynchronized) == nil {
			t.Errorf("status %+v: want every writer's fields as it wrote them", st)
		}
		// What a writer leaves out of its own fields is gone: the controller's PodScheduled and
		// the handler's interfaces.
		if v1alpha1.InstanceCondition(st.Conditions, "PodScheduled") != nil || len(st.Interfaces) != 0 {
			t.Errorf("status %+v: want PodScheduled and the interfaces removed by their owners", st)
		}
	})

	t.Run("the phase never moves back, a final one never changes", func(t *testing.T) {
		a := apiServer{t: t, c: a.c}
		phases := []v1alpha1.VirtualMachineInstancePhase{
			v1alpha1.Pending, v1alpha1.Scheduling, v1alpha1.Scheduled, v1alpha1.Running, v1alpha1.Succeeded, v1alpha1.Failed, v1alpha1.Unknown,
		}
		for i, from := range phases {
			for j, to := range phases {
				vmi := a.create(fmt.Sprintf("phase-%d-%d", i, j))
				a.must(a.apply(vmi, controller, false, v1alpha1.VirtualMachineInstanceStatus{Phase: from}))
				// Forced, by another writer: only the API server's rule stands in the way.
				err := a.apply(vmi, handler, true, v1alpha1.VirtualMachineInstanceStatus{Phase: to})
				switch {
				case from.CanMoveTo(to) && err != nil:
					t.Errorf("%s → %s refused: %v", from, to, err)
				case !from.CanMoveTo(to) && !apierrors.IsInvalid(err):
					t.Errorf("%s → %s: %v, want it refused as invalid", from, to, err)
				case err != nil && a.get(vmi).Phase != from:
					t.Errorf("%s → %s refused, yet the phase is %s", from, to, a.get(vmi).Phase)
				}
			}
		}

		vmi := a.create("final")
		a.must(a.apply(vmi, handler, false, v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.Failed, Reason: "Killed"}))
		if err := a.apply(vmi, controller, true, v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.Failed, Reason: v1alpha1.ReasonPodFailed}); !apierrors.IsInvalid(err) {
			t.Errorf("changing the reason of a final phase: %v, want it refused as invalid", err)
		}
		// The owner leaving the phase out would remove it: refused too.
		if err := a.apply(vmi, handler, false, v1alpha1.VirtualMachineInstanceStatus{}); !apierrors.IsInvalid(err) {
			t.Errorf("removing a final phase: %v, want it refused as invalid", err)
		}
		if st := a.get(vmi); st.Phase != v1alpha1.Failed || st.Reason != "Killed" {
			t.Errorf("final status %s/%s, want Failed/Killed", st.Phase, st.Reason)
		}
	})
}
