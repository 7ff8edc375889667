package vmi

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/controlplane/launcherpod"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

const (
	waitTimeout = 30 * time.Second
	poll        = 50 * time.Millisecond
	testImage   = "kubevisor/launcher:test"
)

// TestController runs the VMI controller in a real manager against a real kube-apiserver. There
// is no scheduler and no kubelet: the test plays them through the API (the binding subresource,
// pod status, deletion with a zero grace period).
//
// The subtests run in order and share the cluster-scoped HypervisorClasses: the first one starts
// with none.
func TestController(t *testing.T) {
	ctrl.SetLogger(logr.Discard())
	env := envtest.Start(t, envtest.Options{})
	// The controller runs with exactly the RBAC of its markers.
	cfg := env.ImpersonateWithMarkers(t, "vmi-controller", "controller.go")
	opts := Options{
		Pod:                launcherpod.Config{LauncherImage: testImage, HostStateDir: "/var/lib/kubevisor-test", LauncherMemoryOverhead: resource.MustParse("100Mi")},
		SkipNameValidation: true,
	}
	envtest.StartManager(t, cfg, func(mgr ctrl.Manager) error { return SetupWithManager(mgr, opts) })
	ctx := context.Background()
	h := &harness{c: env.Client}

	t.Run("no class: Pending with the condition, then a new default class unblocks it", func(t *testing.T) {
		ns := h.namespace(t, "no-class")
		vmi := h.createVMI(t, ns, "wait")
		h.waitVMI(t, vmi, "Pending with HypervisorClassNotFound", func(v *v1alpha1.VirtualMachineInstance) bool {
			c := condition(v.Status, v1alpha1.VirtualMachineInstanceLauncherPodCreated)
			return v.Status.Phase == v1alpha1.Pending && c != nil && c.Status == corev1.ConditionFalse &&
				c.Reason == v1alpha1.ReasonHypervisorClassNotFound && strings.Contains(c.Message, "none is annotated")
		})
		h.expectNoPods(t, vmi)
		h.expectEvent(t, vmi, corev1.EventTypeWarning, v1alpha1.ReasonHypervisorClassNotFound)

		h.createClass(t, "standard", true, nil)
		got := h.waitVMI(t, vmi, "Scheduling with the default class", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.Phase == v1alpha1.Scheduling && v.Status.HypervisorClassName == "standard" && v.Status.LauncherPodName != ""
		})
		if got.Status.HypervisorDriver != "qmp" {
			t.Errorf("status.hypervisorDriver = %q, want the class's qmp", got.Status.HypervisorDriver)
		}
		if c := condition(got.Status, v1alpha1.VirtualMachineInstanceLauncherPodCreated); c != nil {
			t.Errorf("LauncherPodCreated condition left after the pod was created: %+v", c)
		}
		pod := h.launcherPod(t, got)
		if pod.Labels[v1alpha1.HypervisorClassLabel] != "standard" {
			t.Errorf("pod class label = %q, want standard", pod.Labels[v1alpha1.HypervisorClassLabel])
		}
		if pod.Labels[v1alpha1.HypervisorDriverLabel] != "qmp" {
			t.Errorf("pod driver label = %q, want qmp", pod.Labels[v1alpha1.HypervisorDriverLabel])
		}
		h.expectEvent(t, vmi, corev1.EventTypeNormal, v1alpha1.ReasonSuccessfulCreate)
	})

	t.Run("several default classes: Pending until one remains", func(t *testing.T) {
		ns := h.namespace(t, "two-defaults")
		second := h.createClass(t, "standard-2", true, nil)
		vmi := h.createVMI(t, ns, "wait")
		h.waitVMI(t, vmi, "Pending with MultipleDefaultHypervisorClasses", func(v *v1alpha1.VirtualMachineInstance) bool {
			c := condition(v.Status, v1alpha1.VirtualMachineInstanceLauncherPodCreated)
			return v.Status.Phase == v1alpha1.Pending && c != nil && c.Reason == v1alpha1.ReasonMultipleDefaultHypervisorClasses &&
				strings.Contains(c.Message, "standard, standard-2")
		})
		h.expectNoPods(t, vmi)
		// Taking the annotation off the second class is an update event that re-queues the VMI.
		patch := client.MergeFrom(second.DeepCopy())
		second.Annotations = nil
		if err := h.c.Patch(ctx, second, patch); err != nil {
			t.Fatal(err)
		}
		h.waitVMI(t, vmi, "Scheduling with the one default", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.Phase == v1alpha1.Scheduling && v.Status.HypervisorClassName == "standard"
		})
	})

	t.Run("named class missing, then created", func(t *testing.T) {
		ns := h.namespace(t, "named-missing")
		vmi := h.createVMI(t, ns, "wait", func(v *v1alpha1.VirtualMachineInstance) { v.Spec.HypervisorClassName = "later" })
		h.waitVMI(t, vmi, "Pending naming the class", func(v *v1alpha1.VirtualMachineInstance) bool {
			c := condition(v.Status, v1alpha1.VirtualMachineInstanceLauncherPodCreated)
			return v.Status.Phase == v1alpha1.Pending && c != nil && c.Reason == v1alpha1.ReasonHypervisorClassNotFound &&
				strings.Contains(c.Message, `"later"`)
		})
		h.createClass(t, "later", false, nil)
		h.waitVMI(t, vmi, "Scheduling with the named class", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.Phase == v1alpha1.Scheduling && v.Status.HypervisorClassName == "later"
		})
	})

	t.Run("probes reach the compute container through the API server, which defaults their timings", func(t *testing.T) {
		ns := h.namespace(t, "probes")
		vmi := h.createVMI(t, ns, "probed", h.plainClass(t), func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.ReadinessProbe = &v1alpha1.Probe{
				ProbeHandler:  v1alpha1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt(80)}},
				PeriodSeconds: 2,
			}
			v.Spec.LivenessProbe = &v1alpha1.Probe{
				ProbeHandler:     v1alpha1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(22)}},
				FailureThreshold: 2, InitialDelaySeconds: 10,
			}
		})
		got := h.waitVMI(t, vmi, "Scheduling", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.LauncherPodName != "" })
		pod := h.launcherPod(t, got)
		c := pod.Spec.Containers[0]
		if c.Name != layout.ComputeContainer {
			t.Fatalf("first container %q, want %s", c.Name, layout.ComputeContainer)
		}
		r, l := c.ReadinessProbe, c.LivenessProbe
		if r == nil || r.HTTPGet == nil || r.HTTPGet.Port.IntValue() != 80 || r.HTTPGet.Path != "/" || r.HTTPGet.Host != "" ||
			r.HTTPGet.Scheme != corev1.URISchemeHTTP || r.PeriodSeconds != 2 || r.FailureThreshold != 3 || r.TimeoutSeconds != 1 {
			t.Errorf("compute readinessProbe = %+v", r)
		}
		if l == nil || l.TCPSocket == nil || l.TCPSocket.Port.IntValue() != 22 || l.FailureThreshold != 2 || l.InitialDelaySeconds != 10 || l.PeriodSeconds != 10 {
			t.Errorf("compute livenessProbe = %+v", l)
		}
		for _, other := range pod.Spec.Containers[1:] {
			if other.ReadinessProbe != nil || other.LivenessProbe != nil {
				t.Errorf("container %s has the VMI's probes", other.Name)
			}
		}
	})

	t.Run("launcher pod: resources, device requests, scheduling, volumes, labels, owner", func(t *testing.T) {
		ns := h.namespace(t, "pod")
		h.createClass(t, "fast", false, func(c *v1alpha1.HypervisorClass) {
			c.Overhead = &v1alpha1.HypervisorClassOverhead{PodFixed: corev1.ResourceList{
				corev1.ResourceMemory: resource.MustParse("64Mi"), corev1.ResourceCPU: resource.MustParse("250m"),
			}}
			c.Scheduling = &v1alpha1.HypervisorClassScheduling{
				NodeSelector: map[string]string{"kubevisor.io/kvm": "true"},
				Tolerations:  []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "vms", Effect: corev1.TaintEffectNoSchedule}},
			}
			c.DeviceResources = []corev1.ResourceName{v1alpha1.KVMDeviceResource, v1alpha1.TunDeviceResource}
		})
		h.createClaim(t, ns, "web-data")
		vmi := h.createVMI(t, ns, "web", func(v *v1alpha1.VirtualMachineInstance) {
			v.Labels = map[string]string{"app": "web"}
			v.Spec.HypervisorClassName = "fast"
			v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](60)
			v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 1, Cores: 2, Threads: 1}
			v.Spec.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
			v.Spec.NodeSelector = map[string]string{"zone": "a"}
			v.Spec.Tolerations = []corev1.Toleration{{Key: "maintenance", Operator: corev1.TolerationOpExists}}
			v.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "rack", Operator: corev1.NodeSelectorOpIn, Values: []string{"r1", "r2"}}},
				}}},
			}}
			v.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root"}, {Name: "data"}, {Name: "scratch"}}
			v.Spec.Volumes = []v1alpha1.Volume{
				{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "guest:latest"}}},
				{Name: "data", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
					PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "web-data"}}}},
				{Name: "scratch", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{
					Path: "/srv/disks/web.img", Type: v1alpha1.HostDiskExistsOrCreate, Capacity: resource.MustParse("1Gi")}}},
			}
		})
		got := h.waitVMI(t, vmi, "Scheduling", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.Phase == v1alpha1.Scheduling && v.Status.LauncherPodName != ""
		})
		if !slices.Contains(got.Finalizers, v1alpha1.TeardownFinalizer) {
			t.Errorf("VMI finalizers = %v, want %s", got.Finalizers, v1alpha1.TeardownFinalizer)
		}
		pod := h.launcherPod(t, got)

		if ref := metav1.GetControllerOf(pod); ref == nil || ref.UID != got.UID || ref.Kind != "VirtualMachineInstance" || !ptr.Deref(ref.BlockOwnerDeletion, false) {
			t.Errorf("pod controller ref = %+v, want the VMI", ref)
		}
		wantLabels := map[string]string{
			"app":                                    "web",
			v1alpha1.CreatedByLabel:                  string(got.UID),
			v1alpha1.VirtualMachineInstanceNameLabel: "web",
			v1alpha1.HypervisorClassLabel:            "fast",
			v1alpha1.HypervisorDriverLabel:           "qmp",
		}
		if !equality.Semantic.DeepEqual(pod.Labels, wantLabels) {
			t.Errorf("pod labels = %v, want %v", pod.Labels, wantLabels)
		}

		c := pod.Spec.Containers[0]
		// memory: 1Gi guest + 100Mi launcher + 64Mi class; cpu: the VMI's limit (no request) + 250m.
		wantRes := corev1.ResourceRequirements{
			Requests: corev1.ResourceList{
				corev1.ResourceMemory: resource.MustParse("1188Mi"), corev1.ResourceCPU: resource.MustParse("2250m"),
				v1alpha1.KVMDeviceResource: resource.MustParse("1"), v1alpha1.TunDeviceResource: resource.MustParse("1"),
			},
			Limits: corev1.ResourceList{
				corev1.ResourceMemory: resource.MustParse("1188Mi"), corev1.ResourceCPU: resource.MustParse("2250m"),
				v1alpha1.KVMDeviceResource: resource.MustParse("1"), v1alpha1.TunDeviceResource: resource.MustParse("1"),
			},
		}
		if !equality.Semantic.DeepEqual(c.Resources, wantRes) {
			t.Errorf("resources = %+v\nwant %+v", c.Resources, wantRes)
		}
		if pod.Status.QOSClass != corev1.PodQOSGuaranteed {
			t.Errorf("QoS class = %s, want Guaranteed (requests = limits)", pod.Status.QOSClass)
		}

		if want := map[string]string{"zone": "a", "kubevisor.io/kvm": "true"}; !equality.Semantic.DeepEqual(pod.Spec.NodeSelector, want) {
			t.Errorf("nodeSelector = %v, want %v", pod.Spec.NodeSelector, want)
		}
		wantTerms := []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: "rack", Operator: corev1.NodeSelectorOpIn, Values: []string{"r1", "r2"}},
			{Key: v1alpha1.DriverHealthLabel("hypervisor", "qmp"), Operator: corev1.NodeSelectorOpIn, Values: []string{v1alpha1.DriverHealthy, v1alpha1.DriverDegraded}},
		}}}
		if terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms; !equality.Semantic.DeepEqual(terms, wantTerms) {
			t.Errorf("required node terms = %+v\nwant %+v", terms, wantTerms)
		}
		for _, key := range []string{"maintenance", "dedicated"} {
			if !slices.ContainsFunc(pod.Spec.Tolerations, func(tol corev1.Toleration) bool { return tol.Key == key }) {
				t.Errorf("tolerations %+v lack %s", pod.Spec.Tolerations, key)
			}
		}

		dir := "/var/lib/kubevisor-test/vmi/" + string(got.UID)
		wantArgs := []string{"--dir", dir + "/launcher", "--vmi", ns + "/web", "--grace-period", "60s"}
		if c.Image != testImage || !slices.Equal(c.Command, []string{"kubevisor-launcher"}) || !slices.Equal(c.Args, wantArgs) {
			t.Errorf("container image %s command %v args %v; want %s [kubevisor-launcher] %v", c.Image, c.Command, c.Args, testImage, wantArgs)
		}
		if g := ptr.Deref(pod.Spec.TerminationGracePeriodSeconds, 0); g != 75 {
			t.Errorf("pod terminationGracePeriodSeconds = %d, want 75", g)
		}
		volumes := map[string]corev1.Volume{}
		for _, v := range pod.Spec.Volumes {
			volumes[v.Name] = v
		}
		if v := volumes[launcherpod.VMIDirVolumeName]; v.EmptyDir == nil {
			t.Errorf("per-VMI directory volume = %+v, want an emptyDir (the handler binds it at %s)", v, dir)
		}
		if m := c.VolumeMounts[0]; m.Name != launcherpod.VMIDirVolumeName || m.MountPath != dir {
			t.Errorf("compute's first mount = %+v, want %s at %s", m, launcherpod.VMIDirVolumeName, dir)
		}
		if v := volumes["data"]; v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != "web-data" {
			t.Errorf("claim volume = %+v, want claim web-data", v)
		}
		if v := volumes["scratch"]; v.HostPath == nil || v.HostPath.Path != "/srv/disks" {
			t.Errorf("host disk volume = %+v, want hostPath /srv/disks", v)
		}
		if _, ok := volumes["root"]; ok {
			t.Error("a containerDisk became a pod volume; the node's storage driver prepares it")
		}
		mounts := map[string]string{}
		for _, m := range c.VolumeMounts {
			mounts[m.Name] = m.MountPath
		}
		if mounts[launcherpod.VMIDirVolumeName] != dir || mounts["data"] != launcherpod.DiskMountDir+"/data" || mounts["scratch"] != "/srv/disks" {
			t.Errorf("mounts = %v", mounts)
		}
		sc := c.SecurityContext
		if sc == nil || ptr.Deref(sc.Privileged, true) || ptr.Deref(sc.AllowPrivilegeEscalation, true) ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
			t.Errorf("container security context = %+v, want unprivileged with every capability dropped", sc)
		}
		if pod.Spec.HostNetwork || pod.Spec.HostPID || pod.Spec.HostIPC {
			t.Error("launcher pod shares a host namespace")
		}
	})

	t.Run("unusable inputs: Pending with FailedCreate naming the conflict", func(t *testing.T) {
		ns := h.namespace(t, "conflict")
		h.createClass(t, "zoned", false, func(c *v1alpha1.HypervisorClass) {
			c.Scheduling = &v1alpha1.HypervisorClassScheduling{NodeSelector: map[string]string{"zone": "b"}}
		})
		vmi := h.createVMI(t, ns, "vm", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.HypervisorClassName = "zoned"
			v.Spec.NodeSelector = map[string]string{"zone": "a"}
		})
		h.waitVMI(t, vmi, "Pending with FailedCreate", func(v *v1alpha1.VirtualMachineInstance) bool {
			c := condition(v.Status, v1alpha1.VirtualMachineInstanceLauncherPodCreated)
			return v.Status.Phase == v1alpha1.Pending && c != nil && c.Reason == v1alpha1.ReasonFailedCreate &&
				strings.Contains(c.Message, `node selector zone: the VMI wants "a" and HypervisorClass zoned wants "b"`)
		})
		h.expectEvent(t, vmi, corev1.EventTypeWarning, v1alpha1.ReasonFailedCreate)
		h.expectNoPods(t, vmi)
	})

	t.Run("priorityClassName: missing class refused with its name in the status, then the pod gets its priority", func(t *testing.T) {
		ns := h.namespace(t, "priority")
		vmi := h.createVMI(t, ns, "vm", h.plainClass(t), func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.PriorityClassName = "vm-priority-test"
		})
		h.waitVMI(t, vmi, "Pending with FailedCreate naming the PriorityClass", func(v *v1alpha1.VirtualMachineInstance) bool {
			c := condition(v.Status, v1alpha1.VirtualMachineInstanceLauncherPodCreated)
			return v.Status.Phase == v1alpha1.Pending && c != nil && c.Reason == v1alpha1.ReasonFailedCreate &&
				strings.Contains(c.Message, "vm-priority-test")
		})
		h.expectNoPods(t, vmi)
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "vm-priority-test"}, Value: 4242}
		if err := h.c.Create(context.Background(), pc); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.c.Delete(context.Background(), pc) })
		got := h.waitVMI(t, vmi, "Scheduling once the class exists", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.Phase == v1alpha1.Scheduling
		})
		pod := h.launcherPod(t, got)
		if pod.Spec.PriorityClassName != "vm-priority-test" || pod.Spec.Priority == nil || *pod.Spec.Priority != 4242 {
			t.Errorf("launcher pod priorityClassName %q priority %v, want vm-priority-test 4242", pod.Spec.PriorityClassName, pod.Spec.Priority)
		}
	})

	t.Run("unschedulable, then scheduled: condition, nodeName, label, Scheduled", func(t *testing.T) {
		ns := h.namespace(t, "schedule")
		vmi := h.createVMI(t, ns, "vm", h.plainClass(t))
		got := h.waitVMI(t, vmi, "Scheduling", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Scheduling })
		pod := h.launcherPod(t, got)

		msg := "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
		h.setPodStatus(t, pod, func(s *corev1.PodStatus) {
			s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: msg}}
		})
		h.waitVMI(t, vmi, "PodScheduled=False Unschedulable", func(v *v1alpha1.VirtualMachineInstance) bool {
			c := condition(v.Status, podScheduledCondition)
			return c != nil && c.Status == corev1.ConditionFalse && c.Reason == v1alpha1.ReasonUnschedulable && c.Message == msg
		})

		h.bind(t, pod, "node-1")
		got = h.waitVMI(t, vmi, "the node's label", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Labels[v1alpha1.NodeNameLabel] == "node-1"
		})
		if got.Status.Phase != v1alpha1.Scheduling || got.Status.NodeName != "" {
			t.Errorf("phase %s, nodeName %q once bound but not running, want Scheduling and none yet (set with Scheduled)", got.Status.Phase, got.Status.NodeName)
		}
		// The kubelet's part: the pod is scheduled and its container started.
		h.setPodStatus(t, pod, func(s *corev1.PodStatus) {
			s.Phase = corev1.PodRunning
			s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
		})
		got = h.waitVMI(t, vmi, "Scheduled", func(v *v1alpha1.VirtualMachineInstance) bool {
			c := condition(v.Status, podScheduledCondition)
			return v.Status.Phase == v1alpha1.Scheduled && c != nil && c.Status == corev1.ConditionTrue && v.Status.NodeName == "node-1"
		})
		phases := make([]v1alpha1.VirtualMachineInstancePhase, 0, len(got.Status.PhaseTransitionTimestamps))
		for _, p := range got.Status.PhaseTransitionTimestamps {
			phases = append(phases, p.Phase)
		}
		if want := []v1alpha1.VirtualMachineInstancePhase{v1alpha1.Pending, v1alpha1.Scheduling, v1alpha1.Scheduled}; !slices.Equal(phases, want) {
			t.Errorf("phase transitions %v, want %v", phases, want)
		}
	})

	t.Run("claims: none, no pod and FailedPvcNotFound naming it; Pending, the pod and WaitingForVolumeBinding; Bound, neither", func(t *testing.T) {
		ns := h.namespace(t, "claims")
		vmi := h.createVMI(t, ns, "vm", h.plainClass(t), func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "data"}}
			v.Spec.Volumes = []v1alpha1.Volume{{Name: "data", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
				PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-claim"}}}}}
		})
		h.waitVMI(t, vmi, "Pending with FailedPvcNotFound naming the claim", func(v *v1alpha1.VirtualMachineInstance) bool {
			c := condition(v.Status, v1alpha1.VirtualMachineInstanceLauncherPodCreated)
			r := condition(v.Status, v1alpha1.VirtualMachineInstanceReady)
			return v.Status.Phase == v1alpha1.Pending && c != nil && c.Status == corev1.ConditionFalse && c.Reason == v1alpha1.ReasonFailedPvcNotFound &&
				strings.Contains(c.Message, "PersistentVolumeClaim claims/data-claim (volume data) does not exist") &&
				r != nil && r.Reason == v1alpha1.ReasonFailedPvcNotFound
		})
		h.expectNoPods(t, vmi)
		h.expectEvent(t, vmi, corev1.EventTypeWarning, v1alpha1.ReasonFailedPvcNotFound)

		// No PersistentVolume controller runs: the claim stays unbound until the test binds it.
		pvc := h.createClaim(t, ns, "data-claim")
		got := h.waitVMI(t, vmi, "Scheduling with WaitingForVolumeBinding naming the claim", func(v *v1alpha1.VirtualMachineInstance) bool {
			r := condition(v.Status, v1alpha1.VirtualMachineInstanceReady)
			return v.Status.Phase == v1alpha1.Scheduling && r != nil && r.Status == corev1.ConditionFalse &&
				r.Reason == v1alpha1.ReasonWaitingForVolumeBinding &&
				strings.Contains(r.Message, "PersistentVolumeClaim claims/data-claim (volume data) is not bound to a volume yet")
		})
		if c := condition(got.Status, v1alpha1.VirtualMachineInstanceLauncherPodCreated); c != nil {
			t.Errorf("LauncherPodCreated left once the claim exists: %+v", c)
		}
		h.launcherPod(t, got)

		pvc.Status.Phase = corev1.ClaimBound
		pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("3Gi")}
		pvc.Status.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
		if err := h.c.Status().Update(ctx, pvc); err != nil {
			t.Fatalf("bind the claim: %v", err)
		}
		h.waitVMI(t, vmi, "Ready=False GuestNotRunning once the claim is bound, volumeStatus with its size", func(v *v1alpha1.VirtualMachineInstance) bool {
			r := condition(v.Status, v1alpha1.VirtualMachineInstanceReady)
			if r == nil || r.Reason != v1alpha1.ReasonGuestNotRunning || len(v.Status.VolumeStatus) != 1 {
				return false
			}
			info := v.Status.VolumeStatus[0].PersistentVolumeClaimInfo
			c := info.Capacity[corev1.ResourceStorage]
			return v.Status.VolumeStatus[0].Name == "data" && info != nil && info.ClaimName == "data-claim" &&
				c.Cmp(resource.MustParse("3Gi")) == 0 && info.FilesystemOverhead == v1alpha1.DefaultFilesystemOverhead
		})
	})

	t.Run("LiveMigratable: False with InterfaceNotLiveMigratable naming a bridge interface on the pod network, True with masquerade", func(t *testing.T) {
		ns := h.namespace(t, "migratable")
		onPodNetwork := func(binding v1alpha1.InterfaceBindingMethod) func(*v1alpha1.VirtualMachineInstance) {
			return func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Networks = []v1alpha1.Network{{Name: "default", NetworkSource: v1alpha1.NetworkSource{Pod: &v1alpha1.PodNetwork{}}}}
				v.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", InterfaceBindingMethod: binding}}
			}
		}
		bridged := h.createVMI(t, ns, "bridged", h.plainClass(t), onPodNetwork(v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}))
		got := h.waitVMI(t, bridged, "LiveMigratable=False", func(v *v1alpha1.VirtualMachineInstance) bool {
			return condition(v.Status, v1alpha1.VirtualMachineInstanceIsMigratable) != nil
		})
		c := condition(got.Status, v1alpha1.VirtualMachineInstanceIsMigratable)
		if c.Status != corev1.ConditionFalse || c.Reason != v1alpha1.ReasonInterfaceNotLiveMigratable ||
			!strings.Contains(c.Message, "interface default: bridge binding on the pod network") || c.ObservedGeneration != got.Generation {
			t.Errorf("LiveMigratable = %+v, want False InterfaceNotLiveMigratable naming interface default, at generation %d", c, got.Generation)
		}
		if !slices.ContainsFunc(got.ManagedFields, func(m metav1.ManagedFieldsEntry) bool {
			return m.Manager == v1alpha1.VMIControllerFieldManager && m.Subresource == "status" &&
				m.FieldsV1 != nil && strings.Contains(m.FieldsV1.GetRawString(), `k:{\"type\":\"LiveMigratable\"}`)
		}) {
			t.Errorf("managed fields %+v: want LiveMigratable applied by %s", got.ManagedFields, v1alpha1.VMIControllerFieldManager)
		}

		masq := h.createVMI(t, ns, "masquerade", h.plainClass(t), onPodNetwork(v1alpha1.InterfaceBindingMethod{Masquerade: &v1alpha1.InterfaceMasquerade{}}))
		h.waitVMI(t, masq, "LiveMigratable=True", func(v *v1alpha1.VirtualMachineInstance) bool {
			c := condition(v.Status, v1alpha1.VirtualMachineInstanceIsMigratable)
			return c != nil && c.Status == corev1.ConditionTrue && c.Reason == ""
		})
	})

	t.Run("LiveMigratable follows the node's live-migration label of the VMI's driver: False with DriverNotLiveMigratable, True again", func(t *testing.T) {
		ns := h.namespace(t, "driver-migrates")
		label := v1alpha1.DriverMigrationLabel("qmp")
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-no-migration", Labels: map[string]string{label: "false"}}}
		if err := h.c.Create(ctx, node); err != nil {
			t.Fatalf("create node: %v", err)
		}
		t.Cleanup(func() { _ = h.c.Delete(context.Background(), node) })
		vmi := h.createVMI(t, ns, "vm", h.plainClass(t))
		got := h.waitVMI(t, vmi, "Scheduling", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Scheduling })
		pod := h.launcherPod(t, got)
		h.bind(t, pod, node.Name)
		h.setPodStatus(t, pod, func(s *corev1.PodStatus) {
			s.Phase = corev1.PodRunning
			s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
		})
		got = h.waitVMI(t, vmi, "LiveMigratable=False DriverNotLiveMigratable", func(v *v1alpha1.VirtualMachineInstance) bool {
			c := condition(v.Status, v1alpha1.VirtualMachineInstanceIsMigratable)
			return v.Status.NodeName == node.Name && c != nil && c.Status == corev1.ConditionFalse && c.Reason == v1alpha1.ReasonDriverNotLiveMigratable
		})
		if c := condition(got.Status, v1alpha1.VirtualMachineInstanceIsMigratable); !strings.Contains(c.Message, "hypervisor driver qmp does not declare live migration on node node-no-migration") {
			t.Errorf("LiveMigratable message %q", c.Message)
		}
		// The node's handler loads a driver that migrates: the label's change alone brings the
		// VMI back.
		patch := client.MergeFrom(node.DeepCopy())
		node.Labels[label] = "true"
		if err := h.c.Patch(ctx, node, patch); err != nil {
			t.Fatal(err)
		}
		h.waitVMI(t, vmi, "LiveMigratable=True", func(v *v1alpha1.VirtualMachineInstance) bool {
			c := condition(v.Status, v1alpha1.VirtualMachineInstanceIsMigratable)
			return c != nil && c.Status == corev1.ConditionTrue
		})
	})

	t.Run("persistent TPM: the VM's state claim created, owned by the VM, mounted by the launcher pod, and kept for its next VMI", func(t *testing.T) {
		ns := h.namespace(t, "state")
		class := h.plainClass(t)
		owner := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"}}
		owner.Spec.Template = &v1alpha1.VirtualMachineInstanceTemplateSpec{}
		owner.Spec.Template.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Persistent: ptr.To(true)}
		owner.Spec.RunStrategy = ptr.To(v1alpha1.RunStrategyHalted)
		if err := h.c.Create(ctx, owner); err != nil {
			t.Fatalf("create VM: %v", err)
		}
		ofVM := func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Persistent: ptr.To(true)}
			v.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachine",
				Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}
		}
		vmi := h.createVMI(t, ns, "db", class, ofVM)
		got := h.waitVMI(t, vmi, "Scheduling", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.LauncherPodName != "" })
		claim := &corev1.PersistentVolumeClaim{}
		if err := h.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "persistent-state-for-db"}, claim); err != nil {
			t.Fatalf("state claim: %v", err)
		}
		if len(claim.OwnerReferences) != 1 || claim.OwnerReferences[0].UID != owner.UID {
			t.Errorf("state claim owners %+v, want the VM %s", claim.OwnerReferences, owner.UID)
		}
		pod := h.launcherPod(t, got)
		found := false
		for _, v := range pod.Spec.Volumes {
			found = found || (v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim.Name)
		}
		if !found {
			t.Errorf("launcher pod volumes %+v: no state claim", pod.Spec.Volumes)
		}
		h.expectEvent(t, vmi, corev1.EventTypeNormal, v1alpha1.ReasonSuccessfulCreate)
		// The next VMI of the VM finds the same claim (its data is what persists).
		if err := h.c.Delete(ctx, vmi); err != nil {
			t.Fatal(err)
		}
		next := h.createVMI(t, ns, "db-2", class, ofVM)
		h.waitVMI(t, next, "Scheduling", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.LauncherPodName != "" })
		again := &corev1.PersistentVolumeClaim{}
		if err := h.c.Get(ctx, client.ObjectKeyFromObject(claim), again); err != nil || again.UID != claim.UID {
			t.Errorf("state claim after the next VMI: %v (uid %s, want %s)", err, again.UID, claim.UID)
		}
	})

	t.Run("containerDisk image cannot be pulled: Ready=False ErrImagePull, then ImagePullBackOff, naming the volume and the image", func(t *testing.T) {
		ns := h.namespace(t, "image-pull")
		const image = "registry.invalid/kubevisor/no-such-disk:v1"
		vmi := h.createVMI(t, ns, "vm", h.plainClass(t), func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root"}}
			v.Spec.Volumes = []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: image}}}}
		})
		got := h.waitVMI(t, vmi, "Scheduling", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Scheduling })
		pod := h.launcherPod(t, got)
		h.bind(t, pod, "node-1")
		for _, reason := range []string{v1alpha1.ReasonErrImagePull, v1alpha1.ReasonImagePullBackOff} {
			h.setPodStatus(t, pod, func(s *corev1.PodStatus) {
				s.ContainerStatuses = []corev1.ContainerStatus{{Name: launcherpod.ContainerDiskContainer("root"), Image: image,
					State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "failed to pull image: not found"}}}}
			})
			h.waitVMI(t, vmi, "Ready=False "+reason+" naming the volume and the image", func(v *v1alpha1.VirtualMachineInstance) bool {
				r := condition(v.Status, v1alpha1.VirtualMachineInstanceReady)
				return v.Status.Phase == v1alpha1.Scheduling && r != nil && r.Status == corev1.ConditionFalse && r.Reason == reason &&
					strings.Contains(r.Message, "containerDisk volume root, image "+image)
			})
		}
	})

	t.Run("pod deleted: VMI Failed, PodNotExists naming the pod", func(t *testing.T) {
		ns := h.namespace(t, "pod-deleted")
		vmi := h.createVMI(t, ns, "vm", h.plainClass(t))
		got := h.waitVMI(t, vmi, "Scheduling", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Scheduling })
		pod := h.launcherPod(t, got)
		h.bind(t, pod, "node-1")
		h.setPodStatus(t, pod, func(s *corev1.PodStatus) { s.Phase = corev1.PodRunning })
		h.waitVMI(t, vmi, "Scheduled", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Scheduled })

		h.forceDelete(t, pod)
		got = h.waitVMI(t, vmi, "Failed", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Failed })
		if got.Status.Reason != v1alpha1.ReasonPodNotExists {
			t.Errorf("reason = %q, want %s", got.Status.Reason, v1alpha1.ReasonPodNotExists)
		}
		if c := condition(got.Status, v1alpha1.VirtualMachineInstanceReady); c == nil || c.Reason != v1alpha1.ReasonPodNotExists || !strings.Contains(c.Message, pod.Name) {
			t.Errorf("Ready condition = %+v, want PodNotExists naming %s", c, pod.Name)
		}
		h.expectEvent(t, vmi, corev1.EventTypeWarning, v1alpha1.ReasonPodNotExists)
		// No second pod: a Failed VMI is final.
		h.expectNoPods(t, vmi)
	})

	t.Run("pod failed: VMI Failed, PodFailed, the pod deleted", func(t *testing.T) {
		ns := h.namespace(t, "pod-failed")
		vmi := h.createVMI(t, ns, "vm", h.plainClass(t))
		got := h.waitVMI(t, vmi, "Scheduling", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Scheduling })
		pod := h.launcherPod(t, got)
		h.bind(t, pod, "node-1")
		h.setPodStatus(t, pod, func(s *corev1.PodStatus) { s.Phase = corev1.PodRunning })
		h.waitVMI(t, vmi, "Scheduled", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Scheduled })
		h.setPodStatus(t, pod, func(s *corev1.PodStatus) {
			s.Phase = corev1.PodFailed
			s.ContainerStatuses = []corev1.ContainerStatus{{
				Name: layout.ComputeContainer, Image: testImage, ImageID: "sha256:0",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}},
			}}
		})
		got = h.waitVMI(t, vmi, "Failed", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Failed })
		c := condition(got.Status, v1alpha1.VirtualMachineInstanceReady)
		if got.Status.Reason != v1alpha1.ReasonPodFailed || c == nil || !strings.Contains(c.Message, pod.Name+" failed: container compute exited with code 1") {
			t.Errorf("reason %q, Ready %+v; want PodFailed naming the pod and its exit", got.Status.Reason, c)
		}
		h.expectEvent(t, vmi, corev1.EventTypeWarning, v1alpha1.ReasonPodFailed)
		// A final VMI's pod is deleted to free the node (the API server removes a pod in a
		// terminal phase at once).
		h.wait(t, "the failed pod deleted", func() bool {
			var p corev1.Pod
			err := h.c.Get(ctx, client.ObjectKeyFromObject(pod), &p)
			return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
		})
		h.expectEvent(t, vmi, corev1.EventTypeNormal, v1alpha1.ReasonSuccessfulDelete)
	})

	t.Run("the node handler's lifecycle stays its own until the pod goes, then the controller ends the VMI", func(t *testing.T) {
		ns := h.namespace(t, "ownership")
		vmi := h.createVMI(t, ns, "vm", h.plainClass(t))
		got := h.waitVMI(t, vmi, "Scheduling", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Scheduling })
		pod := h.launcherPod(t, got)
		h.bind(t, pod, "node-1")
		h.setPodStatus(t, pod, func(s *corev1.PodStatus) { s.Phase = corev1.PodRunning })
		got = h.waitVMI(t, vmi, "Scheduled", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Scheduled })
		if c := condition(got.Status, v1alpha1.VirtualMachineInstanceReady); c != nil {
			t.Errorf("Ready %+v at Scheduled, want it left to the handler", c)
		}

		// The node handler's first write takes the lifecycle over, as its writeStatus does.
		handler := v1alpha1.HandlerFieldManager("node-1")
		now := metav1.NewTime(time.Now().Truncate(time.Second))
		running := v1alpha1.VirtualMachineInstanceStatus{
			Phase:                     v1alpha1.Running,
			PhaseTransitionTimestamps: append(got.Status.PhaseTransitionTimestamps, v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{Phase: v1alpha1.Running, PhaseTransitionTimestamp: now}),
			Conditions:                []v1alpha1.VirtualMachineInstanceCondition{{Type: v1alpha1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue, LastTransitionTime: now}},
			Interfaces:                []v1alpha1.VirtualMachineInstanceNetworkInterface{{Name: "default", IP: "10.244.0.5"}},
		}
		h.applyAs(t, got, handler, running)
		// A pod change brings the VMI back to the controller, which leaves all that alone.
		h.setPodStatus(t, pod, func(s *corev1.PodStatus) {
			s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
		})
		got = h.waitVMI(t, vmi, "PodScheduled from the pod", func(v *v1alpha1.VirtualMachineInstance) bool {
			c := condition(v.Status, podScheduledCondition)
			return c != nil && c.Status == corev1.ConditionTrue
		})
		for range 5 {
			if c := condition(got.Status, v1alpha1.VirtualMachineInstanceReady); got.Status.Phase != v1alpha1.Running || c == nil || c.Status != corev1.ConditionTrue ||
				len(got.Status.Interfaces) != 1 || got.Status.HypervisorClassName != "plain" || got.Status.LauncherPodName != pod.Name {
				t.Fatalf("status %+v: want the handler's Running and Ready, and the controller's fields", got.Status)
			}
			if !v1alpha1.HoldsLifecycle(got, handler) || v1alpha1.SharesLifecycle(got, v1alpha1.VMIControllerFieldManager) {
				t.Fatalf("managed fields %+v: want the lifecycle the handler's alone", got.ManagedFields)
			}
			time.Sleep(100 * time.Millisecond)
			got = h.waitVMI(t, vmi, "readable", func(*v1alpha1.VirtualMachineInstance) bool { return true })
		}

		// The pod goes with no handler left to say so: the controller takes the lifecycle back
		// to end the VMI.
		h.forceDelete(t, pod)
		got = h.waitVMI(t, vmi, "Failed", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Failed })
		if c := condition(got.Status, v1alpha1.VirtualMachineInstanceReady); got.Status.Reason != v1alpha1.ReasonPodNotExists || c == nil ||
			c.Status != corev1.ConditionFalse || c.Reason != v1alpha1.ReasonPodNotExists || len(got.Status.Interfaces) != 1 {
			t.Errorf("status %+v: want Failed PodNotExists, Ready=False PodNotExists, the handler's interfaces kept", got.Status)
		}
		if !v1alpha1.HoldsLifecycle(got, v1alpha1.VMIControllerFieldManager) {
			t.Errorf("managed fields %+v: want the phase the controller's", got.ManagedFields)
		}
		// A late write of the handler's Running is refused: a final phase does not move.
		if err := h.tryApplyAs(got, handler, true, running); !apierrors.IsInvalid(err) {
			t.Errorf("the handler forcing Running on a Failed VMI: %v, want it refused as invalid", err)
		}
		if err := h.tryApplyAs(got, handler, false, running); !v1alpha1.IsFieldConflict(err) {
			t.Errorf("the handler writing Running on a Failed VMI: %v, want a field conflict", err)
		}
		if got := h.waitVMI(t, vmi, "readable", func(*v1alpha1.VirtualMachineInstance) bool { return true }); got.Status.Phase != v1alpha1.Failed {
			t.Errorf("phase %s, want Failed", got.Status.Phase)
		}
	})

	t.Run("a completed migration moves the VMI to the target pod and node, and deletes the source pod", func(t *testing.T) {
		ns := h.namespace(t, "migrated")
		vmi := h.createVMI(t, ns, "vm", h.plainClass(t))
		got := h.waitVMI(t, vmi, "Scheduling", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Scheduling })
		source := h.launcherPod(t, got)
		h.bind(t, source, "node-1")
		h.setPodStatus(t, source, func(s *corev1.PodStatus) { s.Phase = corev1.PodRunning })
		got = h.waitVMI(t, vmi, "Scheduled", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Scheduled })
		h.applyAs(t, got, v1alpha1.HandlerFieldManager("node-1"), v1alpha1.VirtualMachineInstanceStatus{
			Phase: v1alpha1.Running, PhaseTransitionTimestamps: got.Status.PhaseTransitionTimestamps,
		})
		// The migration controller's target pod, running on node-2.
		target := source.DeepCopy()
		target.ObjectMeta = metav1.ObjectMeta{Name: "vm-target", Namespace: ns, Labels: map[string]string{}, OwnerReferences: source.OwnerReferences}
		for k, v := range source.Labels {
			target.Labels[k] = v
		}
		target.Labels[v1alpha1.MigrationUIDLabel] = "mig-1"
		target.Spec.NodeName = ""
		target.Status = corev1.PodStatus{}
		if err := h.c.Create(ctx, target); err != nil {
			t.Fatal(err)
		}
		h.bind(t, target, "node-2")
		h.setPodStatus(t, target, func(s *corev1.PodStatus) { s.Phase = corev1.PodRunning })
		got = h.waitVMI(t, vmi, "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })
		if got.Status.LauncherPodName != source.Name || got.Status.NodeName != "node-1" {
			t.Fatalf("before the migration completes: pod %s on %s, want %s on node-1", got.Status.LauncherPodName, got.Status.NodeName, source.Name)
		}
		// The node side reports the migration completed.
		h.applyAs(t, got, v1alpha1.MigrationControllerFieldManager, v1alpha1.VirtualMachineInstanceStatus{MigrationState: &v1alpha1.VirtualMachineInstanceMigrationState{
			MigrationUID: "mig-1", SourceNode: "node-1", SourcePod: source.Name, TargetNode: "node-2", TargetPod: target.Name, Completed: true,
		}})
		got = h.waitVMI(t, vmi, "on the target", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.LauncherPodName == target.Name && v.Status.NodeName == "node-2" && v.Labels[v1alpha1.NodeNameLabel] == "node-2"
		})
		if got.Status.Phase != v1alpha1.Running {
			t.Errorf("phase %s after the migration, want Running", got.Status.Phase)
		}
		h.wait(t, "the source pod deleted", func() bool {
			var p corev1.Pod
			err := h.c.Get(ctx, client.ObjectKeyFromObject(source), &p)
			return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
		})
		var tp corev1.Pod
		if err := h.c.Get(ctx, client.ObjectKeyFromObject(target), &tp); err != nil || tp.DeletionTimestamp != nil {
			t.Errorf("target pod: %v, deletion %v; want it kept", err, tp.DeletionTimestamp)
		}
		h.expectEvent(t, vmi, corev1.EventTypeNormal, v1alpha1.ReasonMigrated)
	})

	t.Run("VMI deleted: pod deleted, finalizer held until the pod is gone", func(t *testing.T) {
		ns := h.namespace(t, "delete")
		vmi := h.createVMI(t, ns, "vm", h.plainClass(t))
		got := h.waitVMI(t, vmi, "Scheduling", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Scheduling })
		pod := h.launcherPod(t, got)
		// Bound, so that the API server deletes it gracefully and waits for the (absent) kubelet.
		h.bind(t, pod, "node-1")
		h.setPodStatus(t, pod, func(s *corev1.PodStatus) { s.Phase = corev1.PodRunning })
		h.waitVMI(t, vmi, "Scheduled", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Scheduled })

		if err := h.c.Delete(ctx, vmi); err != nil {
			t.Fatal(err)
		}
		h.wait(t, "the pod deleting", func() bool {
			var p corev1.Pod
			return h.c.Get(ctx, client.ObjectKeyFromObject(pod), &p) == nil && p.DeletionTimestamp != nil
		})
		// The pod is still terminating: the VMI must still be there, with its finalizer.
		time.Sleep(500 * time.Millisecond)
		var still v1alpha1.VirtualMachineInstance
		if err := h.c.Get(ctx, client.ObjectKeyFromObject(vmi), &still); err != nil {
			t.Fatalf("VMI gone while its pod terminates: %v", err)
		}
		if !slices.Contains(still.Finalizers, v1alpha1.TeardownFinalizer) || still.DeletionTimestamp == nil {
			t.Errorf("VMI while its pod terminates: finalizers %v deletionTimestamp %v", still.Finalizers, still.DeletionTimestamp)
		}
		h.expectEvent(t, vmi, corev1.EventTypeNormal, v1alpha1.ReasonSuccessfulDelete)

		h.forceDelete(t, pod) // the kubelet's part
		h.wait(t, "the VMI gone", func() bool {
			return apierrors.IsNotFound(h.c.Get(ctx, client.ObjectKeyFromObject(vmi), &v1alpha1.VirtualMachineInstance{}))
		})
	})

	t.Run("VMI deleted before its pod was bound", func(t *testing.T) {
		ns := h.namespace(t, "delete-unbound")
		vmi := h.createVMI(t, ns, "vm", h.plainClass(t))
		h.waitVMI(t, vmi, "Scheduling", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Scheduling })
		if err := h.c.Delete(ctx, vmi); err != nil {
			t.Fatal(err)
		}
		h.wait(t, "the VMI gone", func() bool {
			return apierrors.IsNotFound(h.c.Get(ctx, client.ObjectKeyFromObject(vmi), &v1alpha1.VirtualMachineInstance{}))
		})
		h.expectNoPods(t, vmi)
	})
}

