package launcherpod

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
)

const testUID = types.UID("0b5c5f52-9d43-4c44-a7e5-3a1f3f1d1a11")

func q(s string) resource.Quantity { return resource.MustParse(s) }

func testVMI(mut ...func(*v1alpha1.VirtualMachineInstance)) *v1alpha1.VirtualMachineInstance {
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns1", UID: testUID},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			Domain: v1alpha1.DomainSpec{Memory: &v1alpha1.Memory{Guest: ptr.To(q("1Gi"))}},
		},
	}
	for _, m := range mut {
		m(vmi)
	}
	return vmi
}

func testClass(mut ...func(*v1alpha1.HypervisorClass)) *v1alpha1.HypervisorClass {
	c := &v1alpha1.HypervisorClass{ObjectMeta: metav1.ObjectMeta{Name: "qemu"}, Driver: "qmp"}
	for _, m := range mut {
		m(c)
	}
	return c
}

var testConfig = Config{LauncherImage: "kubevisor/launcher:test", LauncherMemoryOverhead: q("100Mi")}

// driverUp is the node requirement every launcher pod of testClass carries.
var driverUp = corev1.NodeSelectorRequirement{
	Key:      "capability.kubevisor.io/hypervisor.qmp",
	Operator: corev1.NodeSelectorOpIn,
	Values:   []string{"healthy", "degraded"},
}

