// Package nsdial opens TCP connections from inside a network namespace, so that the node
// handler reaches a guest at the address it has in its launcher pod's namespace.
package nsdial

import (
	"context"
	"fmt"
	"net"
	"runtime"

	"github.com/vishvananda/netns"
)

// Dial connects to address over network ("tcp") from inside the network namespace at path
// (/proc/PID/ns/net, /run/netns/NAME); an empty path dials from the caller's namespace.
//
// The socket is made on an OS thread locked into the namespace and keeps that namespace for
// its life, so the returned conn is used from any goroutine. The thread goes back to its own
// namespace afterwards; when that fails it stays locked and ends with its goroutine, so that no
// other goroutine runs in the guest's namespace.
func Dial(ctx context.Context, path, network, address string) (net.Conn, error) {
	var d net.Dialer
	if path == "" {
		return d.DialContext(ctx, network, address)
	}
	target, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer target.Close()
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		own, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("current network namespace: %w", err)}
			return
		}
		defer own.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("enter network namespace %s: %w", path, err)}
			return
		}
		conn, dialErr := d.DialContext(ctx, network, address)
		if err := netns.Set(own); err == nil {
			runtime.UnlockOSThread()
		}
		// Otherwise the thread stays in the target namespace, locked: it exits with this
		// goroutine.
		done <- result{conn: conn, err: dialErr}
	}()
	r := <-done
	return r.conn, r.err
}
