package cmd

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
)

// serveListener accepts connections on ln until ctx is done, opens one stream per connection
// with dial, and copies bytes both ways. A refused stream is reported with report and closes
// that connection only.
func serveListener(ctx context.Context, ln net.Listener, dial func(context.Context) (net.Conn, error), report func(error)) error {
	go func() { <-ctx.Done(); ln.Close() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		local, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer local.Close()
			remote, err := dial(ctx)
			if err != nil {
				report(err)
				return
			}
			defer remote.Close()
			splice(ctx, local, remote)
		}()
	}
}

// splice copies a to b and b to a until either side ends or ctx is done, then closes both. It
// does not wait for the other direction: a Read of stdin cannot be interrupted.
func splice(ctx context.Context, a, b io.ReadWriteCloser) {
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(a, b); done <- struct{}{} }()
	go func() { _, _ = io.Copy(b, a); done <- struct{}{} }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	a.Close()
	b.Close()
}
