package launcher

import (
	"context"

	lclient "github.com/kubevisor/kubevisor/core/driver/launcher"
)

// Client is the launcher client of the hypervisor SDK (core/driver/launcher), which the handler
// side uses too.
type Client = lclient.Client

// Dial connects to the launcher serving socketPath; it is core/driver/launcher's Dial.
func Dial(ctx context.Context, socketPath string) (*Client, error) {
	return lclient.Dial(ctx, socketPath)
}
