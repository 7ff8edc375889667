package launcherpod

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
)

// TestStateClaim: a VMI with a persistent TPM or persistent EFI variables has a persistent state
// claim named for its VM and owned by it (for a VMI of no VM: its own), of the configured class,
// and its launcher pod mounts it in the compute container at layout.VMStateDir; any other VMI has
// neither.
func TestStateClaim(t *testing.T) {
	persistentTPM := func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Persistent: ptr.To(true)}
	}
	persistentEFI := func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{Persistent: ptr.To(true)}}}
	}
	ofVM := func(v *v1alpha1.VirtualMachineInstance) {
		v.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachine", Name: "db", UID: "vm-uid", Controller: ptr.To(true),
		}}
	}
	tests := []struct {
		name      string
		vmi       *v1alpha1.VirtualMachineInstance
		cfg       Config
		wantName  string // "": no claim
		wantOwner string
		wantClass *string
	}{
		{name: "no persistence", vmi: testVMI()},
		{name: "a TPM that is not persistent", vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{} })},
		{name: "persistent but disabled TPM", vmi: testVMI(func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Enabled: ptr.To(false), Persistent: ptr.To(true)}
		})},
		{name: "persistent TPM of a VM", vmi: testVMI(persistentTPM, ofVM), cfg: testConfig,
			wantName: "persistent-state-for-db", wantOwner: "VirtualMachine/db"},
		{name: "persistent EFI of a lone VMI, configured class", vmi: testVMI(persistentEFI),
			cfg:      Config{LauncherImage: "img", StateStorageClass: "fast"},
			wantName: "persistent-state-for-" + testVMI().Name, wantOwner: "VirtualMachineInstance/" + testVMI().Name, wantClass: ptr.To("fast")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			if cfg.LauncherImage == "" {
				cfg = testConfig
			}
			claim := StateClaim(tt.vmi, cfg)
			pod, err := Build(tt.vmi, testClass(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			var vol *corev1.Volume
			for i := range pod.Spec.Volumes {
				if pod.Spec.Volumes[i].Name == StateVolumeName {
					vol = &pod.Spec.Volumes[i]
				}
			}
			mounted := false
			for _, m := range pod.Spec.Containers[0].VolumeMounts {
				if m.Name == StateVolumeName {
					mounted = m.MountPath == layout.VMStateDir && !m.ReadOnly
				}
			}
			if tt.wantName == "" {
				if claim != nil || vol != nil {
					t.Fatalf("claim %v, pod volume %v: want none", claim, vol)
				}
				return
			}
			if claim == nil {
				t.Fatal("no claim")
			}
			if claim.Name != tt.wantName || claim.Namespace != tt.vmi.Namespace {
				t.Errorf("claim %s/%s, want %s/%s", claim.Namespace, claim.Name, tt.vmi.Namespace, tt.wantName)
			}
			if len(claim.OwnerReferences) != 1 || claim.OwnerReferences[0].Kind+"/"+claim.OwnerReferences[0].Name != tt.wantOwner {
				t.Errorf("owners %+v, want %s", claim.OwnerReferences, tt.wantOwner)
			}
			if !ptr.Equal(claim.Spec.StorageClassName, tt.wantClass) {
				t.Errorf("storage class %v, want %v", ptr.Deref(claim.Spec.StorageClassName, "<default>"), ptr.Deref(tt.wantClass, "<default>"))
			}
			if got := claim.Spec.Resources.Requests[corev1.ResourceStorage]; got.Cmp(DefaultStateClaimSize) != 0 {
				t.Errorf("size %s, want %s", got.String(), DefaultStateClaimSize.String())
			}
			if vol == nil || vol.PersistentVolumeClaim == nil || vol.PersistentVolumeClaim.ClaimName != tt.wantName || !mounted {
				t.Errorf("pod volume %+v (mounted read-write at %s in compute: %v), want claim %s", vol, layout.VMStateDir, mounted, tt.wantName)
			}
			if p := pod.Spec.Containers[0].VolumeMounts[0].MountPropagation; ptr.Deref(p, "") != corev1.MountPropagationHostToContainer {
				t.Errorf("compute's VMI directory propagation %v, want HostToContainer (the handler mounts the state there)", p)
			}
			for _, c := range pod.Spec.Containers[1:] {
				for _, m := range c.VolumeMounts {
					if m.Name == StateVolumeName {
						t.Errorf("container %s mounts the state claim too", c.Name)
					}
				}
			}
		})
	}
}
