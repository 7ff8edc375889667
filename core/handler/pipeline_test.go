package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/drivers/fake"
)

var fakeSet = DriverSet{Hypervisor: fakeHV, Network: testNetwork, Storage: testStorage}

func TestSyncRunsAndStopRemovesEverything(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	h := e.start()
	vmi := testVMI("demo", "uid-demo", e.disk)

	st := mustRun(t, h, vmi)
	if st.NodeName != "node-1" {
		t.Errorf("nodeName = %q", st.NodeName)
	}
	if c := Condition(st, v1alpha1.VirtualMachineInstanceReady); c == nil || c.Status != corev1.ConditionTrue {
		t.Errorf("Ready = %+v, want True", c)
	}
	if len(st.Interfaces) != 1 || st.Interfaces[0].Name != "default" || st.Interfaces[0].MAC == "" ||
		st.Interfaces[0].IP == "" || strings.Contains(st.Interfaces[0].IP, "/") || st.Interfaces[0].InterfaceName != "eth0" {
		t.Errorf("interfaces = %+v", st.Interfaces)
	}
	// The state records every step and the handle.
	raw, err := os.ReadFile(filepath.Join(e.cfg.StateDir, "vmis", "uid-demo.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"started": true`, `"handle"`, `"storage"`, `"network"`, `"hypervisor"`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("state %s lacks %s", raw, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(e.cfg.StateDir, "vmis")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("vmis directory: %v %v", fi.Mode(), err)
	}

	// A second Sync changes nothing: the VM is not started again.
	again := mustRun(t, h, vmi)
	if again.Phase != v1alpha1.Running {
		t.Errorf("second Sync: %s", again.Phase)
	}
	hv, _ := h.host.Hypervisor(fakeHV)
	vs, err := hv.Status(context.Background(), "uid-demo")
	if err != nil || vs.GetBoots() != 1 {
		t.Errorf("Status = %v, %v; want 1 boot", vs, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	final, err := h.Stop(ctx, vmi, 5*time.Second)
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if final.Phase != v1alpha1.Succeeded {
		t.Errorf("phase after Stop = %s, want Succeeded", final.Phase)
	}
	requireNothingLeft(t, h, vmi.UID)
	if got := e.rec.phases(vmi.UID); !equalPhases(got, v1alpha1.Scheduled, v1alpha1.Running, v1alpha1.Succeeded) {
		t.Errorf("phases = %v", got)
	}
	// Stop is idempotent.
	if _, err := h.Stop(ctx, vmi, time.Second); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func equalPhases(got []v1alpha1.VirtualMachineInstancePhase, want ...v1alpha1.VirtualMachineInstancePhase) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

func TestGuestShutdownSucceedsAndEventsReachStatus(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	var (
		mu     sync.Mutex
		events []string
	)
	e.opts.OnEvent = func(uid types.UID, ev *hypervisorv1.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, string(uid)+":"+ev.GetReason())
	}
	h := e.start()
	vmi := testVMI("demo", "uid-events", e.disk)
	mustRun(t, h, vmi)

	hv, _ := h.host.Hypervisor(fakeHV)
	ctx := context.Background()
	if err := mustPauser(t, hv).Pause(ctx, string(vmi.UID)); err != nil {
		t.Fatal(err)
	}
	e.rec.waitFor(t, vmi.UID, "paused", 5*time.Second, func(st v1alpha1.VirtualMachineInstanceStatus) bool {
		c := Condition(st, v1alpha1.VirtualMachineInstancePaused)
		r := Condition(st, v1alpha1.VirtualMachineInstanceReady)
		return c != nil && c.Status == corev1.ConditionTrue && c.Reason == v1alpha1.ReasonPaused && r.Status == corev1.ConditionFalse
	})
	if err := mustPauser(t, hv).Resume(ctx, string(vmi.UID)); err != nil {
		t.Fatal(err)
	}
	// The guest powers off by itself: Succeeded.
	if _, err := hv.Shutdown(ctx, string(vmi.UID), time.Second); err != nil {
		t.Fatal(err)
	}
	e.rec.waitFor(t, vmi.UID, "Succeeded", 5*time.Second, func(st v1alpha1.VirtualMachineInstanceStatus) bool {
		return st.Phase == v1alpha1.Succeeded && Condition(st, v1alpha1.VirtualMachineInstancePaused) == nil
	})
	// A stopped VM is not started again by Sync.
	st, err := doSync(t, h, vmi)
	if err != nil || st.Phase != v1alpha1.Succeeded {
		t.Errorf("Sync after shutdown = %s, %v", st.Phase, err)
	}
	if _, err := h.Stop(ctx, vmi, time.Second); err != nil {
		t.Fatal(err)
	}
	requireNothingLeft(t, h, vmi.UID)
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{"uid-events:Paused", "uid-events:Resumed", "uid-events:GuestShutdown"} {
		if !slices.Contains(events, want) {
			t.Errorf("events %v lack %s", events, want)
		}
	}
}

func TestKilledVMFails(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	h := e.start()
	vmi := testVMI("demo", "uid-killed", e.disk)
	mustRun(t, h, vmi)
	hv, _ := h.host.Hypervisor(fakeHV)
	if err := hv.Kill(context.Background(), string(vmi.UID)); err != nil {
		t.Fatal(err)
	}
	e.rec.waitFor(t, vmi.UID, "Failed", 5*time.Second, func(st v1alpha1.VirtualMachineInstanceStatus) bool {
		return st.Phase == v1alpha1.Failed && st.Reason == driver.ReasonKilled
	})
}

// TestBadInput runs, next to a good VMI, VMIs that cannot run: each gets Synchronized=False
// with the failed step as reason and the error as message, nothing of it is left on the node,
// and the good VMI is untouched.
func TestBadInput(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t,
		"Prepare:fail-storage", "Setup:fail-network", "Start:fail-start", "Create:fail-create"))
	h := e.start()
	good := testVMI("good", "uid-good", e.disk)
	mustRun(t, h, good)
	goodStatus, _ := h.Status(good.UID)

	tests := []struct {
		name    string
		uid     types.UID
		mutate  func(*v1alpha1.VirtualMachineInstance)
		reason  string
		message []string
		// drivers replaces the hypervisor driver (to inject a hypervisor failure).
		hypervisor string
	}{
		{
			name: "missing volume",
			uid:  "uid-missing-volume",
			mutate: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Disks[1].Name = "nope"
			},
			reason:  ReasonInvalidSpec,
			message: []string{`spec.domain.devices.disks[1].name: no volume "nope" in spec.volumes`},
		},
		{
			name: "image not on the node",
			uid:  "uid-no-image",
			mutate: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Volumes[0].ContainerDisk.Image = "quay.io/nobody/nothing:latest"
			},
			reason:  ReasonInvalidSpec,
			message: []string{`spec.volumes[0].containerDisk.image: image "quay.io/nobody/nothing:latest": not found on this node`},
		},
		{
			name: "unsupported interface model",
			uid:  "uid-bad-model",
			mutate: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Interfaces[0].Model = "ne2k_pci"
			},
			reason:  ReasonUnsupported,
			message: []string{`spec.domain.devices.interfaces[0].model: interface model "ne2k_pci" is not supported by the hypervisor driver "fake"`},
		},
		{
			name: "interface without a binding",
			uid:  "uid-no-binding",
			mutate: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Devices.Interfaces[0].Masquerade = nil
			},
			reason:  ReasonInvalidSpec,
			message: []string{`spec.domain.devices.interfaces[0]: a binding is required; bindings other than bridge and masquerade are not supported`},
		},
		{
			name: "masquerade on a secondary network",
			uid:  "uid-masq-multus",
			mutate: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Networks[0].NetworkSource = v1alpha1.NetworkSource{Multus: &v1alpha1.MultusNetwork{NetworkName: "net-a"}}
			},
			reason:  ReasonInvalidSpec,
			message: []string{`spec.domain.devices.interfaces[0].masquerade: not supported on a multus network`},
		},
		{
			name: "secret without a cluster",
			uid:  "uid-secret",
			mutate: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Volumes[1].CloudInitNoCloud = &v1alpha1.CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: "my-userdata"}}
			},
			reason:  ReasonInvalidSpec,
			message: []string{`spec.volumes[1].cloudInitNoCloud.secretRef: secret "my-userdata": not supported without a cluster`},
		},
		{
			name: "persistent EFI on a hypervisor driver that keeps no persistent state",
			uid:  "uid-persistent",
			mutate: func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{Persistent: ptr(true)}}}
			},
			reason:  ReasonUnsupported,
			message: []string{`spec.domain.firmware.bootloader.efi.persistent: a persistent EFI variable store is not supported by the hypervisor driver "fake"`},
		},
		{
			name:    "storage fails",
			uid:     "uid-fail-storage",
			reason:  ReasonStorageFailed,
			message: []string{`Prepare fails for "uid-fail-storage" as asked`},
		},
		{
			name:    "network fails after storage",
			uid:     "uid-fail-network",
			reason:  ReasonNetworkFailed,
			message: []string{`Setup fails for "uid-fail-network" as asked`},
		},
		{
			name:       "hypervisor create fails after storage and network",
			uid:        "uid-fail-create",
			hypervisor: testHV,
			reason:     ReasonCreateFailed,
			message:    []string{`Create fails for "uid-fail-create" as asked`},
		},
		{
			name:       "hypervisor start fails after create",
			uid:        "uid-fail-start",
			hypervisor: testHV,
			reason:     ReasonStartFailed,
			message:    []string{`Start fails for "uid-fail-start" as asked`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hh := h
			if tt.hypervisor != "" {
				// Another node whose hypervisor fails on demand.
				e2 := newEnv(t, DriverSet{Hypervisor: tt.hypervisor, Network: testNetwork, Storage: testStorage}, e.opts.Manifests)
				e2.rec = e.rec
				e2.opts.OnStatus = e.rec.record
				hh = e2.start()
			}
			vmi := testVMI("bad", tt.uid, e.disk)
			if tt.mutate != nil {
				tt.mutate(vmi)
			}
			st, err := doSync(t, hh, vmi)
			if err == nil {
				t.Fatalf("Sync succeeded: %+v", st)
			}
			c := Condition(st, v1alpha1.VirtualMachineInstanceSynchronized)
			if c == nil || c.Status != corev1.ConditionFalse || c.Reason != tt.reason {
				t.Fatalf("Synchronized = %+v, want False with reason %s", c, tt.reason)
			}
			for _, m := range tt.message {
				if !strings.Contains(c.Message, m) {
					t.Errorf("message %q does not say %q", c.Message, m)
				}
			}
			if !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("error %q does not name the reason", err)
			}
			if st.Phase != v1alpha1.Scheduled {
				t.Errorf("phase = %s, want Scheduled", st.Phase)
			}
			requireNothingLeft(t, hh, vmi.UID)
			// A failed VMI can be stopped (deleted): nothing to do, and it is over.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if final, err := hh.Stop(ctx, vmi, time.Second); err != nil || final.Phase != v1alpha1.Failed {
				t.Errorf("Stop = %s, %v; want Failed", final.Phase, err)
			}
		})
	}

	// The VMI refused for its persistent EFI had no persistent state made for it.
	if _, err := os.Stat(filepath.Join(e.cfg.StateDir, PersistentStateDirName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("persistent state of a refused VMI: %v, want none", err)
	}

	// The good VMI is untouched.
	after := mustRun(t, h, good)
	if after.Phase != goodStatus.Phase || !equalPhases(e.rec.phases(good.UID), v1alpha1.Scheduled, v1alpha1.Running) {
		t.Errorf("good VMI: phases %v", e.rec.phases(good.UID))
	}
	hv, _ := h.host.Hypervisor(fakeHV)
	if vs, err := hv.Status(context.Background(), string(good.UID)); err != nil || vs.GetBoots() != 1 || vs.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Errorf("good VM: %v, %v", vs, err)
	}
}

