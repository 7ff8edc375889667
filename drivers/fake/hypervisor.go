package fake

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// ConsoleMarker is the last line of the simulated boot log the fake hypervisor writes to a VM's
// serial console on every boot: a login prompt, as a real guest would print.
const ConsoleMarker = "kubevisor-fake login:"

// RecordFile is the file the fake hypervisor keeps in a VM's run directory (DomainSpec.RunDir)
// while the VM exists: the simulated VM process's own record, which lets a new driver process
// re-adopt the VM (Recover). A VM without a run directory does not survive a driver restart.
const RecordFile = "kubevisor-fake-vm.json"

// consoleHistory is how much console output a VM keeps for consoles that attach later.
const consoleHistory = 64 << 10

// HypervisorConfig is the JSON configuration of the fake hypervisor. The zero value (an empty
// configuration) boots and stops instantly.
type HypervisorConfig struct {
	// IgnoreShutdown simulates guests that ignore ACPI power-down: Shutdown then stops the VM
	// forcibly at its timeout and reports graceful=false.
	IgnoreShutdown bool `json:"ignoreShutdown,omitempty"`
	// BootDelay is how long every boot (Start, Reboot) takes.
	BootDelay Duration `json:"bootDelay,omitempty"`
	// ShutdownDelay is how long a guest takes to power off once asked. A guest slower than the
	// Shutdown timeout is stopped forcibly.
	ShutdownDelay Duration `json:"shutdownDelay,omitempty"`
	// AgentDelay is how long after a boot the simulated guest agent starts answering
	// GuestAgentInfo; before, it is not connected.
	AgentDelay Duration `json:"agentDelay,omitempty"`
	// NoAgent simulates guests without a guest agent: never connected.
	NoAgent bool `json:"noAgent,omitempty"`
}

// Hypervisor is the fake hypervisor driver. VMs are in-memory records that go through the
// states a real VM does; their serial console prints a simulated boot log ending in
// ConsoleMarker and echoes its input. It offers every optional hypervisor feature.
type Hypervisor struct {
	base

	// mu guards everything below, and base.mu is never held with it.
	mu   sync.Mutex
	cfg  HypervisorConfig
	vms  map[string]*vm
	subs map[*subscriber]struct{}
}

var (
	_ driver.Hypervisor   = (*Hypervisor)(nil)
	_ driver.Pauser       = (*Hypervisor)(nil)
	_ driver.Rebooter     = (*Hypervisor)(nil)
	_ driver.SoftRebooter = (*Hypervisor)(nil)
	_ driver.GuestAgent   = (*Hypervisor)(nil)
	_ driver.GuestExecer  = (*Hypervisor)(nil)
	_ driver.Consoler     = (*Hypervisor)(nil)
	_ driver.Recoverer    = (*Hypervisor)(nil)
	_ driver.Migrator     = (*Hypervisor)(nil)
)

// NewHypervisor returns a fake hypervisor with the default configuration.
func NewHypervisor() *Hypervisor {
	return &Hypervisor{
		base: newBase(basev1.Kind_KIND_HYPERVISOR, "simulated hypervisor: VMs are in-memory records, no guest runs"),
		vms:  map[string]*vm{},
		subs: map[*subscriber]struct{}{},
	}
}

// vmRecord is what the fake hypervisor knows of a VM. It is the opaque state of the VM's
// Handle and the content of its RecordFile.
type vmRecord struct {
	ID          string    `json:"id"`
	Name        string    `json:"name,omitempty"`
	RunDir      string    `json:"runDir,omitempty"`
	MemoryBytes uint64    `json:"memoryBytes"`
	VCPUs       uint32    `json:"vcpus"`
	State       string    `json:"state"`
	Reason      string    `json:"reason,omitempty"`
	Message     string    `json:"message,omitempty"`
	Boots       uint32    `json:"boots"`
	StartedAt   time.Time `json:"startedAt,omitzero"`
	// HostDevices are the domain's host devices as name=pci_address (empty for a device with
	// no PCI address), so that tests see what the host passed through.
	HostDevices []string `json:"hostDevices,omitempty"`
	// Devices are the domain's host devices whole: the simulated guest accepts every one, PCI
	// function or not, and its boot log names each (HostDeviceLine).
	Devices []RecordedHostDevice `json:"devices,omitempty"`
	// Incoming is the migration a target VM waits for, until it runs (migrate.go).
	Incoming *incomingRecord `json:"incoming,omitempty"`
}

// RecordedHostDevice is one host device of a VM's domain spec as the fake hypervisor records it.
type RecordedHostDevice struct {
	Name         string            `json:"name"`
	PCIAddress   string            `json:"pciAddress,omitempty"`
	Resource     string            `json:"resource,omitempty"`
	DeviceIDs    []string          `json:"deviceIDs,omitempty"`
	DeviceDriver string            `json:"deviceDriver,omitempty"`
	DeviceNodes  []string          `json:"deviceNodes,omitempty"`
	Env          map[string]string `json:"env,omitempty"`
}

