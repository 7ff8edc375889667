package libvirt

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/driver"
)

var _ driver.Displayer = (*Driver)(nil)

// Display implements driver.Displayer: one RFB session with QEMU's VNC server, which listens on
// the domain spec's vnc.socket_path (xml.go's <graphics type='vnc' socket=...>; libvirt gives
// the domain a video card with it). QEMU serves several VNC clients at once (libvirt's default
// share policy), so every call is its own session; a session ends when either side closes, ctx
// ends, or QEMU exits (the socket closes).
func (d *Driver) Display(ctx context.Context, id string, in io.Reader, out io.Writer) error {
	v, err := d.get(id)
	if err != nil {
		return err
	}
	v.mu.Lock()
	st := v.state
	v.mu.Unlock()
	if !active(st) {
		return status.Errorf(codes.FailedPrecondition, "vm %q is not running (%s)", id, driver.StateWord(st))
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
