package migration

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
)

// serviceAccountVolumePrefix starts the name of the token volume the API server's ServiceAccount
// admission adds to every pod; a copied pod must not carry it, admission adds its own.
const serviceAccountVolumePrefix = "kube-api-access-"

// TargetPodName is the name of the target launcher pod of migration migUID of VMI vmiName. It is
// fixed by the migration so that creating it twice (a stale cache) answers AlreadyExists.
func TargetPodName(vmiName, migUID string) string {
	suffix := migUID
	if len(suffix) > 8 {
		suffix = suffix[:8]
	}
	prefix := "kubevisor-launcher-" + vmiName
	// Keep within 63 characters: the pod's hostname is derived from its name.
	if limit := 63 - len("-mig-") - len(suffix); len(prefix) > limit {
		prefix = strings.TrimRight(prefix[:limit], "-.")
	}
	return prefix + "-mig-" + suffix
}

// TargetPod builds the target launcher pod of a migration from the VMI's source launcher pod:
// the same pod (so the target gets the same devices, volumes and resources) with the
// migration's UID label, a fresh identity, and a node affinity that keeps it off the source node
// and, when driver (the VMI's hypervisor driver) is known, requires a node where that driver
// declares live migration (v1alpha1.DriverMigrationLabel) and, for a VMI with writable
// node-local disks (localDisks), copies them (DriverMigrationDisksLabel).
//
// The launcher image is the current one, launcherImage (kubevisor-controller's), not the
// source's, as KubeVirt's target pods are: every container of the source that ran the source's
// launcher image (the compute container's) runs launcherImage, so a migration moves a VMI off an
// older launcher (the workload updater relies on it); "" keeps the source's.
func TargetPod(source *corev1.Pod, mig *v1alpha1.VirtualMachineInstanceMigration, driver string, localDisks bool, launcherImage string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:            TargetPodName(mig.Spec.VMIName, string(mig.UID)),
			Namespace:       source.Namespace,
			Labels:          map[string]string{},
			Annotations:     map[string]string{},
			OwnerReferences: append([]metav1.OwnerReference(nil), source.OwnerReferences...),
		},
		Spec: *source.Spec.DeepCopy(),
	}
	for k, v := range source.Labels {
		pod.Labels[k] = v
	}
	pod.Labels[v1alpha1.MigrationUIDLabel] = string(mig.UID)
	for k, v := range source.Annotations {
		pod.Annotations[k] = v
	}
	// Finalizers are not copied: whoever prepares the target node adds its own.

	spec := &pod.Spec
	sourceNode := spec.NodeName
	spec.NodeName = ""
	spec.EphemeralContainers = nil
	spec.Volumes = spec.Volumes[:0:0]
	for _, v := range source.Spec.Volumes {
		if !isServiceAccountVolume(v) {
			spec.Volumes = append(spec.Volumes, v)
		}
	}
	spec.InitContainers = dropServiceAccountMounts(spec.InitContainers, source.Spec.Volumes)
	spec.Containers = dropServiceAccountMounts(spec.Containers, source.Spec.Volumes)
	if old := computeImage(source); launcherImage != "" && old != "" {
		for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
			for i := range cs {
				if cs[i].Image == old {
					cs[i].Image = launcherImage
				}
			}
		}
	}
	if prev := source.Annotations[AvoidedNodeAnnotation]; prev != "" {
		// The source is the target of an earlier migration: what kept it off that
		// migration's source node is not this one's to keep.
		unavoidNode(spec, prev)
		delete(pod.Annotations, AvoidedNodeAnnotation)
	}
	if sourceNode != "" {
		avoidNode(spec, sourceNode)
		pod.Annotations[AvoidedNodeAnnotation] = sourceNode
	}
	if driver != "" {
		requireMigratingDriver(spec, v1alpha1.DriverMigrationLabel(driver))
		if localDisks {
			requireMigratingDriver(spec, v1alpha1.DriverMigrationDisksLabel(driver))
		}
	}
	return pod
}

