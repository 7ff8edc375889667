package driver

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// ProtocolVersion is the contract version this SDK serves and the host asks for first. A
// breaking change to any of the driver services adds a new version (and a new .../vN package);
// the host keeps speaking the older ones through go-plugin's VersionedPlugins.
const ProtocolVersion = 1

// Handshake is the go-plugin handshake shared by the host and every driver. The cookie only
// stops a driver binary from being run by hand by mistake; it is not a security measure (the
// host verifies each binary's checksum instead).
var Handshake = plugin.HandshakeConfig{
	// ProtocolVersion is left zero: versions are negotiated through VersionedPlugins.
	MagicCookieKey:   "KUBEVISOR_DRIVER_PLUGIN",
	MagicCookieValue: "0c4bd1f2-6d1e-4f0a-9a57-kubevisor-driver",
}

// Plugin is the go-plugin Plugin of one driver kind. On the driver's side Impl is set and it
// registers the services; on the host's side it returns the kind's client.
type Plugin struct {
	plugin.NetRPCUnsupportedPlugin
	Kind basev1.Kind
	Impl Driver
}

var _ plugin.GRPCPlugin = (*Plugin)(nil)

// GRPCServer implements plugin.GRPCPlugin.
func (p *Plugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	return Register(s, p.Kind, p.Impl)
}

// GRPCClient implements plugin.GRPCPlugin.
func (p *Plugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return NewClient(p.Kind, c)
}

// Register registers the base service and the kind's service for impl on s. impl must
// implement the kind's interface.
func Register(s grpc.ServiceRegistrar, kind basev1.Kind, impl Driver) error {
	switch kind {
	case basev1.Kind_KIND_HYPERVISOR:
		h, ok := impl.(Hypervisor)
		if !ok {
			return fmt.Errorf("%T does not implement driver.Hypervisor", impl)
		}
		hypervisorv1.RegisterHypervisorServer(s, &hypervisorServer{impl: h})
	case basev1.Kind_KIND_NETWORK:
		n, ok := impl.(Network)
		if !ok {
			return fmt.Errorf("%T does not implement driver.Network", impl)
		}
		networkv1.RegisterNetworkServer(s, &networkServer{impl: n})
	case basev1.Kind_KIND_STORAGE:
		st, ok := impl.(Storage)
		if !ok {
			return fmt.Errorf("%T does not implement driver.Storage", impl)
		}
		storagev1.RegisterStorageServer(s, &storageServer{impl: st})
	case basev1.Kind_KIND_DEVICE:
		d, ok := impl.(Device)
		if !ok {
			return fmt.Errorf("%T does not implement driver.Device", impl)
		}
		devicev1.RegisterDeviceServer(s, &deviceServer{impl: d})
	default:
		return fmt.Errorf("unknown driver kind %s", kind)
	}
	basev1.RegisterDriverServer(s, &baseServer{kind: kind, impl: impl})
	return nil
}

// NewClient returns the host's client of the given kind for a driver served on conn: a
// *HypervisorClient, *NetworkClient, *StorageClient or *DeviceClient.
func NewClient(kind basev1.Kind, conn grpc.ClientConnInterface) (Driver, error) {
	switch kind {
	case basev1.Kind_KIND_HYPERVISOR:
		return NewHypervisorClient(conn), nil
	case basev1.Kind_KIND_NETWORK:
		return NewNetworkClient(conn), nil
	case basev1.Kind_KIND_STORAGE:
		return NewStorageClient(conn), nil
	case basev1.Kind_KIND_DEVICE:
		return NewDeviceClient(conn), nil
	}
	return nil, fmt.Errorf("unknown driver kind %s", kind)
}

// HostPlugins is what the host offers go-plugin: every kind, at every protocol version it
// speaks. A plugin is dispensed by its kind's name (KindName).
func HostPlugins() map[int]plugin.PluginSet {
	set := plugin.PluginSet{}
	for _, k := range []basev1.Kind{basev1.Kind_KIND_HYPERVISOR, basev1.Kind_KIND_NETWORK, basev1.Kind_KIND_STORAGE, basev1.Kind_KIND_DEVICE} {
		set[KindName(k)] = &Plugin{Kind: k}
	}
	return map[int]plugin.PluginSet{ProtocolVersion: set}
}
