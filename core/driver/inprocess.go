package driver

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
)

// InProcess serves impl over an in-memory gRPC connection and returns the host's client for it
// (a *HypervisorClient, ...), so a test crosses the real plugin boundary (protobuf encoding,
// status codes, streams) without starting a process. Call stop when done.
func InProcess(kind basev1.Kind, impl Driver) (client Driver, stop func(), err error) {
	if err := Servable(kind, impl); err != nil {
		return nil, nil, err
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	if err := Register(srv, kind, impl); err != nil {
		return nil, nil, err
	}
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///inprocess",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		srv.Stop()
		return nil, nil, fmt.Errorf("dial in-process driver: %w", err)
	}
	client, err = NewClient(kind, conn)
	if err != nil {
		_ = conn.Close()
		srv.Stop()
		return nil, nil, err
	}
	return client, func() { _ = conn.Close(); srv.Stop() }, nil
}

// nopRegistrar accepts registrations and discards them; Servable uses it to type-check an
// implementation against its kind.
type nopRegistrar struct{}

func (nopRegistrar) RegisterService(*grpc.ServiceDesc, any) {}
