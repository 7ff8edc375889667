// Package launcher is kubevisor-launcher, the process that holds one VMI's sandbox and starts its
// VM process there. It implements the launcher protocol of the hypervisor SDK, whose client
// (core/driver/launcher, aliased here as Client and Dial for the handler side) hypervisor drivers
// start their VM processes with; that package documents the protocol as a driver sees it.
//
// In a cluster the launcher is the main process of the launcher pod's compute container
// (unprivileged: devices come from device plugins); in standalone mode the handler starts it as a
// local process in a network namespace of its own. Either way the VM process is the launcher's
// child, so it lives in the launcher's cgroup and namespaces and sees the pod's volumes.
//
// # Directory and sockets
//
// The launcher serves the API of core/driver/launcher/v1 (gRPC) on DIR/launcher.sock, in a per-VMI
// directory shared with the handler side. DIR must be a directory (not a symlink) owned by the
// launcher's user with no group or world access (0700): the launcher refuses to start otherwise,
// since whoever can reach the socket can run programs in the sandbox. The sockets are 0600. A
// lock on DIR/launcher.lock keeps a second launcher off the same directory.
//
// # Descriptors for the VM process
//
// gRPC cannot carry file descriptors, and paths are no substitute: a tap the network driver opened
// on the host, or a descriptor the driver duplicated from another process, cannot be reopened by
// path from inside the pod (other mount and pid namespaces, no privilege). So descriptors travel
// by SCM_RIGHTS on a side channel, DIR/launcher-files.sock (SOCK_SEQPACKET): the client sends them
// in one message and gets back a token; StartRequest.files_token hands them to the process as fds
// 3, 4, ... A token is good for one Start within a minute; the launcher closes its copies once
// the process is started. The SDK's Client.Start does both steps.
//
// # Pids across pid namespaces
//
// The launcher reports its process's pid in its own pid namespace (what Signal and Watch take),
// the pid in the initial namespace when it runs there (standalone mode), and the process's start
// time. A caller in another pid namespace (the handler and its drivers, for a launcher in a pod)
// needs a pid of its own namespace to signal or pidfd_open; the SDK's client resolves it (see
// its Started.LocalPid): it learns the launcher's pid in its namespace from SO_PEERCRED on the
// socket, then looks among the launcher's children for the one whose innermost pid (NSpid in
// /proc/PID/status) and start time match.
//
// # Lifetime
//
// One VM process at a time (with its companions, below); it may be started again after it exits (QEMU relaunched after a guest
// reboot). The process runs in a session of its own with stdin /dev/null and its output appended
// to a log file. It gets SIGKILL when the launcher dies, even by SIGKILL (PR_SET_PDEATHSIG,
// armed from a thread that never exits), and the launcher is a child subreaper, so that what the
// process leaves behind is reaped by the launcher; once the process exits, the rest of its process
// group is killed.
//
// On SIGTERM (or SIGINT) the launcher publishes EVENT_TYPE_TERMINATING with a deadline to the
// subscribers of Events: the hypervisor driver, connected through the handler, shuts the VM down
// gracefully. The launcher cannot do it itself: it does not speak the hypervisor's protocol. If
// the process still runs at the deadline (grace period minus kill margin) the launcher sends its
// process group SIGTERM, then SIGKILL half a margin later. It exits once the process is gone.
// Exit ends an idle launcher without a signal.
//
// # Companions
//
// A Start may name companions (StartRequest.companions; Info lists FEATURE_COMPANIONS): helper
// processes of the VM process, such as the swtpm that emulates its TPM. The launcher starts them
// in order before the VM process, each as it starts that process (its child, a session of its
// own, stdin /dev/null, output appended to its own log, SIGKILL when the launcher dies, fds 3,
// 4, ... from its own files token), so they share the sandbox's cgroup, namespaces, volumes and
// user. Limits:
//
//   - They live as long as the VM process, no longer: once it exits the launcher sends each
//     companion's process group SIGTERM, then SIGKILL 2 s later; if a companion or the VM
//     process cannot be started, the companions already started get SIGKILL and Start fails.
//     A later Start first waits for the last companions to be gone (so that a new swtpm finds
//     its state directory unlocked).
//   - The launcher does not watch them beyond that: a companion that exits early is logged,
//     not published as an event, and does not stop the VM process (QEMU's TPM then fails the
//     guest's commands, as with libvirt).
//   - There is no readiness check. The caller connects the two itself, with descriptors made
//     before either starts (a socketpair whose ends go to the companion and to the VM process),
//     so the VM process never waits for a socket to appear.
//   - They are not in Info or the status file, and Signal and Watch do not take their pids.
//
// # Status
//
// On its way out the launcher writes DIR/launcher-status.json (Status) and logs the same as its
// last line:
//
//	| reason              | when                                                       | exit code |
//	|---------------------|------------------------------------------------------------|-----------|
//	| vm-exited           | terminating, and the process exited before the deadline    | 0         |
//	| killed-at-deadline  | terminating, and the process was killed at the deadline    | 2         |
//	| launcher-terminated | told to exit (SIGTERM, SIGINT, Exit) with no process left  | 0         |
//	| start-failed        | the launcher could not serve, or its last Start had failed | 1         |
//
// A launcher that dies without writing the file (SIGKILL, OOM kill) took its VM process with it;
// a missing file after the launcher is gone says just that. The file is not written when the
// directory fails the checks above (it is not safe to write into) or belongs to another launcher.
package launcher