// TestBuildMinimal pins the whole pod of the smallest VMI, so that any change to it shows here.
func TestBuildMinimal(t *testing.T) {
	pod, err := Build(testVMI(), testClass(), testConfig)
	if err != nil {
		t.Fatal(err)
	}
	dir := "/var/run/kubevisor/vmi/" + string(testUID)
	want := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      Name("vm1", testUID),
			Namespace: "ns1",
			Labels: map[string]string{
				v1alpha1.CreatedByLabel:                  string(testUID),
				v1alpha1.VirtualMachineInstanceNameLabel: "vm1",
				v1alpha1.HypervisorClassLabel:            "qemu",
				v1alpha1.HypervisorDriverLabel:           "qmp",
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "kubevisor.io/v1alpha1", Kind: "VirtualMachineInstance", Name: "vm1", UID: testUID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](45),
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			Hostname:                      "vm1",
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{driverUp}}},
				},
			}},
			// Unprivileged: a class without launcher capabilities runs as 107, which Pod
			// Security's restricted level admits.
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				RunAsNonRoot:   ptr.To(true), RunAsUser: ptr.To[int64](107), RunAsGroup: ptr.To[int64](107), FSGroup: ptr.To[int64](107),
			},
			// The per-VMI directory is an emptyDir, which the handler binds onto dir on the node.
			Volumes: []corev1.Volume{{
				Name:         VMIDirVolumeName,
				VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
			}},
			Containers: []corev1.Container{{
				Name:            "compute",
				Image:           "kubevisor/launcher:test",
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{"kubevisor-launcher"},
				Args:            []string{"--dir", dir + "/launcher", "--vmi", "ns1/vm1", "--grace-period", "30s"},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceMemory: q("1124Mi"), corev1.ResourceCPU: q("100m")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: q("1124Mi")},
				},
				VolumeMounts: []corev1.VolumeMount{{
					Name: VMIDirVolumeName, MountPath: dir,
				}},
				SecurityContext: &corev1.SecurityContext{
					Privileged:               ptr.To(false),
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					// The runtime's default plus userfaultfd (post-copy), which the handler
					// installs on every node.
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("kubevisor/launcher.json")},
				},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}, {
				// The serial console, for kubectl logs: read-only on the VMI directory.
				Name:            "guest-console-log",
				Image:           "kubevisor/launcher:test",
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{"kubevisor-console-log"},
				Args:            []string{"--file", dir + "/console.log"},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: q("10m"), corev1.ResourceMemory: q("16Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: q("16Mi")},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: VMIDirVolumeName, MountPath: dir, ReadOnly: true}},
				SecurityContext: &corev1.SecurityContext{
					RunAsUser:                ptr.To[int64](107),
					RunAsNonRoot:             ptr.To(true),
					Privileged:               ptr.To(false),
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}
	if !equality.Semantic.DeepEqual(pod, want) {
		t.Errorf("pod differs:\n got %+v\nwant %+v", pod, want)
	}
	if pod.Spec.HostNetwork || pod.Spec.HostPID || pod.Spec.HostIPC {
		t.Error("launcher pod shares a host namespace")
	}
}

func TestBuild(t *testing.T) {
	res := func(pairs ...string) corev1.ResourceList {
		l := corev1.ResourceList{}
		for i := 0; i < len(pairs); i += 2 {
			l[corev1.ResourceName(pairs[i])] = q(pairs[i+1])
		}
		return l
	}
	wantResources := func(req, lim corev1.ResourceList) func(*testing.T, *corev1.Pod) {
		return func(t *testing.T, pod *corev1.Pod) {
			t.Helper()
			got := pod.Spec.Containers[0].Resources
			if !equality.Semantic.DeepEqual(got.Requests, req) {
				t.Errorf("requests = %v, want %v", got.Requests, req)
			}
			if !equality.Semantic.DeepEqual(got.Limits, lim) {
				t.Errorf("limits = %v, want %v", got.Limits, lim)
			}
		}
	}
	tests := []struct {
		name    string
		vmi     *v1alpha1.VirtualMachineInstance
		class   *v1alpha1.HypervisorClass
		cfg     *Config
		wantErr string // substring; empty means success
		check   func(*testing.T, *corev1.Pod)
	}{
		{
			name:  "the compute container keeps the class's launcher capabilities, and only those",
			vmi:   testVMI(),
			class: testClass(func(c *v1alpha1.HypervisorClass) { c.LauncherCapabilities = []corev1.Capability{"SETUID", "SETGID"} }),
			check: func(t *testing.T, pod *corev1.Pod) {
				want := &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"SETUID", "SETGID"}}
				if got := pod.Spec.Containers[0].SecurityContext; !equality.Semantic.DeepEqual(got.Capabilities, want) || *got.Privileged || *got.AllowPrivilegeEscalation {
					t.Errorf("compute security context = %+v, want capabilities %+v, unprivileged", got, want)
				}
				for _, c := range pod.Spec.Containers[1:] {
					if len(c.SecurityContext.Capabilities.Add) != 0 {
						t.Errorf("container %s adds capabilities %v: only compute keeps the class's", c.Name, c.SecurityContext.Capabilities.Add)
					}
				}
				// Root, which a process needs to be given capabilities: not unprivileged.
				if sc := pod.Spec.SecurityContext; sc.RunAsUser != nil || sc.RunAsNonRoot != nil || sc.FSGroup != nil {
					t.Errorf("pod security context %+v of a class with capabilities, want no user (root's)", sc)
				}
			},
		},
		{
			name: "containerDisk containers of a class with capabilities run as root, the pod's user",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Volumes = []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "img"}}}}
			}),
			class: testClass(func(c *v1alpha1.HypervisorClass) { c.LauncherCapabilities = []corev1.Capability{"SETUID", "SETGID"} }),
			check: func(t *testing.T, pod *corev1.Pod) {
				for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers[1:]...) {
					if sc := c.SecurityContext; *sc.RunAsUser != 0 || *sc.RunAsNonRoot {
						t.Errorf("container %s runs as %d (runAsNonRoot %v), want root", c.Name, *sc.RunAsUser, *sc.RunAsNonRoot)
					}
				}
			},
		},
		{
			name: "memory from resources.requests when no guest memory",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Memory = nil
				v.Spec.Domain.Resources.Requests = res("memory", "2Gi")
			}),
			check: wantResources(res("memory", "2148Mi", "cpu", "100m"), res("memory", "2148Mi")),
		},
		{
			name: "overcommit: request from resources.requests, limit from guest memory",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Memory.Guest = ptr.To(q("2Gi"))
				v.Spec.Domain.Resources.Requests = res("memory", "1Gi")
			}),
			check: wantResources(res("memory", "1124Mi", "cpu", "100m"), res("memory", "2148Mi")),
		},
		{
			name: "memory and cpu limits of the VMI",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Resources.Requests = res("memory", "1Gi", "cpu", "500m")
				v.Spec.Domain.Resources.Limits = res("memory", "3Gi", "cpu", "2")
			}),
			check: wantResources(res("memory", "1124Mi", "cpu", "500m"), res("memory", "3172Mi", "cpu", "2")),
		},
		{
			name:    "memory limit below the request",
			vmi:     testVMI(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Resources.Limits = res("memory", "512Mi") }),
			wantErr: "memory limit 512Mi is below the memory request 1Gi",
		},
		{
			name:  "cpu request from the cpu limit",
			vmi:   testVMI(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Resources.Limits = res("cpu", "3") }),
			check: wantResources(res("memory", "1124Mi", "cpu", "3"), res("memory", "1124Mi", "cpu", "3")),
		},
		{
			name: "cpu request from the topology",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 2, Cores: 2, Threads: 1}
			}),
			check: wantResources(res("memory", "1124Mi", "cpu", "400m"), res("memory", "1124Mi")),
		},
		{
			name: "class overhead on requests, and on limits only where there is one",
			class: testClass(func(c *v1alpha1.HypervisorClass) {
				c.Overhead = &v1alpha1.HypervisorClassOverhead{PodFixed: res("memory", "64Mi", "cpu", "250m")}
			}),
			check: wantResources(res("memory", "1188Mi", "cpu", "350m"), res("memory", "1188Mi")),
		},
		{
			name: "class device resources requested and limited at one",
			class: testClass(func(c *v1alpha1.HypervisorClass) {
				c.DeviceResources = []corev1.ResourceName{v1alpha1.KVMDeviceResource, v1alpha1.VhostNetDeviceResource}
			}),
			check: wantResources(
				res("memory", "1124Mi", "cpu", "100m", "devices.kubevisor.io/kvm", "1", "devices.kubevisor.io/vhost-net", "1"),
				res("memory", "1124Mi", "devices.kubevisor.io/kvm", "1", "devices.kubevisor.io/vhost-net", "1")),
		},
		{
			name: "one deviceName per GPU and host device",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.GPUs = []v1alpha1.GPU{{Name: "g1", DeviceName: "devices.kubevisor.io/gpu"}, {Name: "g2", DeviceName: "devices.kubevisor.io/gpu"}}
				v.Spec.Domain.Devices.HostDevices = []v1alpha1.HostDevice{{Name: "nic", DeviceName: "nvidia.com/GA102"}}
			}),
			check: wantResources(
				res("memory", "1124Mi", "cpu", "100m", "devices.kubevisor.io/gpu", "2", "nvidia.com/GA102", "1"),
				res("memory", "1124Mi", "devices.kubevisor.io/gpu", "2", "nvidia.com/GA102", "1")),
		},
		{
			name: "a deviceName that is no extended resource",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.HostDevices = []v1alpha1.HostDevice{{Name: "a", DeviceName: "devices.kubevisor.io/ok"}, {Name: "b", DeviceName: "gpu"}}
			}),
			wantErr: `spec.domain.devices.hostDevices[1].deviceName "gpu": not an extended resource name <domain>/<name>`,
		},
		{
			name: "a deviceName of kubernetes.io",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.GPUs = []v1alpha1.GPU{{Name: "g", DeviceName: "kubernetes.io/gpu"}}
			}),
			wantErr: `spec.domain.devices.gpus[0].deviceName "kubernetes.io/gpu": not an extended resource`,
		},
		{
			name:    "device resource outside devices.kubevisor.io",
			class:   testClass(func(c *v1alpha1.HypervisorClass) { c.DeviceResources = []corev1.ResourceName{"nvidia.com/gpu"} }),
			wantErr: `device resource "nvidia.com/gpu" is not a devices.kubevisor.io/<name> resource`,
		},
		{
			name:    "no memory",
			vmi:     testVMI(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Memory = nil }),
			wantErr: "VMI sets no memory",
		},
		{
			name: "node selectors of VMI and class merged",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.NodeSelector = map[string]string{"zone": "a", "disk": "ssd"}
			}),
			class: testClass(func(c *v1alpha1.HypervisorClass) {
				c.Scheduling = &v1alpha1.HypervisorClassScheduling{NodeSelector: map[string]string{"zone": "a", "kvm": "true"}}
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				want := map[string]string{"zone": "a", "disk": "ssd", "kvm": "true"}
				if !equality.Semantic.DeepEqual(pod.Spec.NodeSelector, want) {
					t.Errorf("nodeSelector = %v, want %v", pod.Spec.NodeSelector, want)
				}
			},
		},
		{
			name: "node selector conflict names both sides",
			vmi:  testVMI(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.NodeSelector = map[string]string{"zone": "a"} }),
			class: testClass(func(c *v1alpha1.HypervisorClass) {
				c.Scheduling = &v1alpha1.HypervisorClassScheduling{NodeSelector: map[string]string{"zone": "b"}}
			}),
			wantErr: `node selector zone: the VMI wants "a" and HypervisorClass qemu wants "b"`,
		},
		{
			name: "driver requirement joins each of the VMI's node terms; other affinity kept",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Affinity = &corev1.Affinity{
					NodeAffinity: &corev1.NodeAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
							{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "rack", Operator: corev1.NodeSelectorOpIn, Values: []string{"1"}}}},
							{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n2"}}}},
						}},
						PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 5}},
					},
					PodAntiAffinity: &corev1.PodAntiAffinity{},
				}
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
				want := []corev1.NodeSelectorTerm{
					{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "rack", Operator: corev1.NodeSelectorOpIn, Values: []string{"1"}}, driverUp}},
					{
						MatchFields:      []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n2"}}},
						MatchExpressions: []corev1.NodeSelectorRequirement{driverUp},
					},
				}
				if !equality.Semantic.DeepEqual(terms, want) {
					t.Errorf("node terms = %+v, want %+v", terms, want)
				}
				if len(pod.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 || pod.Spec.Affinity.PodAntiAffinity == nil {
					t.Error("the VMI's preferred node terms or pod anti-affinity were lost")
				}
			},
		},
		{
			name: "architecture places the pod on nodes of it",
			vmi:  testVMI(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Architecture = "amd64" }),
			check: func(t *testing.T, pod *corev1.Pod) {
				if got := pod.Spec.NodeSelector["kubernetes.io/arch"]; got != "amd64" {
					t.Errorf("node selector kubernetes.io/arch = %q, want amd64", got)
				}
			},
		},
		{
			name: "architecture against the VMI's own node selector",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Architecture, v.Spec.NodeSelector = "amd64", map[string]string{"kubernetes.io/arch": "arm64"}
			}),
			wantErr: `node selector kubernetes.io/arch: the VMI wants "arm64" and its architecture is "amd64"`,
		},
		{
			name: "what needs KVM places the pod on nodes whose driver runs with KVM",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Features = &v1alpha1.Features{Hyperv: &v1alpha1.FeatureHyperv{Relaxed: &v1alpha1.FeatureState{}}}
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
				kvm := corev1.NodeSelectorRequirement{Key: "capability.kubevisor.io/" + testClass().Driver + ".accel", Operator: corev1.NodeSelectorOpIn, Values: []string{"kvm"}}
				want := []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{driverUp, kvm}}}
				if !equality.Semantic.DeepEqual(terms, want) {
					t.Errorf("node terms = %+v, want %+v", terms, want)
				}
			},
		},
		{
			name: "AMD SEV asks for /dev/sev and a node whose driver runs with KVM",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.LaunchSecurity = &v1alpha1.LaunchSecurity{SEV: &v1alpha1.SEV{}}
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				c := pod.Spec.Containers[0]
				for _, list := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
					if q, ok := list[v1alpha1.SEVDeviceResource]; !ok || q.Value() != 1 {
						t.Errorf("compute resources %v: want one %s", list, v1alpha1.SEVDeviceResource)
					}
				}
				terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
				kvm := corev1.NodeSelectorRequirement{Key: "capability.kubevisor.io/" + testClass().Driver + ".accel", Operator: corev1.NodeSelectorOpIn, Values: []string{"kvm"}}
				if want := []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{driverUp, kvm}}}; !equality.Semantic.DeepEqual(terms, want) {
					t.Errorf("node terms = %+v, want %+v", terms, want)
				}
			},
		},
		{
			name: "a TPM places the pod on nodes whose driver gives VMs one",
			vmi:  testVMI(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{} }),
			check: func(t *testing.T, pod *corev1.Pod) {
				terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
				tpm := corev1.NodeSelectorRequirement{Key: "capability.kubevisor.io/" + testClass().Driver + ".tpm", Operator: corev1.NodeSelectorOpExists}
				if want := []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{driverUp, tpm}}}; !equality.Semantic.DeepEqual(terms, want) {
					t.Errorf("node terms = %+v, want %+v", terms, want)
				}
			},
		},
		{
			name: "a disabled TPM places the pod anywhere",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Enabled: ptr.To(false)}
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
				if want := []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{driverUp}}}; !equality.Semantic.DeepEqual(terms, want) {
					t.Errorf("node terms = %+v, want %+v", terms, want)
				}
			},
		},
		{
			name: "tolerations of VMI and class, duplicates once",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Tolerations = []corev1.Toleration{{Key: "a", Operator: corev1.TolerationOpExists}}
			}),
			class: testClass(func(c *v1alpha1.HypervisorClass) {
				c.Scheduling = &v1alpha1.HypervisorClassScheduling{Tolerations: []corev1.Toleration{
					{Key: "a", Operator: corev1.TolerationOpExists},
					{Key: "kvm", Operator: corev1.TolerationOpEqual, Value: "x", Effect: corev1.TaintEffectNoSchedule},
				}}
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				want := []corev1.Toleration{
					{Key: "a", Operator: corev1.TolerationOpExists},
					{Key: "kvm", Operator: corev1.TolerationOpEqual, Value: "x", Effect: corev1.TaintEffectNoSchedule},
				}
				if !equality.Semantic.DeepEqual(pod.Spec.Tolerations, want) {
					t.Errorf("tolerations = %+v, want %+v", pod.Spec.Tolerations, want)
				}
			},
		},
		{
			name: "grace period: the VMI's to the launcher, plus the margin to the pod",
			vmi:  testVMI(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](120) }),
			cfg:  &Config{LauncherImage: "img", GracePeriodMarginSeconds: ptr.To[int64](5)},
			check: func(t *testing.T, pod *corev1.Pod) {
				if g := *pod.Spec.TerminationGracePeriodSeconds; g != 125 {
					t.Errorf("pod grace period = %d, want 125", g)
				}
				if args := strings.Join(pod.Spec.Containers[0].Args, " "); !strings.HasSuffix(args, "--grace-period 120s") {
					t.Errorf("args = %q, want --grace-period 120s", args)
				}
			},
		},
		{
			name: "host state directory from the config",
			cfg:  &Config{LauncherImage: "img", HostStateDir: "/srv/kv"},
			check: func(t *testing.T, pod *corev1.Pod) {
				dir := "/srv/kv/vmi/" + string(testUID)
				if pod.Spec.Volumes[0].EmptyDir == nil {
					t.Errorf("per-VMI directory volume = %+v, want an emptyDir", pod.Spec.Volumes[0])
				}
				if m := pod.Spec.Containers[0].VolumeMounts[0].MountPath; m != dir {
					t.Errorf("mount = %s, want %s", m, dir)
				}
				if a := pod.Spec.Containers[0].Args[1]; a != dir+"/launcher" {
					t.Errorf("--dir %s, want %s/launcher", a, dir)
				}
			},
		},
		{
			name: "volumes: claims and host disks become pod volumes, node-prepared sources do not",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Volumes = []v1alpha1.Volume{
					{Name: "data", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
						PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-claim"}}}},
					{Name: "base", VolumeSource: v1alpha1.VolumeSource{Ephemeral: &v1alpha1.EphemeralVolumeSource{
						PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "golden"}}}},
					{Name: "h1", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/srv/disks/a.img", Type: v1alpha1.HostDiskExists}}},
					{Name: "h2", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/srv/disks/b.img", Type: v1alpha1.HostDiskExistsOrCreate}}},
					{Name: "h3", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/srv/new/c.img", Type: v1alpha1.HostDiskExistsOrCreate}}},
					{Name: "scratch", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: q("1Gi")}}},
					{Name: "ci", VolumeSource: v1alpha1.VolumeSource{CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config"}}},
				}
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				wantVolumes := []corev1.Volume{
					pod.Spec.Volumes[0],
					{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-claim"}}},
					{Name: "base", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "golden", ReadOnly: true}}},
					{Name: "h1", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv/disks", Type: ptr.To(corev1.HostPathDirectory)}}},
					{Name: "h3", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv/new", Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}},
				}
				if !equality.Semantic.DeepEqual(pod.Spec.Volumes, wantVolumes) {
					t.Errorf("volumes = %+v\nwant %+v", pod.Spec.Volumes, wantVolumes)
				}
				wantMounts := []corev1.VolumeMount{
					pod.Spec.Containers[0].VolumeMounts[0],
					{Name: "data", MountPath: DiskMountDir + "/data"},
					{Name: "base", MountPath: DiskMountDir + "/base", ReadOnly: true},
					{Name: "h1", MountPath: "/srv/disks"},
					{Name: "h3", MountPath: "/srv/new"},
				}
				if !equality.Semantic.DeepEqual(pod.Spec.Containers[0].VolumeMounts, wantMounts) {
					t.Errorf("mounts = %+v\nwant %+v", pod.Spec.Containers[0].VolumeMounts, wantMounts)
				}
				// The handler mounts the claims into the VMI directory once the pod runs.
				if len(pod.Spec.Containers) != 2 || len(pod.Spec.InitContainers) != 0 ||
					ptr.Deref(wantMounts[0].MountPropagation, "") != corev1.MountPropagationHostToContainer {
					t.Errorf("containers %d, init containers %d, propagation %v: want 2 (compute, guest-console-log), 0, HostToContainer", len(pod.Spec.Containers), len(pod.Spec.InitContainers), wantMounts[0].MountPropagation)
				}
			},
		},
		{
			name: "containerDisk volumes: a container each running the image and kubevisor-containerdisk, copied from the launcher image by an init container into an emptyDir; HostToContainer on the per-VMI directory",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Volumes = []v1alpha1.Volume{
					{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "kubevisor/test-guest:latest"}}},
					{Name: "ci", VolumeSource: v1alpha1.VolumeSource{CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config"}}},
					{Name: "extra", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{
						Image: "registry.example/disks/extra:v1", Path: "/custom/extra.raw", ImagePullPolicy: corev1.PullAlways}}},
				}
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				dir := "/var/run/kubevisor/vmi/" + string(testUID)
				cdDir := dir + "/containerdisks"
				if got := pod.Spec.Containers[0].VolumeMounts[0]; got.MountPath != dir || !equality.Semantic.DeepEqual(got.MountPropagation, ptr.To(corev1.MountPropagationHostToContainer)) {
					t.Errorf("per-VMI directory mount %+v, want %s with HostToContainer", got, dir)
				}
				wantVolumes := []corev1.Volume{
					pod.Spec.Volumes[0],
					{Name: ContainerDiskBinVolumeName, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				}
				if !equality.Semantic.DeepEqual(pod.Spec.Volumes, wantVolumes) {
					t.Errorf("volumes = %+v\nwant %+v", pod.Spec.Volumes, wantVolumes)
				}
				security := &corev1.SecurityContext{
					RunAsUser: ptr.To[int64](107), RunAsNonRoot: ptr.To(true), Privileged: ptr.To(false),
					AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				}
				small := corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: q("10m"), corev1.ResourceMemory: q("16Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: q("16Mi")},
				}
				wantInit := []corev1.Container{{
					Name: ContainerDiskInstallContainer, Image: "kubevisor/launcher:test", ImagePullPolicy: corev1.PullIfNotPresent,
					Command:                  []string{"kubevisor-containerdisk", "--copy-to", "/kubevisor-containerdisk"},
					Resources:                small,
					VolumeMounts:             []corev1.VolumeMount{{Name: ContainerDiskBinVolumeName, MountPath: "/kubevisor-containerdisk"}},
					SecurityContext:          security,
					TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				}}
				if !equality.Semantic.DeepEqual(pod.Spec.InitContainers, wantInit) {
					t.Errorf("init containers = %+v\nwant %+v", pod.Spec.InitContainers, wantInit)
				}
				disk := func(name, image string, pull corev1.PullPolicy, volume string) corev1.Container {
					return corev1.Container{
						Name: name, Image: image, ImagePullPolicy: pull,
						Command:   []string{"/kubevisor-containerdisk/kubevisor-containerdisk"},
						Args:      []string{"--socket", cdDir + "/" + volume + ".sock"},
						Resources: small,
						VolumeMounts: []corev1.VolumeMount{
							{Name: ContainerDiskBinVolumeName, MountPath: "/kubevisor-containerdisk", ReadOnly: true},
							{Name: VMIDirVolumeName, MountPath: dir},
						},
						SecurityContext:          security,
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
					}
				}
				want := []corev1.Container{
					disk("volume-root", "kubevisor/test-guest:latest", corev1.PullIfNotPresent, "root"),
					disk("volume-extra", "registry.example/disks/extra:v1", corev1.PullAlways, "extra"),
				}
				if got := pod.Spec.Containers[2:]; !equality.Semantic.DeepEqual(got, want) {
					t.Errorf("containerDisk containers = %+v\nwant %+v", got, want)
				}
				if pod.Spec.Containers[0].Name != layout.ComputeContainer {
					t.Errorf("first container %s, want the launcher", pod.Spec.Containers[0].Name)
				}
			},
		},
		{
			name: "containerDisk volume names too long for a container name: shortened, distinct, valid",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				for _, n := range []string{strings.Repeat("a", 60) + "-1", strings.Repeat("a", 60) + "-2"} {
					v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: n, VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "img"}}})
				}
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				a, b := pod.Spec.Containers[1].Name, pod.Spec.Containers[2].Name
				for _, n := range []string{a, b} {
					if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
						t.Errorf("container name %q: %v", n, errs)
					}
				}
				if a == b {
					t.Errorf("both containers are named %s", a)
				}
			},
		},
		{
			name: "a VMI volume named like the containerDisk socket directory's volume",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Volumes = []v1alpha1.Volume{
					{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "img"}}},
					{Name: ContainerDiskBinVolumeName, VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
						PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}}},
				}
			}),
			wantErr: "volume kubevisor-containerdisk-bin: its name is taken",
		},
		{
			name: "a VMI volume named like the per-VMI directory's volume",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Volumes = []v1alpha1.Volume{{Name: VMIDirVolumeName, VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
					PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}}}}
			}),
			wantErr: "volume kubevisor-vmi-dir: its name is taken",
		},
		{
			name: "VMI labels copied; Kubevisor's own win; the node label is not copied",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Labels = map[string]string{"app": "web", v1alpha1.CreatedByLabel: "forged", v1alpha1.NodeNameLabel: "n1"}
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				want := map[string]string{
					"app":                                    "web",
					v1alpha1.CreatedByLabel:                  string(testUID),
					v1alpha1.VirtualMachineInstanceNameLabel: "vm1",
					v1alpha1.HypervisorClassLabel:            "qemu",
					v1alpha1.HypervisorDriverLabel:           "qmp",
				}
				if !equality.Semantic.DeepEqual(pod.Labels, want) {
					t.Errorf("labels = %v, want %v", pod.Labels, want)
				}
			},
		},
		{
			name: "hostname and subdomain",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Name = "web.example"
				v.Spec.Subdomain = "svc1"
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				if pod.Spec.Hostname != "web-example" || pod.Spec.Subdomain != "svc1" {
					t.Errorf("hostname %q subdomain %q, want web-example svc1", pod.Spec.Hostname, pod.Spec.Subdomain)
				}
			},
		},
		{
			name: "hostname of the VMI",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Hostname = "db-0"
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				if pod.Spec.Hostname != "db-0" {
					t.Errorf("hostname %q, want db-0", pod.Spec.Hostname)
				}
			},
		},
		{
			name: "secrets of cloud-init and access credentials",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Volumes = []v1alpha1.Volume{
					{Name: "ci", VolumeSource: v1alpha1.VolumeSource{CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{
						UserDataSecretRef: &corev1.LocalObjectReference{Name: "user-data"}, NetworkDataSecretRef: &corev1.LocalObjectReference{Name: "net"},
					}}},
					{Name: "cd", VolumeSource: v1alpha1.VolumeSource{CloudInitConfigDrive: &v1alpha1.CloudInitConfigDriveSource{
						UserDataSecretRef: &corev1.LocalObjectReference{Name: "user-data"},
					}}},
				}
				v.Spec.AccessCredentials = []v1alpha1.AccessCredential{{SSHPublicKey: &v1alpha1.SSHPublicKeyAccessCredential{
					Source:            v1alpha1.SSHPublicKeyAccessCredentialSource{Secret: &v1alpha1.AccessCredentialSecretSource{SecretName: "my.keys"}},
					PropagationMethod: v1alpha1.SSHPublicKeyAccessCredentialPropagationMethod{NoCloud: &v1alpha1.NoCloudSSHPublicKeyAccessCredentialPropagation{}},
				}}}
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				mounts := map[string]corev1.VolumeMount{}
				for _, m := range pod.Spec.Containers[0].VolumeMounts {
					mounts[m.Name] = m
				}
				var got []string
				for _, vol := range pod.Spec.Volumes {
					if vol.Secret == nil {
						continue
					}
					name := vol.Secret.SecretName
					got = append(got, name)
					if vol.Name != SecretVolumeName(name) || len(validation.IsDNS1123Label(vol.Name)) > 0 {
						t.Errorf("secret %s: volume %q", name, vol.Name)
					}
					if vol.Secret.Optional != nil && *vol.Secret.Optional {
						t.Errorf("secret %s: optional", name)
					}
					if vol.Secret.DefaultMode == nil || *vol.Secret.DefaultMode != 0o400 {
						t.Errorf("secret %s: mode %v, want 0400", name, vol.Secret.DefaultMode)
					}
					m, ok := mounts[vol.Name]
					if !ok || !m.ReadOnly || m.MountPath != layout.SecretDir(name) {
						t.Errorf("secret %s: compute mount %+v, want read-only at %s", name, m, layout.SecretDir(name))
					}
				}
				if want := []string{"my.keys", "net", "user-data"}; !slices.Equal(got, want) {
					t.Errorf("secret volumes %v, want %v (each once)", got, want)
				}
				for _, c := range pod.Spec.Containers[1:] {
					for _, m := range c.VolumeMounts {
						if strings.HasPrefix(m.Name, SecretVolumePrefix) {
							t.Errorf("container %s mounts secret volume %s", c.Name, m.Name)
						}
					}
				}
			},
		},
		{
			name: "dns policy and config",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.DNSPolicy = corev1.DNSNone
				v.Spec.DNSConfig = &corev1.PodDNSConfig{
					Nameservers: []string{"10.96.0.10"}, Searches: []string{"example.org"},
					Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr.To("2")}},
				}
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				want := &corev1.PodDNSConfig{
					Nameservers: []string{"10.96.0.10"}, Searches: []string{"example.org"},
					Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr.To("2")}},
				}
				if pod.Spec.DNSPolicy != corev1.DNSNone || !equality.Semantic.DeepEqual(pod.Spec.DNSConfig, want) {
					t.Errorf("dnsPolicy %q dnsConfig %+v, want None %+v", pod.Spec.DNSPolicy, pod.Spec.DNSConfig, want)
				}
			},
		},
		{
			name: "no dns settings: the pod's defaults",
			vmi:  testVMI(),
			check: func(t *testing.T, pod *corev1.Pod) {
				if pod.Spec.DNSPolicy != "" || pod.Spec.DNSConfig != nil {
					t.Errorf("dnsPolicy %q dnsConfig %+v, want neither", pod.Spec.DNSPolicy, pod.Spec.DNSConfig)
				}
			},
		},
		{
			name: "priority class and scheduler",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.PriorityClassName, v.Spec.SchedulerName = "vm-critical", "my-scheduler"
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				if pod.Spec.PriorityClassName != "vm-critical" || pod.Spec.SchedulerName != "my-scheduler" {
					t.Errorf("priorityClassName %q schedulerName %q, want vm-critical my-scheduler", pod.Spec.PriorityClassName, pod.Spec.SchedulerName)
				}
			},
		},
		{
			name:    "VMI name too long for a label value",
			vmi:     testVMI(func(v *v1alpha1.VirtualMachineInstance) { v.Name = strings.Repeat("a", 64) }),
			wantErr: "VMI name",
		},
		{
			name:    "no launcher image",
			cfg:     &Config{},
			wantErr: "no launcher image configured",
		},
		{
			name: "seccomp RuntimeDefault from the config: the compute container gets the runtime's profile",
			cfg:  &Config{LauncherImage: "img", ComputeSeccomp: corev1.SeccompProfileTypeRuntimeDefault},
			check: func(t *testing.T, pod *corev1.Pod) {
				want := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
				if got := pod.Spec.Containers[0].SecurityContext.SeccompProfile; !equality.Semantic.DeepEqual(got, want) {
					t.Errorf("compute seccomp profile = %+v, want %+v", got, want)
				}
				if got := pod.Spec.SecurityContext.SeccompProfile; !equality.Semantic.DeepEqual(got, want) {
					t.Errorf("pod seccomp profile = %+v, want %+v", got, want)
				}
			},
		},
		{
			name: "seccomp Localhost from the config: the launcher profile for compute only, RuntimeDefault for the other containers",
			vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: "cd", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "disk:1"}}})
			}),
			cfg: &Config{LauncherImage: "img", ComputeSeccomp: corev1.SeccompProfileTypeLocalhost},
			check: func(t *testing.T, pod *corev1.Pod) {
				want := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("kubevisor/launcher.json")}
				if got := pod.Spec.Containers[0].SecurityContext.SeccompProfile; !equality.Semantic.DeepEqual(got, want) {
					t.Errorf("compute seccomp profile = %+v, want %+v", got, want)
				}
				if got := pod.Spec.SecurityContext.SeccompProfile; got == nil || got.Type != corev1.SeccompProfileTypeRuntimeDefault {
					t.Errorf("pod seccomp profile = %+v, want RuntimeDefault", got)
				}
				if len(pod.Spec.Containers) < 2 {
					t.Fatalf("containers = %d, want compute and the containerDisk's", len(pod.Spec.Containers))
				}
				for _, c := range pod.Spec.Containers[1:] {
					if c.SecurityContext != nil && c.SecurityContext.SeccompProfile != nil {
						t.Errorf("container %s has its own seccomp profile %+v, want the pod's", c.Name, c.SecurityContext.SeccompProfile)
					}
				}
			},
		},
		{
			name:    "seccomp profile type neither Localhost nor RuntimeDefault",
			cfg:     &Config{LauncherImage: "img", ComputeSeccomp: corev1.SeccompProfileTypeUnconfined},
			wantErr: `seccomp profile "Unconfined" is neither Localhost nor RuntimeDefault`,
		},
		{
			name:    "relative host state directory",
			cfg:     &Config{LauncherImage: "img", HostStateDir: "var/lib"},
			wantErr: "not an absolute path",
		},
		{
			name:    "VMI without UID",
			vmi:     testVMI(func(v *v1alpha1.VirtualMachineInstance) { v.UID = "" }),
			wantErr: "VMI has no UID",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vmi, class, cfg := tt.vmi, tt.class, testConfig
			if vmi == nil {
				vmi = testVMI()
			}
			if class == nil {
				class = testClass()
			}
			if tt.cfg != nil {
				cfg = *tt.cfg
			}
			vmiBefore, classBefore := vmi.DeepCopy(), class.DeepCopy()
			pod, err := Build(vmi, class, cfg)
			if !equality.Semantic.DeepEqual(vmi, vmiBefore) || !equality.Semantic.DeepEqual(class, classBefore) {
				t.Error("Build changed its inputs")
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, pod)
		})
	}
}

