package migration

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/controlplane/launcherpod"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/mcs"
)

func sourcePod(affinity *corev1.Affinity) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "kubevisor-launcher-vm1-abcde", Namespace: "ns", UID: "pod-uid", ResourceVersion: "42",
			Labels:          map[string]string{v1alpha1.CreatedByLabel: "vmi-uid", "app": "x"},
			Annotations:     map[string]string{"a": "b"},
			Finalizers:      []string{v1alpha1.TeardownFinalizer},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevisor.io/v1alpha1", Kind: "VirtualMachineInstance", Name: "vm1", UID: "vmi-uid", Controller: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{
			NodeName: "node-a",
			Affinity: affinity,
			Containers: []corev1.Container{{Name: "compute", Image: "launcher", VolumeMounts: []corev1.VolumeMount{
				{Name: "run", MountPath: "/run/kubevisor"}, {Name: "kube-api-access-x1", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"},
			}}},
			Volumes: []corev1.Volume{
				{Name: "run", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/run/kubevisor/vmi-uid"}}},
				{Name: "kube-api-access-x1", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}},
			},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

var notOnA = corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"node-a"}}

func TestTargetPod(t *testing.T) {
	capability := corev1.NodeSelectorRequirement{Key: v1alpha1.DriverHealthLabel("hypervisor", "qmp"), Operator: corev1.NodeSelectorOpIn, Values: []string{"healthy", "degraded"}}
	migrates := corev1.NodeSelectorRequirement{Key: v1alpha1.DriverMigrationLabel("qmp"), Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}
	copiesDisks := corev1.NodeSelectorRequirement{Key: v1alpha1.DriverMigrationDisksLabel("qmp"), Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}
	podAffinity := &corev1.PodAffinity{}
	for _, tc := range []struct {
		name     string
		affinity *corev1.Affinity
		driver   string
		// localDisks: the VMI has writable node-local disks.
		localDisks bool
		want       []corev1.NodeSelectorTerm
	}{
		{name: "no affinity", want: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{notOnA}}}},
		{
			name:     "pod affinity only",
			affinity: &corev1.Affinity{PodAffinity: podAffinity},
			want:     []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{notOnA}}},
		},
		{
			name: "capability terms each keep off the source node",
			affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{capability}}, {MatchExpressions: []corev1.NodeSelectorRequirement{capability}}},
			}}},
			want: []corev1.NodeSelectorTerm{
				{MatchExpressions: []corev1.NodeSelectorRequirement{capability}, MatchFields: []corev1.NodeSelectorRequirement{notOnA}},
				{MatchExpressions: []corev1.NodeSelectorRequirement{capability}, MatchFields: []corev1.NodeSelectorRequirement{notOnA}},
			},
		},
		{
			name:   "a known driver must declare migration on the target's node",
			driver: "qmp",
			affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{capability}}, {}},
			}}},
			want: []corev1.NodeSelectorTerm{
				{MatchExpressions: []corev1.NodeSelectorRequirement{capability, migrates}, MatchFields: []corev1.NodeSelectorRequirement{notOnA}},
				{MatchExpressions: []corev1.NodeSelectorRequirement{migrates}, MatchFields: []corev1.NodeSelectorRequirement{notOnA}},
			},
		},
		{
			name: "node-local disks: the driver must copy disks there too", driver: "qmp", localDisks: true,
			want: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{migrates, copiesDisks}, MatchFields: []corev1.NodeSelectorRequirement{notOnA}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := sourcePod(tc.affinity)
			orig := src.DeepCopy()
			mig := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "ns", UID: types.UID("0123456789abcdef")}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"}}
			got := TargetPod(src, mig, tc.driver, tc.localDisks, "")

			if !equality.Semantic.DeepEqual(src, orig) {
				t.Fatal("TargetPod modified the source pod")
			}
			if got.Name != "kubevisor-launcher-vm1-mig-01234567" || got.Namespace != "ns" {
				t.Errorf("name %s/%s", got.Namespace, got.Name)
			}
			if got.UID != "" || got.ResourceVersion != "" || len(got.Finalizers) != 0 {
				t.Errorf("identity copied: uid %q rv %q finalizers %v", got.UID, got.ResourceVersion, got.Finalizers)
			}
			if got.Labels[v1alpha1.MigrationUIDLabel] != "0123456789abcdef" || got.Labels[v1alpha1.CreatedByLabel] != "vmi-uid" || got.Labels["app"] != "x" {
				t.Errorf("labels %v", got.Labels)
			}
			if got.Annotations["a"] != "b" {
				t.Errorf("annotations %v", got.Annotations)
			}
			if !equality.Semantic.DeepEqual(got.OwnerReferences, src.OwnerReferences) {
				t.Errorf("owner references %v", got.OwnerReferences)
			}
			if got.Spec.NodeName != "" || got.Status.Phase != "" {
				t.Errorf("nodeName %q, status phase %q: want both empty", got.Spec.NodeName, got.Status.Phase)
			}
			if len(got.Spec.Volumes) != 1 || got.Spec.Volumes[0].Name != "run" {
				t.Errorf("volumes %v: want the service account token volume dropped", got.Spec.Volumes)
			}
			if m := got.Spec.Containers[0].VolumeMounts; len(m) != 1 || m[0].Name != "run" {
				t.Errorf("mounts %v", m)
			}
			if got.Spec.Containers[0].Image != "launcher" {
				t.Errorf("container not copied (no current launcher image given): %v", got.Spec.Containers[0])
			}
			terms := got.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
			if !equality.Semantic.DeepEqual(terms, tc.want) {
				t.Errorf("node selector terms\n got %+v\nwant %+v", terms, tc.want)
			}
			if tc.affinity != nil && tc.affinity.PodAffinity != nil && got.Spec.Affinity.PodAffinity == nil {
				t.Error("pod affinity dropped")
			}
		})
	}
}

