/*
Copyright 2026 The Kubevisor Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package v1alpha1

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// kubevirtAPIVersion is the apiVersion of the KubeVirt manifests under testdata/kubevirt.
const kubevirtAPIVersion = "kubevirt.io/v1"

// convertKubeVirtManifest does what "vmctl convert" does: it replaces the apiVersion, and nothing else.
func convertKubeVirtManifest(t *testing.T, data []byte) []byte {
	t.Helper()
	old := []byte("\napiVersion: " + kubevirtAPIVersion + "\n")
	if bytes.Count(data, old) != 1 {
		t.Fatalf("manifest must have exactly one top-level apiVersion: %s line", kubevirtAPIVersion)
	}
	return bytes.Replace(data, old, []byte("\napiVersion: "+GroupVersion.String()+"\n"), 1)
}

// newObjectForKind returns an empty object of one of this package's kinds.
func newObjectForKind(t *testing.T, kind string) runtime.Object {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	obj, err := scheme.New(GroupVersion.WithKind(kind))
	if err != nil {
		t.Fatalf("kind %q: %v", kind, err)
	}
	return obj
}

// decodeStrict decodes YAML into obj twice: with sigs.k8s.io/yaml's UnmarshalStrict, and with the
// case-sensitive, strict JSON decoder the API server uses. Both must accept it.
func decodeStrict(t *testing.T, data []byte, obj runtime.Object) error {
	t.Helper()
	if err := yaml.UnmarshalStrict(data, obj); err != nil {
		return err
	}
	jsonData, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	again := obj.DeepCopyObject()
	strictErrs, err := kjson.UnmarshalStrict(jsonData, again)
	if err != nil {
		return err
	}
	if len(strictErrs) > 0 {
		return strictErrs[0]
	}
	return nil
}

// normalize drops nulls and empty objects, which a typed round trip may add (status: {}) or drop
// (creationTimestamp: null) without changing meaning.
func normalize(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range v {
			e = normalize(e)
			if e == nil {
				continue
			}
			if m, ok := e.(map[string]any); ok && len(m) == 0 {
				continue
			}
			out[k] = e
		}
		return out
	case []any:
		out := make([]any, 0, len(v))
		for _, e := range v {
			out = append(out, normalize(e))
		}
		return out
	default:
		return v
	}
}

func toGeneric(t *testing.T, jsonData []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(jsonData, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestKubeVirtManifestsConvert checks the promise of the API: a KubeVirt manifest of the supported
// subset becomes a Kubevisor manifest by changing its apiVersion. Each manifest must decode strictly
// into the Go type, survive the round trip back to JSON unchanged, and lose nothing to the pruning
// the API server does with the generated CRD schema.
func TestKubeVirtManifestsConvert(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "kubevirt", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crds := loadCRDs(t)
	tested := 0
	for _, f := range files {
		if strings.Contains(f, "unsupported") {
			continue
		}
		tested++
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			data := convertKubeVirtManifest(t, raw)

			var meta struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal(data, &meta); err != nil {
				t.Fatal(err)
			}
			obj := newObjectForKind(t, meta.Kind)
			if err := decodeStrict(t, data, obj); err != nil {
				t.Fatalf("strict decode as %s: %v", meta.Kind, err)
			}

			// Round trip: typed object back to JSON equals the manifest.
			inJSON, err := yaml.YAMLToJSON(data)
			if err != nil {
				t.Fatal(err)
			}
			outJSON, err := json.Marshal(obj)
			if err != nil {
				t.Fatal(err)
			}
			in, out := normalize(toGeneric(t, inJSON)), normalize(toGeneric(t, outJSON))
			if !reflect.DeepEqual(in, out) {
				t.Errorf("round trip changed the manifest\n in: %s\nout: %s", mustJSON(t, in), mustJSON(t, out))
			}

			// Pruning: the CRD schema knows every field of the manifest.
			var crdName string
			for name, crd := range crds {
				if crd.Spec.Names.Kind == meta.Kind {
					crdName = name
				}
			}
			s, errs := structuralSchema(t, crds[crdName])
			if len(errs) > 0 {
				t.Fatal(errs.ToAggregate())
			}
			generic := toGeneric(t, inJSON)
			if pruned := pruning.PruneWithOptions(generic, s, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}); len(pruned) > 0 {
				t.Errorf("the %s CRD schema prunes fields of the manifest: %v", crdName, pruned)
			}
		})
	}
	if tested < 5 {
		t.Fatalf("only %d manifests tested", tested)
	}
}

// TestKubeVirtVMFedora checks the decoded content of the main example field by field.
func TestKubeVirtVMFedora(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "kubevirt", "vm-fedora.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	vm := &VirtualMachine{}
	if err := decodeStrict(t, convertKubeVirtManifest(t, raw), vm); err != nil {
		t.Fatal(err)
	}

	if vm.APIVersion != "kubevisor.io/v1alpha1" || vm.Kind != "VirtualMachine" || vm.Name != "vm-fedora" {
		t.Errorf("type/object meta = %s %s %s", vm.APIVersion, vm.Kind, vm.Name)
	}
	if vm.Spec.Running != nil || vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != RunStrategyAlways {
		t.Errorf("running = %v, runStrategy = %v", vm.Spec.Running, vm.Spec.RunStrategy)
	}
	tmpl := vm.Spec.Template
	if tmpl == nil {
		t.Fatal("no template")
	}
	if tmpl.ObjectMeta.Labels["kubevirt.io/vm"] != "vm-fedora" {
		t.Errorf("template labels = %v", tmpl.ObjectMeta.Labels)
	}
	spec := tmpl.Spec
	d := spec.Domain
	if d.CPU == nil || d.CPU.Cores != 2 || d.CPU.Sockets != 1 || d.CPU.Threads != 1 || d.CPU.Model != "host-passthrough" {
		t.Errorf("cpu = %+v", d.CPU)
	}
	if d.Memory == nil || d.Memory.Guest == nil || d.Memory.Guest.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("memory = %+v", d.Memory)
	}
	if d.Devices.Rng == nil {
		t.Error("devices.rng: {} did not decode into a virtio entropy device")
	}
	if q := d.Resources.Requests[corev1.ResourceMemory]; q.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("memory request = %s", q.String())
	}
	if q := d.Resources.Limits[corev1.ResourceCPU]; q.Cmp(resource.MustParse("2")) != 0 {
		t.Errorf("cpu limit = %s", q.String())
	}
	if d.Machine == nil || d.Machine.Type != "q35" {
		t.Errorf("machine = %+v", d.Machine)
	}
	if fw := d.Firmware; fw == nil || fw.Bootloader == nil || fw.Bootloader.EFI == nil ||
		fw.Bootloader.EFI.SecureBoot == nil || *fw.Bootloader.EFI.SecureBoot {
		t.Errorf("firmware = %+v", d.Firmware)
	}
	if c := d.Devices.AutoattachSerialConsole; c == nil || !*c {
		t.Errorf("autoattachSerialConsole = %v", c)
	}
	if len(d.Devices.Disks) != 2 {
		t.Fatalf("disks = %+v", d.Devices.Disks)
	}
	if disk := d.Devices.Disks[0]; disk.Name != "containerdisk" || disk.Disk == nil || disk.Disk.Bus != DiskBusVirtio ||
		disk.BootOrder == nil || *disk.BootOrder != 1 {
		t.Errorf("disk[0] = %+v", disk)
	}
	if len(d.Devices.Interfaces) != 1 {
		t.Fatalf("interfaces = %+v", d.Devices.Interfaces)
	}
	iface := d.Devices.Interfaces[0]
	if iface.Name != "default" || iface.Masquerade == nil || iface.Bridge != nil || iface.Model != "virtio" {
		t.Errorf("interface = %+v", iface)
	}
	if len(iface.Ports) != 1 || iface.Ports[0] != (Port{Name: "ssh", Protocol: "TCP", Port: 22}) {
		t.Errorf("ports = %+v", iface.Ports)
	}
	if len(spec.Networks) != 1 || spec.Networks[0].Name != "default" || spec.Networks[0].Pod == nil || spec.Networks[0].Multus != nil {
		t.Errorf("networks = %+v", spec.Networks)
	}
	if len(spec.Volumes) != 2 {
		t.Fatalf("volumes = %+v", spec.Volumes)
	}
	if cd := spec.Volumes[0].ContainerDisk; cd == nil || cd.Image != "quay.io/containerdisks/fedora:40" || cd.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("containerDisk = %+v", cd)
	}
	if ci := spec.Volumes[1].CloudInitNoCloud; ci == nil || !strings.HasPrefix(ci.UserData, "#cloud-config\npassword: fedora") {
		t.Errorf("cloudInitNoCloud = %+v", ci)
	}
	if spec.EvictionStrategy == nil || *spec.EvictionStrategy != EvictionStrategyLiveMigrate {
		t.Errorf("evictionStrategy = %v", spec.EvictionStrategy)
	}
	if spec.TerminationGracePeriodSeconds == nil || *spec.TerminationGracePeriodSeconds != 180 {
		t.Errorf("terminationGracePeriodSeconds = %v", spec.TerminationGracePeriodSeconds)
	}
	if spec.NodeSelector["kubernetes.io/arch"] != "amd64" || len(spec.Tolerations) != 1 || spec.Hostname != "fedora" {
		t.Errorf("scheduling = %v %v %q", spec.NodeSelector, spec.Tolerations, spec.Hostname)
	}
	if spec.HypervisorClassName != "" {
		t.Errorf("hypervisorClassName = %q, want empty (default class)", spec.HypervisorClassName)
	}
}

// TestKubeVirtUnsupportedFieldRejected checks that a KubeVirt field outside the subset is an error
// that names the field, rather than being dropped silently.
func TestKubeVirtUnsupportedFieldRejected(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "kubevirt", "vm-datavolume-unsupported.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	err = decodeStrict(t, convertKubeVirtManifest(t, raw), &VirtualMachine{})
	if err == nil || !strings.Contains(err.Error(), "dataVolume") {
		t.Fatalf("err = %v, want an unknown field error naming dataVolume", err)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
