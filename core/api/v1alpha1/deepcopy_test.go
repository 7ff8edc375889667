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
	"encoding/json"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/randfill"
)

// sampleVMI returns a VMI with nested pointers, maps and slices set at every level this test mutates.
func sampleVMI() *VirtualMachineInstance {
	now := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	guest := resource.MustParse("1Gi")
	return &VirtualMachineInstance{
		TypeMeta: metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: "VirtualMachineInstance"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "vmi", Namespace: "default",
			Labels:      map[string]string{"app": "web"},
			Annotations: map[string]string{"note": "a"},
			Finalizers:  []string{TeardownFinalizer},
		},
		Spec: VirtualMachineInstanceSpec{
			Domain: DomainSpec{
				Resources: ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
				},
				CPU:     &CPU{Cores: 2, Sockets: 1, Threads: 1, Model: "host-model"},
				Memory:  &Memory{Guest: &guest},
				Machine: &Machine{Type: "q35"},
				Firmware: &Firmware{
					UUID:       "uuid",
					Bootloader: &Bootloader{EFI: &EFI{SecureBoot: ptr.To(true)}},
					KernelBoot: &KernelBoot{KernelArgs: "console=ttyS0", Container: &KernelBootContainer{Image: "kernel:1"}},
				},
				Devices: Devices{
					Disks: []Disk{
						{Name: "root", DiskDevice: DiskDevice{Disk: &DiskTarget{Bus: DiskBusVirtio}}, BootOrder: ptr.To[uint](1)},
						{Name: "iso", DiskDevice: DiskDevice{CDRom: &CDRomTarget{ReadOnly: ptr.To(true), Tray: TrayStateClosed}}},
					},
					Interfaces: []Interface{{
						Name:                   "default",
						InterfaceBindingMethod: InterfaceBindingMethod{Masquerade: &InterfaceMasquerade{}},
						Ports:                  []Port{{Name: "ssh", Port: 22}},
						BootOrder:              ptr.To[uint](2),
					}},
					AutoattachSerialConsole: ptr.To(true),
				},
			},
			NodeSelector: map[string]string{"kubernetes.io/arch": "amd64"},
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
						{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}},
					}}},
				},
			}},
			Tolerations:                   []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists, TolerationSeconds: ptr.To[int64](5)}},
			EvictionStrategy:              ptr.To(EvictionStrategyLiveMigrate),
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			Volumes: []Volume{
				{Name: "root", VolumeSource: VolumeSource{ContainerDisk: &ContainerDiskSource{Image: "disk:1"}}},
				{Name: "data", VolumeSource: VolumeSource{HostDisk: &HostDisk{Path: "/d.img", Type: HostDiskExistsOrCreate, Capacity: resource.MustParse("1Gi"), Shared: ptr.To(false)}}},
				{Name: "ci", VolumeSource: VolumeSource{CloudInitNoCloud: &CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: "s"}}}},
			},
			Networks:            []Network{{Name: "default", NetworkSource: NetworkSource{Pod: &PodNetwork{VMNetworkCIDR: "10.0.2.0/24"}}}},
			HypervisorClassName: "qemu",
		},
		Status: VirtualMachineInstanceStatus{
			NodeName:   "node1",
			Phase:      Running,
			Conditions: []VirtualMachineInstanceCondition{{Type: VirtualMachineInstanceReady, Status: corev1.ConditionTrue, LastTransitionTime: now, ObservedGeneration: 1}},
			Interfaces: []VirtualMachineInstanceNetworkInterface{{Name: "default", IP: "10.0.0.5", IPs: []string{"10.0.0.5", "fd00::5"}}},
			MigrationState: &VirtualMachineInstanceMigrationState{
				StartTimestamp: &now, SourceNode: "node1", TargetNode: "node2", MigrationUID: types.UID("m1"),
			},
			LauncherPodName:     "launcher-vmi-abcde",
			HypervisorClassName: "qemu",
		},
	}
}

