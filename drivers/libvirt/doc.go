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
// launcher, root, drops to the user with util-linux setpriv (no capabilities, no new
// privileges): in a cluster the HypervisorClass keeps SETUID and SETGID for the launcher's
// compute container (launcherCapabilities), and the launcher image carries libvirtd, its
// modules and swtpm's tools (hack/images).
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
// then creates the domain (virDomainCreateXML). State changes come from libvirt's event loop
// (lifecycle and reboot events, one default event loop per driver process); a guest reboot is a
// reset of the same QEMU (on_reboot restart), counted in boots. Shutdown presses the ACPI power
// button until the guest powers off or the timeout, then destroys the domain. Delete kills the
// daemon and removes its directory. A connection to a daemon that closes unasked (keepalive:
// 5 s x 3) ends the VM's run as CRASHED, ProcessExited, with the daemon's last log lines.
//
// # Recover
//
// The daemon is the launcher's child, not the driver's, so it and its domain outlive the driver
// process. Recover connects again to the daemon named in the VM's record (checked to be that
// daemon by its environment) and takes the domain's state; the serial backlog starts then.
//
// # Limits
//
//   - The domain spec's fields this driver does not implement are refused at Create with their
//     field path (BuildDomain), and left out of Capabilities: launch security, huge pages,
//     BIOS serial output, lun, NIC descriptors (tap_fd); no migration yet.
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
//     QEMU (checked to be the daemon's by its command line).
//   - The accelerator probe is the qmp driver's (the same QEMU): KVM where a test guest runs
//     under it, otherwise TCG, said in the fingerprint.
package libvirt
