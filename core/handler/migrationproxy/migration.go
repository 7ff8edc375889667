package migrationproxy

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
)

// side is which end of a migration a proxy is.
type side string

const (
	sideSource side = "source"
	sideTarget side = "target"
)

// Stats are a migration's figures on one side, so far.
type Stats struct {
	// Carried is how many connections were carried (handshake done, both ends connected);
	// Active how many are open now.
	Carried, Active int
	// Refused is how many connections were refused: at the target, handshakes naming this
	// migration that failed (another node, another CA, too many); at the source, connections
	// of the VM process that could not be carried to the target (dial, handshake, the target's
	// refusal). Under TLS 1.3 the target refuses the source's certificate after the source's
	// handshake is done: such a connection is counted carried and refused, and the source sees
	// only the TLS alert (the reason is in the target's log).
	Refused int
	// ToTarget and ToSource are the bytes carried each way, over every channel.
	ToTarget, ToSource uint64
	// Channels are the figures of each channel of the migration (ChannelMemory, ChannelDisks),
	// by name.
	Channels map[string]ChannelStats
}

// ChannelStats are one channel's figures, so far.
type ChannelStats struct {
	// Carried is how many connections of the channel were carried.
	Carried int
	// ToTarget and ToSource are the bytes carried each way on the channel.
	ToTarget, ToSource uint64
}

// Channels of a migration: each is its own pair of sockets (the source's, the target VM's),
// and its connections name it in the ClientHello (ChannelServerName).
const (
	// ChannelMemory carries the memory and device state: the MigrateRequest's
	// target_socket_path to the target's incoming_migration.socket_path.
	ChannelMemory = "memory"
	// ChannelDisks carries the disks a migration copies: the MigrateRequest's
	// target_disks_socket_path to the target's incoming_migration.disks_socket_path (its NBD
	// server).
	ChannelDisks = "disks"
)

// channel is one channel of a migration.
type channel struct {
	name string
	// socket is the unix socket: the target VM's (Incoming) or the one the proxy listens on
	// (Outgoing).
	socket string
	// ln is an Outgoing's listener.
	ln *net.UnixListener

	toTarget, toSource atomic.Uint64
	carried            atomic.Int64
}

// Migration is one side of one migration on this node's proxy (Incoming or Outgoing). Close it
// when the migration ends.
type Migration struct {
	p    *Proxy
	id   string
	side side
	// peer is the node at the other end: the source node of an Incoming, the target node of an
	// Outgoing.
	peer string
	// channels are the migration's channels by name; ChannelMemory is always one.
	channels map[string]*channel
	// ctx ends with Close; it stops dials and handshakes.
	ctx    context.Context
	cancel context.CancelFunc

	toTarget, toSource atomic.Uint64

	mu      sync.Mutex
	closed  bool
	conns   map[net.Conn]struct{}
	pending int // connections admitted and not yet carried or refused
	active  int // connections carried now (each has two ends in conns)
	carried int
	refused int
	wg      sync.WaitGroup
	closing sync.Once
}

