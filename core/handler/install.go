package handler

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/core/plugin"
)

// DriverBinaryPrefix starts the file name of every in-tree driver binary: kubevisor-driver-<name>.
const DriverBinaryPrefix = "kubevisor-driver-"

// Manifests returns the driver manifests of the configured drivers' kubevisor-driver-<name>
// binaries in binDir, with their digests computed now (plugin.ManifestFor). It is how a handler
// without a plugin directory trusts the driver binaries shipped beside it: the standalone
// handler's own directory, or the handler image's in a cluster (serve --plugin-bin-dir). Every
// configured driver must be there; the error names each missing one.
func (s DriverSet) Manifests(binDir string) ([]plugin.Manifest, error) {
	var out []plugin.Manifest
	var errs []error
	for _, d := range s.all() {
		m, err := plugin.ManifestFor(filepath.Join(binDir, DriverBinaryPrefix+d.name), d.kind, d.name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, m)
	}
	return out, errors.Join(errs...)
}

// LoadConfigPath loads the configuration at path: a file (LoadConfig) or a directory
// (LoadConfigDir).
func LoadConfigPath(path string) (Config, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Config{}, fmt.Errorf("handler config: %w", err)
	}
	if fi.IsDir() {
		return LoadConfigDir(path)
	}
	return LoadConfig(path)
}

// LoadConfigDir reads the configuration from the *.yaml, *.yml and *.json files of dir (names
// starting with "." are skipped: a mounted ConfigMap's ..data), in name order, each decoded
// strictly over the ones before: a field a later file sets replaces the earlier value, a map
// (driverConfig, images, claims) gains its keys. This lets an installation compose the
// configuration from parts (the install manifests' base and one file per driver). The hypervisor
// drivers the files name (drivers.hypervisor and drivers.hypervisors) add up, in name order,
// each once: the first file's is the default. So do the device drivers (drivers.device and
// drivers.devices). Two files naming different network or storage drivers is an error, not an
// override: a node runs one driver of each of those kinds.
// Relative paths are taken from dir.
func LoadConfigDir(dir string) (Config, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return Config{}, fmt.Errorf("handler config: %w", err)
	}
	var c Config
	setBy := map[string]string{} // kind → file that named its driver
	var errs []error
	n := 0
	for _, e := range entries {
		name := e.Name()
		ext := filepath.Ext(name)
		if strings.HasPrefix(name, ".") || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			continue
		}
		path := filepath.Join(dir, name)
		if fi, err := os.Stat(path); err != nil || fi.IsDir() {
			continue // a dangling link or a directory is not a part
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("handler config: %w", err)
		}
		var part Config
		if err := DecodeStrict(data, &part); err != nil {
			return Config{}, fmt.Errorf("handler config %s: %w", path, err)
		}
		for _, d := range part.Drivers.all() {
			if d.kind == driver.KindHypervisor || d.kind == driver.KindDevice {
				continue
			}
			if prev, ok := setBy[d.kind]; ok && c.Drivers.of(d.kind) != d.name {
				errs = append(errs, fmt.Errorf("handler config %s: drivers.%s: %q here, %q in %s: one %s driver per node",
					dir, d.kind, d.name, c.Drivers.of(d.kind), prev, d.kind))
			}
			setBy[d.kind] = name
		}
		hypervisors := append(c.Drivers.HypervisorNames(), part.Drivers.HypervisorNames()...)
		devices := append(c.Drivers.DeviceNames(), part.Drivers.DeviceNames()...)
		if err := DecodeStrict(data, &c); err != nil {
			return Config{}, fmt.Errorf("handler config %s: %w", path, err)
		}
		c.Drivers = c.Drivers.withHypervisors(DriverSet{Hypervisors: hypervisors}.HypervisorNames())
		c.Drivers = c.Drivers.withDevices(DriverSet{Devices: devices}.DeviceNames())
		n++
	}
	if n > 0 {
		errs = append(errs, c.Drivers.check())
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	if n == 0 {
		return Config{}, fmt.Errorf("handler config %s: no .yaml, .yml or .json file", dir)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Config{}, fmt.Errorf("handler config: %w", err)
	}
	c.resolve(abs)
	return c, nil
}