// requireMigratingDriver adds to each required node selector term that the node's label (a
// driver's live-migration label) is "true", unless the term says so already (the source pod was
// a migration's target).
func requireMigratingDriver(spec *corev1.PodSpec, label string) {
	req := corev1.NodeSelectorRequirement{Key: label, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}
	terms := requiredTerms(spec)
	for i := range terms {
		if !slices.ContainsFunc(terms[i].MatchExpressions, func(r corev1.NodeSelectorRequirement) bool { return equality.Semantic.DeepEqual(r, req) }) {
			terms[i].MatchExpressions = append(terms[i].MatchExpressions, req)
		}
	}
}

// AvoidedNodeAnnotation on a target pod names the node its affinity keeps it off (avoidNode):
// the migration's source node, which a later migration of the VMI from this pod lifts.
const AvoidedNodeAnnotation = v1alpha1.LabelPrefix + "migration-avoids-node"

// unavoidNode removes what avoidNode(spec, node) added: the requirement from every term, and
// the terms (or the node affinity) it alone made.
func unavoidNode(spec *corev1.PodSpec, node string) {
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return
	}
	sel := spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	terms := sel.NodeSelectorTerms[:0]
	for _, t := range sel.NodeSelectorTerms {
		t.MatchFields = slices.DeleteFunc(t.MatchFields, func(r corev1.NodeSelectorRequirement) bool {
			return r.Key == "metadata.name" && r.Operator == corev1.NodeSelectorOpNotIn && slices.Equal(r.Values, []string{node})
		})
		if len(t.MatchFields) == 0 {
			t.MatchFields = nil
		}
		if len(t.MatchExpressions) > 0 || len(t.MatchFields) > 0 {
			terms = append(terms, t)
		}
	}
	sel.NodeSelectorTerms = terms
	if len(terms) == 0 {
		spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = nil
	}
}

func isServiceAccountVolume(v corev1.Volume) bool {
	return strings.HasPrefix(v.Name, serviceAccountVolumePrefix) && v.Projected != nil
}

func dropServiceAccountMounts(cs []corev1.Container, volumes []corev1.Volume) []corev1.Container {
	drop := map[string]bool{}
	for _, v := range volumes {
		if isServiceAccountVolume(v) {
			drop[v.Name] = true
		}
	}
	if len(drop) == 0 {
		return cs
	}
	for i := range cs {
		var kept []corev1.VolumeMount
		for _, m := range cs[i].VolumeMounts {
			if !drop[m.Name] {
				kept = append(kept, m)
			}
		}
		cs[i].VolumeMounts = kept
	}
	return cs
}

// avoidNode adds "metadata.name NotIn [node]" to every required node selector term (terms are
// ORed, so each needs it), or one term holding only it. A field match names the node exactly,
// where the kubernetes.io/hostname label need not equal the node's name.
func avoidNode(spec *corev1.PodSpec, node string) {
	req := corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{node}}
	terms := requiredTerms(spec)
	for i := range terms {
		terms[i].MatchFields = append(terms[i].MatchFields, req)
	}
}

// requiredTerms returns the pod's required node selector terms, made (one empty term) when it has
// none, for a requirement to be added to each.
func requiredTerms(spec *corev1.PodSpec) []corev1.NodeSelectorTerm {
	if spec.Affinity == nil {
		spec.Affinity = &corev1.Affinity{}
	}
	if spec.Affinity.NodeAffinity == nil {
		spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	sel := na.RequiredDuringSchedulingIgnoredDuringExecution
	if len(sel.NodeSelectorTerms) == 0 {
		sel.NodeSelectorTerms = []corev1.NodeSelectorTerm{{}}
	}
	return sel.NodeSelectorTerms
}

// computeImage is the image of pod's compute container (the launcher's), "" without one.
func computeImage(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		if c.Name == layout.ComputeContainer {
			return c.Image
		}
	}
	return ""
}