// HostDeviceLine is the line the simulated guest prints on its serial console at every boot
// for one of its host devices: "hostdev <name> resource=<resource> id=<id>[,<id>...]", then
// " pci=<address>" for a PCI function.
func HostDeviceLine(d RecordedHostDevice) string {
	line := fmt.Sprintf("hostdev %s resource=%s id=%s", d.Name, d.Resource, strings.Join(d.DeviceIDs, ","))
	if d.PCIAddress != "" {
		line += " pci=" + d.PCIAddress
	}
	return line
}

// vm is one VM with its runtime bookkeeping.
type vm struct {
	rec   vmRecord
	state hypervisorv1.State
	// run is the current run of the VM process; nil before the first boot.
	run *run
	// gen changes on every boot and stop, so that delayed work (a guest powering off, a boot
	// delay) can tell whether the VM it started on is still the same.
	gen      uint64
	history  []byte
	consoles map[*queue[[]byte]]struct{}
	// migration is the last simulated migration.
	migration *hypervisorv1.MigrationInfo
	// listeners are a waiting target's sockets; cancel ends a source's stream (migrate.go).
	listeners []net.Listener
	cancel    context.CancelFunc
}

// run is one run of a VM process, from boot to stop.
type run struct {
	stopped chan struct{}
	reason  string
}

func (v *vm) running() bool {
	switch v.state {
	case hypervisorv1.State_STATE_RUNNING, hypervisorv1.State_STATE_PAUSED, hypervisorv1.State_STATE_SHUTTING_DOWN:
		return true
	}
	return false
}

// subscriber is one Events stream.
type subscriber struct {
	id string
	q  *queue[*hypervisorv1.Event]
}

// Capabilities implements driver.Driver: every optional feature, every firmware, disk bus, NIC
// model, machine type and optional device of the domain spec, and every hypervisor flag. It runs no VM process, so
// it honours a launcher socket by starting nothing through it.
func (h *Hypervisor) Capabilities(context.Context) (*basev1.Capabilities, error) {
	return &basev1.Capabilities{
		Features: []basev1.Feature{
			basev1.Feature_FEATURE_HYPERVISOR_PAUSE,
			basev1.Feature_FEATURE_HYPERVISOR_REBOOT,
			basev1.Feature_FEATURE_HYPERVISOR_SOFT_REBOOT,
			basev1.Feature_FEATURE_HYPERVISOR_GUEST_AGENT,
			basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC,
			basev1.Feature_FEATURE_HYPERVISOR_CONSOLE,
			basev1.Feature_FEATURE_HYPERVISOR_RECOVER,
			basev1.Feature_FEATURE_HYPERVISOR_MIGRATE,
		},
		Firmware:     []string{"bios", "efi", "kernel"},
		DiskBuses:    []string{"virtio", "sata", "scsi", "usb"},
		NicModels:    nicModels,
		MachineTypes: []string{"*"},
		SecureBoot:   true,
		Vnc:          true,
		HostDevices:  true,
		TapFd:        true,
		Launcher:     true,
		// Simulated: a Migrate with disks reports each copied (simulatedDiskBytes).
		MigrationDisks:    true,
		MigrationPostCopy: true,
		Devices: []string{driver.DeviceRNG, driver.DeviceChassis, driver.DeviceFeatures, driver.DeviceClock,
			driver.DeviceInput, driver.DeviceWatchdog, driver.DeviceBalloon, driver.DeviceDiskOptions,
			driver.DeviceCPUFeatures, driver.DeviceNICOptions,
			driver.DeviceStartPaused, driver.DeviceSound, driver.DeviceBIOSSerial, driver.DeviceHugepages,
			driver.DeviceNICMultiQueue, driver.DeviceVirtioTransitional},
	}, nil
}

var nicModels = []string{"virtio", "e1000", "e1000e", "rtl8139"}

// Fingerprint implements driver.Driver.
func (h *Hypervisor) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	return h.fingerprint(ctx, send, func() *basev1.FingerprintResponse {
		return healthy("simulated hypervisor: no guest runs")
	})
}

// Configure implements driver.Driver. The configuration is a HypervisorConfig.
func (h *Hypervisor) Configure(_ context.Context, req *basev1.ConfigureRequest) error {
	var cfg HypervisorConfig
	if err := decodeConfig(req.GetConfig(), &cfg); err != nil {
		return err
	}
	h.mu.Lock()
	h.cfg = cfg
	h.mu.Unlock()
	return nil
}

