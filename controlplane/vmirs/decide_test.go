package vmirs

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

var testNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

type rsOpt func(*v1alpha1.VirtualMachineInstanceReplicaSet)

func replicas(n int32) rsOpt {
	return func(rs *v1alpha1.VirtualMachineInstanceReplicaSet) { rs.Spec.Replicas = &n }
}

func paused(rs *v1alpha1.VirtualMachineInstanceReplicaSet) { rs.Spec.Paused = true }

func selector(s *metav1.LabelSelector) rsOpt {
	return func(rs *v1alpha1.VirtualMachineInstanceReplicaSet) { rs.Spec.Selector = s }
}

func newRS(opts ...rsOpt) *v1alpha1.VirtualMachineInstanceReplicaSet {
	rs := &v1alpha1.VirtualMachineInstanceReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "rs", Namespace: "ns", UID: "rs-uid", Generation: 2},
		Spec: v1alpha1.VirtualMachineInstanceReplicaSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: &v1alpha1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web", "tier": "front"}},
			},
		},
	}
	for _, o := range opts {
		o(rs)
	}
	return rs
}

// vmi makes a VMI named name in phase, created age ago; ready adds Ready=True.
func vmi(name string, phase v1alpha1.VirtualMachineInstancePhase, age time.Duration, ready bool) *v1alpha1.VirtualMachineInstance {
	v := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(testNow.Add(-age))},
		Status:     v1alpha1.VirtualMachineInstanceStatus{Phase: phase},
	}
	if ready {
		v.Status.Conditions = []v1alpha1.VirtualMachineInstanceCondition{{Type: v1alpha1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue}}
	}
	return v
}

