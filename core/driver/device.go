package driver

import (
	"context"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
)

// DeviceGroupAttribute is the HostDevice attribute that puts devices of one resource in a
// group that is best allocated together (for VFIO, the IOMMU group: a container is handed whole
// group nodes, and one process at a time may use a group). The kubelet device plugins prefer,
// for a container, the free devices of groups it already has, then whole free groups.
const DeviceGroupAttribute = "group"

type deviceServer struct {
	devicev1.UnimplementedDeviceServer
	impl Device
}

func (s *deviceServer) List(ctx context.Context, req *devicev1.ListRequest) (*devicev1.ListResponse, error) {
	devs, err := s.impl.List(ctx, req.GetResource())
	if err != nil {
		return nil, err
	}
	return &devicev1.ListResponse{Devices: devs}, nil
}

func (s *deviceServer) Watch(req *devicev1.WatchRequest, stream grpc.ServerStreamingServer[devicev1.ListResponse]) error {
	w, ok := s.impl.(DeviceWatcher)
	if !ok {
		return unimplemented("watch")
	}
	return w.Watch(stream.Context(), req.GetResource(), func(devs []*devicev1.HostDevice) error {
		return stream.Send(&devicev1.ListResponse{Devices: devs})
	})
}

func (s *deviceServer) Allocate(ctx context.Context, req *devicev1.AllocateRequest) (*devicev1.AllocateResponse, error) {
	return s.impl.Allocate(ctx, req)
}

// DeviceClient is the host's Device: it calls a device plugin over gRPC. It implements Device
// only; DeviceWatcher is reached through Optional, for a driver that declares
// FEATURE_DEVICE_WATCH.
type DeviceClient struct {
	baseClient
	dev devicev1.DeviceClient
}

var (
	_ Device        = (*DeviceClient)(nil)
	_ gated         = (*DeviceClient)(nil)
	_ DeviceWatcher = devWatcher{}
)

// NewDeviceClient returns a client for the device plugin served on conn.
func NewDeviceClient(conn grpc.ClientConnInterface) *DeviceClient {
	return &DeviceClient{baseClient: baseClient{base: basev1.NewDriverClient(conn)}, dev: devicev1.NewDeviceClient(conn)}
}

// List implements Device.
func (c *DeviceClient) List(ctx context.Context, resource string) ([]*devicev1.HostDevice, error) {
	resp, err := c.dev.List(ctx, &devicev1.ListRequest{Resource: resource})
	return resp.GetDevices(), err
}

// Allocate implements Device.
func (c *DeviceClient) Allocate(ctx context.Context, req *devicev1.AllocateRequest) (*devicev1.AllocateResponse, error) {
	return c.dev.Allocate(ctx, req)
}

// optional implements gated.
func (c *DeviceClient) optional(f basev1.Feature) any {
	if f == basev1.Feature_FEATURE_DEVICE_WATCH {
		return devWatcher{c}
	}
	return nil
}

// devWatcher is the DeviceWatcher of a DeviceClient.
type devWatcher struct{ c *DeviceClient }

// Watch implements DeviceWatcher.
func (w devWatcher) Watch(ctx context.Context, resource string, send func([]*devicev1.HostDevice) error) error {
	c := w.c
	stream, err := c.dev.Watch(ctx, &devicev1.WatchRequest{Resource: resource})
	if err != nil {
		return err
	}
	return recvAll(ctx, stream.Recv, func(m *devicev1.ListResponse) error { return send(m.GetDevices()) })
}

// ChangedDevices wraps a DeviceWatcher's send so that a list equal to the one sent before is not
// sent again: the first list always goes, later ones only when a device was added, removed or
// changed (its health, say). Watch implementations that re-read on every event or poll use it.
func ChangedDevices(send func([]*devicev1.HostDevice) error) func([]*devicev1.HostDevice) error {
	var last []*devicev1.HostDevice
	first := true
	return func(devs []*devicev1.HostDevice) error {
		if !first && slices.EqualFunc(devs, last, func(a, b *devicev1.HostDevice) bool { return proto.Equal(a, b) }) {
			return nil
		}
		if err := send(devs); err != nil {
			return err
		}
		first, last = false, devs
		return nil
	}
}
