package qmp

import (
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

// console holds the driver's one connection to a VM's serial socket (QEMU's socket chardev
// serves one client at a time), keeps the last consoleBacklog bytes of output and fans output
// out to any number of subscribers. Input from every subscriber goes to the one socket.
type console struct {
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

func newConsole(conn net.Conn) *console {
	c := &console{conn: conn, subs: map[*subscriber]struct{}{}, done: make(chan struct{})}
	go c.readLoop()
	return c
}

func (c *console) readLoop() {
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

func (c *console) publish(p []byte) {
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
func (c *console) subscribe() (*subscriber, []byte) {
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

func (c *console) unsubscribe(s *subscriber) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.subs, s)
}

// Write sends input to the serial port.
func (c *console) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.conn.Write(p)
}

// Close ends the connection and every subscriber.
func (c *console) Close() {
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
