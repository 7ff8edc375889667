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
// <run dir>/lv, so two VMs' daemons share nothing. The launcher, root, drops to the user with
// util-linux setpriv (no capabilities, no new privileges).
//
// Because QEMU runs as that user, the driver gives the user what QEMU must open: the run dir
// (serial and VNC sockets), the taps the network driver made (their owner, TUNSETOWNER: the
// driver takes taps by name, as libvirt opens them, not descriptors), and the VM's writable
// disk images (their owner). Read-only disks and kernels must be readable by the user already;
// Start checks each as that user (setfsuid) and names the one that is not.
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
//     field path (BuildDomain), and left out of Capabilities: features, clock, inputs, watchdog,
//     sound, TPM, persistent state, launch security, chassis, CPU features, pinning and NUMA,
//     huge pages, start paused, BIOS serial output, disk I/O options, lun, NIC descriptors
//     and multi-queue; no guest agent, soft reboot, display stream or migration yet.
//   - QEMU outlives a daemon that dies (libvirt daemonizes it), but nothing could manage it: the
//     driver reports the VM crashed (ProcessExited, the daemon's last log lines) and kills that
//     QEMU (checked to be the daemon's by its command line).
//   - The accelerator probe is the qmp driver's (the same QEMU): KVM where a test guest runs
//     under it, otherwise TCG, said in the fingerprint.
package libvirt