// TestDeepCopyIndependence mutates every nested pointer, map and slice of a copy and checks that the
// original does not change.
func TestDeepCopyIndependence(t *testing.T) {
	orig := sampleVMI()
	before, err := json.Marshal(orig)
	if err != nil {
		t.Fatal(err)
	}

	cp := orig.DeepCopy()
	if !apiequality.Semantic.DeepEqual(orig, cp) {
		t.Fatal("DeepCopy is not equal to the original")
	}
	if obj := orig.DeepCopyObject(); !apiequality.Semantic.DeepEqual(runtime.Object(orig), obj) {
		t.Fatal("DeepCopyObject is not equal to the original")
	}

	cp.Labels["app"] = "db"
	cp.Annotations["note"] = "b"
	cp.Finalizers[0] = "other"
	d := &cp.Spec.Domain
	d.Resources.Requests[corev1.ResourceMemory] = resource.MustParse("8Gi")
	d.Resources.Limits[corev1.ResourceCPU] = resource.MustParse("16")
	d.CPU.Cores = 64
	d.Memory.Guest.Add(resource.MustParse("1Gi"))
	d.Machine.Type = "pc"
	*d.Firmware.Bootloader.EFI.SecureBoot = false
	d.Firmware.KernelBoot.Container.Image = "kernel:2"
	d.Devices.Disks[0].Disk.Bus = DiskBusSATA
	*d.Devices.Disks[0].BootOrder = 9
	*d.Devices.Disks[1].CDRom.ReadOnly = false
	d.Devices.Interfaces[0].Ports[0].Port = 2222
	*d.Devices.Interfaces[0].BootOrder = 8
	*d.Devices.AutoattachSerialConsole = false
	cp.Spec.NodeSelector["kubernetes.io/arch"] = "arm64"
	cp.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Values[0] = "b"
	*cp.Spec.Tolerations[0].TolerationSeconds = 99
	*cp.Spec.EvictionStrategy = EvictionStrategyNone
	*cp.Spec.TerminationGracePeriodSeconds = 0
	cp.Spec.Volumes[0].ContainerDisk.Image = "disk:2"
	cp.Spec.Volumes[1].HostDisk.Capacity.Add(resource.MustParse("1Gi"))
	*cp.Spec.Volumes[1].HostDisk.Shared = true
	cp.Spec.Volumes[2].CloudInitNoCloud.UserDataSecretRef.Name = "other"
	cp.Spec.Networks[0].Pod.VMNetworkCIDR = "10.1.0.0/16"
	cp.Status.Conditions[0].Status = corev1.ConditionFalse
	cp.Status.Conditions[0].LastTransitionTime.Time = cp.Status.Conditions[0].LastTransitionTime.Add(time.Hour)
	cp.Status.Interfaces[0].IPs[1] = "fd00::6"
	cp.Status.MigrationState.TargetNode = "node3"
	*cp.Status.MigrationState.StartTimestamp = metav1.NewTime(time.Unix(0, 0))

	after, err := json.Marshal(orig)
	if err != nil {
		t.Fatal(err)
	}
	if string(before) != string(after) {
		t.Errorf("mutating the copy changed the original:\nbefore: %s\n after: %s", before, after)
	}
	if apiequality.Semantic.DeepEqual(orig, cp) {
		t.Error("the mutations did not reach the copy")
	}
}

// filler fills every field of an object (no nils, non-empty maps and slices) with values that
// survive a JSON round trip.
func filler(seed int64) *randfill.Filler {
	return randfill.NewWithSeed(seed).NilChance(0).NumElements(1, 2).Funcs(
		func(q *resource.Quantity, c randfill.Continue) {
			*q = *resource.NewQuantity(c.Int63n(1<<40), resource.BinarySI)
		},
		func(tm *metav1.Time, c randfill.Continue) {
			*tm = metav1.NewTime(time.Unix(c.Int63n(1<<32), 0).UTC())
		},
		func(f *metav1.FieldsV1, c randfill.Continue) {
			f.SetRawString(`{"f:metadata":{}}`)
		},
	)
}

