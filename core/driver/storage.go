package driver

import (
	"context"

	"google.golang.org/grpc"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

type storageServer struct {
	storagev1.UnimplementedStorageServer
	impl Storage
}

func (s *storageServer) Prepare(ctx context.Context, req *storagev1.PrepareRequest) (*storagev1.PrepareResponse, error) {
	return s.impl.Prepare(ctx, req)
}

func (s *storageServer) Release(ctx context.Context, req *storagev1.ReleaseRequest) (*storagev1.ReleaseResponse, error) {
	return &storagev1.ReleaseResponse{}, s.impl.Release(ctx, req)
}

// StorageClient is the host's Storage: it calls a storage plugin over gRPC.
type StorageClient struct {
	baseClient
	st storagev1.StorageClient
}

var _ Storage = (*StorageClient)(nil)

// NewStorageClient returns a client for the storage plugin served on conn.
func NewStorageClient(conn grpc.ClientConnInterface) *StorageClient {
	return &StorageClient{baseClient: baseClient{base: basev1.NewDriverClient(conn)}, st: storagev1.NewStorageClient(conn)}
}

// Prepare implements Storage.
func (c *StorageClient) Prepare(ctx context.Context, req *storagev1.PrepareRequest) (*storagev1.PrepareResponse, error) {
	return c.st.Prepare(ctx, req)
}

// Release implements Storage.
func (c *StorageClient) Release(ctx context.Context, req *storagev1.ReleaseRequest) error {
	_, err := c.st.Release(ctx, req)
	return err
}
