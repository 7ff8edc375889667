// Package conformance is the driver conformance kit: named checks that a Kubevisor driver meets
// the contract of its kind (core/driver), run as subtests from a Go test or, through the
// kubevisor-conformance CLI, against a plugin binary.
//
// It is a library first. A driver author runs it from a test of their own:
//
//	func TestConformance(t *testing.T) {
//		conformance.HypervisorTesting(t, mydriver.New(), conformance.WithConsoleMarker("login:"))
//	}
//
// The *Testing functions serve the implementation through driver.InProcess, so every check
// crosses the real plugin boundary (protobuf encoding, status codes, streams) without starting a
// process. Hypervisor, Network, Storage and Device take a factory instead, for drivers reached
// some other way (the CLI passes the client of a plugin process), and any T, not only
// *testing.T (see FromTesting and Recorder).
//
// Every check is a subtest with a stable name ("Lifecycle/CreateStartStatusShutdownDelete"), so
// `go test -run` selects checks and CI reports list them. Every kind runs the checks of every
// driver first:
//
//	Info/NameAndKind, Info/ProtocolVersion
//	Capabilities/Stable, Capabilities/Valid, Capabilities/ImplementsDeclared
//	Fingerprint/SendsAtOnce, Fingerprint/StopsOnCancel
//	Configure/Idempotent, Configure/Empty
//
// then those of its kind, listed at Hypervisor, Network, Storage and Device. A check of an optional feature, volume
// type, binding or resource the driver does not declare in its Capabilities is skipped, and the
// skip message names what is missing ("driver does not declare FEATURE_HYPERVISOR_PAUSE").
//
// VM (and VMTesting) runs a hypervisor and a storage driver together with a real guest (a
// Guest; GuestFromDir finds the project's test guest, `make guest`): it boots VMs from the
// volumes the storage driver prepares, each under a real kubevisor-launcher as under the node
// handler (WithLauncher), and checks what the guest prints on its serial console. GuestDomain and
// DomainFromFile give the hypervisor checks a VM with something to boot (WithDomain).
//
// Each check asks the factory for the driver and calls Configure with Options.Config before
// anything kind-specific. A factory may return the same driver every time (a plugin process) or
// a new one; checks clean up what they made, through the T's Cleanup.
package conformance

import (
	"context"
	"testing"
	"time"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
)

// T is what the kit needs of a test: the subset of *testing.T it uses, with Run taking a T.
// FromTesting adapts a *testing.T; Recorder implements it outside `go test`.
//
// As with *testing.T, Fatalf and Skipf end the calling goroutine (runtime.Goexit), so they must
// be called from the goroutine running the test; Errorf and Logf may be called from any.
type T interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Logf(format string, args ...any)
	// Run runs f as a subtest named name and reports whether it passed (or was skipped).
	Run(name string, f func(T)) bool
	Cleanup(f func())
	// Context is cancelled when the test ends, before its Cleanup functions run.
	Context() context.Context
	TempDir() string
	Failed() bool
}

// FromTesting adapts t to T.
func FromTesting(t *testing.T) T { return testingT{t} }

type testingT struct{ *testing.T }

func (t testingT) Run(name string, f func(T)) bool {
	return t.T.Run(name, func(t *testing.T) { f(testingT{t}) })
}

// HypervisorFactory returns the hypervisor driver a check runs against. It is called once per
// check, with the check's T. The kit calls Configure on the driver itself.
type HypervisorFactory func(t T) driver.Hypervisor

// NetworkFactory returns the network driver a check runs against; see HypervisorFactory.
type NetworkFactory func(t T) driver.Network

// StorageFactory returns the storage driver a check runs against; see HypervisorFactory.
type StorageFactory func(t T) driver.Storage

// DeviceFactory returns the device driver a check runs against; see HypervisorFactory.
type DeviceFactory func(t T) driver.Device

// Defaults of Options.
const (
	DefaultTimeout         = 2 * time.Minute
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultMemory is the guest memory of DefaultDomain.
	DefaultMemory = 64 << 20
)

