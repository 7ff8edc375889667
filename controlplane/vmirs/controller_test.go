package vmirs

import (
	"context"
	"strings"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// Generous: the machines that run these share two cores with compilers.
const (
	eventually = 60 * time.Second
	consistent = 3 * time.Second
	poll       = 100 * time.Millisecond
)

// TestController runs the replica set controller in a real manager against a real API server.
// Nothing else runs: the test plays the VMI controller and node handler by writing VMI status.
func TestController(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	// The manager runs with only what the RBAC markers grant.
	cfg := env.ImpersonateWithMarkers(t, "vmirs-controller", "controller.go")
	envtest.StartManager(t, cfg, func(mgr ctrl.Manager) error {
		return SetupWithManager(mgr, Options{SkipNameValidation: true})
	})
	h := &harness{c: env.Client}

	t.Run("ScaleAndReplace", func(t *testing.T) {
		rs := h.createRS(t, "web", 3, nil)
		vmis := h.waitVMIs(t, rs, "3 VMIs", func(v []v1alpha1.VirtualMachineInstance) bool { return len(v) == 3 })
		for _, v := range vmis {
			if !strings.HasPrefix(v.Name, "web-") || v.Labels["app"] != "web" {
				t.Errorf("VMI %s labels %v: want generateName web- and the template's labels", v.Name, v.Labels)
			}
		}
		h.waitRS(t, rs, "3 replicas, selector", func(rs *v1alpha1.VirtualMachineInstanceReplicaSet) bool {
			return rs.Status.Replicas == 3 && rs.Status.ReadyReplicas == 0 && rs.Status.LabelSelector == "app=web"
		})

		// Two become ready; the third never runs.
		envtest.SetVMIPhase(t, h.c, &vmis[0], v1alpha1.Running, true)
		envtest.SetVMIPhase(t, h.c, &vmis[1], v1alpha1.Running, true)
		h.waitRS(t, rs, "2 ready", func(rs *v1alpha1.VirtualMachineInstanceReplicaSet) bool { return rs.Status.ReadyReplicas == 2 })

		scale := &autoscalingv1.Scale{}
		if err := h.c.SubResource("scale").Get(context.Background(), rs, scale); err != nil {
			t.Fatalf("get scale: %v", err)
		}
		if scale.Spec.Replicas != 3 || scale.Status.Replicas != 3 || scale.Status.Selector != "app=web" {
			t.Errorf("scale = %+v", scale)
		}
		scale.Spec.Replicas = 1
		if err := h.c.SubResource("scale").Update(context.Background(), rs, client.WithSubResourceBody(scale)); err != nil {
			t.Fatalf("update scale: %v", err)
		}
		left := h.waitVMIs(t, rs, "1 VMI", func(v []v1alpha1.VirtualMachineInstance) bool { return len(v) == 1 })
		if left[0].UID != vmis[0].UID && left[0].UID != vmis[1].UID {
			t.Errorf("kept %s (phase %q); want one of the running ones", left[0].Name, left[0].Status.Phase)
		}
		h.waitRS(t, rs, "1 replica, 1 ready", func(rs *v1alpha1.VirtualMachineInstanceReplicaSet) bool {
			return rs.Status.Replicas == 1 && rs.Status.ReadyReplicas == 1
		})

		// A failed VMI is deleted and replaced.
		envtest.SetVMIPhase(t, h.c, &left[0], v1alpha1.Failed, false)
		replaced := h.waitVMIs(t, rs, "failed VMI replaced", func(v []v1alpha1.VirtualMachineInstance) bool {
			return len(v) == 1 && v[0].UID != left[0].UID
		})
		h.waitRS(t, rs, "1 replica, none ready", func(rs *v1alpha1.VirtualMachineInstanceReplicaSet) bool {
			return rs.Status.Replicas == 1 && rs.Status.ReadyReplicas == 0
		})
		envtest.SetVMIPhase(t, h.c, &replaced[0], v1alpha1.Running, true)

		// Scale up through the spec as well.
		envtest.Update(t, h.c, rs, func(rs *v1alpha1.VirtualMachineInstanceReplicaSet) { rs.Spec.Replicas = ptr.To[int32](2) })
		h.waitVMIs(t, rs, "2 VMIs", func(v []v1alpha1.VirtualMachineInstance) bool { return len(v) == 2 })
		h.waitRS(t, rs, "2 replicas, 1 ready", func(rs *v1alpha1.VirtualMachineInstanceReplicaSet) bool {
			return rs.Status.Replicas == 2 && rs.Status.ReadyReplicas == 1
		})
		h.waitEvent(t, rs, v1alpha1.ReasonSuccessfulCreate)
		h.waitEvent(t, rs, v1alpha1.ReasonSuccessfulDelete)
	})

	t.Run("SelectorMismatch", func(t *testing.T) {
		rs := h.createRS(t, "mismatch", 2, func(rs *v1alpha1.VirtualMachineInstanceReplicaSet) {
			rs.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}
		})
		got := h.waitRS(t, rs, "ReplicaFailure", func(rs *v1alpha1.VirtualMachineInstanceReplicaSet) bool {
			return hasCondition(rs, v1alpha1.VirtualMachineInstanceReplicaSetReplicaFailure, ReasonInvalidSpec)
		})
		if c := got.Status.Conditions[0]; c.ObservedGeneration != got.Generation || !strings.Contains(c.Message, "does not match") {
			t.Errorf("condition %+v", c)
		}
		h.consistentlyNoVMIs(t, rs)
	})

	t.Run("Paused", func(t *testing.T) {
		rs := h.createRS(t, "paused", 2, func(rs *v1alpha1.VirtualMachineInstanceReplicaSet) { rs.Spec.Paused = true })
		h.waitRS(t, rs, "ReplicaPaused", func(rs *v1alpha1.VirtualMachineInstanceReplicaSet) bool {
			return hasCondition(rs, v1alpha1.VirtualMachineInstanceReplicaSetReplicaPaused, v1alpha1.ReasonPaused)
		})
		h.consistentlyNoVMIs(t, rs)
		envtest.Update(t, h.c, rs, func(rs *v1alpha1.VirtualMachineInstanceReplicaSet) { rs.Spec.Paused = false })
		h.waitVMIs(t, rs, "2 VMIs once resumed", func(v []v1alpha1.VirtualMachineInstance) bool { return len(v) == 2 })
		h.waitRS(t, rs, "no condition", func(rs *v1alpha1.VirtualMachineInstanceReplicaSet) bool {
			return len(rs.Status.Conditions) == 0 && rs.Status.Replicas == 2
		})
	})
}

