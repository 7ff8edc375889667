// Package driver is the SDK for Kubevisor drivers: the Go interfaces of the four driver kinds,
// the go-plugin glue that serves an implementation as a plugin process (Serve*), and the clients
// the host uses to call a plugin through the same interfaces.
//
// A driver author implements one kind's interface (and the optional interfaces it declares in
// its Capabilities) and calls the matching Serve function from main. A hypervisor driver also
// uses core/driver/launcher to start its VM processes and core/domain/v1 for the domain spec.
// Nothing else of the Kubevisor repository is needed.
//
// # The contract
//
// The doc comments of the interfaces below are the contract every implementation must meet: the
// MUST, MUST NOT, SHOULD and MAY of each method (as in RFC 2119), and the error codes it returns.
// docs/driver-authoring.md explains it with examples; the conformance kit (conformance/driver)
// checks it.
//
// # Errors
//
// Every error a driver returns is a gRPC status error (google.golang.org/grpc/status); a plain
// error reaches the host as codes.Unknown, which the host can only take for "something broke".
// The codes mean the same for every kind and method:
//
//   - InvalidArgument: the request cannot be honoured as written (a field the driver does not
//     support, a value out of range, a volume that is not a usable image). The message names the
//     field path in camelCase as in the API ("disks[2].bus", "volumes[1].hostDisk.path") and the
//     disk, interface or volume; core/domain.ValidationError is such an error.
//   - NotFound: an id the driver does not know (a VM, a device), for every method that takes one,
//     except where a method says otherwise (hypervisor Create and Delete). The message names the
//     id.
//   - AlreadyExists: hypervisor Create of an id that exists.
//   - FailedPrecondition: the request is valid but the state of the VM or of the node forbids it
//     (Delete of a running VM, Pause of a stopped one, hardware acceleration required where it is
//     not usable, firmware that is not installed, a device that is unhealthy). The message says
//     which state.
//   - Unimplemented: an optional operation the driver does not offer. The SDK answers it; the
//     host never calls what the driver did not declare.
//   - Unavailable: a transient failure worth retrying as it is (a VM process that does not
//     answer yet); the host retries.
//   - Canceled, DeadlineExceeded: the caller's context ended (status.FromContextError).
//   - Internal: the node failed the driver (an I/O error, a crashed helper); the message wraps
//     the cause.
package driver