// TestPluginDirectoryReplacesImageDriver: a driver the plugin directory has (a driver image's,
// installed there by an init container) replaces the handler image's driver of the same name,
// so that a driver-only upgrade needs no new handler image.
func TestPluginDirectoryReplacesImageDriver(t *testing.T) {
	e := newEnv(t, DriverSet{Hypervisor: fakeHV, Network: testNetwork, Storage: testStorage}, fakeManifests(t))
	e.cfg.PluginDir = filepath.Join(e.dir, "plugins")
	if err := os.MkdirAll(filepath.Join(e.cfg.PluginDir, fakeHV), 0o700); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(e.cfg.PluginDir, fakeHV, "kubevisor-driver-fake")
	data, err := os.ReadFile(bins.fake)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	m := manifest(t, bin, driver.KindHypervisor, fakeHV, driver.KindHypervisor)
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.cfg.PluginDir, fakeHV+".json"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	h := e.start()
	for _, d := range h.Drivers() {
		if !d.Loaded {
			t.Fatalf("driver %s not loaded: %s", d.Name, d.Error)
		}
		if d.Name != fakeHV {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", d.Plugin.Pid))
		if err != nil {
			t.Fatal(err)
		}
		if exe != bin {
			t.Errorf("the %s driver runs %s, want the plugin directory's %s", fakeHV, exe, bin)
		}
	}
}

func TestDriverNotInstalled(t *testing.T) {
	e := newEnv(t, DriverSet{Hypervisor: fakeHV, Network: "cni", Storage: testStorage}, fakeManifests(t))
	e.cfg.PluginDir = filepath.Join(e.dir, "plugins")
	if err := os.Mkdir(e.cfg.PluginDir, 0o700); err != nil {
		t.Fatal(err)
	}
	h := e.start()

	var netStatus DriverStatus
	for _, d := range h.Drivers() {
		if d.Kind == driver.KindNetwork {
			netStatus = d
		} else if !d.Loaded {
			t.Errorf("driver %s not loaded: %s", d.Name, d.Error)
		}
	}
	if netStatus.Loaded || !strings.Contains(netStatus.Error, `network driver "cni" is not installed: no manifest of that name in `+e.cfg.PluginDir) {
		t.Errorf("network driver status = %+v", netStatus)
	}
	vmi := testVMI("demo", "uid-no-driver", e.disk)
	st, err := doSync(t, h, vmi)
	if err == nil {
		t.Fatal("Sync succeeded without a network driver")
	}
	c := Condition(st, v1alpha1.VirtualMachineInstanceSynchronized)
	if c == nil || c.Reason != ReasonDriverNotFound || !strings.Contains(c.Message, `"cni"`) {
		t.Errorf("Synchronized = %+v", c)
	}
	requireNothingLeft(t, h, vmi.UID)
	eventually(t, "labels", 5*time.Second, func() error {
		labels := h.NodeLabels()
		if labels["capability.kubevisor.io/network.cni"] != HealthUnhealthy || labels["capability.kubevisor.io/hypervisor.fake"] != HealthHealthy {
			return fmt.Errorf("labels = %v", labels)
		}
		return nil
	})
}

func TestNodeLabelsFromFingerprints(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	h := e.start()
	want := map[string]string{
		"capability.kubevisor.io/hypervisor.fake":        HealthHealthy,
		"capability.kubevisor.io/network.fake-net":       HealthHealthy,
		"capability.kubevisor.io/storage.fake-storage":   HealthHealthy,
		"capability.kubevisor.io/fake.simulated":         "true",
		"capability.kubevisor.io/fake.live-migration":    "true",
		"capability.kubevisor.io/fake-net.simulated":     "true",
		"capability.kubevisor.io/fake-storage.simulated": "true",
	}
	eventually(t, "labels", 5*time.Second, func() error {
		got := h.NodeLabels()
		for k, v := range want {
			if got[k] != v {
				return fmt.Errorf("labels %v, want %s=%s", got, k, v)
			}
		}
		return nil
	})
}

func TestDevicesFromTheSandbox(t *testing.T) {
	dev := manifest(t, bins.testdriver, driver.KindDevice, "fake-dev", driver.KindDevice, "name=fake-dev")
	dev.Config = json.RawMessage(`{"unhealthy": ["kvm-3"]}`)
	set := fakeSet
	set.Device = "fake-dev"
	e := newEnv(t, set, append(fakeManifests(t), dev))
	devices := map[types.UID]map[string][]string{
		"uid-dev-ok":        {"kvm": {"kvm-0"}, "tun": {"tun-1"}},
		"uid-dev-unhealthy": {"kvm": {"kvm-3"}},
	}
	e.opts.Sandboxes = SandboxesFunc(func(vmi *v1alpha1.VirtualMachineInstance) Sandbox {
		return newTestSandbox(SandboxSpec{Devices: devices[vmi.UID]})
	})
	h := e.start()
	ok := testVMI("ok", "uid-dev-ok", e.disk)
	mustRun(t, h, ok)

	bad := testVMI("bad", "uid-dev-unhealthy", e.disk)
	st, err := doSync(t, h, bad)
	c := Condition(st, v1alpha1.VirtualMachineInstanceSynchronized)
	if err == nil || c == nil || c.Reason != ReasonDeviceFailed || !strings.Contains(c.Message, `resource "kvm"`) {
		t.Fatalf("Sync = %v, Synchronized %+v; want %s", err, c, ReasonDeviceFailed)
	}
	requireNothingLeft(t, h, bad.UID)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.Stop(ctx, ok, time.Second); err != nil {
		t.Fatal(err)
	}
	requireNothingLeft(t, h, ok.UID)
}

// TestSyncReplacesAVMLeftByAnInterruptedSync: a sync interrupted after the hypervisor created
// the VM but before the handler saved its handle leaves a VM the handler does not know. The next
// sync meets AlreadyExists from Create, deletes that VM and makes it again from the VMI's spec.
func TestSyncReplacesAVMLeftByAnInterruptedSync(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	h := e.start()
	vmi := testVMI("interrupted", "uid-interrupted", e.disk)
	hv, err := h.host.Hypervisor(fakeHV)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// What the interrupted sync made: the VM under the VMI's UID, from an older spec, never
	// started, in its own run directory.
	leftDir := t.TempDir()
	if _, err := hv.Create(ctx, &domainv1.DomainSpec{
		Id: string(vmi.UID), Name: "stale", RunDir: leftDir,
		Memory: &domainv1.Memory{GuestBytes: 64 << 20},
	}); err != nil {
		t.Fatalf("create the left-over VM: %v", err)
	}

	st := mustRun(t, h, vmi)
	if c := Condition(st, v1alpha1.VirtualMachineInstanceSynchronized); c != nil {
		t.Errorf("Synchronized = %+v after a sync that met a left-over VM", c)
	}
	vs, err := hv.Status(ctx, string(vmi.UID))
	if err != nil || vs.GetBoots() != 1 || vs.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Fatalf("Status = %v, %v; want running, 1 boot", vs, err)
	}
	// The VM now runs from the VMI's spec (128Mi, the handler's run directory), not the stale one.
	raw, err := os.ReadFile(filepath.Join(e.cfg.RunDir, string(vmi.UID), fake.RecordFile))
	if err != nil {
		t.Fatalf("the replaced VM's record: %v", err)
	}
	var rec struct {
		Name        string `json:"name"`
		MemoryBytes int64  `json:"memoryBytes"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.MemoryBytes != 128<<20 || rec.Name == "stale" {
		t.Errorf("VM record %s: want the VMI's 128Mi spec", raw)
	}
	stop, cancelStop := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelStop()
	if _, err := h.Stop(stop, vmi, 5*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	requireNothingLeft(t, h, vmi.UID)
}
