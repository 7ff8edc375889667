package migration_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/controlplane/migration"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

const (
	ns      = "default"
	timeout = 60 * time.Second
)

// harness is an API server with the migration controller running against it; the test plays
// the scheduler, the kubelet and the node handler by writing what they would write.
type harness struct {
	t   *testing.T
	ctx context.Context
	c   client.Client
}

func start(t *testing.T) *harness {
	ctrl.SetLogger(funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{}))
	env := envtest.Start(t, envtest.Options{})
	// The controller runs as a user granted exactly its +kubebuilder:rbac markers: the markers
	// are proven to suffice, and least privilege is what the tests exercise.
	cfg := env.ImpersonateWithMarkers(t, "kubevisor-migration-test", "controller.go", "policy.go")
	envtest.StartManager(t, cfg, func(mgr ctrl.Manager) error {
		return migration.SetupWithManager(mgr, migration.Options{SkipNameValidation: true})
	})
	return &harness{t: t, ctx: context.Background(), c: env.Client}
}

// runningVMI creates a VMI Running on node-a with its launcher pod there, as the VMI controller,
// the scheduler, the kubelet and the handler would leave it.
func (h *harness) runningVMI(name string, migratable corev1.ConditionStatus) (*v1alpha1.VirtualMachineInstance, *corev1.Pod) {
	h.t.Helper()
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	h.must(h.c.Create(h.ctx, vmi))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "kubevisor-launcher-" + name, Namespace: ns,
			Labels: map[string]string{v1alpha1.CreatedByLabel: string(vmi.UID), v1alpha1.VirtualMachineInstanceNameLabel: name},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachineInstance", Name: name, UID: vmi.UID, Controller: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "compute", Image: "kubevisor-launcher:dev"}},
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: v1alpha1.SchedulableNodeLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"},
				}}}},
			}}},
		},
	}
	h.must(h.c.Create(h.ctx, pod))
	h.schedule(pod, "node-a")
	vmi.Status = v1alpha1.VirtualMachineInstanceStatus{
		Phase: v1alpha1.Running, NodeName: "node-a", LauncherPodName: pod.Name,
		Conditions: []v1alpha1.VirtualMachineInstanceCondition{{Type: v1alpha1.VirtualMachineInstanceIsMigratable, Status: migratable, Reason: "Test"}},
	}
	h.must(h.c.Status().Update(h.ctx, vmi))
	return vmi, pod
}

// schedule binds the pod to node and reports it Running (scheduler and kubelet).
func (h *harness) schedule(pod *corev1.Pod, node string) {
	h.t.Helper()
	h.must(h.c.SubResource("binding").Create(h.ctx, pod, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}))
	h.must(h.c.Get(h.ctx, client.ObjectKeyFromObject(pod), pod))
	pod.Status.Phase = corev1.PodRunning
	h.must(h.c.Status().Update(h.ctx, pod))
}

func (h *harness) migrate(name, vmi string) *v1alpha1.VirtualMachineInstanceMigration {
	h.t.Helper()
	m := &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi},
	}
	h.must(h.c.Create(h.ctx, m))
	return m
}

// waitPhase polls until the migration reaches want and returns it.
func (h *harness) waitPhase(m *v1alpha1.VirtualMachineInstanceMigration, want v1alpha1.VirtualMachineInstanceMigrationPhase) *v1alpha1.VirtualMachineInstanceMigration {
	h.t.Helper()
	got := &v1alpha1.VirtualMachineInstanceMigration{}
	h.eventually(fmt.Sprintf("migration %s in phase %s", m.Name, want), func() (bool, error) {
		if err := h.c.Get(h.ctx, client.ObjectKeyFromObject(m), got); err != nil {
			return false, err
		}
		return got.Status.Phase == want, nil
	})
	return got
}

func (h *harness) eventually(what string, cond func() (bool, error)) {
	h.t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(h.ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok && err == nil, nil
	})
	if err != nil {
		h.t.Fatalf("waiting for %s: %v (last error: %v)", what, err, last)
	}
}