func hasCondition(rs *v1alpha1.VirtualMachineInstanceReplicaSet, t v1alpha1.VirtualMachineInstanceReplicaSetConditionType, reason string) bool {
	for _, c := range rs.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue && c.Reason == reason {
			return true
		}
	}
	return false
}

// harness holds the test's API client and helpers that poll rather than sleep.
type harness struct {
	c client.Client
}

func (h *harness) createRS(t *testing.T, name string, replicas int32, mutate func(*v1alpha1.VirtualMachineInstanceReplicaSet)) *v1alpha1.VirtualMachineInstanceReplicaSet {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "vmirs-"}}
	if err := h.c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	rs := &v1alpha1.VirtualMachineInstanceReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns.Name},
		Spec: v1alpha1.VirtualMachineInstanceReplicaSetSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: &v1alpha1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
			},
		},
	}
	if mutate != nil {
		mutate(rs)
	}
	if err := h.c.Create(context.Background(), rs); err != nil {
		t.Fatalf("create replica set: %v", err)
	}
	return rs
}

// vmis lists the VMIs the replica set controls and that are not being deleted.
func (h *harness) vmis(ctx context.Context, rs *v1alpha1.VirtualMachineInstanceReplicaSet) ([]v1alpha1.VirtualMachineInstance, error) {
	list := &v1alpha1.VirtualMachineInstanceList{}
	if err := h.c.List(ctx, list, client.InNamespace(rs.Namespace)); err != nil {
		return nil, err
	}
	var out []v1alpha1.VirtualMachineInstance
	for _, v := range list.Items {
		if ref := metav1.GetControllerOf(&v); ref != nil && ref.UID == rs.UID && v.DeletionTimestamp == nil {
			out = append(out, v)
		}
	}
	return out, nil
}

func (h *harness) waitVMIs(t *testing.T, rs *v1alpha1.VirtualMachineInstanceReplicaSet, what string, cond func([]v1alpha1.VirtualMachineInstance) bool) []v1alpha1.VirtualMachineInstance {
	t.Helper()
	var got []v1alpha1.VirtualMachineInstance
	err := wait.PollUntilContextTimeout(context.Background(), poll, eventually, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = h.vmis(ctx, rs)
		return err == nil && cond(got), err
	})
	if err != nil {
		t.Fatalf("waiting for VMIs of %s: %s: %v (have %d)", rs.Name, what, err, len(got))
	}
	return got
}

func (h *harness) consistentlyNoVMIs(t *testing.T, rs *v1alpha1.VirtualMachineInstanceReplicaSet) {
	t.Helper()
	for end := time.Now().Add(consistent); time.Now().Before(end); time.Sleep(poll) {
		got, err := h.vmis(context.Background(), rs)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > 0 {
			t.Fatalf("replica set %s created %d VMIs, want none", rs.Name, len(got))
		}
	}
}

func (h *harness) waitRS(t *testing.T, rs *v1alpha1.VirtualMachineInstanceReplicaSet, what string, cond func(*v1alpha1.VirtualMachineInstanceReplicaSet) bool) *v1alpha1.VirtualMachineInstanceReplicaSet {
	t.Helper()
	got := &v1alpha1.VirtualMachineInstanceReplicaSet{}
	err := wait.PollUntilContextTimeout(context.Background(), poll, eventually, true, func(ctx context.Context) (bool, error) {
		if err := h.c.Get(ctx, client.ObjectKeyFromObject(rs), got); err != nil {
			return false, err
		}
		return cond(got), nil
	})
	if err != nil {
		t.Fatalf("waiting for replica set %s: %s: %v; last status %+v", rs.Name, what, err, got.Status)
	}
	return got
}

// waitEvent waits for an event about rs with the given reason.
func (h *harness) waitEvent(t *testing.T, rs *v1alpha1.VirtualMachineInstanceReplicaSet, reason string) {
	t.Helper()
	var seen []string
	err := wait.PollUntilContextTimeout(context.Background(), poll, eventually, true, func(ctx context.Context) (bool, error) {
		events := &eventsv1.EventList{}
		if err := h.c.List(ctx, events, client.InNamespace(rs.Namespace)); err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range events.Items {
			if e.Regarding.UID == rs.UID {
				seen = append(seen, e.Reason)
				if e.Reason == reason {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("waiting for a %s event about %s: %v (seen %v)", reason, rs.Name, err, seen)
	}
}