func TestName(t *testing.T) {
	a := Name("vm1", "uid-a")
	if a != Name("vm1", "uid-a") {
		t.Error("Name is not deterministic")
	}
	if a == Name("vm1", "uid-b") {
		t.Error("two VMIs of the same name but different UIDs get the same pod name")
	}
	if !strings.HasPrefix(a, "kubevisor-launcher-vm1-") {
		t.Errorf("Name = %q", a)
	}
	long := Name(strings.Repeat("x", 250)+".y", "uid-a")
	if errs := validation.IsDNS1123Label(long); len(errs) > 0 {
		t.Errorf("Name of a long VMI name %q: %v", long, errs)
	}
	dotted := Name("a"+strings.Repeat(".b", 30), "uid-a")
	if errs := validation.IsDNS1123Subdomain(dotted); len(errs) > 0 || len(dotted) > 63 {
		t.Errorf("Name of a dotted VMI name %q: %v", dotted, errs)
	}
}

// podGuaranteed says whether every container of pod has CPU and memory limits equal to its
// requests: the Guaranteed QoS class.
func podGuaranteed(pod *corev1.Pod) bool {
	for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			lim, ok := c.Resources.Limits[r]
			if req, has := c.Resources.Requests[r]; !ok || (has && req.Cmp(lim) != 0) {
				return false
			}
		}
	}
	return true
}

