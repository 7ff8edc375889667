package driver

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
)

// baseServer serves the Driver service of every kind from the Go implementation.
type baseServer struct {
	basev1.UnimplementedDriverServer
	kind basev1.Kind
	impl Driver
}

func (s *baseServer) Info(ctx context.Context, _ *basev1.InfoRequest) (*basev1.InfoResponse, error) {
	info, err := s.impl.Info(ctx)
	if err != nil {
		return nil, err
	}
	// The SDK, not the driver, knows which kind it serves and which protocol versions it speaks.
	out := &basev1.InfoResponse{
		Name:             info.GetName(),
		Kind:             s.kind,
		Version:          info.GetVersion(),
		ProtocolVersions: []uint32{ProtocolVersion},
		Description:      info.GetDescription(),
	}
	return out, nil
}

func (s *baseServer) Capabilities(ctx context.Context, _ *basev1.CapabilitiesRequest) (*basev1.CapabilitiesResponse, error) {
	caps, err := s.impl.Capabilities(ctx)
	if err != nil {
		return nil, err
	}
	return &basev1.CapabilitiesResponse{Capabilities: caps}, nil
}

func (s *baseServer) Fingerprint(_ *basev1.FingerprintRequest, stream grpc.ServerStreamingServer[basev1.FingerprintResponse]) error {
	return s.impl.Fingerprint(stream.Context(), stream.Send)
}

func (s *baseServer) Configure(ctx context.Context, req *basev1.ConfigureRequest) (*basev1.ConfigureResponse, error) {
	if err := s.impl.Configure(ctx, req); err != nil {
		return nil, err
	}
	return &basev1.ConfigureResponse{}, nil
}

// baseClient is the host's side of the Driver service. It caches Capabilities, which do not
// change for the life of a plugin process except a device driver's resources, which may follow
// its configuration: a successful Configure (plugin.Host.Reconfigure calls it through this
// client) drops the cache. Optional goes by them.
type baseClient struct {
	base basev1.DriverClient

	mu   sync.Mutex
	caps *basev1.Capabilities
}

func (c *baseClient) Info(ctx context.Context) (*basev1.InfoResponse, error) {
	return c.base.Info(ctx, &basev1.InfoRequest{})
}

func (c *baseClient) Capabilities(ctx context.Context) (*basev1.Capabilities, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.caps != nil {
		return c.caps, nil
	}
	resp, err := c.base.Capabilities(ctx, &basev1.CapabilitiesRequest{})
	if err != nil {
		return nil, err
	}
	c.caps = resp.GetCapabilities()
	if c.caps == nil {
		c.caps = &basev1.Capabilities{}
	}
	return c.caps, nil
}

func (c *baseClient) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	stream, err := c.base.Fingerprint(ctx, &basev1.FingerprintRequest{})
	if err != nil {
		return err
	}
	return recvAll(ctx, stream.Recv, send)
}

func (c *baseClient) Configure(ctx context.Context, req *basev1.ConfigureRequest) error {
	_, err := c.base.Configure(ctx, req)
	if err == nil {
		c.mu.Lock()
		c.caps = nil
		c.mu.Unlock()
	}
	return err
}

// recvAll passes every message of a server stream to send until the stream or ctx ends. The end
// of a stream because ctx was cancelled is not an error.
func recvAll[T any](ctx context.Context, recv func() (*T, error), send func(*T) error) error {
	for {
		msg, err := recv()
		if err != nil {
			if ctx.Err() != nil || status.Code(err) == codes.Canceled {
				return nil
			}
			if isEOF(err) {
				return nil
			}
			return err
		}
		if err := send(msg); err != nil {
			return fmt.Errorf("handle stream message: %w", err)
		}
	}
}