import (
	"context"
	"io"
	"time"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// Driver is what every driver implements, whatever its kind (service
// kubevisor.driver.base.v1.Driver).
//
// Every method of every driver:
//
//   - MUST return gRPC status errors with the codes of the package documentation;
//   - MUST return when its ctx is done;
//   - MUST be safe for concurrent calls;
//   - SHOULD return quickly, doing long work (a boot) in the background and reporting it through
//     status and events.
//
// The host starts the driver's process, calls Info and Capabilities at any time, then Configure
// once before any call of the kind's own service, and keeps a Fingerprint stream open for the
// life of the process. After the process exits or crashes the host starts it again, with backoff,
// and calls Configure again with the same request: the driver's memory is gone, so what must
// survive goes to ConfigureRequest.state_dir (or to the per-VM and per-VMI directories it is
// given). A restart of the host does not restart the driver: the new host reattaches to the
// running process and calls Configure with its own request (a driver that refuses it is killed
// and started again), so a driver MUST NOT depend on the host's stdio after it started (Serve
// ignores SIGPIPE for its log lines) and MUST NOT exit when its stdin or stdout closes.
//
// The host calls Configure of a running driver with another request only to hand it a change
// of what the driver takes while it runs (plugin.Host.Reconfigure): of the in-tree drivers, a
// device driver's selection of host devices, the hostdev driver's config.permittedHostDevices,
// which the live configuration (core/liveconfig) changes on every node without a restart. The
// config is then the one it started with but for that part; node_name, state_dir and
// protocol_version are the same. When the driver accepts it, the host restarts the driver with
// that config from then on and its client asks Capabilities again; when the driver refuses
// it, nothing changes on the host's side (the refusal is logged, with the field it names).
//
// Info:
//
//   - MUST answer at any time, before Configure too, and never fail;
//   - MUST report as name the manifest's name (a DNS label: "qmp", "hostpath");
//   - SHOULD report its own release as version and a one-line description. Kind and
//     protocol_versions are filled in by Serve.
//
// Capabilities:
//
//   - MUST answer the same for the life of the process, before Configure too: the host asks
//     once and caches the answer. One exception: a device driver's resources MAY come from its
//     configuration (which host devices become which resource, as KubeVirt's
//     permittedHostDevices); they MUST then be the same after every Configure with the same
//     request, and MUST follow a change it accepts (below) at once; the host's client asks again
//     after every successful Configure;
//   - MUST declare only optional features it implements and that belong to its kind (Serve
//     refuses to run a driver that does not: CheckCapabilities);
//   - SHOULD list every input it accepts (firmware, disk buses, machine types, volume types,
//     bindings, interface options, resources, and the hypervisor flags vnc, host_devices, tap_fd,
//     launcher, secure_boot): the host checks each request against them before it calls the
//     driver (CheckDomain for a hypervisor, CheckSetup for a network driver), does not send what
//     is not listed, and the conformance kit exercises what is listed and skips the rest.
//
// Fingerprint:
//
//   - MUST send one message at once, then one on every change, until ctx is done, and return nil
//     then;
//   - MUST send only attributes that make valid node labels: the handler publishes each as
//     capability.kubevisor.io/<driver>.<key> = <value>, so "<driver>.<key>" and the value are at
//     most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter
//     or digit (a value may be empty). No paths, no free text, nothing that changes all the time:
//     every change relabels the node;
//   - SHOULD report trouble as HEALTH_DEGRADED or HEALTH_UNHEALTHY with a health_description
//     rather than by failing the stream.
//
// Configure:
//
//   - MUST accept an empty config as the defaults (at its first Configure);
//   - MUST succeed when called again with the same request, changing nothing;
//   - MAY return FailedPrecondition for another request, naming what differs. It MAY instead
//     accept one that changes only what it can take while it runs; it MUST then take the change
//     as a whole or not at all (an error leaves the configuration before it), MUST NOT disturb
//     what it already handed out (a device allocated to a container stays the container's; a
//     running VM runs on), and answers by the new configuration from then on. A device driver
//     whose resources follow its configuration lists a resource it no longer offers with no
//     device (an open Watch of it sends an empty list), refuses Allocate of it (NotFound), and
//     lists a new one as at start; the host then stops and starts the kubelet device plugins of
//     those resources (package deviceplugins). The hostdev driver takes a change of
//     config.permittedHostDevices alone, and refuses any other (devRoot, sysfsRoot,
//     pollInterval, charDevices, node_name, state_dir) with FailedPrecondition;
//   - SHOULD return InvalidArgument naming the field for a config it cannot use ("config.root:
//     must be absolute"), and then keep the configuration it has;
//   - state_dir is a root-only directory owned by this driver that survives restarts of the
//     driver and of the host; node_name is empty in standalone mode.
type Driver interface {
	Info(ctx context.Context) (*basev1.InfoResponse, error)
	Capabilities(ctx context.Context) (*basev1.Capabilities, error)
	Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error
	Configure(ctx context.Context, req *basev1.ConfigureRequest) error
}

// Hypervisor runs VMs described by a domain spec (service
// kubevisor.driver.hypervisor.v1.Hypervisor). A VM is named by DomainSpec.id, the VMI's UID, and
// is known to the driver from Create until Delete.
//
// Where a VM's data lives. Create returns a Handle; the host stores it and hands it back
// unchanged to Recover in a new driver process. Create runs before any VM process exists, so
// Handle.state MUST hold only what is fixed at Create and what Recover needs with it (socket
// paths, the spec), never a pid or a boot count. What changes while the VM lives goes to the
// driver's own record: under ConfigureRequest.state_dir (per driver, root-only, survives driver
// and host restarts; keyed by VM id) or under DomainSpec.run_dir (per VM, exists and is writable
// when Create is called, survives driver restarts; the handler removes it after Delete; in a
// cluster it is in the VMI's directory on the node, which the launcher pod sees at the same
// path). Recover MUST work from Handle.state alone when the record is missing.
//
// Where a VM process runs. When DomainSpec.sandbox.launcher_socket is set (the node handler sets
// it for every VM) a driver that declares Capabilities.launcher MUST start the VM process through
// that launcher (core/driver/launcher), which runs it in the pod's cgroup and network namespace
// (netns_path) and keeps it alive across driver restarts; the driver does not enter netns_path
// itself. When launcher_socket is empty the driver MUST start the process itself inside
// netns_path, in a session of its own, with its output in a file, so that it outlives the driver
// process (launcher.LocalStarter does). Either way a VM MUST outlive the driver process: a
// driver that crashes or restarts leaves its VMs running for Recover.
//
// Events. Every state change is reported on Events, each event with the VM's state after it and
// a reason (the Reason* constants). The sequence of each operation:
//
//   - Create, Delete, Status: none; Recover: none, but it MAY report the end of a run that
//     finished while no driver process ran;
//   - Start: STARTED (RUNNING, Started);
//   - Pause: PAUSED (PAUSED, Paused); Resume: RESUMED (RUNNING, Resumed); none when the VM
//     already is in the asked state;
//   - Reboot: RESET (RUNNING, HostReset); a reboot by the guest: RESET (RUNNING, GuestReset);
//   - Shutdown: RESUMED when the VM was paused, POWERDOWN_REQUESTED (SHUTTING_DOWN,
//     PowerdownRequested), MAY SHUTDOWN (SHUTTING_DOWN) when the guest powers off, then
//     STOPPED (STOPPED, GuestShutdown when the guest powered off in time, ForcedShutdown when
//     it was forced);
//   - Kill: MAY SHUTDOWN (SHUTTING_DOWN), then STOPPED (STOPPED, Killed);
//   - the guest powering off by itself: MAY SHUTDOWN (SHUTTING_DOWN), then STOPPED (STOPPED,
//     GuestShutdown);
//   - a crash: MAY GUEST_PANICKED (CRASHED), then CRASHED (CRASHED, GuestPanicked, or
//     ProcessExited when the VM process ended unasked);
//   - a migration (Migrator): MIGRATION events at each change of its phase or mode, with the
//     VM's state and reason unchanged; at the source STOPPED (STOPPED, Migrated) once it
//     completed; at the target STARTED (RUNNING, Migrated) when it runs the VM, STOPPED
//     (STOPPED, MigrationFailed) when it failed.
//
// Every end of a run ends with exactly one event of type STOPPED or CRASHED whose state is
// STOPPED or CRASHED; no other event of that VM follows until the next Start.
//
// Create:
//
//   - MUST define the VM without starting it: state CREATED, boots 0, no event;
//   - MUST return AlreadyExists for an id it knows, whatever the VM's state, and leave that VM as
//     it is;
//   - MUST return InvalidArgument naming the field for a spec it cannot honour, and MUST NOT drop
//     a field silently; SHOULD run domain.Validate(spec) first;
//   - MUST return FailedPrecondition naming the field when the node cannot run the spec as it is:
//     acceleration ACCELERATION_REQUIRED where hardware acceleration is not usable
//     ("acceleration: ..."), firmware that is not installed;
//   - MUST return a Handle with id, driver (its name) and state as above.
//
// Start:
//
//   - MUST boot a created, stopped or crashed VM and return once it runs: state RUNNING, boots
//     one more, event STARTED;
//   - MUST succeed on a running or paused VM without booting it again;
//   - MUST return FailedPrecondition for a VM that is shutting down, and FailedPrecondition
//     naming acceleration when the node can no longer run it;
//   - MUST start the VM process where the sandbox says (above).
//
// Shutdown:
//
//   - MUST ask the guest to power off and wait up to timeout, then stop the VM forcibly, and
//     return only once the VM is stopped (state STOPPED);
//   - MUST return graceful true only when the guest powered off by itself within the timeout;
//   - MUST stop the VM forcibly at once, with graceful false, when timeout is 0;
//   - MUST resume a paused VM first, so that its guest can react, within the same timeout;
//   - MUST succeed, with graceful false and changing nothing, on a created or stopped VM;
//   - MUST let a concurrent Kill stop the VM, and then return;
//   - returns Canceled or DeadlineExceeded when ctx ends first, the VM possibly still shutting
//     down.
//
// Kill:
//
//   - MUST stop the VM at once and return once its process is gone: state STOPPED, reason Killed,
//     pid 0;
//   - MUST succeed on a created or stopped VM, changing nothing.
//
// Delete:
//
//   - MUST remove a created, stopped or crashed VM and everything the driver made for it (its
//     record, the files it made in run_dir; the handler removes run_dir itself); Status then
//     returns NotFound;
//   - MUST succeed for an id it does not know;
//   - MUST return FailedPrecondition for a running, paused or shutting-down VM.
//
// Status:
//
//   - MUST report state, and reason as one CamelCase word for the last transition (the Reason*
//     constants, or the driver's own word for a cause none of them names);
//   - SHOULD fill started_at, boots (guest starts since Create, resets included), pid (the VM
//     process in the driver's pid namespace, 0 while there is none) and accelerated.
//
// Events:
//
//   - MUST stream the events of every VM (id empty) or of the one named, from when the call is
//     registered until ctx is done, and return nil then;
//   - MUST NOT let a slow stream hold up a VM or other streams (drop its oldest events instead);
//   - ends when the driver process does; the host opens it again and recovers its VMs.
type Hypervisor interface {
	Driver
	Create(ctx context.Context, spec *domainv1.DomainSpec) (*hypervisorv1.Handle, error)
	Start(ctx context.Context, id string) error
	Shutdown(ctx context.Context, id string, timeout time.Duration) (graceful bool, err error)
	Kill(ctx context.Context, id string) error
	Delete(ctx context.Context, id string) error
	Status(ctx context.Context, id string) (*hypervisorv1.VMStatus, error)
	Events(ctx context.Context, id string, send func(*hypervisorv1.Event) error) error
}

// Pauser is the optional FEATURE_HYPERVISOR_PAUSE.
//
// Pause:
//
//   - MUST freeze the vCPUs of a running VM: state PAUSED, event PAUSED; the guest prints nothing
//     until Resume and boots does not change;
//   - MUST succeed on a paused VM, changing nothing;
//   - MUST return FailedPrecondition for a VM that is not running (created, stopped, shutting
//     down).
//
// Resume:
//
//   - MUST continue a paused VM: state RUNNING, event RESUMED;
//   - MUST succeed on a running VM, changing nothing;
//   - MUST return FailedPrecondition for a VM that is neither running nor paused.
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// Rebooter is the optional FEATURE_HYPERVISOR_REBOOT.
//
// Reboot:
//
//   - MUST reset a running VM, which goes on running and boots again: boots one more, event
//     RESET (reason HostReset);
//   - SHOULD return once the reset is done and counted;
//   - MUST return FailedPrecondition for a VM that is not running (paused, shutting down,
//     stopped).
type Rebooter interface {
	Reboot(ctx context.Context, id string) error
}

// SoftRebooter is the optional FEATURE_HYPERVISOR_SOFT_REBOOT: a reboot the guest performs
// itself, as a user pressing the ACPI power button of a machine set to restart would see it.
//
// SoftReboot:
//
//   - MUST ask the guest to restart (ACPI power button, or a guest agent) and return without
//     waiting for it; when the guest shuts down in answer, the VM MUST boot again instead of
//     stopping: boots one more, event RESET (reason GuestReset), the VM stays RUNNING;
//   - MUST NOT reset the VM when the guest ignores the request (the guest decides);
//   - MUST return FailedPrecondition for a VM that is not running (paused, shutting down,
//     stopped).
type SoftRebooter interface {
	SoftReboot(ctx context.Context, id string) error
}

// GuestAgent is the optional FEATURE_HYPERVISOR_GUEST_AGENT: what the guest agent inside a VM
// reports of the guest (its OS, host name, time zone, the agent's version).
//
// The driver owns the agent's channel: it gives every VM it starts one (the qmp driver: a
// virtio-serial port named org.qemu.guest_agent.0, the QEMU guest agent's), and the host reaches
// the agent only through GuestAgentInfo, never by connecting to the channel itself.
//
// GuestAgentInfo:
//
//   - MUST answer connected true, with what the agent reported, when the agent answered;
//   - MUST answer connected false with a message saying why, not an error, when the guest has no
//     agent or the agent does not answer (a guest that is booting, an agent that is stopped);
//   - MUST return within a few seconds (SHOULD be at most 5 s) whatever the guest does, and
//     MUST NOT block the VM's other operations meanwhile: the host polls it for every running
//     VM;
//   - SHOULD fill every field the agent reports; a query of the agent that fails leaves its
//     fields empty and is named in message, connected staying true;
//   - MUST return FailedPrecondition for a VM that is not running (created, paused, shutting
//     down, stopped).
type GuestAgent interface {
	GuestAgentInfo(ctx context.Context, id string) (*hypervisorv1.GuestAgentInfoResponse, error)
}

// GuestExecer is the optional FEATURE_HYPERVISOR_GUEST_EXEC: pinging the guest agent of a VM and
// running a command in the guest through it, which the host does for a VMI's livenessProbe and
// readinessProbe guestAgentPing and exec (the kubelet runs them every periodSeconds, so both
// are called often and MUST be cheap when the agent answers).
//
// As for GuestAgent, the driver owns the agent's channel and the host never connects to it.
//
// GuestAgentPing:
//
//   - MUST answer connected true when the agent answered a ping, connected false with a message
//     saying why, not an error, when the guest has no agent or the agent does not answer;
//   - MUST return within a few seconds (SHOULD be at most 5 s) and by ctx's deadline.
//
// GuestAgentExec runs command (the program, looked up in the guest's PATH, then its arguments)
// in the guest and waits for it to end, up to timeout (0: the driver's choice of a few seconds):
//
//   - MUST answer exited true with the exit status (or the signal that killed the command) and
//     what it wrote to stdout and stderr when it ended within timeout; a non-zero status is an
//     answer, not an error;
//   - MUST answer connected false with a message when the agent does not answer, and connected
//     true, exited false with a message when the agent refused to start the command (no such
//     program) or the command was still running at timeout;
//   - MUST return by timeout and ctx's deadline, whatever the guest does; it SHOULD NOT leave
//     the agent waiting on a command whose result nobody reads (the QEMU guest agent has no way
//     to kill a command: it reaps it when it ends);
//   - MUST return InvalidArgument for an empty command;
//   - SHOULD keep at most 64 KiB of each output, setting truncated when it dropped some.
//
// Both MUST NOT block the VM's other operations while they wait for the guest, MUST return
// FailedPrecondition for a VM that is not running (created, paused, shutting down, stopped) and
// NotFound for an unknown id.
type GuestExecer interface {
	GuestAgentPing(ctx context.Context, id string) (*hypervisorv1.GuestAgentPingResponse, error)
	GuestAgentExec(ctx context.Context, id string, command []string, timeout time.Duration) (*hypervisorv1.GuestAgentExecResponse, error)
}

// MaxGuestExecOutput is how much of each of a guest command's outputs GuestAgentExec keeps.
const MaxGuestExecOutput = 64 << 10

// Displayer is the optional FEATURE_HYPERVISOR_DISPLAY: the VM's graphical display as an RFB
// (VNC) byte stream.
//
// The driver owns the display server: a domain spec with vnc set (Capabilities.vnc declared)
// gets a graphics device and a VNC server on vnc.socket_path, and the host reaches that server
// only through Display, never by connecting to the socket itself.
//
// Display:
//
//   - MUST connect one new RFB client session per call: out receives the server's bytes from the
//     protocol version greeting on ("RFB 003.008\n"), in is copied to the server, until ctx is
//     done, in ends, the server closes the session, or the VM stops; it returns nil then;
//   - MUST serve several Displays of one VM at once, each its own RFB session;
//   - MUST return FailedPrecondition for a VM that is not running or has no display.
type Displayer interface {
	Display(ctx context.Context, id string, in io.Reader, out io.Writer) error
}

// Consoler is the optional FEATURE_HYPERVISOR_CONSOLE: the VM's first serial port.
//
// The driver owns the serial port: DomainSpec.serial.socket_path is where the driver has the VM
// expose it, and the driver is its only client (nothing else connects; the host reads the console
// only through Console). The driver keeps a backlog of the recent output (SHOULD be at least 64
// KiB) from when it attached to the port.
//
// Console:
//
//   - MUST write the backlog to out first, then the output as it comes, and copy in to the serial
//     input, until ctx is done, in ends, or the VM stops; it returns nil then, after the last
//     output of a stopped VM;
//   - MUST serve several Consoles of one VM at once: each gets the backlog and then all output,
//     and the input of each goes to the port;
//   - MUST return FailedPrecondition for a VM that is not running (before Start, after it
//     stopped): the host attaches after Start;
//   - MUST NOT let a slow reader hold up the guest or other readers (drop its oldest output
//     instead).
//
// A Console ends when the driver process does. The new process attaches to the port again when it
// recovers the VM; what the guest printed while no driver process was attached is lost, and the
// new backlog starts at Recover, so a host that attaches again sees no output twice. The node
// handler attaches again by itself for a reader of the output alone (in nil).
type Consoler interface {
	Console(ctx context.Context, id string, in io.Reader, out io.Writer) error
}

// Recoverer is the optional FEATURE_HYPERVISOR_RECOVER: re-adopting a VM, in a new driver
// process (Configured with the same state_dir), from the Handle its Create returned. The host
// calls it after a restart of the driver process for every VM it started, and when the driver
// answers NotFound for a VM the host knows.
//
// Recover:
//
//   - MUST re-adopt a VM whose process runs without disturbing it and report it as it is:
//     RUNNING or PAUSED (or SHUTTING_DOWN), the same pid, reason Recovered, boots as recorded;
//     its Console, Events and every operation work again;
//   - MUST report a VM that was created and never started (nor deleted) as CREATED with boots
//     0; Start then boots it. The driver's record, which Delete removes, tells the two apart;
//   - MUST report a VM whose process is gone (it stopped, crashed, or was killed while no driver
//     ran, or the pod went away) as STOPPED (CRASHED when the driver recorded a crash), with
//     reason ProcessGone unless it recorded another; and the same for a VM that was deleted.
//     This is not an error;
//   - in every case the driver knows the VM afterwards: Status answers and Delete removes it;
//   - MUST answer the same again, changing nothing, for a VM it knows already;
//   - returns InvalidArgument for a handle whose state it cannot read, Unavailable when the VM
//     process runs but cannot be reached yet (the host retries).
type Recoverer interface {
	Recover(ctx context.Context, handle *hypervisorv1.Handle) (*hypervisorv1.VMStatus, error)
}

// Migrator is the optional FEATURE_HYPERVISOR_MIGRATE: live migration of a running VM from one
// instance of the driver (the source, on one node) to another (the target, on another node, or
// another process on the same node), the guest going on running without a reboot.
//
// The driver only ever sees unix sockets: the target listens on a socket in its run_dir, the
// source connects to a socket on its node, and between nodes the node handlers carry the stream
// (source socket, handler, mutual TLS, handler, target socket). A driver MUST NOT listen on or
// connect to the network for a migration.
//
// The sequence, as the host runs it:
//
//  1. Target: Create with DomainSpec.incoming_migration set (the same virtual hardware as the
//     source's; with disks to copy, fresh images of them and a second socket: "Disks" below),
//     then Start.
//  2. Source: Migrate with the socket that reaches the target's (MigrateRequest), and the one
//     that reaches its disks' when it copies disks.
//  3. Both: MigrationStatus and MIGRATION events until the phase is COMPLETED, FAILED or
//     CANCELLED; CancelMigration to give up.
//  4. Completed: the source is STOPPED (reason Migrated) and the host Deletes it; the target
//     runs the VM. Otherwise the source runs as before and the host Kills (if needed) and
//     Deletes the target.
//
// The target (a VM whose spec has incoming_migration):
//
//   - Create MUST check the spec as for any VM and MUST NOT listen yet; domain.Validate refuses
//     a socket_path that is not absolute, not in run_dir, or too long for a unix socket;
//   - Start MUST start the VM process without booting the guest, listening on
//     incoming_migration.socket_path (SHOULD remove a stale socket there first), and return once
//     it listens: state PAUSED, reason IncomingMigration, boots 0, and a MIGRATION event (phase
//     SETUP, role TARGET); not a STARTED event;
//   - when the state has arrived and the VM runs: event STARTED (state RUNNING, reason
//     Migrated), started_at then, boots unchanged (the guest did not boot), and a MIGRATION
//     event with phase COMPLETED. Every operation works on it from then on as on a VM started
//     here, a later migration out included;
//   - when the incoming migration fails (the stream breaks, the state does not load, the source
//     cancels): the VM process ends, event STOPPED (state STOPPED, reason MigrationFailed) and a
//     MIGRATION event with phase FAILED; the host Deletes it and creates a new target (a driver
//     MAY listen again on a later Start of it);
//   - Pause, Resume, Reboot, SoftReboot and the guest agent MUST return FailedPrecondition
//     until the VM runs; Console and Display MAY attach before (output follows once it runs);
//     Kill and Shutdown (with no wait: there is no guest yet) MUST stop it, which fails the
//     migration at the source, the source going on running.
//
// The source (Migrate):
//
//   - MUST return InvalidArgument naming the field when neither or both of target_uri and
//     target_socket_path are set, for a target_socket_path that is not absolute, and for a
//     target_uri it does not understand; FailedPrecondition for a VM that is not RUNNING
//     (created, paused, shutting down, stopped), for a VM that is migrating already, and for a
//     target_socket_path where no socket is;
//   - MUST start the migration and return once it began (phase SETUP or ACTIVE, a MIGRATION
//     event), not wait for its end: it can take minutes, and it goes on in the VM process when
//     the driver process restarts;
//   - MUST honour bandwidth_bytes_per_second (0: the driver's own limit, which SHOULD NOT be
//     lower than the node's network; the qmp driver lifts QEMU's default of 32 MiB/s), use
//     auto-converge only when allow_auto_converge and post-copy only when allow_post_copy;
//     a driver that declares Capabilities.migration_post_copy, with allow_post_copy, SHOULD
//     switch to post-copy when pre-copy does not converge (the memory left after a pass does
//     not shrink) and MUST switch when completion_timeout is reached; otherwise (no
//     allow_post_copy, or a driver without post-copy) it MUST cancel the migration at
//     completion_timeout, as CancelMigration does, with phase CANCELLED and a message naming
//     the timeout;
//   - SHOULD copy memory while the guest runs (MIGRATION_MODE_PRE_COPY); where that would lose
//     some of the guest's writes it MUST instead pause the guest for the copy
//     (MIGRATION_MODE_PAUSED, the pause counted in MigrationInfo.downtime), and MAY switch to
//     post-copy at once when allow_post_copy;
//   - while it migrates the VM stays RUNNING: the pause for the switch-over is reported as
//     MigrationInfo.downtime, not as PAUSED and RESUMED events. Pause, Resume, Reboot and
//     SoftReboot MUST return FailedPrecondition meanwhile; Shutdown SHOULD cancel the
//     migration first; Kill MUST stop the VM at once (the migration fails at both ends);
//   - MUST report the VM STOPPED with reason Migrated (event STOPPED, then no other of this
//     run) only once the target acknowledged that it holds the whole state and runs it, and
//     MUST then end the VM process here; the MigrationInfo of the completed migration (downtime,
//     total_time, bytes) stays readable through MigrationStatus until Delete;
//   - a migration that fails or is cancelled in pre-copy MUST leave the VM RUNNING here as
//     before (resumed if the switch-over had paused it, with no event of it), phase FAILED or
//     CANCELLED with a message;
//   - a failure after the switch to post-copy leaves the guest's memory split between the two
//     ends: the source VM MUST end CRASHED with reason MigrationFailed (the target likewise
//     stops), and the host recovers the VM as from a crash.
//
// MigrationStatus:
//
//   - MUST report the current migration, else the last one (its outcome), of a VM at either end,
//     with role, phase, mode and started_at; at the source while ACTIVE also total_bytes,
//     transferred_bytes, remaining_bytes, dirty_rate_bytes_per_second, iterations and
//     throughput_bytes_per_second as the VM process measures them now; once COMPLETED, downtime
//     and total_time;
//   - MUST answer an unset migration (not an error) for a VM that never migrated, and NotFound
//     for an unknown id;
//   - MUST return quickly (SHOULD be under a second): the host polls it every few seconds.
//
// CancelMigration:
//
//   - at the source, MUST abort a migration in pre-copy and return once it ended: phase
//     CANCELLED (or COMPLETED or FAILED if it ended first otherwise), the VM RUNNING here;
//   - MUST return FailedPrecondition when the migration is in post-copy (it can no longer be
//     cancelled) and for a VM that migrated away (STOPPED, Migrated);
//   - at the target, MUST stop an incoming VM that does not run yet: STOPPED, reason
//     MigrationCancelled, phase CANCELLED; the source then sees its migration fail;
//   - MUST succeed, changing nothing, for a VM with no migration in progress otherwise.
//
// Recover of a VM in the middle of a migration (the driver process restarted) MUST re-adopt it
// without disturbing the migration, which goes on in the VM process: a source is RUNNING with
// its migration ACTIVE (the driver enforces completion_timeout and the post-copy switch again);
// a target that still waits is PAUSED with reason IncomingMigration. A migration that ended
// while no driver ran is finished as if it had been watched: a source whose migration completed
// is stopped (reason Migrated), a target that received the VM is run.
//
// Disks. The host migrates a VM only when each of its writable disks is either shared (the
// same image reachable by the target at the path of the target's spec: a RWX volume, or one
// host) or copied by the driver. A driver that declares Capabilities.migration_disks copies the
// writable node-local disks (a containerDisk's overlay, an emptyDisk) by block mirroring before
// the memory; the host sends disks to copy to no other driver, and MUST NOT migrate a VM with a
// node-local writable disk between nodes through one. Read-only media (cloud-init) are made
// again on the target by its storage driver and never copied. The target's storage driver has
// made a fresh image for each disk to copy (an overlay over the same base image, an empty disk
// of the same size) at the path of the target's spec.
//
//   - Target: with incoming_migration.disks and disks_socket_path, Start MUST also serve each
//     named disk over NBD on disks_socket_path, writable, as an export named as the disk, before
//     it returns (SHOULD remove a stale socket there first); the guest does not run meanwhile.
//     It MUST stop serving (and remove the socket) once the VM runs here, and when the
//     migration fails or is cancelled (the VM process ends); the VM then runs on what the copy
//     wrote into its images.
//   - Source: with MigrateRequest.disks, Migrate MUST return InvalidArgument naming the field for
//     a disk that is not a writable disk of the VM (read-only, a CD-ROM, a LUN, unknown) or is
//     named twice, and when target_disks_socket_path is missing or not absolute;
//     FailedPrecondition when no socket is there. It starts mirroring each named disk into the
//     target's export of the same name (top_only: only the top image, over a backing image the
//     target has too; else the whole disk as the guest sees it) and returns (phase ACTIVE): the
//     guest runs on, and what it writes meanwhile is mirrored too; bandwidth_bytes_per_second
//     limits each disk's copy as well. The memory migration MUST NOT start before every mirror
//     is ready (in sync); it then starts as without disks.
//   - Switch-over: with the guest paused for it, the source MUST complete every mirror (every
//     write the guest made reaches the target's image) before the target may run the VM: the
//     target MUST NOT run a guest whose disks lack a write the source acknowledged. The
//     source's own images are left as they are (the mirror never switches the source to the
//     target's images).
//   - Failure or cancel (CancelMigration, the completion timeout, a mirror's error, the stream
//     breaking, in the disk phase as in the memory phase): the source MUST cancel every mirror
//     and disconnect from the target's NBD server, and go on running on its own disks, RUNNING
//     as before; phase FAILED (with a message naming the disk whose copy failed, when one did)
//     or CANCELLED. A target whose migration fails stops as without disks.
//   - MigrationStatus at the source SHOULD report disk_total_bytes, disk_transferred_bytes and
//     disks (per disk: total, transferred, ready) while the disks are copied and once the
//     migration ended; the memory figures stay the memory's.
//   - Recover of a source in the middle of copying its disks MUST re-adopt the mirrors (they
//     go on in the VM process) and go on as if watched: start the memory once every mirror is
//     ready, complete the mirrors at the switch-over.
//   - A driver that does not declare migration_disks MUST refuse a MigrateRequest with disks
//     (FailedPrecondition, or Unimplemented, naming the first disk) and a target spec with
//     incoming_migration.disks (InvalidArgument from Create, as CheckDomain does), and never
//     migrate such a VM without its disks.
type Migrator interface {
	Migrate(ctx context.Context, req *hypervisorv1.MigrateRequest) error
	MigrationStatus(ctx context.Context, id string) (*hypervisorv1.MigrationInfo, error)
	CancelMigration(ctx context.Context, id string) error
}

// Network connects a VMI's interfaces inside its sandbox's network namespace (service
// kubevisor.driver.network.v1.Network).
//
// Setup:
//
//   - MUST be idempotent: a second call for a set-up VMI returns the same result;
//   - MUST use the requested mac, or choose one that is stable per (vmi_id, interface name);
//   - MUST return for each interface its tap_name in the sandbox's namespace and its mac;
//   - MUST remove what it made before it returns an error;
//   - MUST return InvalidArgument naming the interface for a binding it does not declare;
//   - with the interface option "dhcp-options" declared (Capabilities.interface_options), MUST
//     send an interface's dhcp_options in every DHCPv4 OFFER and ACK its guest gets, and return
//     InvalidArgument naming the interface for options it cannot send as asked (DHCPOptions);
//     the host sends dhcp_options to no other driver (CheckSetup);
//   - SHOULD fill ip_addresses (CIDR), mtu and pod_interface, forward the interface's ports with
//     the masquerade binding, and fill reachable_addresses when others reach the guest at other
//     addresses than its own (NAT).
//
// Teardown:
//
//   - MUST remove everything Setup made for the VMI;
//   - MUST succeed when called twice, when the namespace is gone, and after a half-made Setup.
type Network interface {
	Driver
	Setup(ctx context.Context, req *networkv1.SetupRequest) (*networkv1.SetupResponse, error)
	Teardown(ctx context.Context, req *networkv1.TeardownRequest) error
}

// NetworkChecker is the optional FEATURE_NETWORK_CHECK.
//
// Check:
//
//   - MUST return FailedPrecondition naming the interface when the interfaces are no longer as
//     Setup left them;
//   - SHOULD return the same results as Setup otherwise.
type NetworkChecker interface {
	Check(ctx context.Context, req *networkv1.CheckRequest) (*networkv1.CheckResponse, error)
}

// Storage turns a VMI's volumes into disk images the hypervisor can open (service
// kubevisor.driver.storage.v1.Storage).
//
// Prepare:
//
//   - MUST make a disk for every volume, under work_dir unless the volume names a path, and
//     return for each its path, format (DISK_FORMAT_RAW or DISK_FORMAT_QCOW2), size_bytes,
//     read_only and cdrom (cloud-init media);
//   - MUST be idempotent: a second call returns the same disks and keeps what the guest wrote;
//   - MUST return InvalidArgument naming the volume for a source that is not a usable image or a
//     source type it does not declare;
//   - MUST remove what it made before it returns an error;
//   - SHOULD check every volume before it changes anything, and create sparse files.
//
// Release:
//
//   - MUST remove what Prepare made and nothing else: not a hostDisk it was handed, not a file
//     someone else put in work_dir;
//   - MUST succeed when called twice, and for a VMI never prepared;
//   - SHOULD keep a record of what Prepare made (in work_dir or state_dir) rather than recompute
//     it from the request.
type Storage interface {
	Driver
	Prepare(ctx context.Context, req *storagev1.PrepareRequest) (*storagev1.PrepareResponse, error)
	Release(ctx context.Context, req *storagev1.ReleaseRequest) error
}

// Device finds host devices and allocates them to containers (service
// kubevisor.driver.device.v1.Device); the node's kubelet device plugins
// (devices.kubevisor.io/<resource>) are fed from it.
//
// List:
//
//   - MUST return every device of the resource (of every resource when it is empty), healthy or
//     not, each with its id, resource (without domain: "kvm", "vfio-10de-1eb8") and health;
//   - SHOULD keep ids stable across calls and restarts, and fill pci_address and numa_node for PCI
//     devices.
//
// Allocate:
//
//   - MUST return NotFound for an unknown id and FailedPrecondition for an unhealthy device,
//     naming it: the VMI's sync fails with that message;
//   - MUST return the device_nodes, mounts and env a container needs, and pci_addresses for the
//     domain spec's host devices.
//
// What reaches the domain spec: for each resource a VMI names (hostDevices[] and gpus[] with
// deviceName devices.kubevisor.io/<resource>), the handler's Allocate answer becomes
// DomainSpec.host_devices: one per pci_addresses entry, or, without any, one per VMI entry; each
// with the VMI's name for it, the resource, the driver's name, the device ids, and the answer's
// device_nodes and env. A hypervisor driver that cannot give the guest a device without a PCI
// address refuses it by field path (domain.NonPCIHostDevices). Resources the VMI does not name
// (the class's kvm and tun) give none.
//
// A node runs several device drivers; a resource MUST be listed by one of them only.
type Device interface {
	Driver
	List(ctx context.Context, resource string) ([]*devicev1.HostDevice, error)
	Allocate(ctx context.Context, req *devicev1.AllocateRequest) (*devicev1.AllocateResponse, error)
}

// DeviceWatcher is the optional FEATURE_DEVICE_WATCH.
//
// Watch:
//
//   - MUST send the full device list of the resource at once and again on every change, until
//     ctx is done, and return nil then.
type DeviceWatcher interface {
	Watch(ctx context.Context, resource string, send func([]*devicev1.HostDevice) error) error
}
