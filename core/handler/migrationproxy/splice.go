package migrationproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// halfCloser is a connection whose writing side ends on its own: *net.UnixConn (shutdown) and
// *tls.Conn (close_notify).
type halfCloser interface {
	net.Conn
	CloseWrite() error
}

// spliceBuffer is the size of a read: the most a TLS record holds, four times.
const spliceBuffer = 64 << 10

// splice carries bytes between src (the source's end: the VM process's socket at the source,
// the TLS connection at the target) and dst (the target's end) both ways until both directions
// have ended, counting them in toTarget and toSource as they go (and in count). A direction
// ends at EOF of its reader, which becomes a half-close of its writer; the other direction goes
// on. An error in either direction closes both ends, which ends the other. It closes both ends
// before it returns, and returns the first error, nil when both directions ended at EOF.
func splice(src, dst halfCloser, toTarget, toSource *atomic.Uint64, count func(toTarget bool, n int)) error {
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	fail := func(err error) {
		once.Do(func() {
			firstErr = err
			src.Close()
			dst.Close()
		})
	}
	half := func(r, w halfCloser, n *atomic.Uint64, toTarget bool) {
		buf := make([]byte, spliceBuffer)
		for {
			nr, rerr := r.Read(buf)
			if nr > 0 {
				nw, werr := w.Write(buf[:nr])
				n.Add(uint64(nw))
				count(toTarget, nw)
				if werr != nil {
					fail(werr)
					return
				}
			}
			if errors.Is(rerr, io.EOF) {
				if err := w.CloseWrite(); err != nil {
					fail(err)
				}
				return
			}
			if rerr != nil {
				fail(rerr)
				return
			}
		}
	}
	wg.Go(func() { half(src, dst, toTarget, true) })
	wg.Go(func() { half(dst, src, toSource, false) })
	wg.Wait()
	fail(nil)
	return firstErr
}
