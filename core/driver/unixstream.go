package driver

import (
	"context"
	"io"
	"net"
	"sync"
)

// ServeUnixStream connects to the unix socket at path and carries one session between it and
// in/out (in may be nil: nothing is sent) until either side closes or ctx ends: a hypervisor's
// VNC server for Displayer, for example. Dial errors are returned as they are, for the caller to
// name the VM; the end of ctx is not an error.
func ServeUnixStream(ctx context.Context, path string, in io.Reader, out io.Writer) error {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", path)
	if err != nil {
		return &DialError{Err: err}
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

// DialError is ServeUnixStream's failure to connect, as opposed to one of the session.
type DialError struct{ Err error }

func (e *DialError) Error() string { return e.Err.Error() }
func (e *DialError) Unwrap() error { return e.Err }