// Create implements driver.Hypervisor. It validates spec with domain.Validate and with what the
// fake cannot honour: unknown NIC models (InvalidArgument), and hardware acceleration, which a
// simulation never has (FailedPrecondition).
func (h *Hypervisor) Create(_ context.Context, spec *domainv1.DomainSpec) (*hypervisorv1.Handle, error) {
	if err := validateSpec(spec); err != nil {
		return nil, err
	}
	if spec.GetAcceleration() == domainv1.Acceleration_ACCELERATION_REQUIRED {
		return nil, precondition("acceleration: hardware acceleration is required but the fake hypervisor only simulates")
	}
	rec := vmRecord{
		ID:          spec.GetId(),
		Name:        spec.GetName(),
		RunDir:      spec.GetRunDir(),
		MemoryBytes: spec.GetMemory().GetGuestBytes(),
		VCPUs:       domain.VCPUs(spec),
		State:       hypervisorv1.State_STATE_CREATED.String(),
		Reason:      driver.ReasonCreated,
	}
	if in := spec.GetIncomingMigration(); in != nil {
		rec.Incoming = &incomingRecord{Socket: in.GetSocketPath(), DisksSocket: in.GetDisksSocketPath(), Disks: in.GetDisks()}
	}
	for _, h := range spec.GetHostDevices() {
		rec.HostDevices = append(rec.HostDevices, h.GetName()+"="+h.GetPciAddress())
		d := RecordedHostDevice{Name: h.GetName(), PCIAddress: h.GetPciAddress(), Resource: h.GetResource(),
			DeviceIDs: h.GetDeviceIds(), DeviceDriver: h.GetDeviceDriver(), Env: h.GetEnv()}
		for _, n := range h.GetDeviceNodes() {
			d.DeviceNodes = append(d.DeviceNodes, n.GetPath())
		}
		rec.Devices = append(rec.Devices, d)
	}
	state, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encode VM record: %w", err)
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.vms[rec.ID]; ok {
		return nil, alreadyExists("VM %q already exists", rec.ID)
	}
	v := &vm{rec: rec, state: hypervisorv1.State_STATE_CREATED, consoles: map[*queue[[]byte]]struct{}{}}
	if err := v.persist(); err != nil {
		return nil, invalid("runDir: %v", err)
	}
	h.vms[rec.ID] = v
	return &hypervisorv1.Handle{Id: rec.ID, Driver: Name, State: state}, nil
}

