package driver

import (
	"fmt"
	"slices"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
)

// Kind names as they appear in plugin manifests and plugin sets.
const (
	KindHypervisor = "hypervisor"
	KindNetwork    = "network"
	KindStorage    = "storage"
	KindDevice     = "device"
)

// KindName returns the manifest name of a kind ("hypervisor", ...), or "" for an unknown kind.
func KindName(k basev1.Kind) string {
	switch k {
	case basev1.Kind_KIND_HYPERVISOR:
		return KindHypervisor
	case basev1.Kind_KIND_NETWORK:
		return KindNetwork
	case basev1.Kind_KIND_STORAGE:
		return KindStorage
	case basev1.Kind_KIND_DEVICE:
		return KindDevice
	}
	return ""
}

// ParseKind is the inverse of KindName.
func ParseKind(name string) (basev1.Kind, error) {
	for _, k := range []basev1.Kind{basev1.Kind_KIND_HYPERVISOR, basev1.Kind_KIND_NETWORK, basev1.Kind_KIND_STORAGE, basev1.Kind_KIND_DEVICE} {
		if KindName(k) == name {
			return k, nil
		}
	}
	return basev1.Kind_KIND_UNSPECIFIED, fmt.Errorf("unknown driver kind %q (want hypervisor, network, storage or device)", name)
}

// featureImpl says, for each optional feature, which kind it belongs to and whether an
// implementation offers it.
var featureImpl = map[basev1.Feature]struct {
	kind  basev1.Kind
	iface string
	has   func(any) bool
}{
	basev1.Feature_FEATURE_HYPERVISOR_PAUSE:   {basev1.Kind_KIND_HYPERVISOR, "driver.Pauser", is[Pauser]},
	basev1.Feature_FEATURE_HYPERVISOR_REBOOT:  {basev1.Kind_KIND_HYPERVISOR, "driver.Rebooter", is[Rebooter]},
	basev1.Feature_FEATURE_HYPERVISOR_CONSOLE: {basev1.Kind_KIND_HYPERVISOR, "driver.Consoler", is[Consoler]},
	basev1.Feature_FEATURE_HYPERVISOR_RECOVER: {basev1.Kind_KIND_HYPERVISOR, "driver.Recoverer", is[Recoverer]},
	basev1.Feature_FEATURE_HYPERVISOR_MIGRATE: {basev1.Kind_KIND_HYPERVISOR, "driver.Migrator", is[Migrator]},
	basev1.Feature_FEATURE_NETWORK_CHECK:      {basev1.Kind_KIND_NETWORK, "driver.NetworkChecker", is[NetworkChecker]},
	basev1.Feature_FEATURE_DEVICE_WATCH:       {basev1.Kind_KIND_DEVICE, "driver.DeviceWatcher", is[DeviceWatcher]},
}

func is[T any](v any) bool { _, ok := v.(T); return ok }

// CheckCapabilities reports whether impl, a driver of the given kind, implements the optional
// interface of every feature caps declares, and declares no feature of another kind. Serve
// refuses to start a driver that fails it; the conformance kit runs it too.
func CheckCapabilities(kind basev1.Kind, impl any, caps *basev1.Capabilities) error {
	for _, f := range caps.GetFeatures() {
		fi, ok := featureImpl[f]
		switch {
		case !ok:
			return fmt.Errorf("capabilities declare unknown feature %s", f)
		case fi.kind != kind:
			return fmt.Errorf("capabilities declare %s, which is not a feature of a %s driver", f, KindName(kind))
		case !fi.has(impl):
			return fmt.Errorf("capabilities declare %s but the driver does not implement %s", f, fi.iface)
		}
	}
	return nil
}

// HasFeature reports whether caps declares f.
func HasFeature(caps *basev1.Capabilities, f basev1.Feature) bool {
	return slices.Contains(caps.GetFeatures(), f)
}