// TestTargetPodOfATarget: a VMI that migrated from node-a to node-b migrates again, from its
// target pod there: the new target pod keeps off node-b only (node-a is allowed again), and the
// VMI's own node affinity is kept.
func TestTargetPodOfATarget(t *testing.T) {
	capability := corev1.NodeSelectorRequirement{Key: v1alpha1.DriverHealthLabel("hypervisor", "qmp"), Operator: corev1.NodeSelectorOpIn, Values: []string{"healthy"}}
	for _, affinity := range []*corev1.Affinity{nil, {NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{capability}}},
	}}}} {
		m1 := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m1", Namespace: "ns", UID: "1111111111"}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"}}
		m2 := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m2", Namespace: "ns", UID: "2222222222"}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"}}
		first := TargetPod(sourcePod(affinity), m1, "qmp", false, "")
		if first.Annotations[AvoidedNodeAnnotation] != "node-a" {
			t.Fatalf("first target's annotations %v", first.Annotations)
		}
		first.Spec.NodeName = "node-b"
		second := TargetPod(first, m2, "qmp", false, "")
		notOnB := corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"node-b"}}
		// The driver's requirement is the first target's, not added twice.
		migrates := corev1.NodeSelectorRequirement{Key: v1alpha1.DriverMigrationLabel("qmp"), Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}
		want := []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{migrates}, MatchFields: []corev1.NodeSelectorRequirement{notOnB}}}
		if affinity != nil {
			want[0].MatchExpressions = []corev1.NodeSelectorRequirement{capability, migrates}
		}
		if got := second.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms; !equality.Semantic.DeepEqual(got, want) {
			t.Errorf("second target's terms %+v, want %+v", got, want)
		}
		if second.Annotations[AvoidedNodeAnnotation] != "node-b" {
			t.Errorf("second target's annotations %v", second.Annotations)
		}
	}
}

func TestTargetPodName(t *testing.T) {
	for _, vmi := range []string{"a", strings.Repeat("v", 63), strings.Repeat("v", 40) + "-" + strings.Repeat("w", 40)} {
		n := TargetPodName(vmi, "0123456789abcdef")
		if len(n) > 63 || !strings.HasSuffix(n, "-mig-01234567") || strings.Contains(n, "--") {
			t.Errorf("TargetPodName(%q) = %q (%d characters)", vmi, n, len(n))
		}
	}
}

// TestTargetPodRunsTheCurrentLauncher: a target pod runs the controller's launcher image in
// every container that ran the source's launcher image (after an upgrade, a migration moves the
// VMI to the new launcher); other images (a containerDisk) are kept.
func TestTargetPodRunsTheCurrentLauncher(t *testing.T) {
	src := sourcePod(nil)
	src.Spec.Containers[0].Image = "launcher:v1"
	src.Spec.Containers = append(src.Spec.Containers, corev1.Container{Name: "guest-console-log", Image: "launcher:v1"})
	src.Spec.InitContainers = []corev1.Container{{Name: "volume-containerdisk", Image: "guest:latest"}, {Name: "setup", Image: "launcher:v1"}}
	mig := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "ns", UID: "0123456789"}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"}}
	got := TargetPod(src, mig, "qmp", false, "launcher:v2")
	images := func(cs []corev1.Container) (out []string) {
		for _, c := range cs {
			out = append(out, c.Name+"="+c.Image)
		}
		return out
	}
	if want := []string{"compute=launcher:v2", "guest-console-log=launcher:v2"}; !slices.Equal(images(got.Spec.Containers), want) {
		t.Errorf("containers %v, want %v", images(got.Spec.Containers), want)
	}
	if want := []string{"volume-containerdisk=guest:latest", "setup=launcher:v2"}; !slices.Equal(images(got.Spec.InitContainers), want) {
		t.Errorf("init containers %v, want %v", images(got.Spec.InitContainers), want)
	}
	if src.Spec.Containers[0].Image != "launcher:v1" || src.Spec.InitContainers[1].Image != "launcher:v1" {
		t.Error("TargetPod modified the source pod's images")
	}
}

// TestTargetPodKeepsSELinuxLevel: a target pod runs at its VMI's SELinux level, the source's
// (launcherpod.Build's, from status.selinuxLevel), and so does the target of a migration from
// it: the VM's files on the target's node are labelled with the level its process runs at.
func TestTargetPodKeepsSELinuxLevel(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "vmi-uid"},
		Spec:       v1alpha1.VirtualMachineInstanceSpec{Domain: v1alpha1.DomainSpec{Memory: &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("1Gi"))}}},
		Status:     v1alpha1.VirtualMachineInstanceStatus{SELinuxLevel: "s0:c40,c41"},
	}
	source, err := launcherpod.Build(vmi, &v1alpha1.HypervisorClass{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Driver: "qmp"}, launcherpod.Config{LauncherImage: "launcher:1"})
	if err != nil {
		t.Fatal(err)
	}
	source.Spec.NodeName = "node-a"
	mig := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{UID: "mig-1"}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"}}
	target := TargetPod(source, mig, "qmp", false, "launcher:2")
	again := TargetPod(target, &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{UID: "mig-2"}, Spec: mig.Spec}, "qmp", false, "launcher:2")
	for _, pod := range []*corev1.Pod{source, target, again} {
		l, ok, err := mcs.PodLevel(pod)
		if err != nil || !ok || l.String() != "s0:c40,c41" {
			t.Errorf("pod %s runs at %s (set %v, %v), want the VMI's s0:c40,c41", pod.Name, l, ok, err)
		}
	}
}
