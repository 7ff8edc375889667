package conformance

import (
	"sync"
	"testing"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
)

// HypervisorTesting runs Hypervisor against impl served through driver.InProcess, so that the
// checks cross the real plugin boundary. With WithRestart, the restart hook returns a new
// implementation, which is served the same way.
func HypervisorTesting(t *testing.T, impl driver.Hypervisor, opts ...Option) {
	t.Helper()
	tt := FromTesting(t)
	client := ServeInProcess(tt, basev1.Kind_KIND_HYPERVISOR, impl).(driver.Hypervisor)
	opts = append([]Option{WithImplementation(impl)}, opts...)
	opts = append(opts, func(o *Options) {
		restart := o.Restart
		if restart == nil {
			return
		}
		o.Restart = func(ct T) driver.Hypervisor {
			impl := restart(ct)
			if impl == nil {
				return nil
			}
			// Served until the end of t, not of the check: the check's own cleanup still needs
			// it to remove the VM.
			client, stop, err := driver.InProcess(basev1.Kind_KIND_HYPERVISOR, impl)
			if err != nil {
				ct.Fatalf("serve the driver in-process: %v", err)
			}
			t.Cleanup(stop)
			return client.(driver.Hypervisor)
		}
	})
	Hypervisor(tt, func(T) driver.Hypervisor { return client }, opts...)
}

// VMTesting runs VM against hv and st, each served through driver.InProcess. With
// WithDriverKill, the hook returns a new hypervisor implementation (having made the old one let
// go of its VMs, as the death of its process would), which is served the same way until t
// ends, and is the hypervisor of the checks that follow.
func VMTesting(t *testing.T, hv driver.Hypervisor, st driver.Storage, g Guest, opts ...Option) {
	t.Helper()
	tt := FromTesting(t)
	var (
		mu      sync.Mutex
		current = ServeInProcess(tt, basev1.Kind_KIND_HYPERVISOR, hv).(driver.Hypervisor)
	)
	stClient := ServeInProcess(tt, basev1.Kind_KIND_STORAGE, st).(driver.Storage)
	opts = append(opts, func(o *Options) {
		kill := o.DriverKill
		if kill == nil {
			return
		}
		o.DriverKill = func(ct T) driver.Hypervisor {
			impl := kill(ct)
			if impl == nil {
				return nil
			}
			// Served until the end of t, not of the check: the check's own cleanup still
			// needs it to remove the VM.
			client, stop, err := driver.InProcess(basev1.Kind_KIND_HYPERVISOR, impl)
			if err != nil {
				ct.Fatalf("serve the driver in-process: %v", err)
			}
			t.Cleanup(stop)
			mu.Lock()
			current = client.(driver.Hypervisor)
			mu.Unlock()
			return client.(driver.Hypervisor)
		}
	})
	VM(tt, func(T) driver.Hypervisor {
		mu.Lock()
		defer mu.Unlock()
		return current
	}, func(T) driver.Storage { return stClient }, g, opts...)
}

// NetworkTesting runs Network against impl served through driver.InProcess.
func NetworkTesting(t *testing.T, impl driver.Network, opts ...Option) {
	t.Helper()
	tt := FromTesting(t)
	client := ServeInProcess(tt, basev1.Kind_KIND_NETWORK, impl).(driver.Network)
	Network(tt, func(T) driver.Network { return client }, append([]Option{WithImplementation(impl)}, opts...)...)
}

// StorageTesting runs Storage against impl served through driver.InProcess.
func StorageTesting(t *testing.T, impl driver.Storage, opts ...Option) {
	t.Helper()
	tt := FromTesting(t)
	client := ServeInProcess(tt, basev1.Kind_KIND_STORAGE, impl).(driver.Storage)
	Storage(tt, func(T) driver.Storage { return client }, append([]Option{WithImplementation(impl)}, opts...)...)
}

// DeviceTesting runs Device against impl served through driver.InProcess.
func DeviceTesting(t *testing.T, impl driver.Device, opts ...Option) {
	t.Helper()
	tt := FromTesting(t)
	client := ServeInProcess(tt, basev1.Kind_KIND_DEVICE, impl).(driver.Device)
	Device(tt, func(T) driver.Device { return client }, append([]Option{WithImplementation(impl)}, opts...)...)
}

// ServeInProcess serves impl, a driver of the given kind, through driver.InProcess until t
// ends, and returns the host's client for it. Use it to build a factory for a T that is not a
// *testing.T (a Recorder).
func ServeInProcess(t T, kind basev1.Kind, impl driver.Driver) driver.Driver {
	t.Helper()
	client, stop, err := driver.InProcess(kind, impl)
	if err != nil {
		t.Fatalf("serve the driver in-process: %v", err)
	}
	t.Cleanup(stop)
	return client
}