// rootObjects returns an empty object of each kind of this package.
func rootObjects() []runtime.Object {
	return []runtime.Object{
		&VirtualMachine{}, &VirtualMachineList{},
		&VirtualMachineInstance{}, &VirtualMachineInstanceList{},
		&VirtualMachineInstanceReplicaSet{}, &VirtualMachineInstanceReplicaSetList{},
		&VirtualMachineInstanceMigration{}, &VirtualMachineInstanceMigrationList{},
		&HypervisorClass{}, &HypervisorClassList{},
	}
}

// TestDeepCopyNoAliasing fills every field of every kind and checks that the generated DeepCopy
// shares no pointer, map or slice with its source.
func TestDeepCopyNoAliasing(t *testing.T) {
	for i, proto := range rootObjects() {
		for seed := int64(0); seed < 5; seed++ {
			obj := proto.DeepCopyObject()
			filler(seed + int64(i)*100).Fill(obj)
			cp := obj.DeepCopyObject()
			if !apiequality.Semantic.DeepEqual(obj, cp) {
				t.Fatalf("%T: copy differs from original", obj)
			}
			checkNoAliasing(t, reflect.ValueOf(obj), reflect.ValueOf(cp), reflect.TypeOf(obj).Elem().Name())
		}
	}
}

var (
	timeType     = reflect.TypeFor[time.Time]()
	quantityType = reflect.TypeFor[resource.Quantity]()
)

func checkNoAliasing(t *testing.T, a, b reflect.Value, path string) {
	t.Helper()
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() {
			return
		}
		// Go gives every zero-size allocation (new(InterfaceBridge)) the same address.
		if a.Pointer() == b.Pointer() && a.Type().Elem().Size() > 0 {
			t.Errorf("%s: copy shares the pointer", path)
			return
		}
		checkNoAliasing(t, a.Elem(), b.Elem(), path)
	case reflect.Map:
		if a.Len() == 0 {
			return
		}
		if a.Pointer() == b.Pointer() {
			t.Errorf("%s: copy shares the map", path)
			return
		}
		iter := a.MapRange()
		for iter.Next() {
			checkNoAliasing(t, iter.Value(), b.MapIndex(iter.Key()), path+"["+iter.Key().String()+"]")
		}
	case reflect.Slice:
		if a.Len() == 0 {
			return
		}
		if a.Pointer() == b.Pointer() {
			t.Errorf("%s: copy shares the slice", path)
			return
		}
		for i := range a.Len() {
			checkNoAliasing(t, a.Index(i), b.Index(i), path+"[]")
		}
	case reflect.Struct:
		if a.Type() == timeType || a.Type() == quantityType {
			return // immutable in practice; copied by their own DeepCopy
		}
		for i := range a.NumField() {
			if !a.Type().Field(i).IsExported() {
				continue
			}
			checkNoAliasing(t, a.Field(i), b.Field(i), path+"."+a.Type().Field(i).Name)
		}
	}
}

// TestJSONRoundTrip fills every field of every kind, encodes it, and decodes it with the API
// server's strict decoder: every field must have a JSON name and come back unchanged.
func TestJSONRoundTrip(t *testing.T) {
	for i, proto := range rootObjects() {
		for seed := int64(0); seed < 20; seed++ {
			obj := proto.DeepCopyObject()
			filler(seed + int64(i)*1000).Fill(obj)
			data, err := json.Marshal(obj)
			if err != nil {
				t.Fatalf("%T: marshal: %v", obj, err)
			}
			got := proto.DeepCopyObject()
			strictErrs, err := kjson.UnmarshalStrict(data, got)
			if err != nil || len(strictErrs) > 0 {
				t.Fatalf("%T: strict unmarshal: %v %v", obj, err, strictErrs)
			}
			if !apiequality.Semantic.DeepEqual(obj, got) {
				t.Fatalf("%T: round trip changed the object:\n%s", obj, data)
			}
		}
	}
}
