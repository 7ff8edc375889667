// Package migrationproxy is the node handler's migration proxy: it carries a live migration's
// streams between the source node's handler and the target node's, over mutual TLS, so that
// neither VM process ever listens on the network.
//
//	source VM process ──unix──▶ source handler ══TLS══▶ target handler ──unix──▶ target VM process
//	  (connects to the          (Outgoing: listens on   (Incoming: accepts     (listens on
//	   MigrateRequest's          a socket in the VM's    on MigrationPort)      DomainSpec.incoming_
//	   target_socket_path)       run_dir)                                       migration.socket_path)
//
// # Protocol
//
// A migration has one or two channels, each a pair of unix sockets: ChannelMemory (the memory
// and device state: the source's Socket, the target VM's incoming socket) and, for a migration
// that copies disks, ChannelDisks (the disk mirrors' NBD stream: the source's DisksSocket, the
// target VM's NBD socket, IncomingSpec.DisksTargetSocket). A connection made on a channel's
// source socket reaches that channel's target socket and no other.
//
// One TCP connection per stream the VM process opens: a hypervisor may open several for one
// migration (QEMU's post-copy preemption channel, multifd channels, one NBD connection per
// mirrored disk), and each is carried on a TLS connection of its own, so that they neither
// share a window nor wait on one another. The bytes after the handshake are the VM process's, untouched: no header, no
// framing. Each direction ends on its own: when one side stops writing (EOF on the unix socket,
// close_notify on TLS) the proxy passes the half-close on and the other direction goes on (the
// VM process's return path keeps talking after the main stream is done). An error in either
// direction closes both ends of that connection.
//
// The migration and the channel are named in the TLS ClientHello: the server name (SNI) is
// ChannelServerName(id, channel), with id the migration's identifier (a DNS label: the
// VirtualMachineInstanceMigration's UID): "<id>.migration.kubevisor.io" (ServerName(id)) for
// ChannelMemory, "<channel>.<id>.migration.kubevisor.io" for another channel ("disks.<id>...");
// the application protocol (ALPN) is Protocol. The identifier and the channel are in the
// ClientHello rather than in the first bytes of the stream because
//   - the target handler knows which migration and channel are asked for before the handshake
//     completes, and so which node the client certificate must name: it refuses an unknown or
//     ended migration, a channel that migration does not have, and a client of another node, in
//     the handshake itself, before it has read a byte of the stream or dialled the VM's socket;
//   - the stream stays the VM process's own bytes, with nothing to parse or wait for, and no
//     header a slow client could hold a connection open with;
//   - ALPN versions the protocol: a later one (a framed stream, say) is negotiated, not guessed.
//
// The identifier and the channel are not secrets (SNI is sent in clear, and anyone who can read
// the migration object knows them): they route and scope, the certificates authenticate; every
// channel of a migration has the same trust rules (below), checked on each connection. A token known to both
// handlers would add nothing: only the source node's handler holds the key of its node
// certificate.
//
// # Trust
//
// Both handlers present their node certificate (core/nodeapi: common name
// nodeapi.NodeCommonName(node), issued by the control plane's CA, ExtKeyUsage serverAuth and
// clientAuth), read from Config.CertDir (tls.crt, tls.key, ca.crt) and read again when the files
// change. TLS 1.2 or later; no session resumption (every connection is verified against the
// current CA bundle).
//   - The target accepts a client certificate that chains to the CA bundle, is valid now, is
//     for clientAuth, and names the source node of that migration (Incoming's SourceNode).
//   - The source accepts a server certificate that chains to the CA bundle, is valid now, is for
//     serverAuth, and names the target node (Outgoing's TargetNode). The address dialled is not
//     in the certificate (pod or node IPs change): the node name is what is checked.
//   - Every refusal (unknown migration, another node, another CA, expired, no certificate,
//     another protocol) is logged with its reason, the remote address and the name in the peer's
//     certificate, and counted. The other side learns only the TLS alert (internal error for an
//     unknown migration, bad certificate, unknown certificate authority) and logs that; under
//     TLS 1.3 a source learns of the target's refusal of its certificate at its first read, after
//     its handshake is done. Either way the VM process's connection is closed, and its
//     migration fails.
//
// Nothing listens unauthenticated: the TCP port (MigrationPort) completes a handshake only with
// a certificate of the CA, and carries bytes only for a migration this node expects from the
// client's node. The source's unix sockets are made 0600 in the VM's run directory (0700), given
// to the VM process's user when Outgoing says so: only that user and root on the node reach them.
// The target's sockets are the hypervisor driver's own, in the target VM's run directory.
//
// # Lifetime and limits
//
// Incoming and Outgoing return a Migration, which the handler closes when the migration ends,
// fails or is cancelled: Close stops accepting for it, closes every connection it carries
// (both ends), removes the source's sockets, and waits for its goroutines. The target's sockets
// are left to the driver. The proxy itself closes every migration when its Run ends.
//
//   - Config.MaxConnsPerMigration connections at once per migration and side (8), its channels
//     together; more are refused.
//   - Config.MaxPendingHandshakes handshakes at once on the port (32); more connections are
//     closed unanswered.
//   - A handshake must complete within Config.HandshakeTimeout (10 s), and the source's dial of
//     the target within Config.DialTimeout (10 s). Once carrying, a connection has no idle
//     timeout (the return path idles for the whole pre-copy): TCP keep-alive finds a dead peer,
//     and the hypervisor's own progress (the control plane's progress timeout) a stalled one.
//   - No bandwidth limit of its own: the hypervisor's (MigrateRequest.bandwidth_bytes_per_second)
//     applies to the stream it writes.
//
// # Progress
//
// Migration.Stats counts the bytes carried each way and the connections carried and refused,
// live, in all and by channel (Stats.Channels). With Config.Registerer the proxy also exports Prometheus metrics, by side and direction
// (not by migration: their number is unbounded):
//
//	kubevisor_migration_proxy_bytes_total{side, direction}
//	kubevisor_migration_proxy_connections_total{side, result}   result: carried, refused
//	kubevisor_migration_proxy_active_connections{side}
package migrationproxy