type harness struct {
	c client.Client
}

func (h *harness) wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", waitTimeout, what)
		}
		time.Sleep(poll)
	}
}

func (h *harness) namespace(t *testing.T, name string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := h.c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return name
}

func (h *harness) createClass(t *testing.T, name string, isDefault bool, mut func(*v1alpha1.HypervisorClass)) *v1alpha1.HypervisorClass {
	t.Helper()
	c := &v1alpha1.HypervisorClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Driver: "qmp"}
	if isDefault {
		c.Annotations = map[string]string{v1alpha1.IsDefaultHypervisorClassAnnotation: "true"}
	}
	if mut != nil {
		mut(c)
	}
	if err := h.c.Create(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	return c
}

// plainClass makes sure the class "plain" exists and returns a change that names it, so that a
// subtest does not depend on the default class an earlier one made.
func (h *harness) plainClass(t *testing.T) func(*v1alpha1.VirtualMachineInstance) {
	t.Helper()
	c := &v1alpha1.HypervisorClass{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Driver: "qmp"}
	if err := h.c.Create(context.Background(), c); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return func(v *v1alpha1.VirtualMachineInstance) { v.Spec.HypervisorClassName = "plain" }
}

// createClaim creates a PersistentVolumeClaim of 1Gi; nothing binds it (no PersistentVolume
// controller runs).
func (h *harness) createClaim(t *testing.T, ns, name string) *corev1.PersistentVolumeClaim {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if err := h.c.Create(context.Background(), pvc); err != nil {
		t.Fatal(err)
	}
	return pvc
}

