package migrationproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"
)

// IncomingSpec is a migration this node receives: the target side.
type IncomingSpec struct {
	// ID identifies the migration (ValidID: the VirtualMachineInstanceMigration's UID). The
	// source handler names it in its connections.
	ID string
	// SourceNode is the node the migration comes from: the only node whose certificate is
	// accepted for it.
	SourceNode string
	// TargetSocket is the target VM's incoming socket (its DomainSpec.incoming_migration.
	// socket_path), which each connection is carried to. The proxy does not make or remove it.
	TargetSocket string
	// DisksTargetSocket, when set, is the target VM's NBD socket (its
	// incoming_migration.disks_socket_path), which each connection of ChannelDisks is carried
	// to, for a migration that copies disks. The proxy does not make or remove it.
	DisksTargetSocket string
}

// Incoming makes the proxy accept connections for migration spec.ID from the handler of
// spec.SourceNode on its port, and carry each to spec.TargetSocket (a connection of
// ChannelDisks to spec.DisksTargetSocket), until the returned
// Migration is closed. It fails with ErrDisabled when the port is not served, ErrNoCertificate
// without this node's certificate, ErrExists when the migration is already expected here, and
// ErrInvalid for a spec that is not valid.
func (p *Proxy) Incoming(spec IncomingSpec) (*Migration, error) {
	switch {
	case !ValidID(spec.ID):
		return nil, fmt.Errorf("%w: migration id %q is not a DNS label", ErrInvalid, spec.ID)
	case spec.SourceNode == "":
		return nil, fmt.Errorf("%w: the source node is required", ErrInvalid)
	case spec.SourceNode == p.cfg.NodeName:
		return nil, fmt.Errorf("%w: the source node %s is this node (a migration within a node needs no proxy)", ErrInvalid, spec.SourceNode)
	case !filepath.IsAbs(spec.TargetSocket):
		return nil, fmt.Errorf("%w: the target socket %q is not an absolute path", ErrInvalid, spec.TargetSocket)
	case spec.DisksTargetSocket != "" && !filepath.IsAbs(spec.DisksTargetSocket):
		return nil, fmt.Errorf("%w: the disks target socket %q is not an absolute path", ErrInvalid, spec.DisksTargetSocket)
	}
	if _, err := p.credentials(); err != nil {
		return nil, err
	}
	m := newMigration(p, sideTarget, spec.ID, spec.SourceNode, channelSockets(spec.TargetSocket, spec.DisksTargetSocket))
	if err := p.register(m); err != nil {
		return nil, err
	}
	p.log.Info("migration proxy expects a migration", "migration", m.id, "source", m.peer, "sockets", m.sockets())
	return m, nil
}

// serveConn runs the handshake of a connection to the port and carries it to its migration's
// target socket.
func (p *Proxy) serveConn(ctx context.Context, conn net.Conn) {
	remote := conn.RemoteAddr().String()
	var (
		serverName string     // what the client sent
		admitted   *Migration // the migration the handshake was admitted to
		ch         *channel   // and its channel
	)
	cfg := p.serverConfig(func(name string) { serverName = name }, func(m *Migration, c *channel) error {
		if err := m.admit(conn); err != nil {
			return err
		}
		admitted, ch = m, c
		return nil
	})
	tconn := tls.Server(conn, cfg)
	hctx, cancel := context.WithTimeout(ctx, p.cfg.HandshakeTimeout)
	err := tconn.HandshakeContext(hctx)
	cancel()
	<-p.pending
	if err != nil {
		name := peerName(err)
		if name == "" {
			if certs := tconn.ConnectionState().PeerCertificates; len(certs) > 0 {
				name = certs[0].Subject.CommonName
			}
		}
		p.log.Warn("migration connection refused", "side", sideTarget, "remote", remote, "server_name", serverName, "peer", name, "reason", err)
		p.metrics.refused(sideTarget)
		if admitted != nil {
			admitted.refuse(conn)
		} else if id, _, ierr := idOfServerName(serverName); ierr == nil {
			if m := p.incomingMigration(id); m != nil {
				m.countRefused()
			}
		}
		tconn.Close()
		return
	}
	m := admitted
	dctx, cancel := context.WithTimeout(m.ctx, p.cfg.DialTimeout)
	vconn, err := (&net.Dialer{}).DialContext(dctx, "unix", ch.socket)
	cancel()
	if err != nil {
		p.log.Warn("migration connection not carried: the target VM's socket", "migration", m.id, "channel", ch.name, "remote", remote, "socket", ch.socket, "error", err)
		p.metrics.refused(sideTarget)
		m.refuse(conn)
		tconn.Close()
		return
	}
	p.carry(m, ch, conn, tconn, vconn.(*net.UnixConn), remote)
}

// remoteAlert says err is a TLS alert the peer sent (it refused the handshake).
func remoteAlert(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error"
}

// carry splices the two ends of the connection of channel ch admitted as raw (src the source's
// end) until both directions end or the migration is closed.
func (p *Proxy) carry(m *Migration, ch *channel, raw net.Conn, src, dst halfCloser, remote string) {
	if !m.track(raw, src, dst) {
		src.Close()
		dst.Close()
		return
	}
	p.metrics.carried(m.side)
	ch.carried.Add(1)
	start := time.Now()
	before := m.Stats()
	p.log.Debug("migration connection carried", "migration", m.id, "channel", ch.name, "side", m.side, "remote", remote)
	metric := p.metrics.counter(m.side)
	err := splice(src, dst, &ch.toTarget, &ch.toSource, func(toTarget bool, n int) {
		if toTarget {
			m.toTarget.Add(uint64(n))
		} else {
			m.toSource.Add(uint64(n))
		}
		metric(toTarget, n)
	})
	after := m.Stats()
	p.metrics.done(m.side)
	if remoteAlert(err) {
		// Under TLS 1.3 the client's handshake is done before the server has checked its
		// certificate: the target's refusal comes as an alert on the first read.
		p.log.Warn("migration connection refused by the peer", "side", m.side, "migration", m.id, "peer_node", m.peer, "remote", remote, "reason", err)
		p.metrics.refused(m.side)
		m.countRefused()
	}
	m.untrack(src, dst)
	// The counts are the migration's: with several connections at once they are not this
	// connection's alone.
	p.log.Debug("migration connection ended", "migration", m.id, "channel", ch.name, "side", m.side, "remote", remote,
		"duration", time.Since(start).Round(time.Millisecond), "to_target", after.ToTarget-before.ToTarget, "to_source", after.ToSource-before.ToSource, "error", err)
}