// TestHelperResources: the helper containers (guest-console-log, containerDisk) have no CPU
// limit beside a compute container without one, which would only throttle their start; beside
// a Guaranteed compute container they get a CPU limit equal to their request, so that the pod
// stays Guaranteed.
func TestHelperResources(t *testing.T) {
	withDisk := func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Volumes = []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "kubevisor/test-guest:latest"}}}}
	}
	for _, tc := range []struct {
		name       string
		edit       func(*v1alpha1.VirtualMachineInstance)
		guaranteed bool
		helperCPU  string // request; the limit too when guaranteed
	}{
		{"no CPU limit: Burstable, helpers unthrottled", func(v *v1alpha1.VirtualMachineInstance) { withDisk(v) }, false, "10m"},
		{"CPU limit and requests equal to limits: Guaranteed, helpers too", func(v *v1alpha1.VirtualMachineInstance) {
			withDisk(v)
			v.Spec.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: q("2")}
		}, true, "100m"},
		{"CPU limit above the request: Burstable", func(v *v1alpha1.VirtualMachineInstance) {
			withDisk(v)
			v.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: q("1")}
			v.Spec.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: q("2")}
		}, false, "10m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod, err := Build(testVMI(tc.edit), testClass(), testConfig)
			if err != nil {
				t.Fatal(err)
			}
			if got := podGuaranteed(pod); got != tc.guaranteed {
				t.Errorf("pod Guaranteed = %v, want %v", got, tc.guaranteed)
			}
			if len(pod.Spec.Containers) != 3 {
				t.Fatalf("containers %d, want compute, guest-console-log, volume-root", len(pod.Spec.Containers))
			}
			for _, c := range pod.Spec.Containers[1:] {
				req, lim := c.Resources.Requests[corev1.ResourceCPU], c.Resources.Limits[corev1.ResourceCPU]
				_, limited := c.Resources.Limits[corev1.ResourceCPU]
				if req.Cmp(q(tc.helperCPU)) != 0 || limited != tc.guaranteed || (limited && lim.Cmp(req) != 0) {
					t.Errorf("%s: cpu request %s, limit %v (%s); want request %s and a limit only when Guaranteed", c.Name, req.String(), limited, lim.String(), tc.helperCPU)
				}
			}
		})
	}
}

