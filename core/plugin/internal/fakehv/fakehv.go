// Package fakehv is an in-memory hypervisor driver for the plugin host's tests and benchmarks.
package fakehv

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// Hypervisor keeps VMs as records in memory. Its Fingerprint reports what Configure received
// and the process's pid, so a test can check both across the plugin boundary.
type Hypervisor struct {
	// Name is what Info reports.
	Name string
	// PanicOn names an operation ("Status", "Configure", ...) that panics when called.
	PanicOn string

	mu         sync.Mutex
	vms        map[string]*hypervisorv1.VMStatus
	configured *basev1.ConfigureRequest
	configures int
}

var _ driver.Hypervisor = (*Hypervisor)(nil)

// New returns a Hypervisor reporting name.
func New(name string) *Hypervisor {
	return &Hypervisor{Name: name, vms: map[string]*hypervisorv1.VMStatus{}}
}

func (h *Hypervisor) maybePanic(op string) {
	if h.PanicOn == op {
		panic(fmt.Sprintf("fakehv: %s panics as asked", op))
	}
}

// Info implements driver.Driver.
func (h *Hypervisor) Info(context.Context) (*basev1.InfoResponse, error) {
	return &basev1.InfoResponse{Name: h.Name, Version: "0.0.1", Description: "in-memory test hypervisor"}, nil
}

// Capabilities implements driver.Driver.
func (h *Hypervisor) Capabilities(context.Context) (*basev1.Capabilities, error) {
	return &basev1.Capabilities{}, nil
}

// Fingerprint implements driver.Driver: one message with attributes pid, configures, node,
// state-dir, protocol-version and config, then nothing until ctx is done.
func (h *Hypervisor) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	h.mu.Lock()
	attrs := map[string]string{"pid": strconv.Itoa(os.Getpid()), "configures": strconv.Itoa(h.configures)}
	if c := h.configured; c != nil {
		attrs["node"] = c.GetNodeName()
		attrs["state-dir"] = c.GetStateDir()
		attrs["protocol-version"] = strconv.Itoa(int(c.GetProtocolVersion()))
		attrs["config"] = string(c.GetConfig())
	}
	h.mu.Unlock()
	if err := send(&basev1.FingerprintResponse{Health: basev1.Health_HEALTH_HEALTHY, Attributes: attrs}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// Configure implements driver.Driver. The config must be empty or a JSON object.
func (h *Hypervisor) Configure(_ context.Context, req *basev1.ConfigureRequest) error {
	h.maybePanic("Configure")
	if len(req.GetConfig()) > 0 {
		var obj map[string]any
		if err := json.Unmarshal(req.GetConfig(), &obj); err != nil {
			return status.Errorf(codes.InvalidArgument, "config: %v", err)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.configured = proto.Clone(req).(*basev1.ConfigureRequest)
	h.configures++
	return nil
}

// Create implements driver.Hypervisor.
func (h *Hypervisor) Create(_ context.Context, spec *domainv1.DomainSpec) (*hypervisorv1.Handle, error) {
	h.maybePanic("Create")
	if spec.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "id: required")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.vms[spec.GetId()]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "vm %q exists", spec.GetId())
	}
	h.vms[spec.GetId()] = &hypervisorv1.VMStatus{Id: spec.GetId(), State: hypervisorv1.State_STATE_CREATED}
	return &hypervisorv1.Handle{Id: spec.GetId(), Driver: h.Name}, nil
}

func (h *Hypervisor) setState(id string, st hypervisorv1.State) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	vm, ok := h.vms[id]
	if !ok {
		return status.Errorf(codes.NotFound, "vm %q not found", id)
	}
	if st == hypervisorv1.State_STATE_RUNNING && vm.State != st {
		vm.Boots++
	}
	vm.State = st
	return nil
}

// Start implements driver.Hypervisor.
func (h *Hypervisor) Start(_ context.Context, id string) error {
	h.maybePanic("Start")
	return h.setState(id, hypervisorv1.State_STATE_RUNNING)
}

// Shutdown implements driver.Hypervisor.
func (h *Hypervisor) Shutdown(_ context.Context, id string, _ time.Duration) (bool, error) {
	h.maybePanic("Shutdown")
	return true, h.setState(id, hypervisorv1.State_STATE_STOPPED)
}

// Kill implements driver.Hypervisor.
func (h *Hypervisor) Kill(_ context.Context, id string) error {
	h.maybePanic("Kill")
	return h.setState(id, hypervisorv1.State_STATE_STOPPED)
}

// Delete implements driver.Hypervisor.
func (h *Hypervisor) Delete(_ context.Context, id string) error {
	h.maybePanic("Delete")
	h.mu.Lock()
	defer h.mu.Unlock()
	if vm, ok := h.vms[id]; ok && vm.State == hypervisorv1.State_STATE_RUNNING {
		return status.Errorf(codes.FailedPrecondition, "vm %q is running", id)
	}
	delete(h.vms, id)
	return nil
}

// Status implements driver.Hypervisor.
func (h *Hypervisor) Status(_ context.Context, id string) (*hypervisorv1.VMStatus, error) {
	h.maybePanic("Status")
	h.mu.Lock()
	defer h.mu.Unlock()
	vm, ok := h.vms[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "vm %q not found", id)
	}
	return proto.Clone(vm).(*hypervisorv1.VMStatus), nil
}

// Events implements driver.Hypervisor: it sends nothing until ctx is done.
func (h *Hypervisor) Events(ctx context.Context, _ string, _ func(*hypervisorv1.Event) error) error {
	<-ctx.Done()
	return nil
}
