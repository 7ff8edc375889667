package libvirt

import (
	"context"
	"io"
	"net"
	"sync"

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
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", path)
	if err != nil {
		return status.Errorf(codes.Unavailable, "vm %q: connect to its VNC server: %v", id, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); conn.Close() }) }
	defer stop()
	go func() {
		<-ctx.Done()
		stop()
	}()
	if in != nil {
		go func() {
			_, _ = io.Copy(conn, in)
			stop()
		}()
	}
	_, err = io.Copy(out, conn)
	if ctx.Err() != nil {
		return nil
	}
	return err
}
