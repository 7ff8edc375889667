// Package launcher is the launcher protocol of the hypervisor SDK: how a hypervisor driver starts
// its VM process inside the VMI's sandbox, through the kubevisor-launcher that holds the
// sandbox, and the client that speaks it. The wire API is the gRPC service of
// core/driver/launcher/v1 plus a descriptor side channel; this package is all a driver needs of
// it.
//
// # When a driver uses it
//
// DomainSpec.sandbox.launcher_socket names the unix socket of the VMI's launcher. The node
// handler sets it for every VM: in a cluster the launcher is the main process of the launcher
// pod's compute container, in standalone mode a local process in a network namespace of its own.
// A hypervisor driver that declares Capabilities.launcher:
//
//   - MUST start the VM process through that launcher when launcher_socket is set (Starter.Start
//     of SocketStarter, or Client.Start), never as its own child: only then does the VM live in
//     the pod's cgroup, network namespace and volumes, and die with the pod;
//   - MUST start it itself when launcher_socket is empty (standalone mode with bypassLauncher, a
//     driver's own tests), as LocalStarter does (see "Without a launcher" below).
//
// The host never sends a launcher_socket to a driver that does not declare Capabilities.launcher:
// its client refuses such a Create without calling the driver (InvalidArgument naming
// sandbox.launcherSocket). A driver picks the right Starter with For(spec.GetSandbox()).
//
// # What the launcher does with the process
//
//   - It runs one process at a time, as its own child, in its session and process group of its
//     own, with stdin /dev/null and stdout and stderr appended to Command.LogPath (an absolute
//     path as the launcher sees it; the handler makes run_dir such a path). Once that process has
//     exited another may be started (a new VM process after the guest powered off).
//   - Command.Path is resolved where the launcher runs (in a cluster: in the launcher's image),
//     not where the driver runs.
//   - The process runs in the launcher's network namespace, which is the sandbox's netns_path:
//     the taps the network driver made there (nics[].tap_name) are visible to it. The driver does
//     not enter netns_path itself; SocketStarter refuses a Command.NetNS that names another
//     namespace than the launcher's.
//   - Command.ExtraFiles become the process's fds 3, 4, ... in order. gRPC cannot carry
//     descriptors, so the client sends them beforehand by SCM_RIGHTS on FilesSocketName, next to
//     the socket, and gets a token that one Start within FilesTTL uses. A tap passed as
//     nics[].tap_fd_path (/proc/PID/fd/N) is duplicated with pidfd_getfd and passed this way:
//     opening the path again would give a new, unattached tap.
//   - The process outlives the driver process: a driver that crashes or restarts leaves it
//     running. It dies with the launcher (SIGKILL by PR_SET_PDEATHSIG), and whatever else is in
//     its process group is killed once it exits. A change of credentials clears that signal
//     (prctl(2)): a Command.Path that drops privileges before it execs the VM's program (such as
//     setpriv --reuid) must set it again (setpriv --pdeathsig=KILL). What the process
//     daemonizes (its children that leave its session) is adopted by the launcher, a child
//     subreaper, without the signal: it dies with a launcher pod's launcher, the init of the
//     container's pid namespace, but outlives a SIGKILLed launcher that runs as a process of the
//     node (standalone mode, the conformance kit) unless it sets the signal itself once adopted.
//   - Command.Companions (a TPM emulator, ...) are started before it, each the same way with
//     its own ExtraFiles, and stopped once it exits (SIGTERM, then SIGKILL after 2 s); when
//     they or the process cannot be started, Start kills those started and fails. Only a
//     launcher whose Info lists FEATURE_COMPANIONS starts them: Start fails with
//     FailedPrecondition, starting nothing, against an older one. Connect a companion to the
//     process with descriptors (one end of a socketpair each), not with a path to wait for:
//     the launcher has no readiness check.
//
// # Pids
//
// The launcher names its process by its pid in the launcher's pid namespace
// (Started.Process.Pid; what Signal, Watch and Wait take). A driver in another pid namespace
// (the handler and its drivers run in the node's) needs a pid of its own to poll, signal or
// pidfd_open: Started.LocalPid is that pid, which the client finds through the launcher's pid
// (SO_PEERCRED on the socket) among the launcher's children by innermost pid and start time.
// The driver must see the launcher's pid namespace from above or share it (a node's pid
// namespace does); otherwise LocalPid is 0 and SocketStarter fails.
//
// # After a driver restart
//
// The launcher socket stays where it is for the VMI's life, so a driver process that re-adopts
// a VM (Recover) dials it again: Client.Info reports the running or last process
// (InfoResponse.process) and Client.LocalPid resolves it to a pid of the driver's namespace.
// A driver may instead keep that pid and its start time in its own record (state_dir or run_dir)
// and check them against /proc; it must not keep them in Handle.state, which Create returns
// before any process exists.
//
// # Termination
//
// When the pod is deleted the launcher gets SIGTERM, publishes EVENT_TYPE_TERMINATING with a
// deadline to the subscribers of Events (Client.Events), and at the deadline sends the process
// SIGTERM, then SIGKILL. The launcher cannot shut a guest down gracefully itself: the handler
// does it through the driver (Shutdown) when the VMI is stopped, and a driver MAY subscribe to
// Events and shut its VM down on TERMINATING before the deadline.
//
// # Without a launcher
//
// When launcher_socket is empty the driver starts the VM process itself. It MUST then, as
// LocalStarter does:
//
//   - enter netns_path for that process only (setns(2) in the child before exec, or
//     nsenter --net=PATH -- BINARY, which execs the binary so that the pid is the VM's), never
//     for its own threads;
//   - start it in a session of its own (setsid), without PR_SET_PDEATHSIG, with stdin /dev/null
//     and stdout and stderr in a file rather than the driver's own stderr (a go-plugin pipe that
//     closes when the host goes away, which would kill the VM with SIGPIPE), so that the VM
//     outlives the driver process as it does under a launcher;
//   - reap it while the driver lives; after a driver restart the process is no longer the new
//     driver's child and is watched by pidfd.
package launcher