// TestSerialConsoleLog: guest-console-log is in the pod only when the serial console is logged.
func TestSerialConsoleLog(t *testing.T) {
	off := ptr.To(false)
	for _, tc := range []struct {
		name string
		edit func(*v1alpha1.Devices)
		want []string
	}{
		{"default: logged", func(*v1alpha1.Devices) {}, []string{layout.ComputeContainer, layout.ConsoleLogContainer, "volume-root"}},
		{"logSerialConsole false", func(d *v1alpha1.Devices) { d.LogSerialConsole = off }, []string{layout.ComputeContainer, "volume-root"}},
		{"no serial console", func(d *v1alpha1.Devices) { d.AutoattachSerialConsole = off }, []string{layout.ComputeContainer, "volume-root"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod, err := Build(testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Volumes = []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "kubevisor/test-guest:latest"}}}}
				tc.edit(&v.Spec.Domain.Devices)
			}), testClass(), testConfig)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range pod.Spec.Containers {
				got = append(got, c.Name)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("containers %v, want %v", got, tc.want)
			}
		})
	}
}

// TestProbes checks that a VMI's probes become the compute container's, targeting the pod's
// address (no host), and that the other containers get none.
func TestProbes(t *testing.T) {
	tests := []struct {
		name                string
		liveness, readiness *v1alpha1.Probe
		wantLive, wantReady *corev1.Probe
	}{
		{name: "none"},
		{
			name: "httpGet readiness with its timings",
			readiness: &v1alpha1.Probe{
				ProbeHandler:        v1alpha1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt(80)}},
				InitialDelaySeconds: 3, TimeoutSeconds: 2, PeriodSeconds: 2, SuccessThreshold: 2, FailureThreshold: 4,
			},
			wantReady: &corev1.Probe{
				ProbeHandler:        corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt(80)}},
				InitialDelaySeconds: 3, TimeoutSeconds: 2, PeriodSeconds: 2, SuccessThreshold: 2, FailureThreshold: 4,
			},
		},
		{
			name:     "tcpSocket liveness, defaults left to the kubelet",
			liveness: &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(22)}}},
			wantLive: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(22)}}},
		},
		{
			name:      "both",
			liveness:  &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(22)}}, PeriodSeconds: 2, FailureThreshold: 2},
			readiness: &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt(80), Scheme: corev1.URISchemeHTTPS}}},
			wantLive:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(22)}}, PeriodSeconds: 2, FailureThreshold: 2},
			wantReady: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt(80), Scheme: corev1.URISchemeHTTPS}}},
		},
		{
			// Through the guest agent: kubevisor-probe asks the node handler at the VMI's guest
			// probe socket, within the probe's timeout (the kubelet's default 1 s when unset).
			name: "exec liveness and guestAgentPing readiness with their timings",
			liveness: &v1alpha1.Probe{
				ProbeHandler:        v1alpha1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/healthy"}}},
				InitialDelaySeconds: 20, TimeoutSeconds: 3, PeriodSeconds: 5, SuccessThreshold: 1, FailureThreshold: 6,
			},
			readiness: &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{GuestAgentPing: &v1alpha1.GuestAgentPing{}}, PeriodSeconds: 2, SuccessThreshold: 2},
			wantLive: &corev1.Probe{
				ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{
					"kubevisor-probe", "--socket", "/var/run/kubevisor/vmi/" + string(testUID) + "/guest-probe/probe.sock", "--timeout", "3s",
					"exec", "--", "cat", "/tmp/healthy",
				}}},
				InitialDelaySeconds: 20, TimeoutSeconds: 3, PeriodSeconds: 5, SuccessThreshold: 1, FailureThreshold: 6,
			},
			wantReady: &corev1.Probe{
				ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{
					"kubevisor-probe", "--socket", "/var/run/kubevisor/vmi/" + string(testUID) + "/guest-probe/probe.sock", "--timeout", "1s", "ping",
				}}},
				PeriodSeconds: 2, SuccessThreshold: 2,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vmi := testVMI(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.LivenessProbe, v.Spec.ReadinessProbe = tt.liveness, tt.readiness
				v.Spec.Volumes = []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{
					ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "example.org/disk:1"},
				}}}
			})
			pod, err := Build(vmi, testClass(), testConfig)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range pod.Spec.Containers {
				live, ready := c.LivenessProbe, c.ReadinessProbe
				wantLive, wantReady := tt.wantLive, tt.wantReady
				if c.Name != layout.ComputeContainer {
					wantLive, wantReady = nil, nil
				}
				if !equality.Semantic.DeepEqual(live, wantLive) {
					t.Errorf("%s: livenessProbe = %+v, want %+v", c.Name, live, wantLive)
				}
				if !equality.Semantic.DeepEqual(ready, wantReady) {
					t.Errorf("%s: readinessProbe = %+v, want %+v", c.Name, ready, wantReady)
				}
			}
			if len(pod.Spec.Containers) < 2 {
				t.Fatalf("want compute and a containerDisk container, got %d containers", len(pod.Spec.Containers))
			}
			// The VMI's probe is not shared with the pod's: changing one leaves the other.
			if tt.readiness != nil && tt.readiness.HTTPGet != nil {
				tt.readiness.HTTPGet.Path = "/changed"
				if pod.Spec.Containers[0].ReadinessProbe.HTTPGet.Path == "/changed" {
					t.Error("the pod's probe aliases the VMI's")
				}
			}
		})
	}
}

