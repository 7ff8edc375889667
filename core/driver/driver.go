// Package driver is the SDK for Kubevisor drivers: the Go interfaces of the four driver kinds,
// the go-plugin glue that serves an implementation as a plugin process (Serve*), and the clients
// the host uses to call a plugin through the same interfaces.
//
// A driver author implements one kind's interface (and any optional interfaces it declares in
// its Capabilities) and calls the matching Serve function from main. Nothing else of the
// Kubevisor repository is needed. The contract every implementation must meet is written out in
// docs/driver-authoring.md and checked by the conformance kit (conformance/driver).
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

// Driver is what every driver implements, whatever its kind.
//
// | operation    | an implementation MUST                                                     |
// |--------------|----------------------------------------------------------------------------|
// | Info         | answer at any time, before Configure too, and never fail                   |
// | Capabilities | answer the same for the life of the process                                |
// | Fingerprint  | send once at once, then on every change, until ctx is done; return nil then |
// | Configure    | accept an empty config as defaults; succeed when called again with the same |
//
// Errors are gRPC status errors (google.golang.org/grpc/status); a plain error reaches the host
// as codes.Unknown.
type Driver interface {
	Info(ctx context.Context) (*basev1.InfoResponse, error)
	Capabilities(ctx context.Context) (*basev1.Capabilities, error)
	Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error
	Configure(ctx context.Context, req *basev1.ConfigureRequest) error
}

// Hypervisor runs VMs described by a domain spec. VMs are named by DomainSpec.Id.
//
// | operation | an implementation MUST                                                          |
// |-----------|---------------------------------------------------------------------------------|
// | Create    | return InvalidArgument naming the field for a spec it cannot honour; AlreadyExists for a known id |
// | Start     | boot a created or stopped VM; succeed on a running one                          |
// | Shutdown  | ask the guest to power off, force it off at the timeout, return once stopped; succeed on a stopped VM |
// | Kill      | stop the VM at once; succeed on a stopped VM                                    |
// | Delete    | remove a stopped VM and all it made; succeed on an unknown id; FailedPrecondition on a running VM |
// | Status    | return NotFound for an unknown id                                               |
// | (all)     | return NotFound for an unknown id, except Create and Delete                      |
// | Events    | stream state changes (all VMs, or the one named) until ctx is done              |
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

// Pauser is the optional FEATURE_HYPERVISOR_PAUSE: Pause freezes the vCPUs of a running VM,
// Resume continues them. Both succeed when the VM already is in the asked state.
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// Rebooter is the optional FEATURE_HYPERVISOR_REBOOT: Reboot resets a running VM, which goes
// on running and boots again.
type Rebooter interface {
	Reboot(ctx context.Context, id string) error
}

// Consoler is the optional FEATURE_HYPERVISOR_CONSOLE: Console copies the VM's serial output
// to out and in to the serial input, until ctx is done, in ends, or the VM stops.
type Consoler interface {
	Console(ctx context.Context, id string, in io.Reader, out io.Writer) error
}

// Recoverer is the optional FEATURE_HYPERVISOR_RECOVER: Recover re-adopts a VM from the handle
// Create returned, in a new driver process. A VM that is gone is reported as stopped.
type Recoverer interface {
	Recover(ctx context.Context, handle *hypervisorv1.Handle) (*hypervisorv1.VMStatus, error)
}

// Migrator is the optional FEATURE_HYPERVISOR_MIGRATE.
type Migrator interface {
	Migrate(ctx context.Context, req *hypervisorv1.MigrateRequest) error
}

// Network connects a VMI's interfaces inside its sandbox's network namespace.
//
// | operation | an implementation MUST                                                        |
// |-----------|-------------------------------------------------------------------------------|
// | Setup     | be idempotent; return stable MACs per (vmi, interface); undo a failed half-setup |
// | Teardown  | succeed twice, with the namespace gone, and after a half-made Setup            |
type Network interface {
	Driver
	Setup(ctx context.Context, req *networkv1.SetupRequest) (*networkv1.SetupResponse, error)
	Teardown(ctx context.Context, req *networkv1.TeardownRequest) error
}

// NetworkChecker is the optional FEATURE_NETWORK_CHECK: Check reports FailedPrecondition when
// the interfaces are no longer as Setup left them.
type NetworkChecker interface {
	Check(ctx context.Context, req *networkv1.CheckRequest) (*networkv1.CheckResponse, error)
}

// Storage turns a VMI's volumes into disks.
//
// | operation | an implementation MUST                                                          |
// |-----------|---------------------------------------------------------------------------------|
// | Prepare   | be idempotent; InvalidArgument naming the volume for a source that is not a usable image; undo a failed half-prepare |
// | Release   | remove only what Prepare made; succeed twice and for a VMI never prepared       |
type Storage interface {
	Driver
	Prepare(ctx context.Context, req *storagev1.PrepareRequest) (*storagev1.PrepareResponse, error)
	Release(ctx context.Context, req *storagev1.ReleaseRequest) error
}

// Device finds host devices and allocates them to containers.
//
// | operation | an implementation MUST                                                  |
// |-----------|-------------------------------------------------------------------------|
// | List      | return every device of the resource (all when empty), healthy or not    |
// | Allocate  | NotFound for an unknown id; FailedPrecondition for an unhealthy device  |
type Device interface {
	Driver
	List(ctx context.Context, resource string) ([]*devicev1.HostDevice, error)
	Allocate(ctx context.Context, req *devicev1.AllocateRequest) (*devicev1.AllocateResponse, error)
}

// DeviceWatcher is the optional FEATURE_DEVICE_WATCH: Watch sends the full device list at once
// and again on every change, until ctx is done.
type DeviceWatcher interface {
	Watch(ctx context.Context, resource string, send func([]*devicev1.HostDevice) error) error
}
