package qmp

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/driver"
)

// Display implements driver.Displayer: one RFB session with QEMU's VNC server, which listens on
// the domain spec's vnc.socket_path (args.go gives the VM a VGA device and `-vnc unix:...`).
// QEMU serves several VNC clients at once, so every call is its own session; a session ends when
// either side closes, ctx ends, or QEMU exits (the socket closes).
func (d *Driver) Display(ctx context.Context, id string, in io.Reader, out io.Writer) error {
	v, err := d.get(id)
	if err != nil {
		return err
	}
	if _, _, err := v.running(); err != nil {
		return err
	}
	path := v.spec.GetVnc().GetSocketPath()
	if path == "" {
		return status.Errorf(codes.FailedPrecondition, "vm %q has no display (its domain spec has no vnc)", id)
	}
	err = driver.ServeUnixStream(ctx, path, in, out)
	if dialErr := (*driver.DialError)(nil); errors.As(err, &dialErr) {
		return status.Errorf(codes.Unavailable, "vm %q: connect to its VNC server: %v", id, dialErr.Err)
	}
	return err
}