// TestHugepages: a VMI on huge pages requests its guest memory as hugepages-<size> (requests =
// limits) and keeps only the rest in its memory request and limit; compute, and compute alone,
// mounts an emptyDir of medium HugePages-<size> at layout.HugepagesDir.
func TestHugepages(t *testing.T) {
	res := func(pairs ...string) corev1.ResourceList {
		l := corev1.ResourceList{}
		for i := 0; i < len(pairs); i += 2 {
			l[corev1.ResourceName(pairs[i])] = q(pairs[i+1])
		}
		return l
	}
	hugepages := func(size string, mut ...func(*v1alpha1.VirtualMachineInstance)) *v1alpha1.VirtualMachineInstance {
		return testVMI(append([]func(*v1alpha1.VirtualMachineInstance){func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: size}
		}}, mut...)...)
	}
	tests := []struct {
		name     string
		vmi      *v1alpha1.VirtualMachineInstance
		class    *v1alpha1.HypervisorClass
		req, lim corev1.ResourceList
		medium   corev1.StorageMedium // "": no hugepages volume
		wantErr  string
	}{
		{
			name: "no hugepages: guest memory in the memory request",
			vmi:  testVMI(),
			req:  res("memory", "1124Mi", "cpu", "100m"), lim: res("memory", "1124Mi"),
		},
		{
			name:   "2Mi: the guest memory as hugepages-2Mi, only the overhead as memory",
			vmi:    hugepages("2Mi"),
			req:    res("memory", "100Mi", "cpu", "100m", "hugepages-2Mi", "1Gi"),
			lim:    res("memory", "100Mi", "hugepages-2Mi", "1Gi"),
			medium: "HugePages-2Mi",
		},
		{
			name: "1Gi with guest memory from requests.memory",
			vmi: hugepages("1Gi", func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Memory.Guest = nil
				v.Spec.Domain.Resources.Requests = res("memory", "2Gi")
			}),
			req:    res("memory", "100Mi", "cpu", "100m", "hugepages-1Gi", "2Gi"),
			lim:    res("memory", "100Mi", "hugepages-1Gi", "2Gi"),
			medium: "HugePages-1Gi",
		},
		{
			name: "requests and limits above the guest memory keep the difference as memory",
			vmi: hugepages("2Mi", func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Resources.Requests = res("memory", "1124Mi", "cpu", "1")
				v.Spec.Domain.Resources.Limits = res("memory", "1224Mi", "cpu", "1")
			}),
			req:    res("memory", "200Mi", "cpu", "1", "hugepages-2Mi", "1Gi"),
			lim:    res("memory", "300Mi", "cpu", "1", "hugepages-2Mi", "1Gi"),
			medium: "HugePages-2Mi",
		},
		{
			name: "overcommit: a memory request below the guest memory keeps no guest memory",
			vmi: hugepages("2Mi", func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Resources.Requests = res("memory", "512Mi")
			}),
			req:    res("memory", "100Mi", "cpu", "100m", "hugepages-2Mi", "1Gi"),
			lim:    res("memory", "100Mi", "hugepages-2Mi", "1Gi"),
			medium: "HugePages-2Mi",
		},
		{
			name: "class overhead stays memory",
			vmi:  hugepages("2Mi"),
			class: testClass(func(c *v1alpha1.HypervisorClass) {
				c.Overhead = &v1alpha1.HypervisorClassOverhead{PodFixed: res("memory", "64Mi")}
			}),
			req:    res("memory", "164Mi", "cpu", "100m", "hugepages-2Mi", "1Gi"),
			lim:    res("memory", "164Mi", "hugepages-2Mi", "1Gi"),
			medium: "HugePages-2Mi",
		},
		{
			name:    "a page size x86_64 lacks",
			vmi:     hugepages("4Mi"),
			wantErr: `huge page size "4Mi" is not one of 2Mi, 1Gi`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			class := tt.class
			if class == nil {
				class = testClass()
			}
			pod, err := Build(tt.vmi, class, testConfig)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := pod.Spec.Containers[0].Resources
			if !equality.Semantic.DeepEqual(got.Requests, tt.req) {
				t.Errorf("requests = %v, want %v", got.Requests, tt.req)
			}
			if !equality.Semantic.DeepEqual(got.Limits, tt.lim) {
				t.Errorf("limits = %v, want %v", got.Limits, tt.lim)
			}
			var vols []corev1.Volume
			for _, v := range pod.Spec.Volumes {
				if v.Name == HugepagesVolumeName {
					vols = append(vols, v)
				}
			}
			var mounts []corev1.VolumeMount
			for _, m := range pod.Spec.Containers[0].VolumeMounts {
				if m.Name == HugepagesVolumeName {
					mounts = append(mounts, m)
				}
			}
			if tt.medium == "" {
				if len(vols) != 0 || len(mounts) != 0 {
					t.Fatalf("hugepages volumes %+v and mounts %+v, want none", vols, mounts)
				}
				return
			}
			if len(vols) != 1 || vols[0].EmptyDir == nil || vols[0].EmptyDir.Medium != tt.medium || vols[0].EmptyDir.SizeLimit != nil {
				t.Fatalf("hugepages volumes %+v, want one emptyDir of medium %s", vols, tt.medium)
			}
			if len(mounts) != 1 || mounts[0].MountPath != layout.HugepagesDir || mounts[0].ReadOnly {
				t.Fatalf("compute's hugepages mounts %+v, want one at %s", mounts, layout.HugepagesDir)
			}
			for _, c := range pod.Spec.Containers[1:] {
				for _, m := range c.VolumeMounts {
					if m.Name == HugepagesVolumeName {
						t.Errorf("container %s mounts the huge pages", c.Name)
					}
				}
				if _, ok := c.Resources.Requests[tt.vmi.Spec.Domain.Memory.Hugepages.ResourceName()]; ok {
					t.Errorf("container %s requests huge pages", c.Name)
				}
			}
		})
	}
}