// newMigration is a migration with a channel per entry of sockets (name: socket).
func newMigration(p *Proxy, s side, id, peer string, sockets map[string]string) *Migration {
	ctx, cancel := context.WithCancel(context.Background())
	m := &Migration{p: p, id: id, side: s, peer: peer, channels: map[string]*channel{}, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	for name, socket := range sockets {
		m.channels[name] = &channel{name: name, socket: socket}
	}
	return m
}

// channelSockets is the channels of a spec, by name: memory's, and disks' when set.
func channelSockets(memory, disks string) map[string]string {
	sockets := map[string]string{ChannelMemory: memory}
	if disks != "" {
		sockets[ChannelDisks] = disks
	}
	return sockets
}

// sockets lists the channels' sockets, for the log.
func (m *Migration) sockets() string {
	var parts []string
	for _, name := range []string{ChannelMemory, ChannelDisks} {
		if c := m.channels[name]; c != nil {
			parts = append(parts, name+"="+c.socket)
		}
	}
	return strings.Join(parts, " ")
}

// ID is the migration's identifier.
func (m *Migration) ID() string { return m.id }

// SocketPath is the unix socket of ChannelMemory: for an Outgoing the one the VM process is to
// connect to (the MigrateRequest's target_socket_path), for an Incoming the target VM's.
func (m *Migration) SocketPath() string { return m.channels[ChannelMemory].socket }

// DisksSocketPath is the unix socket of ChannelDisks, "" for a migration without it: for an
// Outgoing the one the VM process is to connect to (the MigrateRequest's
// target_disks_socket_path), for an Incoming the target VM's NBD socket.
func (m *Migration) DisksSocketPath() string {
	if c := m.channels[ChannelDisks]; c != nil {
		return c.socket
	}
	return ""
}

// Stats returns the migration's figures so far.
func (m *Migration) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := Stats{
		Carried: m.carried, Active: m.active, Refused: m.refused,
		ToTarget: m.toTarget.Load(), ToSource: m.toSource.Load(),
		Channels: map[string]ChannelStats{},
	}
	for name, c := range m.channels {
		st.Channels[name] = ChannelStats{Carried: int(c.carried.Load()), ToTarget: c.toTarget.Load(), ToSource: c.toSource.Load()}
	}
	return st
}

// Close ends the migration on this side: no new connection, every connection closed (both
// ends), the source's socket removed. It waits for what the migration runs, and may be called
// more than once.
func (m *Migration) Close() error {
	var err error
	m.closing.Do(func() {
		m.p.unregister(m)
		m.mu.Lock()
		m.closed = true
		m.mu.Unlock()
		m.cancel()
		for _, c := range m.channels {
			if c.ln != nil {
				// The listener removes its socket file.
				if cerr := c.ln.Close(); cerr != nil && err == nil {
					err = fmt.Errorf("close the migration socket %s: %w", c.socket, cerr)
				}
			}
		}
		m.closeConns()
		m.wg.Wait()
		m.p.log.Info("migration proxy closed", "migration", m.id, "side", m.side, "peer", m.peer, "stats", fmt.Sprintf("%+v", m.Stats()))
	})
	return err
}

// closeConns closes every connection of the migration.
func (m *Migration) closeConns() {
	m.mu.Lock()
	conns := make([]net.Conn, 0, len(m.conns))
	for c := range m.conns {
		conns = append(conns, c)
	}
	m.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// admit reserves room for one more connection, conn (its raw end, which Close closes while it
// is not carried yet), or says why there is none. The connection is then the migration's until
// refuse, or track and untrack: Close waits for it.
func (m *Migration) admit(conn net.Conn) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("migration %s has ended on this node", m.id)
	}
	if n := m.active + m.pending; n >= m.p.cfg.MaxConnsPerMigration {
		return fmt.Errorf("migration %s has %d connections already (at most %d)", m.id, n, m.p.cfg.MaxConnsPerMigration)
	}
	m.pending++
	m.conns[conn] = struct{}{}
	m.wg.Add(1)
	return nil
}

// refuse ends an admitted connection, conn, that was not carried, and counts it refused.
func (m *Migration) refuse(conn net.Conn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.conns, conn)
	m.pending--
	m.refused++
	m.wg.Done()
}

// countRefused counts a refused connection that was never admitted.
func (m *Migration) countRefused() {
	m.mu.Lock()
	m.refused++
	m.mu.Unlock()
}

// track makes conns (the two ends of the connection admitted as raw) carried, so that Close
// closes them, or returns false when the migration has ended meanwhile (the connection is then
// done with: the caller closes conns).
func (m *Migration) track(raw net.Conn, conns ...net.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.conns, raw)
	m.pending--
	if m.closed {
		m.wg.Done()
		return false
	}
	for _, c := range conns {
		m.conns[c] = struct{}{}
	}
	m.carried++
	m.active++
	return true
}

// untrack ends a carried connection, once its ends are closed.
func (m *Migration) untrack(conns ...net.Conn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range conns {
		delete(m.conns, c)
	}
	m.active--
	m.wg.Done()
}