// Options change what the kit checks and how. Set them with the With... functions.
type Options struct {
	// Config is the driver's configuration (JSON) passed to every Configure.
	Config []byte
	// NodeName is passed to Configure.
	NodeName string
	// StateDir is the state directory passed to Configure. Default: a temporary directory
	// shared by every check of one run.
	StateDir string
	// Name, when set, is the name the driver must report in Info.
	Name string
	// Timeout bounds each check. Default: DefaultTimeout.
	Timeout time.Duration
	// ShutdownTimeout is the timeout the hypervisor checks pass to Shutdown. Default:
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Domain returns the domain spec of a VM the hypervisor checks create, for the id given and
	// with dir as its run directory (an empty directory the kit removes afterwards). Default:
	// DefaultDomain.
	Domain func(id, dir string) *domainv1.DomainSpec
	// ConsoleMarker, when set, is text the serial console of a VM the kit started must print
	// (a login prompt, an init's banner). Without it Console/Output only checks that the
	// console attaches and detaches.
	ConsoleMarker string
	// Restart, when set, restarts the hypervisor driver process and returns the driver of the
	// new process; the Recover checks need it. See WithRestart.
	Restart HypervisorFactory
	// NetNS returns the network namespace the network checks pass as netns_path. Default: "".
	NetNS func(t T) string
	// Implementation is the Go implementation behind the driver under test, when the kit can
	// reach it; Capabilities/ImplementsDeclared needs it. The *Testing functions set it.
	Implementation driver.Driver

	// The VM checks (VM) run a hypervisor and a storage driver together. Config, StateDir and
	// Timeout above are the hypervisor's there; these are the rest.

	// StorageConfig is the storage driver's configuration (JSON) the VM checks pass to its
	// Configure.
	StorageConfig []byte
	// StorageStateDir is the state directory the VM checks pass to the storage driver's
	// Configure. Default: a temporary directory shared by every check of one run.
	StorageStateDir string
	// DiskBus is the bus of the disks of the VMs the VM checks boot. Default: virtio.
	DiskBus domainv1.DiskBus
	// CDROMBus is the bus of their CD-ROMs (the cloud-init seed). Default: scsi (virtio-scsi).
	CDROMBus domainv1.DiskBus
	// DriverKill, when set, kills the hypervisor driver process as a crash would and returns
	// the driver of the process that replaced it; Recover/AfterDriverKilled needs it. See
	// WithDriverKill.
	DriverKill HypervisorFactory
	// Launcher is the kubevisor-launcher binary the VM checks start one of for every VM. Default:
	// FindLauncher's, else one built with the go command (a go test has one). See WithLauncher.
	Launcher string
	// ConfineLauncher runs every launcher of the VM checks with LauncherCapabilities only, as
	// in a launcher pod of a class with those HypervisorClass.LauncherCapabilities. See
	// WithLauncherCapabilities.
	ConfineLauncher bool
	// LauncherCapabilities are the capabilities a confined launcher keeps ("SETUID").
	LauncherCapabilities []string
	// MigrationPeer, when set, returns a second instance of the hypervisor driver under test,
	// in a process of its own, as on another node: the Migrate checks move VMs to it. See
	// WithMigrationPeer.
	MigrationPeer HypervisorFactory
	// MigrationPeerStateDir is the state directory the kit passes to the peer's Configure.
	// Default: a temporary directory of its own.
	MigrationPeerStateDir string
	// MigrationRelay, when set, stands between the source and the target of every migration
	// of the Migrate checks. See WithMigrationRelay.
	MigrationRelay MigrationRelay
}

// MigrationRelay carries a migration's streams from the source to the target, as the node
// handlers' migration proxy does between nodes: given an identifier of the migration (a DNS
// label, new for each migration, as a VirtualMachineInstanceMigration's UID), the source VM's
// run directory and the target's sockets by channel (ChannelMemory: its incoming socket;
// ChannelDisks, for a migration that copies disks: its NBD socket), it returns for each channel
// the unix socket the source is to connect to (the MigrateRequest's target_socket_path and
// target_disks_socket_path, normally in the source's run directory), and carries every
// connection made there to that channel's target socket until the check ends (t.Cleanup).
type MigrationRelay func(t T, id, sourceRunDir string, targetSockets map[string]string) map[string]string

// Option changes Options.
type Option func(*Options)

// WithConfig sets the driver configuration (JSON) the kit passes to Configure.
func WithConfig(config []byte) Option { return func(o *Options) { o.Config = config } }

// WithNodeName sets the node name the kit passes to Configure.
func WithNodeName(name string) Option { return func(o *Options) { o.NodeName = name } }

// WithStateDir sets the state directory the kit passes to Configure.
func WithStateDir(dir string) Option { return func(o *Options) { o.StateDir = dir } }

// WithName makes Info/NameAndKind require the driver to report this name.
func WithName(name string) Option { return func(o *Options) { o.Name = name } }

// WithTimeout sets how long each check may take.
func WithTimeout(d time.Duration) Option { return func(o *Options) { o.Timeout = d } }

// WithShutdownTimeout sets the timeout the hypervisor checks pass to Shutdown.
func WithShutdownTimeout(d time.Duration) Option {
	return func(o *Options) { o.ShutdownTimeout = d }
}

// WithDomain lets a driver that cannot run DefaultDomain supply a domain spec it can boot (a
// kernel and initrd, a disk). The spec must use id as its Id and should use dir as its RunDir.
func WithDomain(f func(id, dir string) *domainv1.DomainSpec) Option {
	return func(o *Options) { o.Domain = f }
}

// WithConsoleMarker sets text that a booted VM's serial console must print.
func WithConsoleMarker(marker string) Option { return func(o *Options) { o.ConsoleMarker = marker } }

// WithRestart enables the Recover checks. restart must end the driver process used so far (or
// leave it be, for an in-process driver) and return the driver of a new process, as after a
// restart of the driver; the kit configures it. With HypervisorTesting, restart returns a new
// implementation, which the kit serves in-process.
func WithRestart(restart HypervisorFactory) Option { return func(o *Options) { o.Restart = restart } }