func validateSpec(spec *domainv1.DomainSpec) error {
	err := domain.Validate(spec)
	var errs domain.ValidationError
	if err != nil && !errors.As(err, &errs) {
		return err
	}
	for i, n := range spec.GetNics() {
		if n.GetModel() != "" && !slices.Contains(nicModels, n.GetModel()) {
			errs = append(errs, domain.FieldError{Field: fmt.Sprintf("nics[%d].model", i), Detail: fmt.Sprintf("model %q is not supported (want one of %v)", n.GetModel(), nicModels)})
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// Start implements driver.Hypervisor. A boot takes HypervisorConfig.BootDelay.
func (h *Hypervisor) Start(ctx context.Context, id string) error {
	h.mu.Lock()
	v, err := h.getLocked(id)
	if err != nil {
		h.mu.Unlock()
		return err
	}
	if v.running() {
		err := v.startableLocked()
		h.mu.Unlock()
		return err
	}
	if v.rec.Incoming != nil {
		defer h.mu.Unlock()
		return h.listenIncomingLocked(v)
	}
	delay := time.Duration(h.cfg.BootDelay)
	h.mu.Unlock()

	if err := sleep(ctx, delay); err != nil {
		return err
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	v, err = h.getLocked(id)
	if err != nil {
		return err
	}
	if v.running() {
		// A concurrent Start won the race, or the VM is shutting down.
		return v.startableLocked()
	}
	h.bootLocked(v)
	return nil
}

// startableLocked is what Start answers for a VM whose process runs.
func (v *vm) startableLocked() error {
	if v.state == hypervisorv1.State_STATE_SHUTTING_DOWN {
		return precondition("VM %q is shutting down", v.rec.ID)
	}
	return nil
}

// Shutdown implements driver.Hypervisor. A paused VM is resumed first. The guest powers off after
// HypervisorConfig.ShutdownDelay, unless HypervisorConfig.IgnoreShutdown is set; a guest that has
// not powered off at the timeout is stopped forcibly, at once with a timeout of 0.
func (h *Hypervisor) Shutdown(ctx context.Context, id string, timeout time.Duration) (bool, error) {
	h.mu.Lock()
	v, err := h.getLocked(id)
	if err != nil {
		h.mu.Unlock()
		return false, err
	}
	if timeout <= 0 && (v.state == hypervisorv1.State_STATE_RUNNING || v.state == hypervisorv1.State_STATE_PAUSED) {
		h.stopLocked(v, hypervisorv1.EventType_EVENT_TYPE_STOPPED, driver.ReasonForcedShutdown, "a shutdown without grace (timeout 0) stopped the VM at once")
		h.mu.Unlock()
		return false, nil
	}
	switch v.state {
	case hypervisorv1.State_STATE_RUNNING, hypervisorv1.State_STATE_PAUSED:
		if v.state == hypervisorv1.State_STATE_PAUSED {
			// A paused guest cannot react to the power button.
			h.setStateLocked(v, hypervisorv1.State_STATE_RUNNING, hypervisorv1.EventType_EVENT_TYPE_RESUMED, driver.ReasonResumed, "")
		}
		h.setStateLocked(v, hypervisorv1.State_STATE_SHUTTING_DOWN, hypervisorv1.EventType_EVENT_TYPE_POWERDOWN_REQUESTED, driver.ReasonPowerdownRequested, "")
		if !h.cfg.IgnoreShutdown {
			gen := v.gen
			if delay := time.Duration(h.cfg.ShutdownDelay); delay > 0 {
				time.AfterFunc(delay, func() { h.guestPoweredOff(id, gen) })
			} else {
				h.stopLocked(v, hypervisorv1.EventType_EVENT_TYPE_SHUTDOWN, driver.ReasonGuestShutdown, "the guest powered off")
			}
		}
	case hypervisorv1.State_STATE_SHUTTING_DOWN:
		// Another Shutdown is waiting for the guest: wait along.
	default:
		h.mu.Unlock()
		return false, nil
	}
	r, gen := v.run, v.gen
	h.mu.Unlock()

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-r.stopped:
	case <-timer.C:
		h.mu.Lock()
		if cur, ok := h.vms[id]; ok && cur == v && v.gen == gen && v.state == hypervisorv1.State_STATE_SHUTTING_DOWN {
			h.stopLocked(v, hypervisorv1.EventType_EVENT_TYPE_STOPPED, driver.ReasonForcedShutdown,
				fmt.Sprintf("the guest did not power off within %s and was stopped forcibly", timeout))
		}
		h.mu.Unlock()
		<-r.stopped
	case <-ctx.Done():
		return false, ctxErr(ctx)
	}
	return r.reason == driver.ReasonGuestShutdown, nil
}

// guestPoweredOff is the simulated guest finishing its power-off.
func (h *Hypervisor) guestPoweredOff(id string, gen uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if v, ok := h.vms[id]; ok && v.gen == gen && v.state == hypervisorv1.State_STATE_SHUTTING_DOWN {
		h.stopLocked(v, hypervisorv1.EventType_EVENT_TYPE_SHUTDOWN, driver.ReasonGuestShutdown, "the guest powered off")
	}
}

// Kill implements driver.Hypervisor.
func (h *Hypervisor) Kill(_ context.Context, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, err := h.getLocked(id)
	if err != nil {
		return err
	}
	if v.running() {
		h.stopLocked(v, hypervisorv1.EventType_EVENT_TYPE_STOPPED, driver.ReasonKilled, "the VM was stopped at once")
	}
	return nil
}

// Delete implements driver.Hypervisor. It removes the VM's RecordFile.
func (h *Hypervisor) Delete(_ context.Context, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.vms[id]
	if !ok {
		return nil
	}
	if v.running() {
		return precondition("VM %q is %s: stop it before deleting it", id, driver.StateWord(v.state))
	}
	if v.rec.RunDir != "" {
		if err := os.Remove(filepath.Join(v.rec.RunDir, RecordFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove VM record: %w", err)
		}
	}
	delete(h.vms, id)
	return nil
}

// Status implements driver.Hypervisor.
func (h *Hypervisor) Status(_ context.Context, id string) (*hypervisorv1.VMStatus, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, err := h.getLocked(id)
	if err != nil {
		return nil, err
	}
	return v.status(), nil
}

func (v *vm) status() *hypervisorv1.VMStatus {
	st := &hypervisorv1.VMStatus{
		Id:      v.rec.ID,
		State:   v.state,
		Reason:  v.rec.Reason,
		Message: v.rec.Message,
		Boots:   v.rec.Boots,
	}
	if !v.rec.StartedAt.IsZero() {
		st.StartedAt = timestamppb.New(v.rec.StartedAt)
	}
	return st
}

// Events implements driver.Hypervisor. Every stream gets every event (of the VM named by id,
// if set); a slow stream never holds up the driver.
func (h *Hypervisor) Events(ctx context.Context, id string, send func(*hypervisorv1.Event) error) error {
	s := &subscriber{id: id, q: newQueue[*hypervisorv1.Event]()}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.subs, s)
		h.mu.Unlock()
	}()
	for {
		events, open := s.q.next(ctx, nil)
		for _, e := range events {
			if err := send(e); err != nil {
				return err
			}
		}
		if !open {
			return nil
		}
	}
}

// Pause implements driver.Pauser.
func (h *Hypervisor) Pause(_ context.Context, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, err := h.getLocked(id)
	if err != nil {
		return err
	}
	switch v.state {
	case hypervisorv1.State_STATE_PAUSED:
		return nil
	case hypervisorv1.State_STATE_RUNNING:
		h.setStateLocked(v, hypervisorv1.State_STATE_PAUSED, hypervisorv1.EventType_EVENT_TYPE_PAUSED, driver.ReasonPaused, "")
		return nil
	}
	return precondition("VM %q is %s, not running", id, driver.StateWord(v.state))
}

// Resume implements driver.Pauser.
func (h *Hypervisor) Resume(_ context.Context, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, err := h.getLocked(id)
	if err != nil {
		return err
	}
	switch v.state {
	case hypervisorv1.State_STATE_RUNNING:
		return nil
	case hypervisorv1.State_STATE_PAUSED:
		h.setStateLocked(v, hypervisorv1.State_STATE_RUNNING, hypervisorv1.EventType_EVENT_TYPE_RESUMED, driver.ReasonResumed, "")
		return nil
	}
	return precondition("VM %q is %s, not paused", id, driver.StateWord(v.state))
}

// Reboot implements driver.Rebooter. The new boot takes HypervisorConfig.BootDelay, during
// which the VM is reported running.
func (h *Hypervisor) Reboot(ctx context.Context, id string) error {
	h.mu.Lock()
	v, err := h.getLocked(id)
	if err != nil {
		h.mu.Unlock()
		return err
	}
	if v.state != hypervisorv1.State_STATE_RUNNING {
		h.mu.Unlock()
		return precondition("VM %q is %s, not running", id, driver.StateWord(v.state))
	}
	gen, delay := v.gen, time.Duration(h.cfg.BootDelay)
	h.mu.Unlock()

	if err := sleep(ctx, delay); err != nil {
		return err
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	if cur, ok := h.vms[id]; !ok || cur != v || v.gen != gen || v.state != hypervisorv1.State_STATE_RUNNING {
		return precondition("VM %q stopped while it rebooted", id)
	}
	v.rec.Boots++
	v.rec.Reason, v.rec.Message = driver.ReasonHostReset, ""
	h.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_RESET)
	h.consoleWriteLocked(v, bootLog(v))
	_ = v.persist()
	return nil
}

// SoftReboot implements driver.SoftRebooter. The simulated guest, unless
// HypervisorConfig.IgnoreShutdown, restarts HypervisorConfig.ShutdownDelay later: one boot more,
// event RESET with reason GuestReset. SoftReboot returns before that.
func (h *Hypervisor) SoftReboot(_ context.Context, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, err := h.getLocked(id)
	if err != nil {
		return err
	}
	if v.state != hypervisorv1.State_STATE_RUNNING {
		return precondition("VM %q is %s, not running", id, driver.StateWord(v.state))
	}
	v.rec.Reason, v.rec.Message = driver.ReasonPowerdownRequested, ""
	h.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_POWERDOWN_REQUESTED)
	if h.cfg.IgnoreShutdown {
		return nil
	}
	gen := v.gen
	time.AfterFunc(time.Duration(h.cfg.ShutdownDelay), func() { h.guestRestarted(id, gen) })
	return nil
}

// FakeGuestOS is the operating system the simulated guest agent reports.
var FakeGuestOS = &hypervisorv1.GuestOSInfo{
	Name: "Fake Linux", KernelRelease: "6.1.0-fake", Version: "1 (fake)", PrettyName: "Fake Linux 1",
	VersionId: "1", KernelVersion: "#1 SMP fake", Machine: "x86_64", Id: "fake",
}

// GuestAgentInfo implements driver.GuestAgent. The simulated agent answers
// HypervisorConfig.AgentDelay after each boot (never with NoAgent) with FakeGuestOS, the VM's
// name as host name, and UTC.
func (h *Hypervisor) GuestAgentInfo(_ context.Context, id string) (*hypervisorv1.GuestAgentInfoResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, err := h.getLocked(id)
	if err != nil {
		return nil, err
	}
	if v.state != hypervisorv1.State_STATE_RUNNING {
		return nil, precondition("VM %q is %s, not running", id, driver.StateWord(v.state))
	}
	if h.cfg.NoAgent || time.Since(v.rec.StartedAt) < time.Duration(h.cfg.AgentDelay) {
		return &hypervisorv1.GuestAgentInfoResponse{Message: "the simulated guest agent does not answer"}, nil
	}
	return &hypervisorv1.GuestAgentInfoResponse{
		Connected: true, Version: "fake-1", Os: FakeGuestOS, HostName: v.rec.Name, Timezone: "UTC",
	}, nil
}

// agentAnswers says whether the simulated agent of VM id answers: the VM runs, and its agent
// started (AgentDelay after the boot; never with NoAgent): "" when it answers, the
// reason when it does not.
func (h *Hypervisor) agentAnswers(id string) (why string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, err := h.getLocked(id)
	if err != nil {
		return "", err
	}
	if v.state != hypervisorv1.State_STATE_RUNNING {
		return "", precondition("VM %q is %s, not running", id, driver.StateWord(v.state))
	}
	if h.cfg.NoAgent || time.Since(v.rec.StartedAt) < time.Duration(h.cfg.AgentDelay) {
		return "the simulated guest agent does not answer", nil
	}
	return "", nil
}

// GuestAgentPing implements driver.GuestExecer: the simulated agent answers as it does
// GuestAgentInfo.
func (h *Hypervisor) GuestAgentPing(_ context.Context, id string) (*hypervisorv1.GuestAgentPingResponse, error) {
	why, err := h.agentAnswers(id)
	if err != nil {
		return nil, err
	}
	return &hypervisorv1.GuestAgentPingResponse{Connected: why == "", Message: why}, nil
}

// GuestAgentExec implements driver.GuestExecer. The simulated guest has a few programs, run
// in-process: true, false, echo ARGS (prints them), exit N (exits N), sleep SECONDS (waits, up
// to timeout: a longer one is still running at the timeout); any other program is one the agent
// cannot start.
func (h *Hypervisor) GuestAgentExec(ctx context.Context, id string, command []string, timeout time.Duration) (*hypervisorv1.GuestAgentExecResponse, error) {
	if len(command) == 0 || command[0] == "" {
		return nil, status.Error(codes.InvalidArgument, "guest agent exec: command is required")
	}
	why, err := h.agentAnswers(id)
	if err != nil {
		return nil, err
	}
	if why != "" {
		return &hypervisorv1.GuestAgentExecResponse{Message: why}, nil
	}
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	exited := func(code int32, stdout string) *hypervisorv1.GuestAgentExecResponse {
		return &hypervisorv1.GuestAgentExecResponse{Connected: true, Exited: true, ExitCode: code, Stdout: []byte(stdout)}
	}
	switch args := command[1:]; command[0] {
	case "true":
		return exited(0, ""), nil
	case "false":
		return exited(1, ""), nil
	case "echo":
		return exited(0, strings.Join(args, " ")+"\n"), nil
	case "exit":
		n := 0
		if len(args) > 0 {
			n, _ = strconv.Atoi(args[0])
		}
		return exited(int32(n), ""), nil
	case "sleep":
		secs := 0.0
		if len(args) > 0 {
			secs, _ = strconv.ParseFloat(args[0], 64)
		}
		d := time.Duration(secs * float64(time.Second))
		t := time.NewTimer(min(d, timeout))
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		if d <= timeout && ctx.Err() == nil {
			return exited(0, ""), nil
		}
		return &hypervisorv1.GuestAgentExecResponse{Connected: true, Message: fmt.Sprintf("the command was still running after %s", timeout)}, nil
	}
	return &hypervisorv1.GuestAgentExecResponse{Connected: true,
		Message: fmt.Sprintf("guest agent: guest-exec: GenericError: the simulated guest has no program %q", command[0])}, nil
}

// guestRestarted is the simulated guest restarting after a SoftReboot.
func (h *Hypervisor) guestRestarted(id string, gen uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.vms[id]
	if !ok || v.gen != gen || v.state != hypervisorv1.State_STATE_RUNNING {
		return
	}
	v.rec.Boots++
	v.rec.Reason, v.rec.Message = driver.ReasonGuestReset, ""
	h.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_RESET)
	h.consoleWriteLocked(v, bootLog(v))
	_ = v.persist()
}

