package migrationproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
)

// SocketName is the name of the source's socket in the VM's run directory that the handler
// gives Outgoing (and the driver's Migrate as target_socket_path).
const SocketName = "migration-proxy.sock"

// DisksSocketName is the name of the source's socket of ChannelDisks in the VM's run directory
// that the handler gives Outgoing as DisksSocket (and the driver's Migrate as
// target_disks_socket_path).
const DisksSocketName = "migration-proxy-disks.sock"

// maxSocketPath is the longest path a unix socket can be bound at (sun_path, with its NUL).
const maxSocketPath = 107

// OutgoingSpec is a migration this node sends: the source side.
type OutgoingSpec struct {
	// ID identifies the migration (ValidID), as the target's Incoming has it.
	ID string
	// TargetNode is the node the migration goes to: the only node whose certificate is accepted
	// from TargetAddr.
	TargetNode string
	// TargetAddr is the target handler's proxy address, host:port (its pod IP and
	// nodeapi.MigrationPort).
	TargetAddr string
	// Socket is the unix socket the proxy listens on for the VM process's connections: an
	// absolute path in the source VM's run directory (<run_dir>/SocketName), which the driver's
	// Migrate gets as target_socket_path. Something other than a socket there is an error; a
	// socket left by an earlier migration is replaced.
	Socket string
	// DisksSocket, when set, is the socket of ChannelDisks, for a migration that copies disks:
	// an absolute path in the source VM's run directory (<run_dir>/DisksSocketName) other than
	// Socket, which the driver's Migrate gets as target_disks_socket_path; its connections go to
	// the target's IncomingSpec.DisksTargetSocket. Same rules as Socket.
	DisksSocket string
	// Owner, when set, is given the socket (the VM process's user, the owner of the run
	// directory); else it stays the handler's. It is 0600 either way.
	Owner *Owner
}

// Owner is a user and group id.
type Owner struct{ UID, GID int }

// Outgoing makes the proxy listen on spec.Socket (and spec.DisksSocket) and carry each
// connection made there to the target handler at spec.TargetAddr over mutual TLS, on the
// channel of that socket, until the returned Migration is closed (which removes the sockets). It fails with ErrDisabled when the proxy does not run,
// ErrNoCertificate without this node's certificate, ErrExists when the migration is already
// sent from here, and ErrInvalid for a spec that is not valid.
func (p *Proxy) Outgoing(spec OutgoingSpec) (*Migration, error) {
	switch {
	case !ValidID(spec.ID):
		return nil, fmt.Errorf("%w: migration id %q is not a DNS label", ErrInvalid, spec.ID)
	case spec.TargetNode == "":
		return nil, fmt.Errorf("%w: the target node is required", ErrInvalid)
	case spec.TargetNode == p.cfg.NodeName:
		return nil, fmt.Errorf("%w: the target node %s is this node (a migration within a node needs no proxy)", ErrInvalid, spec.TargetNode)
	case !filepath.IsAbs(spec.Socket) || len(spec.Socket) > maxSocketPath:
		return nil, fmt.Errorf("%w: the socket %q is not an absolute path of at most %d bytes", ErrInvalid, spec.Socket, maxSocketPath)
	case spec.DisksSocket != "" && (!filepath.IsAbs(spec.DisksSocket) || len(spec.DisksSocket) > maxSocketPath):
		return nil, fmt.Errorf("%w: the disks socket %q is not an absolute path of at most %d bytes", ErrInvalid, spec.DisksSocket, maxSocketPath)
	case filepath.Clean(spec.DisksSocket) == filepath.Clean(spec.Socket):
		return nil, fmt.Errorf("%w: the disks socket is the memory socket %q", ErrInvalid, spec.Socket)
	}
	if _, _, err := net.SplitHostPort(spec.TargetAddr); err != nil {
		return nil, fmt.Errorf("%w: target address %q: %w", ErrInvalid, spec.TargetAddr, err)
	}
	if _, err := p.credentials(); err != nil {
		return nil, err
	}
	m := newMigration(p, sideSource, spec.ID, spec.TargetNode, channelSockets(spec.Socket, spec.DisksSocket))
	if err := p.register(m); err != nil {
		return nil, err
	}
	for _, c := range m.channels {
		ln, err := listenSocket(c.socket, spec.Owner)
		if err != nil {
			for _, o := range m.channels {
				if o.ln != nil {
					o.ln.Close()
				}
			}
			p.unregister(m)
			return nil, err
		}
		c.ln = ln
	}
	for _, c := range m.channels {
		m.wg.Go(func() { p.acceptOutgoing(m, c, spec.TargetAddr) })
	}
	p.log.Info("migration proxy sends a migration", "migration", m.id, "target", m.peer, "addr", spec.TargetAddr, "sockets", m.sockets())
	return m, nil
}

