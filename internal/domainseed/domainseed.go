// Package domainseed gives tests realistic domain specs: the ones the node handler assembles
// (core/domain/assemble) for the KubeVirt example manifests of core/api's tests, with made-up
// results of the storage and network drivers. Fuzz targets of what a hypervisor driver receives
// take them as seeds.
package domainseed

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/domain/assemble"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// UID is the VMI UID of every spec: its id, and in its paths.
const UID = "6a1f0c1e-0000-4000-8000-000000000001"

// Specs returns the domain specs of the example manifests that assemble (at least two; a
// manifest of a migration or with an unsupported volume does not).
func Specs(tb testing.TB) []*domainv1.DomainSpec {
	_, self, _, _ := runtime.Caller(0)
	files, err := filepath.Glob(filepath.Join(filepath.Dir(self), "..", "..", "core", "api", "v1alpha1", "testdata", "kubevirt", "*.yaml"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("no example manifests: %v", err)
	}
	var out []*domainv1.DomainSpec
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		// Each manifest is a VMI (spec), or a VM or replica set (spec.template.spec).
		var obj struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
			Spec     struct {
				v1alpha1.VirtualMachineInstanceSpec `json:",inline"`
				Template                            *v1alpha1.VirtualMachineInstanceTemplateSpec `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(data, &obj); err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
		vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: obj.Metadata, Spec: obj.Spec.VirtualMachineInstanceSpec}
		if t := obj.Spec.Template; t != nil {
			vmi.Spec = t.Spec
		}
		vmi.Namespace, vmi.UID = "default", UID
		if spec, err := assemble.Domain(vmi, inputs(vmi)); err == nil {
			out = append(out, spec)
		}
	}
	if len(out) < 2 {
		tb.Fatalf("%d of %d example manifests assemble into a domain spec", len(out), len(files))
	}
	return out
}

// inputs are the other drivers' results for vmi: a qcow2 overlay per volume (an ISO for
// cloud-init), a tap per interface, and the node's directories and CPUs.
func inputs(vmi *v1alpha1.VirtualMachineInstance) assemble.Inputs {
	dir := "/var/lib/kubevisor/volumes/" + UID
	run := "/run/kubevisor/vmis/" + UID
	in := assemble.Inputs{
		Disks:              map[string]*storagev1.PreparedDisk{},
		Interfaces:         map[string]*networkv1.InterfaceResult{},
		RunDir:             run,
		Sandbox:            &domainv1.Sandbox{NetnsPath: "/run/netns/kv-6a1f0c1e", LauncherSocket: run + "/launcher.sock"},
		Kernel:             &assemble.KernelArtifacts{KernelPath: dir + "/kernel/vmlinuz", InitrdPath: dir + "/kernel/initrd"},
		HugepagesDir:       "/dev/hugepages",
		CPUs:               []uint32{2, 3, 4, 5},
		PersistentStateDir: "/var/lib/kubevisor/persistent/default/" + vmi.Name,
	}
	for _, v := range vmi.Spec.Volumes {
		d := &storagev1.PreparedDisk{VolumeName: v.Name, Path: dir + "/" + v.Name + ".qcow2", Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2}
		if v.CloudInitNoCloud != nil {
			d.Path, d.Format, d.ReadOnly, d.Cdrom = dir+"/"+v.Name+".iso", domainv1.DiskFormat_DISK_FORMAT_RAW, true, true
		}
		in.Disks[v.Name] = d
	}
	for i, iface := range vmi.Spec.Domain.Devices.Interfaces {
		in.Interfaces[iface.Name] = &networkv1.InterfaceResult{Name: iface.Name, TapName: fmt.Sprintf("tap%d", i),
			Mac: fmt.Sprintf("02:00:00:00:00:%02x", i+1), IpAddresses: []string{fmt.Sprintf("10.0.2.%d/24", i+2)}, Mtu: 1450}
	}
	return in
}
