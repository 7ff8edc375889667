// Package libvirt is Kubevisor's libvirt hypervisor driver: it runs each VM as a transient
// libvirt domain, built with libvirt.org/go/libvirtxml from the same driver-neutral domain spec
// as the qmp driver, on a libvirt daemon of its own, and serves the serial console.
//
// # One daemon per VM, in the VM's sandbox
//
// Each VM gets a libvirtd (Debian 12's libvirt 9.0 has the monolithic daemon only) started
// through the VMI's launcher, so that the daemon and the QEMU it forks live in the launcher's
// sandbox (the launcher pod's cgroup, network namespace and volumes), exactly as the qmp
// driver's QEMU does. The daemon runs in session mode as Config.User: libvirt chooses the mode
// by the daemon's euid, and a root daemon is the node's system daemon (system paths, cgroups,
// DAC relabelling, capabilities it cannot have in a launcher pod). Its XDG directories are in
// <run dir>/lv, so two VMs' daemons share nothing; each daemon has one domain, named "vm". The
// launcher, root, drops to the user with util-linux setpriv: in a cluster the HypervisorClass
// keeps SETUID and SETGID, which setpriv needs for that, for the launcher's compute container
// (launcherCapabilities), and the launcher image carries libvirtd, its modules and swtpm's
// tools (hack/images).
//
// What the daemon, and the QEMU it forks, then run with (TestDaemonCredentials reads it):
// the user's uid and gid (real, effective, saved, file system), no supplementary group, empty
// inheritable, permitted, effective and ambient capability sets, and no_new_privs, so that they
// hold no capability and an exec of a set-user-ID or file-capability program grants none. The
// bounding set is emptied only where the launcher has CAP_SETPCAP (root's, in standalone mode
// and the conformance kit without a class). A launcher pod's compute container lacks it, and
// setpriv then leaves the bounding set as the launcher's, SETUID and SETGID, without failing
// (util-linux 2.38): capabilities the two processes do not hold and that only an exec could
// add to their permitted set, which no_new_privs forbids.
//
// # Dying with the launcher
//
// The daemon and its QEMU die with the VM's launcher, even a SIGKILLed one, with no driver
// process running. The launcher starts its process with a parent-death signal, which setpriv's
// change of user clears (prctl(2)): setpriv sets it again (--pdeathsig=KILL, util-linux 2.38).
// QEMU, which libvirt daemonizes, is not the daemon's child but the launcher's (a child
// subreaper adopts it), and nothing in libvirt or QEMU ends it when the daemon dies: in a
// launcher pod the launcher is the init of the container's pid namespace, whose death kills
// every process in it; a launcher that is not (the conformance kit's, standalone mode's: a
// process of the node) has the domain's emulator be a script in the daemon's directory that
// execs QEMU through setpriv --pdeathsig=KILL (daemon.emulator), which needs /bin/sh and setpriv
// where that launcher runs.
//
// Because QEMU runs as that user, the driver gives the user what QEMU must open (access.go),
// and nothing more: the taps the network driver made (their owner and group, TUNSETOWNER and
// TUNSETGROUP: libvirt opens taps by name, not descriptors), the VM's writable disk images
// (their owner), and POSIX ACL entries for the user alone on the run dir, on read-only disks,
// their qcow2 backing chain and kernels, with search on the directories on the way, and on the
// sandbox's /dev/net/tun and /dev/kvm (a launcher pod's device nodes copy the host's mode, which
// may be root's 0600). Start then opens each file as that user (setfsuid) and names the one it
// cannot.
//
// The daemon binds QEMU's monitor socket under the run dir, and a unix socket path has 107
// bytes: Create refuses a run dir longer than 60 bytes by its field (a cluster's per-VMI run
// dirs, /run/kubevisor/vmi/<uid>/run, have 59).
//
// # Lifecycle and events
//
// Create checks the spec by building the domain XML. Start starts the daemon when none runs,
// then creates the domain (virDomainCreateXML) with its vCPUs stopped, attaches the serial
// port, and resumes the guest (unless the spec starts paused): QEMU drops what a guest writes to
// a socket port that no client holds, so a guest running at once could lose its first lines on
// a loaded node. State changes come from libvirt's event loop
// (lifecycle and reboot events, one default event loop per driver process); a guest reboot is a
// reset of the same QEMU (on_reboot restart), counted in boots. Shutdown presses the ACPI power
// button until the guest powers off or the timeout, then destroys the domain. Delete kills the
// daemon and removes its directory. A connection to a daemon that closes unasked (keepalive:
// 5 s x 3) ends the VM's run as CRASHED, ProcessExited, with the daemon's last log lines.
//
// # Errors: what a user sees
//
// Every error is a gRPC status; the handler puts it in the VMI's Synchronized=False condition
// with the failed step as its reason (HypervisorStartFailed for Start).
//
//   - Create refuses what the spec alone shows (domain.Validate, then BuildDomain: what the
//     driver does not implement or accept) with the field path, InvalidArgument; what the node
//     lacks (KVM, OVMF, swtpm) is FailedPrecondition naming the field.
//   - Start hands the domain to libvirt and QEMU, which check the rest: a machine type this
//     QEMU does not offer, an unknown CPU model or feature, more vCPUs than the machine type
//     takes, a read-only sata disk, a PCI address used twice or beyond the buses, an image not
//     of its format, block sizes QEMU refuses, a host NUMA node or CPU the node lacks, a tap that
//     is gone. BuildDomain keeps a record of which spec field each part of the XML came from
//     (Origins, origins.go: the element or attribute, a device by its alias, and the names
//     libvirt and QEMU call it by: guest target, path, tap, MAC, PCI address), and Explain places
//     libvirt's refusal with it: the error names the spec's field paths, the device, then
//     libvirt's message whole and what QEMU wrote to its log at that start, e.g.
//     "cpu.model: libvirt: internal error: Unknown CPU model NoSuchCPU" or
//     `disks[1].format: disk "data": libvirt: internal error: ... Image is not in qcow2 format`.
//     The code is InvalidArgument when the spec cannot run as written, FailedPrecondition when
//     the node's state forbids it (a host CPU or NUMA node that is not there, the network
//     driver's tap gone, an image another process holds, a file the VM's user cannot open),
//     Internal otherwise. A refusal Explain cannot place says so: "libvirt refused the domain,
//     naming no field of the domain spec: <libvirt's message>" (InvalidArgument when libvirt
//     calls it a configuration error, else Internal). The refusals it places are those
//     measured with libvirt 9.0 and QEMU 7.2 (origins_test.go).
//   - A failed Start leaves nothing behind: the domain is transient, so a refused one is never
//     defined; the daemon the Start started is stopped and its sockets removed; the VM stays as
//     it was (CREATED, STOPPED or CRASHED) and starts again or is deleted. A daemon that ran
//     before the Start stays, as the VM's, until Delete.
//   - The VM's daemon failing to come up (libvirtd missing in the sandbox, a configuration it
//     cannot read, a runtime directory it cannot write, an exit at once, no answer within 30 s)
//     fails Start with Internal: "the VM's libvirtd (<path>) exited before it served the VM
//     (pid N); its log ends: <its last lines>" (or "could not be started", or "did not serve
//     the VM within 30s ..., and was killed"). It is killed if it still runs and its sockets
//     removed; other VMs' daemons are their own and are not touched.
//   - A daemon that dies, or hangs past its keepalive, while its VM runs ends the VM's run as
//     CRASHED, ProcessExited, "the VM's libvirtd went away ...: <its last log lines>"; the
//     daemon (if hung) and its QEMU are killed and their sockets removed; Start then runs a new
//     daemon.
//
// # Recover
//
// The daemon is the launcher's child, not the driver's, so it and its domain outlive the driver
// process. Recover connects again to the daemon named in the VM's record (checked to be that
// daemon by its environment) and takes the domain's state; the serial backlog starts then.
//
// A driver process SIGKILLed after the launcher started the VM's daemon, before it recorded
// it, leaves a daemon no record names; so does a Recover that cannot reach the daemon. The
// launcher runs one process at a time, so a Start under a launcher first kills what the
// launcher runs (launcher.SocketStarter.KillLeftover), with the QEMU that daemon's pid file
// names, checked by its command line (where the driver shares the launcher's pid namespace:
// not a launcher pod's), and its sockets, then starts the VM's daemon.
//
// # Live migration
//
// A VM moves between two VMs' daemons by libvirt's own migration (migrate.go, driver.Migrator),
// peer to peer and tunnelled: the source's daemon connects to the target's, as a libvirt
// client, and QEMU's migration stream travels inside that one libvirt connection (a virStream),
// so the migration is one unix-socket connection (and a second, short one in which the source's
// driver reads the target's domain), which the node agents' proxies carry like any byte
// stream; nothing listens on a network port.
//
//   - Target: Start (incoming_migration set) starts the VM's daemon as for any Start and defines
//     the target's domain on it, built from the target's own spec (its run dir's sockets, its
//     emulator), without starting it; then makes incoming_migration.socket_path a symlink to the
//     daemon's socket. The VM is PAUSED (IncomingMigration), no QEMU runs: "the daemon is up and
//     ready to receive". A symlink, not a proxy in the driver: it holds nothing the driver
//     process owns, so a driver that restarts mid-migration does not cut the stream, and a
//     Recover finds the target as it was. libvirt's Prepare, called by the source's daemon
//     through that socket, starts the target's QEMU paused (the lifecycle event STARTED,
//     migrated: the migration is ACTIVE) and its Finish resumes it (RESUMED, migrated or
//     post-copy): the driver then attaches the serial console, undefines the domain (transient,
//     as every VM's) and removes the symlink, and reports STARTED, RUNNING (Migrated), the
//     migration COMPLETED; the guest did not boot (boots stays 0). A domain libvirt stops before
//     that (the migration failed or was cancelled at the source: libvirt's Finish destroys it)
//     ends the target STOPPED (MigrationFailed).
//   - Source: Migrate checks target_socket_path (absolute, a socket: else InvalidArgument or
//     FailedPrecondition), gives the VM's user an ACL entry on it (the daemon, unprivileged,
//     connects to it), reads the target's defined domain through it (a second, short
//     connection: the XML the target must run, passed to libvirt as the destination XML: the
//     source's own XML names the source's run dir), and starts virDomainMigrateToURI3 to
//     qemu+unix:///session?socket=<target_socket_path> with VIR_MIGRATE_LIVE, PEER2PEER,
//     TUNNELLED and UNSAFE (libvirt refuses writable disks whose cache mode is not none unless
//     on a file system it knows to be shared; the contract leaves which disks are shared to the
//     host), AUTO_CONVERGE as the request allows, and the bandwidth limit in MiB/s
//     (libvirt's unit: a limit below 1 MiB/s is 1 MiB/s, others rounded down to whole MiB/s).
//     An emulated VM on a QEMU before 9.0 (qmp.TCGLosesMigrationWrites: its TCG loses guest
//     writes made during a live copy) migrates paused: the same call without VIR_MIGRATE_LIVE,
//     libvirt pausing the domain for the whole copy (MIGRATION_MODE_PAUSED; the downtime is the
//     time from that pause, libvirt's SUSPENDED event, to the call's return), resuming it at the
//     target, or here when the migration fails or is cancelled.
//     The call, which lasts the whole migration, has a libvirt connection of its own (on the
//     VM's, it held other calls up for seconds). MigrationStatus reads virDomainGetJobStats,
//     waiting 0.5 s at most (around the switch-over libvirt's job holds the domain for a second
//     or two: the figures so far then); the final figures (downtime, total time) come in
//     libvirt's job-completed event. The source's pause for the switch-over (SUSPENDED,
//     migrated) is downtime, not reported; libvirt's STOPPED (migrated) makes the source STOPPED
//     (Migrated). CancelMigration and the completion timeout abort the job
//     (virDomainAbortJob): libvirt resumes the source (the driver resumes one libvirt left
//     paused), which stays RUNNING, and its Finish stops the target.
//   - Recover: the migration is in the VM's record. The daemons do the migration, so it goes on
//     while no driver runs; a restarted driver re-adopts it: a target that waits is PAUSED
//     (IncomingMigration), one whose domain arrived and runs is run as the event would have; a
//     source whose domain runs is RUNNING, its job watched (virDomainGetJobStats) until libvirt
//     ends it, the completion timeout counted from the migration's start; a source whose domain
//     ended while no driver ran is STOPPED (Migrated) when the target's daemon runs the domain
//     (asked through the socket it migrated to), otherwise the migration FAILED.
//
// Disks (Capabilities.migration_disks; migratedisks.go). libvirt's own storage migration
// cannot be used: with a tunnelled migration libvirt 9.0 refuses it ("migration of non-shared
// storage is not supported with tunnelled migration and this QEMU"), and a native one takes one
// disks URI for both ends (the target's NBD server listens on it, the source's QEMU connects
// to it), while the contract gives the two ends different sockets. So the copy is the driver's:
//
//   - Target: a Start with incoming_migration.disks starts QEMU's storage daemon
//     (qemu-storage-daemon, beside QEMU) as a launcher companion of the VM's libvirtd, as the
//     VM's user: a QMP monitor and an NBD server on sockets of its own in the run dir, one
//     writable export per disk, named as the disk, of the fresh image the target's storage
//     driver made. The driver relays disks_socket_path to that NBD socket and counts the
//     connections: once every disk's came and all closed (the source completed its copies), or
//     the migration ended, it makes the storage daemon quit and waits for its exit, so that its
//     image locks are gone before libvirt's Prepare starts the target's QEMU on the images; a
//     connection that comes meanwhile is held, and closed without a byte once it has exited.
//   - Source: Migrate checks the disks as the qmp driver does (qmp.MigrationDisks), gives the
//     VM's user an ACL entry on target_disks_socket_path, and starts libvirt's block copy of
//     each disk (virDomainBlockCopy, REUSE_EXT, SHALLOW for a top_only one: the top image only,
//     the target's is over the same base) into an NBD disk on that socket, limited to the
//     bandwidth, and returns: phase ACTIVE, the guest runs on and its writes are mirrored. The
//     disk watcher samples the copies (virDomainGetBlockJobInfo; ready: the domain XML's
//     mirror ready='yes') every 200 ms into MigrationInfo's disk figures. Once every copy is
//     ready it pauses the guest (virDomainSuspend), completes every copy (virDomainBlockJobAbort
//     without pivot: for a ready copy libvirt waits for the target to be in sync, and the
//     source stays on its own images), waits until a connection to target_disks_socket_path is
//     refused or closed without a byte (the target released the images), then migrates the
//     memory as above, paused (MIGRATION_MODE_PAUSED: libvirt refuses a migration while a block
//     job runs, so the copies end first, and the guest may not write in between). libvirt's
//     Finish leaves the arrived domain paused, as the source was; the target's driver resumes
//     it (lifecycle SUSPENDED, paused, after STARTED, migrated). A copy that fails, a cancel or
//     the completion timeout before the memory moves aborts the copies, and the guest runs on
//     here on its own disks (resumed, when it was paused for the switch-over).
//
// Limits of live migration:
//
//   - With disks the memory always moves paused, also where QEMU could copy it live (KVM, or
//     QEMU 9.0 and later): the downtime is the whole memory copy.
//   - The target's relay is the driver process's: a target driver that restarts in the disk
//     phase breaks the copies' connections (QEMU's NBD client did not reconnect to a relay
//     that came back, measured), so its Recover makes the storage daemon quit and reports the
//     target STOPPED (MigrationFailed), and the source's migration fails naming the disk. A
//     source driver that restarts goes on: the copies run in QEMU, and Recover re-adopts them
//     (the disks and the target's NBD socket are in the VM's record) and goes on with the disk
//     phase and the memory as if watched.
//   - No post-copy (Capabilities.migration_post_copy is false): allow_post_copy is accepted
//     (MigrationInfo.post_copy says it was allowed) but never used, since libvirt 9.0 refuses post-copy in a tunnelled migration ("post-copy
//     is not supported with tunnelled migration"), and tunnelling is what puts the whole
//     migration in the one socket connection; a migration that does not converge is cancelled
//     at its completion timeout. A native (not tunnelled) migration would allow post-copy but
//     takes one unix socket path for QEMU's stream at both ends, as libvirt's disk copy does.
//   - The target's domain is the source's XML checked by libvirt against the target's (ABI
//     stability): both specs must be the same but for their paths, as the host makes them.
//   - Only a RUNNING VM migrates (a PAUSED one is refused).
//   - While a target waits, its socket_path reaches its daemon's whole libvirt API (in a
//     cluster only through the target node's proxy, after the source node's mutual TLS); the
//     link goes once the migration completes or fails.
//
// # Limits
//
//   - The domain spec's fields this driver does not implement are refused at Create with their
//     field path (BuildDomain), and left out of Capabilities: launch security, huge pages,
//     BIOS serial output, lun, NIC descriptors (tap_fd).
//   - The guest agent (guestagent.go) is reached through the VM's daemon, which is the agent
//     channel's one client (virDomainQemuAgentCommand, libvirt-qemu). A soft reboot
//     (softreboot.go) is libvirt's fake reboot; its pending mark lives in the daemon, so a driver
//     restarted while one is pending reports the guest's power-off, which the daemon then turns
//     into a boot.
//   - cpu.pinning is libvirt's <cputune>, pinned by sched_setaffinity in session mode (no
//     cgroups). Several vCPUs under TCG rely on QEMU running a thread per vCPU, multi-threaded
//     TCG, which QEMU 7.2 does by default for an x86-64 guest on an x86-64 host (measured);
//     libvirt 9.0 cannot ask for it.
//   - The TPM (tpm.go) is libvirt's emulated one: the node, and the launcher image, need swtpm
//     and swtpm-tools (swtpm_setup, swtpm_ioctl, swtpm_localca, swtpm_cert, with GnuTLS's
//     certtool), or "tpm" is not declared. A persistent TPM's
//     state is reached through a symlink from the daemon's swtpm directory (libvirt 9.0 has no
//     element for where it goes). libvirt manufactures a TPM with swtpm_setup (EK and platform
//     certificates), the qmp driver's swtpm at its first start: the same directory serves both.
//   - clock.timezone is the zone's offset when the VM starts, a fixed adjustment from UTC (as
//     the qmp driver's -rtc base): a daylight saving change while it runs does not move it.
//   - cpu.features without cpu.model name libvirt's default model, qemu64, which libvirt needs
//     beside features (the qmp driver's default under TCG is max).
//   - QEMU outlives a daemon that dies (libvirt daemonizes it), but nothing could manage it: the
//     driver reports the VM crashed (ProcessExited, the daemon's last log lines) and kills that
//     QEMU (checked to be the daemon's by its command line; in a launcher pod's pid namespace
//     the daemon's pid file numbers it there, and the driver finds it among the launcher's
//     children by that innermost pid), as Errors says. That takes a
//     driver process: a daemon that dies while none runs leaves its QEMU running until the
//     launcher ends (a launcher that dies takes both, above).
//   - A launcher that is not its pid namespace's init and is SIGKILLed in the few milliseconds
//     between QEMU's adoption and the script's prctl leaves that QEMU running.
//   - Explain places only the refusals it knows (origins.go's refusals, measured with libvirt
//     9.0 and QEMU 7.2) and those whose message holds a name of a device the record has; another
//     libvirt's wording may leave a refusal unplaced, which the error then says.
//   - The accelerator probe is the qmp driver's (the same QEMU): KVM where a test guest runs
//     under it, otherwise TCG, said in the fingerprint.
package libvirt
