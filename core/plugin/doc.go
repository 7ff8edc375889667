// Package plugin finds, starts, supervises and reattaches to driver plugins, the go-plugin
// (gRPC) processes a node's host runs drivers in.
//
// A plugin directory holds one manifest per driver (Discover, LoadManifest); a Host starts each
// (Start) and hands out connections (Conn, Driver, Hypervisor, ...) that survive the plugin's
// restarts.
//
// # Trust
//
// A binary runs only when its SHA-256 matches its manifest (go-plugin's SecureConfig); a
// reattached process must run an executable with that digest too (read from /proc/<pid>/exe).
// go-plugin's AutoMTLS cannot be reattached to, so the plugins' unix sockets live in a root-only
// directory (StateDir/sockets, 0700) instead, and each plugin gets a minimal environment rather
// than the host's.
//
// # Supervision
//
// One goroutine per driver waits for its process to exit (on a pidfd). An unexpected exit is
// logged with the process's exit status and last stderr lines, and the plugin is started again
// after a backoff (HostConfig.MinBackoff doubling up to MaxBackoff, reset once a process stayed
// up a minute) and configured again. Calls made while it is down fail at once with
// codes.Unavailable. Stop and Close do not count as exits.
//
// # Configuration
//
// Each driver is configured (Configure) with its manifest's Config when its process starts.
// Reconfigure hands a running driver another configuration, for what the driver takes while it
// runs (core/driver's Configure contract): an accepted one replaces the manifest's for every
// later start of that driver by this host, and the host's clients ask Capabilities again; a
// refused one changes nothing.
//
// # Reattach
//
// After a start the host writes a reattach record (go-plugin's ReattachConfig, the binary's
// digest, and the process's boot id, pid and start time) to StateDir/plugins/<name>.json. A
// plugin runs in its own process group and outlives its host; the next Host on the same state
// directory reattaches to it if the record still names that very process, running the manifest's
// binary, and otherwise kills it (only when it provably is that process) and starts a new one.
// Detach leaves the plugins for the next host on purpose; Close stops them.
//
// Limits of reattaching:
//   - A plugin's log lines (its stderr) go to the host that started it. Once that host is gone
//     they are lost, until the plugin is restarted: a reattaching host cannot reopen that pipe.
//     A reattached plugin's crash is therefore reported without its last words.
//   - What a plugin writes to os.Stdout/os.Stderr after Serve goes through go-plugin's stdio
//     stream, which buffers little while no host is attached; a driver should log with
//     driver.NewLogger instead.
//   - An exited plugin whose parent is gone is reaped by whatever adopts it (init, or a
//     subreaper); the host reaps only its own children.
//   - Processes survive the host process, not its container: for drivers to outlive a handler
//     container restart they must run outside that container's cgroup.
package plugin