// TestDedicatedCPUs: a VMI with cpu.dedicatedCpuPlacement gets a Guaranteed launcher pod whose
// compute container has as many whole CPUs as the VMI has vCPUs (one more with
// isolateEmulatorThread), requests = limits for cpu and memory in every container, and a node
// selector on kubevisor.io/cpumanager=true.
func TestDedicatedCPUs(t *testing.T) {
	res := func(pairs ...string) corev1.ResourceList {
		l := corev1.ResourceList{}
		for i := 0; i < len(pairs); i += 2 {
			l[corev1.ResourceName(pairs[i])] = q(pairs[i+1])
		}
		return l
	}
	dedicated := func(mut ...func(*v1alpha1.VirtualMachineInstance)) *v1alpha1.VirtualMachineInstance {
		return testVMI(append([]func(*v1alpha1.VirtualMachineInstance){func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 1, Cores: 2, Threads: 1, DedicatedCPUPlacement: true}
		}}, mut...)...)
	}
	tests := []struct {
		name     string
		vmi      *v1alpha1.VirtualMachineInstance
		class    *v1alpha1.HypervisorClass
		res      corev1.ResourceList // compute's requests = limits
		selector map[string]string
		wantErr  string
	}{
		{
			name: "2 vCPUs: 2 CPUs",
			vmi:  dedicated(),
			res:  res("cpu", "2", "memory", "1124Mi"),
		},
		{
			name: "isolateEmulatorThread: one CPU more",
			vmi:  dedicated(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.CPU.IsolateEmulatorThread = true }),
			res:  res("cpu", "3", "memory", "1124Mi"),
		},
		{
			name: "vCPUs from the CPU request, memory from its limit",
			vmi: dedicated(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.CPU = &v1alpha1.CPU{DedicatedCPUPlacement: true}
				v.Spec.Domain.Resources.Requests = res("cpu", "4")
				v.Spec.Domain.Resources.Limits = res("memory", "2Gi")
			}),
			res: res("cpu", "4", "memory", "2148Mi"),
		},
		{
			name: "class overhead: memory added, cpu not (it would not be whole)",
			vmi:  dedicated(),
			class: testClass(func(c *v1alpha1.HypervisorClass) {
				c.Overhead = &v1alpha1.HypervisorClassOverhead{PodFixed: res("memory", "64Mi", "cpu", "250m")}
			}),
			res: res("cpu", "2", "memory", "1188Mi"),
		},
		{
			name: "on huge pages",
			vmi: dedicated(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
			}),
			res: res("cpu", "2", "memory", "100Mi", "hugepages-2Mi", "1Gi"),
		},
		{
			name:     "the VMI's node selector kept",
			vmi:      dedicated(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.NodeSelector = map[string]string{"zone": "a"} }),
			res:      res("cpu", "2", "memory", "1124Mi"),
			selector: map[string]string{"zone": "a", v1alpha1.CPUManagerNodeLabel: "true"},
		},
		{
			name: "a VMI selecting nodes without the CPU manager",
			vmi: dedicated(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.NodeSelector = map[string]string{v1alpha1.CPUManagerNodeLabel: "false"}
			}),
			wantErr: `node selector kubevisor.io/cpumanager: the VMI wants "false" and cpu.dedicatedCpuPlacement needs "true"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			class := tt.class
			if class == nil {
				class = testClass()
			}
			pod, err := Build(tt.vmi, class, testConfig)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := pod.Spec.Containers[0].Resources
			if !equality.Semantic.DeepEqual(got.Requests, tt.res) || !equality.Semantic.DeepEqual(got.Limits, tt.res) {
				t.Errorf("compute requests %v, limits %v, want both %v", got.Requests, got.Limits, tt.res)
			}
			// The Guaranteed QoS class: every container has cpu and memory limits equal to its
			// requests.
			for _, c := range pod.Spec.Containers {
				for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
					r, l := c.Resources.Requests[name], c.Resources.Limits[name]
					if l.IsZero() || r.Cmp(l) != 0 {
						t.Errorf("container %s: %s request %s, limit %s: not Guaranteed", c.Name, name, r.String(), l.String())
					}
				}
			}
			want := tt.selector
			if want == nil {
				want = map[string]string{v1alpha1.CPUManagerNodeLabel: "true"}
			}
			if !equality.Semantic.DeepEqual(pod.Spec.NodeSelector, want) {
				t.Errorf("node selector %v, want %v", pod.Spec.NodeSelector, want)
			}
		})
	}

	// Without dedicatedCpuPlacement, no node selector and the usual fraction of a CPU.
	pod, err := Build(testVMI(), testClass(), testConfig)
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeSelector != nil {
		t.Errorf("node selector %v without dedicated CPUs, want none", pod.Spec.NodeSelector)
	}
}

// TestSELinuxLevel: the VMI's status.selinuxLevel is the pod's SELinux level, and the only
// SELinux option the pod sets (the runtime picks user, role and type); a VMI without one gets a
// pod without SELinux options, and a level that is not one of the allocator's is refused.
func TestSELinuxLevel(t *testing.T) {
	withLevel := func(level string) *v1alpha1.VirtualMachineInstance {
		return testVMI(func(v *v1alpha1.VirtualMachineInstance) {
			v.Status.SELinuxLevel = level
			v.Spec.Volumes = []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "kubevisor/test-guest:latest"}}}}
		})
	}
	pod, err := Build(withLevel("s0:c17,c903"), testClass(), testConfig)
	if err != nil {
		t.Fatal(err)
	}
	want := &corev1.PodSecurityContext{
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		SELinuxOptions: &corev1.SELinuxOptions{Level: "s0:c17,c903"},
		RunAsNonRoot:   ptr.To(true), RunAsUser: ptr.To[int64](107), RunAsGroup: ptr.To[int64](107), FSGroup: ptr.To[int64](107),
	}
	if !equality.Semantic.DeepEqual(pod.Spec.SecurityContext, want) {
		t.Errorf("pod security context %+v, want %+v", pod.Spec.SecurityContext, want)
	}
	// Every container (compute, guest-console-log, the containerDisk's) runs at the pod's level:
	// none sets its own.
	if len(pod.Spec.Containers) != 3 {
		t.Fatalf("%d containers, want compute, guest-console-log and volume-root", len(pod.Spec.Containers))
	}
	for _, c := range pod.Spec.Containers {
		if c.SecurityContext != nil && c.SecurityContext.SELinuxOptions != nil {
			t.Errorf("container %s sets SELinux options %+v", c.Name, c.SecurityContext.SELinuxOptions)
		}
	}

	pod, err = Build(withLevel(""), testClass(), testConfig)
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.SecurityContext.SELinuxOptions != nil {
		t.Errorf("a VMI without a level: pod SELinux options %+v", pod.Spec.SecurityContext.SELinuxOptions)
	}
	for _, bad := range []string{"s0:c903,c17", "s0", "s0:c1,c1024", "s0:c1,c2 ", "system_u:system_r:spc_t:s0"} {
		if _, err := Build(withLevel(bad), testClass(), testConfig); err == nil || !strings.Contains(err.Error(), "status.selinuxLevel") {
			t.Errorf("level %q: %v, want an error naming status.selinuxLevel", bad, err)
		}
	}
}
