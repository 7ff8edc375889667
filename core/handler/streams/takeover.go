package streams

import (
	"context"
	"net"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// TakeOverMessage is the last thing an interactive console session gets when another session
// opens the same VMI's console: one interactive console per VMI, the newest wins (as a serial
// line has one terminal), and the one it replaces is closed after this line.
const TakeOverMessage = nodeapi.ConsoleTakenOver

// consoles keeps the interactive console session of each VMI.
type consoles struct {
	mu sync.Mutex
	by map[types.UID]*session
}

// session is one console stream.
type session struct {
	conn   net.Conn
	cancel context.CancelFunc
}

// attach makes s the VMI's console session, taking over from the one before, which gets
// TakeOverMessage and is closed.
func (c *consoles) attach(uid types.UID, s *session) {
	c.mu.Lock()
	if c.by == nil {
		c.by = map[types.UID]*session{}
	}
	old := c.by[uid]
	c.by[uid] = s
	c.mu.Unlock()
	if old != nil {
		_, _ = old.conn.Write([]byte(TakeOverMessage))
		old.cancel()
		_ = old.conn.Close()
	}
}

// detach forgets s when it still is the VMI's session.
func (c *consoles) detach(uid types.UID, s *session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by[uid] == s {
		delete(c.by, uid)
	}
}
