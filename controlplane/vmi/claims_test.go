package vmi

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

func TestClaimRefs(t *testing.T) {
	pvc := func(name, claim string) v1alpha1.Volume {
		return v1alpha1.Volume{Name: name, VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}
	}
	vmi := &v1alpha1.VirtualMachineInstance{}
	vmi.Spec.Volumes = []v1alpha1.Volume{
		{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "disk:v1"}}},
		pvc("data", "data-claim"),
		{Name: "base", VolumeSource: v1alpha1.VolumeSource{Ephemeral: &v1alpha1.EphemeralVolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "golden"}}}},
		pvc("again", "data-claim"),
	}
	want := []claimRef{{Claim: "data-claim", Volume: "data"}, {Claim: "golden", Volume: "base"}}
	if got := claimRefs(vmi); !reflect.DeepEqual(got, want) {
		t.Errorf("claimRefs = %+v, want %+v", got, want)
	}
}

func TestClaimsProblem(t *testing.T) {
	claim := func(phase corev1.PersistentVolumeClaimPhase) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns"}, Status: corev1.PersistentVolumeClaimStatus{Phase: phase}}
	}
	refs := []claimRef{{Claim: "a", Volume: "va"}, {Claim: "b", Volume: "vb"}}
	tests := []struct {
		name  string
		found map[string]*corev1.PersistentVolumeClaim
		// want is nil, or the reason and the exact message.
		want *problem
	}{
		{name: "all bound", found: map[string]*corev1.PersistentVolumeClaim{"a": claim(corev1.ClaimBound), "b": claim(corev1.ClaimBound)}},
		{
			name:  "one missing, one pending: the missing one first, and only it",
			found: map[string]*corev1.PersistentVolumeClaim{"b": claim(corev1.ClaimPending)},
			want:  &problem{v1alpha1.ReasonFailedPvcNotFound, "PersistentVolumeClaim ns/a (volume va) does not exist"},
		},
		{
			name: "both missing: both named",
			want: &problem{v1alpha1.ReasonFailedPvcNotFound,
				"PersistentVolumeClaim ns/a (volume va) does not exist; PersistentVolumeClaim ns/b (volume vb) does not exist"},
		},
		{
			name:  "pending and lost: waiting for binding, each with its phase",
			found: map[string]*corev1.PersistentVolumeClaim{"a": claim(corev1.ClaimPending), "b": claim(corev1.ClaimLost)},
			want: &problem{v1alpha1.ReasonWaitingForVolumeBinding,
				"PersistentVolumeClaim ns/a (volume va) is not bound to a volume yet (phase Pending); PersistentVolumeClaim ns/b (volume vb) is not bound to a volume yet (phase Lost)"},
		},
		{
			name:  "no phase yet counts as Pending",
			found: map[string]*corev1.PersistentVolumeClaim{"a": claim(""), "b": claim(corev1.ClaimBound)},
			want:  &problem{v1alpha1.ReasonWaitingForVolumeBinding, "PersistentVolumeClaim ns/a (volume va) is not bound to a volume yet (phase Pending)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := claimsProblem("ns", refs, tt.found)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("claimsProblem = %+v, want %+v", got, tt.want)
			}
			if holds := got.holdsPod(); holds != (tt.want != nil && tt.want.Reason == v1alpha1.ReasonFailedPvcNotFound) {
				t.Errorf("holdsPod = %v for %+v", holds, got)
			}
		})
	}
	if p := claimsProblem("ns", nil, nil); p != nil {
		t.Errorf("no claims: %+v, want nil", p)
	}
}

func TestChecksClaims(t *testing.T) {
	for phase, want := range map[v1alpha1.VirtualMachineInstancePhase]bool{
		v1alpha1.VMIPhaseUnset: true, v1alpha1.Pending: true, v1alpha1.Scheduling: true,
		v1alpha1.Scheduled: false, v1alpha1.Running: false, v1alpha1.Failed: false,
	} {
		vmi := &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: phase}}
		if got := checksClaims(vmi); got != want {
			t.Errorf("checksClaims(%q) = %v, want %v", phase, got, want)
		}
	}
	deleting := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &t0}}
	if checksClaims(deleting) {
		t.Error("checksClaims of a VMI being deleted = true, want false")
	}
}

func TestVolumeStatus(t *testing.T) {
	fs := corev1.PersistentVolumeFilesystem
	bound := &corev1.PersistentVolumeClaim{
		Spec: corev1.PersistentVolumeClaimSpec{
			VolumeMode: &fs,
			Resources:  corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
		Status: corev1.PersistentVolumeClaimStatus{
			Phase:       corev1.ClaimBound,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")},
		},
	}
	pending := &corev1.PersistentVolumeClaim{Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}}
	vmi := &v1alpha1.VirtualMachineInstance{}
	vmi.Spec.Volumes = []v1alpha1.Volume{
		{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "disk:v1"}}},
		{Name: "data", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-claim"}}}},
		{Name: "base", VolumeSource: v1alpha1.VolumeSource{Ephemeral: &v1alpha1.EphemeralVolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-claim"}}}},
		{Name: "later", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "pending"}}}},
		{Name: "gone", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "missing"}}}},
	}
	info := &v1alpha1.PersistentVolumeClaimInfo{
		ClaimName: "data-claim", AccessModes: bound.Status.AccessModes, VolumeMode: &fs,
		Capacity: bound.Status.Capacity, Requests: bound.Spec.Resources.Requests,
		FilesystemOverhead: v1alpha1.DefaultFilesystemOverhead,
	}
	want := []v1alpha1.VolumeStatus{{Name: "data", PersistentVolumeClaimInfo: info}, {Name: "base", PersistentVolumeClaimInfo: info}}
	got := volumeStatus(vmi, map[string]*corev1.PersistentVolumeClaim{"data-claim": bound, "pending": pending})
	if !reflect.DeepEqual(got, want) {
		t.Errorf("volumeStatus = %+v, want %+v (bound claims only, a volume each)", got, want)
	}

	// deriveStatus writes it when the claims were read, and keeps the last one when they were not.
	st := deriveStatus(vmi, observation{Claims: map[string]*corev1.PersistentVolumeClaim{"data-claim": bound}}, metav1.Now())
	if !reflect.DeepEqual(st.VolumeStatus, want) {
		t.Errorf("deriveStatus volumeStatus = %+v, want %+v", st.VolumeStatus, want)
	}
	vmi.Status = st
	if again := deriveStatus(vmi, observation{}, metav1.Now()); !reflect.DeepEqual(again.VolumeStatus, want) {
		t.Errorf("claims not read: volumeStatus = %+v, want the last one kept", again.VolumeStatus)
	}
	if f := controllerFields(st, false); !reflect.DeepEqual(f.VolumeStatus, want) {
		t.Errorf("controllerFields drops volumeStatus: %+v", f.VolumeStatus)
	}
}