func deleting(v *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstance {
	t := metav1.NewTime(testNow)
	v.DeletionTimestamp = &t
	return v
}

func TestDecide(t *testing.T) {
	const hour = time.Hour
	tests := []struct {
		name    string
		rs      *v1alpha1.VirtualMachineInstanceReplicaSet
		vmis    []*v1alpha1.VirtualMachineInstance
		burst   int
		create  int
		delete  []string
		capped  bool
		current int32
		ready   int32
		// condition is the condition type expected True with its reason, if any.
		condition v1alpha1.VirtualMachineInstanceReplicaSetConditionType
		reason    string
	}{
		{name: "replicas unset means one", rs: newRS(), create: 1},
		{name: "scale up from zero", rs: newRS(replicas(3)), create: 3},
		{name: "scale up counts the active", rs: newRS(replicas(3)),
			vmis: []*v1alpha1.VirtualMachineInstance{vmi("a", v1alpha1.Running, hour, true)}, create: 2, current: 1, ready: 1},
		{name: "at size does nothing", rs: newRS(replicas(2)),
			vmis:    []*v1alpha1.VirtualMachineInstance{vmi("a", v1alpha1.Running, hour, true), vmi("b", v1alpha1.Pending, hour, false)},
			current: 2, ready: 1},
		{name: "scale down prefers not running, then newest", rs: newRS(replicas(1)),
			vmis: []*v1alpha1.VirtualMachineInstance{
				vmi("old-ready", v1alpha1.Running, 3*hour, true),
				vmi("new-ready", v1alpha1.Running, hour, true),
				vmi("pending", v1alpha1.Pending, 5*hour, false),
				vmi("unready", v1alpha1.Running, 4*hour, false),
			},
			delete: []string{"pending", "unready", "new-ready"}, current: 4, ready: 2},
		{name: "scale to zero", rs: newRS(replicas(0)),
			vmis:   []*v1alpha1.VirtualMachineInstance{vmi("a", v1alpha1.Running, hour, true), vmi("b", v1alpha1.Scheduled, hour, false)},
			delete: []string{"b", "a"}, current: 2, ready: 1},
		{name: "failed VMI is replaced", rs: newRS(replicas(2)),
			vmis:   []*v1alpha1.VirtualMachineInstance{vmi("a", v1alpha1.Running, hour, true), vmi("f", v1alpha1.Failed, hour, false)},
			delete: []string{"f"}, create: 1, current: 1, ready: 1},
		{name: "succeeded VMI is replaced", rs: newRS(replicas(1)),
			vmis:   []*v1alpha1.VirtualMachineInstance{vmi("s", v1alpha1.Succeeded, hour, false)},
			delete: []string{"s"}, create: 1},
		{name: "deleting VMI is neither counted nor deleted again", rs: newRS(replicas(1)),
			vmis:   []*v1alpha1.VirtualMachineInstance{deleting(vmi("d", v1alpha1.Running, hour, true))},
			create: 1},
		{name: "burst caps creations", rs: newRS(replicas(5)), burst: 2, create: 2, capped: true},
		{name: "burst is shared by replacements and creations", rs: newRS(replicas(2)), burst: 2,
			vmis:   []*v1alpha1.VirtualMachineInstance{vmi("f", v1alpha1.Failed, hour, false), vmi("g", v1alpha1.Failed, 2*hour, false)},
			delete: []string{"f", "g"}, capped: true},
		{name: "paused does nothing but count", rs: newRS(replicas(3), paused),
			vmis:    []*v1alpha1.VirtualMachineInstance{vmi("f", v1alpha1.Failed, hour, false), vmi("a", v1alpha1.Running, hour, true)},
			current: 1, ready: 1,
			condition: v1alpha1.VirtualMachineInstanceReplicaSetReplicaPaused, reason: v1alpha1.ReasonPaused},
		{name: "selector not matching the template", rs: newRS(replicas(3), selector(&metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}})),
			condition: v1alpha1.VirtualMachineInstanceReplicaSetReplicaFailure, reason: ReasonInvalidSpec},
		{name: "empty selector", rs: newRS(replicas(3), selector(&metav1.LabelSelector{})),
			condition: v1alpha1.VirtualMachineInstanceReplicaSetReplicaFailure, reason: ReasonInvalidSpec},
		{name: "invalid selector", rs: newRS(replicas(3), selector(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}})),
			condition: v1alpha1.VirtualMachineInstanceReplicaSetReplicaFailure, reason: ReasonInvalidSpec},
		{name: "matchExpressions selector", rs: newRS(replicas(1), selector(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"front"}}}})),
			create: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.rs, tt.vmis, tt.burst, testNow)
			if d.Create != tt.create {
				t.Errorf("create %d, want %d", d.Create, tt.create)
			}
			var deleted []string
			for _, v := range d.Delete {
				deleted = append(deleted, v.Name)
			}
			if !slices.Equal(deleted, tt.delete) {
				t.Errorf("delete %v, want %v", deleted, tt.delete)
			}
			if d.Capped != tt.capped {
				t.Errorf("capped = %v, want %v", d.Capped, tt.capped)
			}
			if d.Status.Replicas != tt.current || d.Status.ReadyReplicas != tt.ready {
				t.Errorf("status replicas %d ready %d, want %d and %d", d.Status.Replicas, d.Status.ReadyReplicas, tt.current, tt.ready)
			}
			if want := metav1.FormatLabelSelector(tt.rs.Spec.Selector); d.Status.LabelSelector != want {
				t.Errorf("labelSelector = %q, want %q", d.Status.LabelSelector, want)
			}
			var trueConds []v1alpha1.VirtualMachineInstanceReplicaSetCondition
			for _, c := range d.Status.Conditions {
				if c.Status == corev1.ConditionTrue {
					trueConds = append(trueConds, c)
				}
			}
			switch {
			case tt.condition == "" && len(trueConds) > 0:
				t.Errorf("unexpected conditions %+v", trueConds)
			case tt.condition != "" && (len(trueConds) != 1 || trueConds[0].Type != tt.condition || trueConds[0].Reason != tt.reason ||
				trueConds[0].ObservedGeneration != tt.rs.Generation):
				t.Errorf("conditions %+v, want %s=True (%s) at generation %d", trueConds, tt.condition, tt.reason, tt.rs.Generation)
			}
		})
	}
}

func TestDecideClearsConditions(t *testing.T) {
	rs := newRS(replicas(1), paused)
	rs.Status = Decide(rs, nil, 0, testNow).Status
	rs.Spec.Paused = false
	rs.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}
	rs.Status = Decide(rs, nil, 0, testNow).Status
	rs.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	d := Decide(rs, nil, 0, testNow)
	if len(d.Status.Conditions) != 0 {
		t.Errorf("conditions %+v remain once paused and selector are fixed", d.Status.Conditions)
	}
	if d.Create != 1 {
		t.Errorf("create %d, want 1", d.Create)
	}
}

func TestNewVMI(t *testing.T) {
	rs := newRS(replicas(2))
	rs.Spec.Template.Spec.Hostname = "guest"
	v := NewVMI(rs)
	if v.GenerateName != "rs-" || v.Name != "" || v.Namespace != "ns" {
		t.Errorf("name %q generateName %q namespace %q", v.Name, v.GenerateName, v.Namespace)
	}
	if v.Labels["app"] != "web" || v.Spec.Hostname != "guest" {
		t.Errorf("VMI not from the template: %+v", v)
	}
	ref := metav1.GetControllerOf(v)
	if ref == nil || ref.UID != rs.UID || ref.Kind != "VirtualMachineInstanceReplicaSet" || !ptr.Deref(ref.BlockOwnerDeletion, false) {
		t.Errorf("controller ref %+v", ref)
	}
	v.Labels["x"] = "y"
	if _, ok := rs.Spec.Template.ObjectMeta.Labels["x"]; ok {
		t.Error("the VMI shares its labels map with the template")
	}
}
