// Package serial is what a hypervisor driver needs to own a VM's serial port as driver.Consoler
// asks: one connection to the port's unix socket, a backlog of recent output, and any number
// of readers and writers at once, none of which can hold up the guest or the others.
package serial

import (
	"context"
	"io"
	"net"
	"sync"
)

const (
	// consoleBacklog is how much recent serial output a new console subscriber gets first.
	consoleBacklog = 256 << 10
	// subscriberBuffer bounds what a slow subscriber may fall behind; beyond it the oldest
	// bytes are dropped rather than stalling the guest or the other subscribers.
	subscriberBuffer = 1 << 20
)

// Console holds the driver's one connection to a VM's serial socket (a hypervisor's socket
// chardev serves one client at a time), keeps the last consoleBacklog bytes of output and fans
// output out to any number of subscribers. Input from every subscriber goes to the one socket.
type Console struct {
	conn net.Conn
	wmu  sync.Mutex // serialises input

	mu      sync.Mutex
	backlog []byte
	subs    map[*subscriber]struct{}
	closed  bool
	done    chan struct{}
}

// subscriber is one Console call's view of the output.
type subscriber struct {
	mu      sync.Mutex
	pending []byte
	notify  chan struct{} // has a value when pending has data
	closed  chan struct{} // closed when the console ends
}

// New attaches to a VM's serial port on conn, which the Console owns from now on.
func New(conn net.Conn) *Console {
	c := &Console{conn: conn, subs: map[*subscriber]struct{}{}, done: make(chan struct{})}
	go c.readLoop()
	return c
}

func (c *Console) readLoop() {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.conn.Read(buf)
		if n > 0 {
			c.publish(buf[:n])
		}
		if err != nil {
			c.Close()
			return
		}
	}
}

func (c *Console) publish(p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.backlog = append(c.backlog, p...)
	if len(c.backlog) > 2*consoleBacklog { // amortised trim
		c.backlog = append([]byte(nil), c.backlog[len(c.backlog)-consoleBacklog:]...)
	}
	for s := range c.subs {
		s.push(p)
	}
}

// subscribe returns a new subscriber and the output so far (up to consoleBacklog bytes).
func (c *Console) subscribe() (*subscriber, []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &subscriber{notify: make(chan struct{}, 1), closed: make(chan struct{})}
	if c.closed {
		close(s.closed)
	} else {
		c.subs[s] = struct{}{}
	}
	b := c.backlog
	if len(b) > consoleBacklog {
		b = b[len(b)-consoleBacklog:]
	}
	return s, append([]byte(nil), b...)
}

func (c *Console) unsubscribe(s *subscriber) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.subs, s)
}

// Serve is driver.Consoler's Console on this port: the backlog to out first, then the output
// as it comes, and in copied to the port, until ctx is done, in ends (nil in: never) or the port
// closes; after the port closed it writes the last output and returns nil.
func (c *Console) Serve(ctx context.Context, in io.Reader, out io.Writer) error {
	sub, backlog := c.subscribe()
	defer c.unsubscribe(sub)
	if len(backlog) > 0 {
		if _, err := out.Write(backlog); err != nil {
			return err
		}
	}
	inDone := make(chan struct{})
	if in != nil {
		go func() {
			defer close(inDone)
			_, _ = io.Copy(c, in)
		}()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-inDone:
			return nil
		case <-sub.notify:
			if p := sub.take(); len(p) > 0 {
				if _, err := out.Write(p); err != nil {
					return err
				}
			}
		case <-sub.closed:
			if p := sub.take(); len(p) > 0 {
				if _, err := out.Write(p); err != nil {
					return err
				}
			}
			return nil
		}
	}
}

// Write sends input to the serial port.
func (c *Console) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.conn.Write(p)
}

// Done is closed once the console has ended: the port closed (the VM process is gone) or Close.
func (c *Console) Done() <-chan struct{} { return c.done }

// Close ends the connection and every subscriber.
func (c *Console) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	_ = c.conn.Close()
	for s := range c.subs {
		close(s.closed)
	}
	c.subs = nil
	close(c.done)
}

func (s *subscriber) push(p []byte) {
	s.mu.Lock()
	s.pending = append(s.pending, p...)
	if over := len(s.pending) - subscriberBuffer; over > 0 {
		s.pending = append([]byte(nil), s.pending[over:]...)
	}
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// take returns and clears what is pending.
func (s *subscriber) take() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pending
	s.pending = nil
	return p
}
