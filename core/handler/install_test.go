package handler

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadConfigDirMergesInNameOrder(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"00-base.yaml":           "stateDir: /var/lib/kv\nacceleration: auto\ndriverConfig: {qmp: {disableKVM: false}}\n",
		"10-hypervisor-qmp.yaml": "drivers: {hypervisor: qmp}\ndriverConfig: {qmp: {disableKVM: true}}\n",
		"10-network-cni.json":    `{"drivers": {"network": "cni"}, "driverConfig": {"cni": {"cniBinDir": ["/opt/cni/bin"]}}}`,
		"20-override.yml":        "acceleration: emulated\npluginDir: plugins\n",
		"README":                 "not a part",
		"..data/ignored.yaml":    "drivers: {hypervisor: libvirt}\n", // a mounted ConfigMap's internals
	})
	c, err := LoadConfigDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Drivers, DriverSet{Hypervisor: "qmp", Network: "cni"}) {
		t.Errorf("drivers %+v", c.Drivers)
	}
	if c.StateDir != "/var/lib/kv" || c.Acceleration != "emulated" || c.PluginDir != filepath.Join(dir, "plugins") {
		t.Errorf("stateDir %q acceleration %q pluginDir %q", c.StateDir, c.Acceleration, c.PluginDir)
	}
	if got := string(c.DriverConfig["qmp"]); !strings.Contains(got, "true") || c.DriverConfig["cni"] == nil {
		t.Errorf("driverConfig %s", c.DriverConfig)
	}
	p, err := LoadConfigPath(dir)
	if err != nil || !reflect.DeepEqual(p.Drivers, c.Drivers) {
		t.Errorf("LoadConfigPath(dir) = %+v, %v", p.Drivers, err)
	}
}

func TestLoadConfigDirErrors(t *testing.T) {
	for name, files := range map[string]map[string]string{
		"two networks":        {"a.yaml": "drivers: {network: cni}\n", "b.yaml": "drivers: {network: other}\n"},
		"one name, two kinds": {"a.yaml": "drivers: {hypervisor: x, storage: x}\n"},
		"unknown field":       {"a.yaml": "driver: {hypervisor: qmp}\n"},
		"no part":             {"README": "x"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := LoadConfigDir(writeFiles(t, files)); err == nil {
				t.Fatal("no error")
			}
		})
	}
	// The same driver named twice is not a conflict.
	if _, err := LoadConfigDir(writeFiles(t, map[string]string{"a.yaml": "drivers: {storage: local}\n", "b.yaml": "drivers: {storage: local}\n"})); err != nil {
		t.Fatal(err)
	}
}

func TestDriverSetManifests(t *testing.T) {
	dir := writeFiles(t, map[string]string{DriverBinaryPrefix + "qmp": "#!/bin/sh\n", DriverBinaryPrefix + "cni": "#!/bin/sh\n"})
	ms, err := DriverSet{Hypervisor: "qmp", Network: "cni"}.Manifests(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Kind != "hypervisor" || ms[0].Name != "qmp" || ms[1].Name != "cni" || ms[0].SHA256 == "" {
		t.Errorf("manifests %+v", ms)
	}
	_, err = DriverSet{Hypervisor: "qmp", Storage: "local"}.Manifests(dir)
	if err == nil || !strings.Contains(err.Error(), "local") {
		t.Errorf("missing binary: %v", err)
	}
}

// TestLoadConfigDirHypervisors: the hypervisor drivers of the parts add up in name order (the
// install manifests' one file per hypervisor driver component), each once, the first the
// default; hypervisor and hypervisors both count.
func TestLoadConfigDirHypervisors(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"00-base.yaml":               "drivers: {network: cni, storage: local}\n",
		"10-hypervisor-qmp.yaml":     "drivers: {hypervisor: qmp}\n",
		"10-hypervisor-libvirt.yaml": "drivers: {hypervisor: libvirt}\n",
		"20-more.yaml":               "drivers: {hypervisors: [qmp, fake]}\n",
	})
	c, err := LoadConfigDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := DriverSet{Hypervisor: "libvirt", Hypervisors: []string{"qmp", "fake"}, Network: "cni", Storage: "local"}
	if !reflect.DeepEqual(c.Drivers, want) {
		t.Errorf("drivers %+v, want %+v", c.Drivers, want)
	}
	if got := c.Drivers.HypervisorNames(); !reflect.DeepEqual(got, []string{"libvirt", "qmp", "fake"}) || c.Drivers.DefaultHypervisor() != "libvirt" {
		t.Errorf("HypervisorNames %v, default %q", got, c.Drivers.DefaultHypervisor())
	}
	// One file, the list form.
	c, err = LoadConfig(filepath.Join(writeFiles(t, map[string]string{"c.yaml": "drivers: {hypervisors: [qmp, libvirt], network: cni}\n"}), "c.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Drivers.HypervisorNames(); !reflect.DeepEqual(got, []string{"qmp", "libvirt"}) {
		t.Errorf("HypervisorNames %v", got)
	}
	if _, err := (Config{Drivers: DriverSet{Hypervisors: []string{"a"}, Network: "a"}}).withDefaults(); err == nil || !strings.Contains(err.Error(), `"a" is configured as a hypervisor and a network driver`) {
		t.Errorf("one name, two kinds: %v", err)
	}
}

// TestLoadConfigDirDevices: the device drivers of the parts add up in name order, each once,
// whether a part names one (device, the older single key) or several (devices), as the install
// manifests' hostdev component and an example device driver's component do side by side.
func TestLoadConfigDirDevices(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"00-base.yaml":           "drivers: {hypervisor: qmp, network: cni, storage: local}\n",
		"10-device-hostdev.yaml": "drivers: {device: hostdev}\n",
		"10-device-sim.yaml":     "drivers: {device: sim}\n",
		"20-more.yaml":           "drivers: {devices: [hostdev, gpu]}\n",
	})
	c, err := LoadConfigDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := DriverSet{Hypervisor: "qmp", Network: "cni", Storage: "local", Device: "hostdev", Devices: []string{"sim", "gpu"}}
	if !reflect.DeepEqual(c.Drivers, want) {
		t.Errorf("drivers %+v, want %+v", c.Drivers, want)
	}
	if got := c.Drivers.DeviceNames(); !reflect.DeepEqual(got, []string{"hostdev", "sim", "gpu"}) {
		t.Errorf("DeviceNames %v", got)
	}
	var kinds []string
	for _, d := range c.Drivers.all() {
		kinds = append(kinds, d.kind+"/"+d.name)
	}
	if want := []string{"hypervisor/qmp", "network/cni", "storage/local", "device/hostdev", "device/sim", "device/gpu"}; !reflect.DeepEqual(kinds, want) {
		t.Errorf("all() = %v, want %v", kinds, want)
	}
	if _, err := (Config{Drivers: DriverSet{Devices: []string{"x"}, Storage: "x"}}).withDefaults(); err == nil || !strings.Contains(err.Error(), `"x" is configured as a storage and a device driver`) {
		t.Errorf("one name, two kinds: %v", err)
	}
}
