package driver

import (
	"context"

	"google.golang.org/grpc"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

type networkServer struct {
	networkv1.UnimplementedNetworkServer
	impl Network
}

func (s *networkServer) Setup(ctx context.Context, req *networkv1.SetupRequest) (*networkv1.SetupResponse, error) {
	return s.impl.Setup(ctx, req)
}

func (s *networkServer) Check(ctx context.Context, req *networkv1.CheckRequest) (*networkv1.CheckResponse, error) {
	c, ok := s.impl.(NetworkChecker)
	if !ok {
		return nil, unimplemented("check")
	}
	return c.Check(ctx, req)
}

func (s *networkServer) Teardown(ctx context.Context, req *networkv1.TeardownRequest) (*networkv1.TeardownResponse, error) {
	return &networkv1.TeardownResponse{}, s.impl.Teardown(ctx, req)
}

// NetworkClient is the host's Network: it calls a network plugin over gRPC. It implements
// Network only; NetworkChecker is reached through Optional, for a driver that declares
// FEATURE_NETWORK_CHECK. Setup checks the request against the driver's Capabilities first
// (CheckSetup), without reaching the plugin when it fails.
type NetworkClient struct {
	baseClient
	net networkv1.NetworkClient
}

var (
	_ Network        = (*NetworkClient)(nil)
	_ gated          = (*NetworkClient)(nil)
	_ NetworkChecker = netChecker{}
)

// NewNetworkClient returns a client for the network plugin served on conn.
func NewNetworkClient(conn grpc.ClientConnInterface) *NetworkClient {
	return &NetworkClient{baseClient: baseClient{base: basev1.NewDriverClient(conn)}, net: networkv1.NewNetworkClient(conn)}
}

// Setup implements Network. It checks req against the driver's Capabilities first
// (CheckSetup), without reaching the plugin when it fails.
func (c *NetworkClient) Setup(ctx context.Context, req *networkv1.SetupRequest) (*networkv1.SetupResponse, error) {
	caps, err := c.Capabilities(ctx)
	if err != nil {
		return nil, err
	}
	if err := CheckSetup(caps, req); err != nil {
		return nil, err
	}
	return c.net.Setup(ctx, req)
}

// optional implements gated.
func (c *NetworkClient) optional(f basev1.Feature) any {
	if f == basev1.Feature_FEATURE_NETWORK_CHECK {
		return netChecker{c}
	}
	return nil
}

// netChecker is the NetworkChecker of a NetworkClient.
type netChecker struct{ c *NetworkClient }

// Check implements NetworkChecker.
func (n netChecker) Check(ctx context.Context, req *networkv1.CheckRequest) (*networkv1.CheckResponse, error) {
	return n.c.net.Check(ctx, req)
}

// Teardown implements Network.
func (c *NetworkClient) Teardown(ctx context.Context, req *networkv1.TeardownRequest) error {
	_, err := c.net.Teardown(ctx, req)
	return err
}