// listenSocket listens on path, 0600 and given to owner (when set), replacing a socket there.
func listenSocket(path string, owner *Owner) (*net.UnixListener, error) {
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.Mode().Type() != fs.ModeSocket:
		return nil, fmt.Errorf("%w: %s exists and is not a socket", ErrInvalid, path)
	case err == nil:
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove the socket left at %s: %w", path, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("migration socket: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Net: "unix", Name: path})
	if err != nil {
		return nil, fmt.Errorf("migration socket: %w", err)
	}
	// The run directory (0700) keeps others from the socket until its mode is set.
	err = os.Chmod(path, 0o600)
	if err == nil && owner != nil {
		err = os.Lchown(path, owner.UID, owner.GID)
	}
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("migration socket: %w", err)
	}
	return ln, nil
}

// acceptOutgoing carries each connection of the VM process on the socket of m's channel c to
// the target, until m is closed.
func (p *Proxy) acceptOutgoing(m *Migration, c *channel, addr string) {
	for {
		conn, err := c.ln.AcceptUnix()
		if err != nil {
			if m.ctx.Err() == nil {
				p.log.Error("migration socket stopped accepting", "migration", m.id, "channel", c.name, "socket", c.socket, "error", err)
			}
			return
		}
		if err := m.admit(conn); err != nil {
			p.log.Warn("migration connection refused", "side", sideSource, "migration", m.id, "channel", c.name, "reason", err)
			p.metrics.refused(sideSource)
			m.countRefused()
			conn.Close()
			continue
		}
		go p.dialTarget(m, c, conn, addr)
	}
}

// dialTarget carries an admitted connection of the VM process to the target handler.
func (p *Proxy) dialTarget(m *Migration, c *channel, vconn *net.UnixConn, addr string) {
	tconn, err := p.dial(m, c, addr)
	if err != nil {
		if m.ctx.Err() == nil {
			p.log.Warn("migration connection not carried: the target refused or could not be reached", "side", sideSource, "migration", m.id, "channel", c.name,
				"target", m.peer, "addr", addr, "peer", peerName(err), "reason", err)
		}
		p.metrics.refused(sideSource)
		m.refuse(vconn)
		vconn.Close()
		return
	}
	p.carry(m, c, vconn, vconn, tconn, addr)
}

// dial connects to the target handler at addr and completes the handshake for m's channel ch.
func (p *Proxy) dial(m *Migration, ch *channel, addr string) (*tls.Conn, error) {
	c, err := p.credentials()
	if err != nil {
		return nil, err
	}
	d := &tls.Dialer{
		NetDialer: &net.Dialer{Timeout: p.cfg.DialTimeout},
		Config:    clientConfig(c, ChannelServerName(m.id, ch.name), m.peer),
	}
	ctx, cancel := context.WithTimeout(m.ctx, p.cfg.DialTimeout+p.cfg.HandshakeTimeout)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return conn.(*tls.Conn), nil
}