// WithNetNS sets the network namespace the network checks use: a real network driver needs one
// per check, made by f (and removed through t.Cleanup).
func WithNetNS(f func(t T) string) Option { return func(o *Options) { o.NetNS = f } }

// WithImplementation names the Go implementation behind the driver under test, so that
// Capabilities/ImplementsDeclared can run when the driver is reached through a client.
func WithImplementation(impl driver.Driver) Option {
	return func(o *Options) { o.Implementation = impl }
}

// WithStorageConfig sets the configuration (JSON) the VM checks pass to the storage driver's
// Configure; WithConfig sets the hypervisor's.
func WithStorageConfig(config []byte) Option { return func(o *Options) { o.StorageConfig = config } }

// WithStorageStateDir sets the state directory the VM checks pass to the storage driver's
// Configure; WithStateDir sets the hypervisor's.
func WithStorageStateDir(dir string) Option { return func(o *Options) { o.StorageStateDir = dir } }

// WithDiskBus sets the bus of the disks of the VMs the VM checks boot (default virtio). The
// hypervisor must declare it in Capabilities.disk_buses and the guest must have a driver for it.
func WithDiskBus(bus domainv1.DiskBus) Option { return func(o *Options) { o.DiskBus = bus } }

// WithCDROMBus sets the bus of the CD-ROMs of the VMs the VM checks boot (default scsi: a
// virtio-scsi CD-ROM, which every machine type has and the test guest reads).
func WithCDROMBus(bus domainv1.DiskBus) Option { return func(o *Options) { o.CDROMBus = bus } }

// WithDriverKill enables Recover/AfterDriverKilled. kill must end the hypervisor driver process
// abruptly, as a crash does (SIGKILL), leaving its VMs running, and return the driver of the
// process that replaced it; the kit configures it. With VMTesting, kill returns a new
// implementation (after making the old one let go of its VMs as a dead process would), which
// the kit serves in-process.
func WithDriverKill(kill HypervisorFactory) Option { return func(o *Options) { o.DriverKill = kill } }

// WithLauncher sets the kubevisor-launcher binary the VM checks run every VM under: each VM gets
// a launcher of its own, and its domain spec names the launcher's socket and network namespace
// (sandbox.launcher_socket, sandbox.netns_path), as the node handler's does, so that passing the
// VM checks means working under the handler.
func WithLauncher(path string) Option { return func(o *Options) { o.Launcher = path } }

// WithLauncherCapabilities runs every launcher of the VM checks as the compute container of a
// launcher pod whose HypervisorClass keeps caps (its LauncherCapabilities, by their
// securityContext names: "SETUID", "SETGID"; none drops all) runs in a cluster: as root, with
// caps exactly in its bounding, permitted and effective sets, none inheritable or ambient, and no
// new privileges (the pod's allowPrivilegeEscalation: false). util-linux's setpriv applies it
// when it execs the launcher, and the kit reads the launcher's /proc/<pid>/status to check it:
// a launcher that holds other sets fails the check. So passing the VM checks this way shows the
// hypervisor driver works inside its class's pods. It needs root: a kit that is not root runs
// its launchers as its own user, unconfined, and notes it in every check that starts one.
func WithLauncherCapabilities(caps ...string) Option {
	return func(o *Options) {
		o.ConfineLauncher = true
		o.LauncherCapabilities = caps
	}
}

// WithMigrationPeer enables the Migrate checks of VM: peer returns a second instance of the
// hypervisor driver under test, as the driver of another node would be (its own process, or
// for VMTesting its own implementation served in-process), which the kit configures with
// Options.Config and stateDir (a temporary directory when empty): the checks migrate running
// guests from the driver under test to it over a unix socket, on this host.
func WithMigrationPeer(peer HypervisorFactory, stateDir string) Option {
	return func(o *Options) {
		o.MigrationPeer = peer
		o.MigrationPeerStateDir = stateDir
	}
}

// WithMigrationRelay makes the Migrate checks migrate through relay (a proxy between the source
// and the target) rather than straight to the target's socket.
func WithMigrationRelay(relay MigrationRelay) Option {
	return func(o *Options) { o.MigrationRelay = relay }
}

// DefaultDomain is the domain spec of the hypervisor checks unless WithDomain replaces it: the
// smallest spec domain.Validate accepts (DefaultMemory of memory, no disk, no NIC) with dir as
// its run directory. A VM made from it has nothing to boot; a driver that cannot start such a VM
// supplies its own spec.
func DefaultDomain(id, dir string) *domainv1.DomainSpec {
	return &domainv1.DomainSpec{
		Id:     id,
		Name:   "conformance/" + id,
		Memory: &domainv1.Memory{GuestBytes: DefaultMemory},
		RunDir: dir,
		Labels: map[string]string{"kubevisor.io/conformance": "true"},
	}
}

func newOptions(t T, opts []Option) Options {
	o := Options{}
	for _, opt := range opts {
		opt(&o)
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o.Domain == nil {
		o.Domain = DefaultDomain
	}
	if o.StateDir == "" {
		o.StateDir = t.TempDir()
	}
	return o
}