// simulatedDiskBytes is what a simulated migration reports copied of each disk it copies.
const simulatedDiskBytes = 1 << 20

// Migrate implements driver.Migrator. The simulated migration completes at once: the VM stops
// with reason Migrated, and MigrationStatus reports it completed, with each disk of
// req.disks copied (simulatedDiskBytes, ready). The fake simulates the source side only: it
// refuses to create a migration target (Create).
func (h *Hypervisor) Migrate(_ context.Context, req *hypervisorv1.MigrateRequest) error {
	target := cmp.Or(req.GetTargetUri(), req.GetTargetSocketPath())
	if target == "" {
		return invalid("target_uri: required")
	}
	var disks []*hypervisorv1.MigrationDisk
	for i, d := range req.GetDisks() {
		if d.GetName() == "" {
			return invalid("disks[%d].name: required", i)
		}
		disks = append(disks, &hypervisorv1.MigrationDisk{Name: d.GetName(), TopOnly: d.GetTopOnly(), TotalBytes: simulatedDiskBytes, TransferredBytes: simulatedDiskBytes, Ready: true})
	}
	if (len(disks) > 0) != (req.GetTargetDisksSocketPath() != "") {
		return invalid("target_disks_socket_path: set with disks, and only with them")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	v, err := h.getLocked(req.GetId())
	if err != nil {
		return err
	}
	if v.state != hypervisorv1.State_STATE_RUNNING {
		return precondition("VM %q is %s, not running", req.GetId(), driver.StateWord(v.state))
	}
	if v.migration != nil && v.migration.GetPhase() == hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE {
		return precondition("VM %q is migrating already", req.GetId())
	}
	if isSocket(req.GetTargetSocketPath()) {
		h.streamOutLocked(v, req, disks)
		return nil
	}
	now := timestamppb.Now()
	v.migration = &hypervisorv1.MigrationInfo{
		Role: hypervisorv1.MigrationRole_MIGRATION_ROLE_SOURCE, Phase: hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED,
		Mode: hypervisorv1.MigrationMode_MIGRATION_MODE_PRE_COPY, StartedAt: now, EndedAt: now, Target: target,
		TotalBytes: v.rec.MemoryBytes, TransferredBytes: v.rec.MemoryBytes, Iterations: 1,
		BandwidthLimitBytesPerSecond: req.GetBandwidthBytesPerSecond(),
		AutoConverge:                 req.GetAllowAutoConverge(), PostCopy: req.GetAllowPostCopy(),
		Disks:          disks,
		DiskTotalBytes: uint64(len(disks)) * simulatedDiskBytes, DiskTransferredBytes: uint64(len(disks)) * simulatedDiskBytes,
	}
	h.stopLocked(v, hypervisorv1.EventType_EVENT_TYPE_STOPPED, driver.ReasonMigrated, "migrated to "+target)
	return nil
}

// MigrationStatus implements driver.Migrator: the last simulated migration.
func (h *Hypervisor) MigrationStatus(_ context.Context, id string) (*hypervisorv1.MigrationInfo, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, err := h.getLocked(id)
	if err != nil {
		return nil, err
	}
	return proto.CloneOf(v.migration), nil
}

// CancelMigration implements driver.Migrator. A simulated migration is never in progress:
// there is nothing to cancel, but a VM that migrated cannot come back.
func (h *Hypervisor) CancelMigration(_ context.Context, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, err := h.getLocked(id)
	if err != nil {
		return err
	}
	if v.migration != nil && v.state == hypervisorv1.State_STATE_STOPPED && v.rec.Reason == driver.ReasonMigrated {
		return precondition("VM %q migrated already", id)
	}
	if v.rec.Incoming != nil && v.running() {
		// A target that does not run yet stops.
		v.migration = &hypervisorv1.MigrationInfo{Role: hypervisorv1.MigrationRole_MIGRATION_ROLE_TARGET,
			Phase: hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED, Message: "cancelled at the target", EndedAt: timestamppb.Now()}
		h.stopLocked(v, hypervisorv1.EventType_EVENT_TYPE_STOPPED, driver.ReasonMigrationCancelled, "the incoming migration was cancelled")
		return nil
	}
	if v.cancel != nil && v.migration.GetPhase() == hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE {
		v.migration.Phase, v.migration.Message = hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED, "cancelled"
		v.migration.EndedAt = timestamppb.Now()
		v.cancel()
		v.cancel = nil
	}
	return nil
}

// Recover implements driver.Recoverer. The handle's state is the VM's record from Create; the
// VM's current state comes from its RecordFile. A VM whose RecordFile is gone (deleted, or
// never made because the VM had no run directory) is reported as stopped.
func (h *Hypervisor) Recover(_ context.Context, handle *hypervisorv1.Handle) (*hypervisorv1.VMStatus, error) {
	var rec vmRecord
	if err := json.Unmarshal(handle.GetState(), &rec); err != nil {
		return nil, invalid("handle.state: not a fake hypervisor VM record: %v", err)
	}
	if rec.ID == "" || (handle.GetId() != "" && handle.GetId() != rec.ID) {
		return nil, invalid("handle.state: the record is of VM %q, the handle of %q", rec.ID, handle.GetId())
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	if v, ok := h.vms[rec.ID]; ok {
		return v.status(), nil
	}
	v := &vm{rec: rec, consoles: map[*queue[[]byte]]struct{}{}}
	live, err := readRecord(rec.RunDir)
	switch {
	case err != nil:
		return nil, fmt.Errorf("read VM record: %w", err)
	case live == nil:
		// The simulated VM process is gone: adopt the VM as stopped, without a record file.
		v.rec.RunDir = ""
		v.state = hypervisorv1.State_STATE_STOPPED
		v.rec.State = v.state.String()
		v.rec.Reason, v.rec.Message = driver.ReasonProcessGone, "the VM was gone when the driver recovered it"
	default:
		v.rec = *live
		v.state = hypervisorv1.State(hypervisorv1.State_value[live.State])
		if v.state == hypervisorv1.State_STATE_UNSPECIFIED {
			return nil, fmt.Errorf("read VM record: unknown state %q", live.State)
		}
	}
	v.run = &run{stopped: make(chan struct{})}
	if !v.running() {
		close(v.run.stopped)
	}
	if v.rec.Incoming != nil && v.state == hypervisorv1.State_STATE_PAUSED {
		// A target that waited while no driver ran: it listens again (the simulated VM
		// process is this driver).
		if err := h.listenIncomingLocked(v); err != nil {
			return nil, err
		}
	}
	if v.state == hypervisorv1.State_STATE_SHUTTING_DOWN && !h.cfg.IgnoreShutdown {
		// The guest was powering off while no driver watched: it has finished by now.
		h.stopLocked(v, hypervisorv1.EventType_EVENT_TYPE_SHUTDOWN, driver.ReasonGuestShutdown, "the guest powered off")
	}
	h.vms[rec.ID] = v
	return v.status(), nil
}

// readRecord reads the RecordFile in runDir; nil when there is none.
func readRecord(runDir string) (*vmRecord, error) {
	if runDir == "" {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(runDir, RecordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rec vmRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("%s: %w", RecordFile, err)
	}
	return &rec, nil
}

// Console implements driver.Consoler. A console that attaches gets the output of the VM's
// boots so far (the last 64 KiB), then what follows; input is echoed to every console of the
// VM. It returns when ctx is done, in ends, or the VM stops.
func (h *Hypervisor) Console(ctx context.Context, id string, in io.Reader, out io.Writer) error {
	h.mu.Lock()
	v, err := h.getLocked(id)
	if err != nil {
		h.mu.Unlock()
		return err
	}
	if !v.running() {
		h.mu.Unlock()
		return precondition("VM %q is %s, not running", id, driver.StateWord(v.state))
	}
	q := newQueue[[]byte]()
	if len(v.history) > 0 {
		q.push(slices.Clone(v.history))
	}
	v.consoles[q] = struct{}{}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(v.consoles, q)
		h.mu.Unlock()
	}()

	inDone := make(chan struct{})
	if in != nil {
		go func() {
			defer close(inDone)
			buf := make([]byte, 4096)
			for {
				n, err := in.Read(buf)
				if n > 0 {
					h.consoleInput(v, buf[:n])
				}
				if err != nil {
					return
				}
			}
		}()
	}
	for {
		chunks, open := q.next(ctx, inDone)
		for _, c := range chunks {
			if _, err := out.Write(c); err != nil {
				return fmt.Errorf("write console output: %w", err)
			}
		}
		if !open {
			return nil
		}
	}
}

// consoleInput is what the guest's serial port receives: the simulated guest echoes it.
func (h *Hypervisor) consoleInput(v *vm, p []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if v.running() {
		h.consoleWriteLocked(v, slices.Clone(p))
	}
}

// consoleWriteLocked is the guest writing p to its serial port.
func (h *Hypervisor) consoleWriteLocked(v *vm, p []byte) {
	v.history = append(v.history, p...)
	if over := len(v.history) - consoleHistory; over > 0 {
		v.history = slices.Clone(v.history[over:])
	}
	for q := range v.consoles {
		q.push(p)
	}
}

// bootLog is what the simulated guest prints on its serial console while it boots.
func bootLog(v *vm) []byte {
	return fmt.Appendf(nil, "\r\n"+
		"SeaBIOS (simulated by the Kubevisor fake hypervisor)\r\n"+
		"[    0.000000] Linux version 6.1.0-kubevisor-fake (simulated)\r\n"+
		"[    0.000000] Memory: %dK available\r\n"+
		"[    0.010000] smp: Brought up 1 node, %d CPU(s)\r\n"+
		"%s"+
		"[    0.250000] Run /sbin/init as init process\r\n"+
		"\r\n"+
		"Kubevisor fake guest %s, boot %d\r\n"+
		"\r\n"+
		"%s ",
		v.rec.MemoryBytes>>10, max(v.rec.VCPUs, 1), hostDeviceLog(v.rec.Devices), v.rec.ID, v.rec.Boots, ConsoleMarker)
}

// hostDeviceLog is the boot log's line of each host device (HostDeviceLine).
func hostDeviceLog(devs []RecordedHostDevice) string {
	var b strings.Builder
	for _, d := range devs {
		fmt.Fprintf(&b, "[    0.100000] %s\r\n", HostDeviceLine(d))
	}
	return b.String()
}

func (h *Hypervisor) getLocked(id string) (*vm, error) {
	v, ok := h.vms[id]
	if !ok {
		return nil, notFound("no VM %q", id)
	}
	return v, nil
}

// bootLocked starts a new run of v.
func (h *Hypervisor) bootLocked(v *vm) {
	v.gen++
	v.run = &run{stopped: make(chan struct{})}
	v.rec.Boots++
	v.rec.StartedAt = time.Now().UTC()
	h.setStateLocked(v, hypervisorv1.State_STATE_RUNNING, hypervisorv1.EventType_EVENT_TYPE_STARTED, driver.ReasonStarted, "")
	h.consoleWriteLocked(v, bootLog(v))
}

// stopLocked ends the current run of v: consoles close and waiting Shutdowns return. The last
// event is STOPPED; a SHUTDOWN (the guest powered off) comes before it, in state SHUTTING_DOWN.
func (h *Hypervisor) stopLocked(v *vm, typ hypervisorv1.EventType, reason, message string) {
	v.gen++
	v.closeListeners()
	if typ == hypervisorv1.EventType_EVENT_TYPE_SHUTDOWN {
		h.setStateLocked(v, hypervisorv1.State_STATE_SHUTTING_DOWN, typ, reason, message)
		typ = hypervisorv1.EventType_EVENT_TYPE_STOPPED
	}
	h.setStateLocked(v, hypervisorv1.State_STATE_STOPPED, typ, reason, message)
	for q := range v.consoles {
		q.close()
	}
	clear(v.consoles)
	if v.run != nil {
		v.run.reason = reason
		close(v.run.stopped)
	}
}

func (h *Hypervisor) setStateLocked(v *vm, state hypervisorv1.State, typ hypervisorv1.EventType, reason, message string) {
	v.state = state
	v.rec.State = state.String()
	v.rec.Reason, v.rec.Message = reason, message
	// The record file is best effort once the VM exists, as a real VM's would be: the run
	// directory may be removed under a stopped VM.
	_ = v.persist()
	h.emitLocked(v, typ)
}

func (h *Hypervisor) emitLocked(v *vm, typ hypervisorv1.EventType) {
	e := &hypervisorv1.Event{
		Id:      v.rec.ID,
		Type:    typ,
		Time:    timestamppb.Now(),
		State:   v.state,
		Reason:  v.rec.Reason,
		Message: v.rec.Message,
	}
	for s := range h.subs {
		if s.id == "" || s.id == v.rec.ID {
			s.q.push(e)
		}
	}
}

// persist writes v's RecordFile, when v has a run directory.
func (v *vm) persist() error {
	if v.rec.RunDir == "" {
		return nil
	}
	b, err := json.Marshal(v.rec)
	if err != nil {
		return err
	}
	path := filepath.Join(v.rec.RunDir, RecordFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctxErr(ctx)
	}
}
