package deviceplugins

import (
	"context"
	"encoding/json"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/liveconfig"
)

// Reconfigurer hands a running driver another configuration: plugin.Host's Reconfigure.
type Reconfigurer interface {
	Reconfigure(ctx context.Context, name string, config json.RawMessage) error
}

// HostDevices brings the live configuration's permitted host devices (core/liveconfig) to the
// hostdev driver this process runs and to the kubelet, without a restart: Set gives the driver
// its node configuration with them in place of its own (liveconfig.MergeHostDevices) through
// the plugin host, then the manager's plugins follow the driver's resources (Manager.Resync): a
// resource no longer permitted is retired, a new one registered. kubevisor-deviceplugins hands
// Set to liveconfig.HostDevices, as the handler does its own.
//
// A change the driver refuses (FailedPrecondition, InvalidArgument naming the field) is
// returned and leaves the driver and the plugins as they were. The node handler's own hostdev
// process takes the same change on its own watch; the two may take it a moment apart, and a
// launcher pod scheduled in between onto a resource just removed fails its device step.
type HostDevices struct {
	// Host runs the driver (StartDrivers's host).
	Host Reconfigurer
	// Base is the driver's configuration on this node: the handler configuration's
	// driverConfig.hostdev (or its manifest's), what nil permitted host devices go back to.
	Base json.RawMessage
	// Manager runs the plugins.
	Manager *Manager
}

// Set gives the driver permitted in place of its configuration's permitted host devices (nil:
// the configuration's own), and makes the plugins follow.
func (h *HostDevices) Set(ctx context.Context, permitted *v1alpha1.PermittedHostDevices) error {
	config, err := liveconfig.MergeHostDevices(h.Base, permitted)
	if err != nil {
		return err
	}
	if err := h.Host.Reconfigure(ctx, liveconfig.HostDevicesDriver, config); err != nil {
		return err
	}
	_, _, err = h.Manager.Resync(ctx)
	return err
}