func (h *harness) createVMI(t *testing.T, ns, name string, mut ...func(*v1alpha1.VirtualMachineInstance)) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	vmi.Spec.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("1Gi"))}
	for _, m := range mut {
		m(vmi)
	}
	if err := h.c.Create(context.Background(), vmi); err != nil {
		t.Fatal(err)
	}
	return vmi
}

func (h *harness) waitVMI(t *testing.T, vmi *v1alpha1.VirtualMachineInstance, what string, cond func(*v1alpha1.VirtualMachineInstance) bool) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	got := &v1alpha1.VirtualMachineInstance{}
	deadline := time.Now().Add(waitTimeout)
	for {
		err := h.c.Get(context.Background(), client.ObjectKeyFromObject(vmi), got)
		if err == nil && cond(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for VMI %s/%s: %s (err %v); status %+v", vmi.Namespace, vmi.Name, what, err, got.Status)
		}
		time.Sleep(poll)
	}
}

func (h *harness) pods(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) []corev1.Pod {
	t.Helper()
	var list corev1.PodList
	if err := h.c.List(context.Background(), &list, client.InNamespace(vmi.Namespace)); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// launcherPod returns the one pod in the VMI's namespace and checks that the status names it.
func (h *harness) launcherPod(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) *corev1.Pod {
	t.Helper()
	pods := h.pods(t, vmi)
	if len(pods) != 1 {
		t.Fatalf("%d pods in %s, want 1", len(pods), vmi.Namespace)
	}
	if pods[0].Name != vmi.Status.LauncherPodName {
		t.Errorf("pod %s, VMI status.launcherPodName %s", pods[0].Name, vmi.Status.LauncherPodName)
	}
	return &pods[0]
}

// expectNoPods checks, for a while, that no pod appears in the VMI's namespace.
func (h *harness) expectNoPods(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) {
	t.Helper()
	for range 5 {
		if pods := h.pods(t, vmi); len(pods) > 0 {
			t.Fatalf("pod %s exists, want none", pods[0].Name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// setPodStatus changes the pod's status as the scheduler or the kubelet would.
func (h *harness) setPodStatus(t *testing.T, pod *corev1.Pod, mut func(*corev1.PodStatus)) {
	t.Helper()
	ctx := context.Background()
	for {
		var p corev1.Pod
		if err := h.c.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
			t.Fatal(err)
		}
		mut(&p.Status)
		err := h.c.Status().Update(ctx, &p)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			t.Fatalf("update pod status: %v", err)
		}
		return
	}
}

// bind assigns the pod to a node as the scheduler does.
func (h *harness) bind(t *testing.T, pod *corev1.Pod, node string) {
	t.Helper()
	b := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	if err := h.c.SubResource("binding").Create(context.Background(), pod, b); err != nil {
		t.Fatalf("bind pod %s to %s: %v", pod.Name, node, err)
	}
}

// applyAs writes st as the VMI's status under manager, taking over what it sets, as a writer
// other than the VMI controller would.
func (h *harness) applyAs(t *testing.T, vmi *v1alpha1.VirtualMachineInstance, manager string, st v1alpha1.VirtualMachineInstanceStatus) {
	t.Helper()
	if err := h.tryApplyAs(vmi, manager, true, st); err != nil {
		t.Fatalf("apply VMI status as %s: %v", manager, err)
	}
}

func (h *harness) tryApplyAs(vmi *v1alpha1.VirtualMachineInstance, manager string, force bool, st v1alpha1.VirtualMachineInstanceStatus) error {
	body, err := v1alpha1.StatusApply(vmi, &st, "")
	if err != nil {
		return err
	}
	opts := []client.SubResourceApplyOption{client.FieldOwner(manager)}
	if force {
		opts = append(opts, client.ForceOwnership)
	}
	return h.c.Status().Apply(context.Background(), client.ApplyConfigurationFromUnstructured(body), opts...)
}

// forceDelete removes a pod at once, as the kubelet does once its containers are gone.
func (h *harness) forceDelete(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if err := h.c.Delete(context.Background(), pod, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	h.wait(t, "pod "+pod.Name+" gone", func() bool {
		return apierrors.IsNotFound(h.c.Get(context.Background(), client.ObjectKeyFromObject(pod), &corev1.Pod{}))
	})
}

// expectEvent waits for an event about the VMI with the type and reason.
func (h *harness) expectEvent(t *testing.T, vmi *v1alpha1.VirtualMachineInstance, typ, reason string) {
	t.Helper()
	h.wait(t, fmt.Sprintf("a %s event %s about VMI %s", typ, reason, vmi.Name), func() bool {
		var list eventsv1.EventList
		if err := h.c.List(context.Background(), &list, client.InNamespace(vmi.Namespace)); err != nil {
			return false
		}
		for _, e := range list.Items {
			if e.Regarding.Name == vmi.Name && e.Regarding.Kind == "VirtualMachineInstance" && e.Type == typ && e.Reason == reason &&
				e.ReportingController == controllerName {
				return true
			}
		}
		return false
	})
}