func (h *harness) must(err error) {
	h.t.Helper()
	if err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) targetPod(m *v1alpha1.VirtualMachineInstanceMigration) *corev1.Pod {
	h.t.Helper()
	var pod *corev1.Pod
	h.eventually("target pod of "+m.Name, func() (bool, error) {
		var pods corev1.PodList
		if err := h.c.List(h.ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.MigrationUIDLabel: string(m.UID)}); err != nil {
			return false, err
		}
		if len(pods.Items) != 1 {
			return false, nil
		}
		pod = &pods.Items[0]
		return true, nil
	})
	return pod
}

func TestMigration(t *testing.T) {
	h := start(t)

	t.Run("lifecycle and cancellation", func(t *testing.T) {
		h := &harness{t: t, ctx: h.ctx, c: h.c}
		vmi, source := h.runningVMI("vm1", corev1.ConditionTrue)
		m := h.migrate("mig1", "vm1")
		h.waitPhase(m, v1alpha1.MigrationScheduling)

		target := h.targetPod(m)
		if target.Labels[v1alpha1.CreatedByLabel] != string(vmi.UID) {
			t.Errorf("target pod labels %v: want %s=%s", target.Labels, v1alpha1.CreatedByLabel, vmi.UID)
		}
		if target.Spec.NodeName != "" {
			t.Errorf("target pod bound to %q at creation", target.Spec.NodeName)
		}
		if len(target.OwnerReferences) != 1 || target.OwnerReferences[0].UID != vmi.UID {
			t.Errorf("target pod owners %v: want the VMI", target.OwnerReferences)
		}
		terms := target.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || len(terms[0].MatchFields) != 1 ||
			terms[0].MatchFields[0].Key != "metadata.name" || terms[0].MatchFields[0].Operator != corev1.NodeSelectorOpNotIn ||
			len(terms[0].MatchFields[0].Values) != 1 || terms[0].MatchFields[0].Values[0] != source.Spec.NodeName {
			t.Errorf("target pod node affinity %+v: want the source's capability term plus metadata.name NotIn [node-a]", terms)
		}

		h.schedule(target, "node-b")
		got := h.waitPhase(m, v1alpha1.MigrationTargetReady)
		if s := got.Status.MigrationState; s == nil || s.SourceNode != "node-a" || s.TargetNode != "node-b" || s.TargetPod != target.Name || s.SourcePod != source.Name {
			t.Errorf("migration state %+v", s)
		}
		// The hand-off: the node side finds the migration on the VMI.
		h.eventually("VMI migration state handed off", func() (bool, error) {
			if err := h.c.Get(h.ctx, client.ObjectKeyFromObject(vmi), vmi); err != nil {
				return false, err
			}
			s := vmi.Status.MigrationState
			return s != nil && s.MigrationUID == m.UID && s.TargetPod == target.Name && s.TargetNode == "node-b" && s.SourceNode == "node-a", nil
		})

		// The node side starts moving the guest.
		vmi.Status.MigrationState.StartTimestamp = ptr.To(metav1.Now())
		h.must(h.c.Status().Update(h.ctx, vmi))
		h.waitPhase(m, v1alpha1.MigrationRunning)

		// Cancel: the target pod is deleted, the VMI forgets the migration, the finalizer stays
		// until the pod is gone.
		h.must(h.c.Delete(h.ctx, m))
		h.eventually("target pod terminating", func() (bool, error) {
			err := h.c.Get(h.ctx, client.ObjectKeyFromObject(target), target)
			return err == nil && target.DeletionTimestamp != nil, err
		})
		// The controller removes what it wrote; the startTimestamp the node side (this test)
		// wrote is the node side's to remove.
		h.eventually("VMI migration state cleared of the hand-off", func() (bool, error) {
			err := h.c.Get(h.ctx, client.ObjectKeyFromObject(vmi), vmi)
			s := vmi.Status.MigrationState
			return err == nil && (s == nil || *s == v1alpha1.VirtualMachineInstanceMigrationState{StartTimestamp: s.StartTimestamp}), err
		})
		h.must(h.c.Get(h.ctx, client.ObjectKeyFromObject(m), m))
		if len(m.Finalizers) == 0 {
			t.Error("finalizer released while the target pod still exists")
		}
		// The kubelet confirms the pod's termination.
		h.must(h.c.Delete(h.ctx, target, client.GracePeriodSeconds(0)))
		h.eventually("migration gone", func() (bool, error) {
			err := h.c.Get(h.ctx, client.ObjectKeyFromObject(m), m)
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		})
		h.must(h.c.Get(h.ctx, client.ObjectKeyFromObject(source), source))
		if source.DeletionTimestamp != nil {
			t.Error("the source pod is being deleted")
		}
	})

	t.Run("succeeded migration keeps its target pod", func(t *testing.T) {
		h := &harness{t: t, ctx: h.ctx, c: h.c}
		vmi, _ := h.runningVMI("vm2", corev1.ConditionTrue)
		m := h.migrate("mig2", "vm2")
		h.waitPhase(m, v1alpha1.MigrationScheduling)
		target := h.targetPod(m)
		h.schedule(target, "node-b")
		h.waitPhase(m, v1alpha1.MigrationTargetReady)
		h.eventually("VMI migration state handed off", func() (bool, error) {
			err := h.c.Get(h.ctx, client.ObjectKeyFromObject(vmi), vmi)
			return err == nil && vmi.Status.MigrationState != nil, err
		})
		now := metav1.Now()
		vmi.Status.MigrationState.StartTimestamp, vmi.Status.MigrationState.EndTimestamp = &now, &now
		vmi.Status.MigrationState.Completed = true
		h.must(h.c.Status().Update(h.ctx, vmi))
		got := h.waitPhase(m, v1alpha1.MigrationSucceeded)
		if s := got.Status.MigrationState; s == nil || !s.Completed || s.EndTimestamp == nil {
			t.Errorf("migration state %+v: want completed with an end time", s)
		}
		h.must(h.c.Delete(h.ctx, m))
		h.eventually("migration gone", func() (bool, error) {
			err := h.c.Get(h.ctx, client.ObjectKeyFromObject(m), m)
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		})
		h.must(h.c.Get(h.ctx, client.ObjectKeyFromObject(target), target))
		if target.DeletionTimestamp != nil {
			t.Error("the target pod, which now runs the guest, is being deleted")
		}
		h.must(h.c.Get(h.ctx, client.ObjectKeyFromObject(vmi), vmi))
		if vmi.Status.MigrationState == nil || !vmi.Status.MigrationState.Completed {
			t.Errorf("VMI migration state %+v: want the completed record kept", vmi.Status.MigrationState)
		}
	})

	for _, tc := range []struct {
		name, vmi, reason string
		setup             func(h *harness)
	}{
		{name: "VMI not running", vmi: "vm3", reason: migration.ReasonVMINotRunning, setup: func(h *harness) {
			h.must(h.c.Create(h.ctx, &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm3", Namespace: ns}}))
		}},
		{name: "VMI not live migratable", vmi: "vm4", reason: migration.ReasonNotLiveMigratable, setup: func(h *harness) {
			h.runningVMI("vm4", corev1.ConditionFalse)
		}},
		{name: "VMI missing", vmi: "vm5", reason: migration.ReasonVMINotFound, setup: func(*harness) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &harness{t: t, ctx: h.ctx, c: h.c}
			tc.setup(h)
			m := h.migrate("mig-"+tc.vmi, tc.vmi)
			got := h.waitPhase(m, v1alpha1.MigrationFailed)
			if s := got.Status.MigrationState; s == nil || !s.Failed || len(s.FailureReason) <= len(tc.reason) || s.FailureReason[:len(tc.reason)] != tc.reason {
				t.Errorf("migration state %+v: want failed with reason %s", s, tc.reason)
			}
			var pods corev1.PodList
			h.must(h.c.List(h.ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.MigrationUIDLabel: string(got.UID)}))
			if len(pods.Items) != 0 {
				t.Errorf("%d target pods for a refused migration", len(pods.Items))
			}
			// A failed migration is deleted without waiting for anything.
			h.must(h.c.Delete(h.ctx, m))
			h.eventually("migration gone", func() (bool, error) {
				err := h.c.Get(h.ctx, types.NamespacedName{Namespace: ns, Name: m.Name}, m)
				return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
			})
		})
	}
}
