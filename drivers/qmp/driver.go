package qmp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/core/driver/launcher"
)

// Name is the driver's name, as in its plugin manifest.
const Name = "qmp"

// Version is the driver's release version.
var Version = "0.1.0"

// Config is the driver's configuration (ConfigureRequest.config, JSON). The zero value is the
// default.
type Config struct {
	// QEMU is the qemu-system-x86_64 binary; empty searches PATH.
	QEMU string `json:"qemu,omitempty"`
	// OVMF overrides the UEFI firmware files (DefaultOVMF: Debian's ovmf package).
	OVMF *OVMF `json:"ovmf,omitempty"`
	// KVMDevice is the KVM device node (/dev/kvm).
	KVMDevice string `json:"kvmDevice,omitempty"`
	// DisableKVM makes the node emulation only, without probing KVM.
	DisableKVM bool `json:"disableKVM,omitempty"`
	// ProbeTimeout bounds each test boot of the accelerator probe, as a Go duration ("5s").
	ProbeTimeout string `json:"probeTimeout,omitempty"`
	// SWTPM is the swtpm binary that emulates the VMs' TPMs; empty searches PATH. The driver
	// offers the "tpm" device only when it runs and emulates TPM 2.0. In a cluster the launcher
	// image must have it at the same path.
	SWTPM string `json:"swtpm,omitempty"`
	// TCGTranslationCacheMiB bounds the translation cache of an emulated (TCG) VM, in MiB
	// (QEMU's tb-size). Zero means DefaultTCGTranslationCacheMiB. QEMU's own default is 1 GiB,
	// which it fills a boot at a time: every guest reboot adds tens of MiB of resident memory
	// until the gigabyte is used, far past the launcher pod's memory overhead, whose cgroup
	// then kills QEMU.
	TCGTranslationCacheMiB int `json:"tcgTranslationCacheMiB,omitempty"`
}

// DefaultTCGTranslationCacheMiB is the translation cache of an emulated VM unless Config says
// otherwise. Measured with the test guest (128 MiB, four boots by system_reset): QEMU's
// resident memory stays at ~240 MiB with 64 MiB where the default grows 231, 296, 360,
// 424 MiB, and the boots take as long (8-12 s under TCG either way).
const DefaultTCGTranslationCacheMiB = 64

func (c Config) probeOptions() (ProbeOptions, error) {
	o := ProbeOptions{QEMU: c.QEMU, KVMDevice: c.KVMDevice, DisableKVM: c.DisableKVM}
	if c.ProbeTimeout != "" {
		d, err := time.ParseDuration(c.ProbeTimeout)
		if err != nil || d <= 0 {
			return o, fmt.Errorf("probeTimeout: %q is not a positive duration", c.ProbeTimeout)
		}
		o.Timeout = d
	}
	return o, nil
}

// Driver is the QEMU hypervisor driver. It implements driver.Hypervisor and the optional
// Pauser, Rebooter, SoftRebooter, GuestAgent, GuestExecer, Consoler, Displayer, Recoverer and
// Migrator.
type Driver struct {
	log    hclog.Logger
	local  launcher.Starter
	prober *Prober
	dial   DialFunc

	mu         sync.Mutex
	configured bool
	rawConfig  []byte
	cfg        Config
	stateDir   string
	probe      *HostProbe
	vms        map[string]*vm

	events driver.Broadcaster
}

var (
	_ driver.Hypervisor  = (*Driver)(nil)
	_ driver.Pauser      = (*Driver)(nil)
	_ driver.Rebooter    = (*Driver)(nil)
	_ driver.Consoler    = (*Driver)(nil)
	_ driver.Recoverer   = (*Driver)(nil)
	_ driver.GuestAgent  = (*Driver)(nil)
	_ driver.GuestExecer = (*Driver)(nil)
	_ driver.Migrator    = (*Driver)(nil)
)

// Option changes a Driver made by New.
type Option func(*Driver)

// WithLogger sets the logger (none by default).
func WithLogger(l hclog.Logger) Option { return func(d *Driver) { d.log = l } }

// WithLocalStarter sets how QEMU processes of VMs without a launcher (an empty
// sandbox.launcher_socket) are started: launcher.LocalStarter by default. A VM with a launcher
// is always started through it.
func WithLocalStarter(s launcher.Starter) Option { return func(d *Driver) { d.local = s } }

// WithProber sets the accelerator prober (by default one shared by the process, which probes
// once per configuration).
func WithProber(p *Prober) Option { return func(d *Driver) { d.prober = p } }

// WithDialer sets how QMP sockets are connected (DialQMP by default).
func WithDialer(f DialFunc) Option { return func(d *Driver) { d.dial = f } }

// New returns a driver. It probes QEMU at Configure (or at the first call that needs it).
func New(opts ...Option) *Driver {
	d := &Driver{
		log:    hclog.NewNullLogger(),
		local:  launcher.LocalStarter{},
		prober: defaultProber,
		dial:   DialQMP,
		vms:    map[string]*vm{},
	}
	for _, o := range opts {
		o(d)
	}
	d.probe = &HostProbe{Prober: d.prober, Log: func(h *HostInfo, took time.Duration) {
		d.log.Info("probed qemu", "qemu", h.QEMU, "version", h.Version, "kvm", h.KVM, "kvm_reason", h.KVMReason,
			"tcg", h.TCG, "problem", h.Problem, "transient", h.Transient, "took", took.String())
	}}
	return d
}

// Info implements driver.Driver.
func (d *Driver) Info(context.Context) (*basev1.InfoResponse, error) {
	return &basev1.InfoResponse{Name: Name, Version: Version, Description: "QEMU (qemu-system-x86_64) controlled over QMP"}, nil
}

// swtpm is what the driver found of its configured swtpm.
func (d *Driver) swtpm(ctx context.Context) *SWTPMInfo {
	d.mu.Lock()
	bin := d.cfg.SWTPM
	d.mu.Unlock()
	return d.prober.SWTPM(ctx, bin)
}

// Capabilities implements driver.Driver. It declares the "tpm" device only when swtpm is
// usable on the node.
func (d *Driver) Capabilities(ctx context.Context) (*basev1.Capabilities, error) {
	caps := d.capabilities()
	if d.swtpm(ctx).Path != "" {
		caps.Devices = append(caps.Devices, driver.DeviceTPM)
	}
	return caps, nil
}

func (d *Driver) capabilities() *basev1.Capabilities {
	return &basev1.Capabilities{
		Features: []basev1.Feature{
			basev1.Feature_FEATURE_HYPERVISOR_PAUSE,
			basev1.Feature_FEATURE_HYPERVISOR_REBOOT,
			basev1.Feature_FEATURE_HYPERVISOR_SOFT_REBOOT,
			basev1.Feature_FEATURE_HYPERVISOR_GUEST_AGENT,
			basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC,
			basev1.Feature_FEATURE_HYPERVISOR_CONSOLE,
			basev1.Feature_FEATURE_HYPERVISOR_DISPLAY,
			basev1.Feature_FEATURE_HYPERVISOR_RECOVER,
			basev1.Feature_FEATURE_HYPERVISOR_MIGRATE,
		},
		Firmware:     supportedFirmware,
		DiskBuses:    supportedDiskBuses,
		NicModels:    supportedNICModels,
		MachineTypes: supportedMachineTypes,
		// Secure Boot needs the OVMF Secure Boot build on the node: Create says when it is not
		// installed (FailedPrecondition).
		SecureBoot:  true,
		Vnc:         true,
		HostDevices: true,
		TapFd:       true,
		Launcher:    true,
		// The TPM's state and the EFI variable store in persistent_state_dir (persistent.go).
		PersistentState: true,
		// Writable node-local disks copied by block mirroring over NBD (migratedisks.go).
		MigrationDisks:    true,
		MigrationPostCopy: true,
		Devices: []string{driver.DeviceRNG, driver.DeviceChassis, driver.DeviceFeatures, driver.DeviceClock,
			driver.DeviceInput, driver.DeviceWatchdog, driver.DeviceBalloon, driver.DeviceDiskOptions,
			driver.DeviceCPUFeatures, driver.DeviceNICOptions,
			driver.DeviceStartPaused, driver.DeviceSound, driver.DeviceBIOSSerial, driver.DeviceLaunchSecurity, driver.DeviceHugepages,
			driver.DeviceCPUPinning, driver.DeviceNUMA,
			driver.DeviceNICMultiQueue, driver.DeviceVirtioTransitional, driver.DeviceLUN},
	}
}

// Configure implements driver.Driver. It starts the accelerator probe in the background.
func (d *Driver) Configure(_ context.Context, req *basev1.ConfigureRequest) error {
	var cfg Config
	if len(bytes.TrimSpace(req.GetConfig())) > 0 {
		dec := json.NewDecoder(bytes.NewReader(req.GetConfig()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return status.Errorf(codes.InvalidArgument, "config: %v", err)
		}
	}
	opts, err := cfg.probeOptions()
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "config: %v", err)
	}
	if sd := req.GetStateDir(); sd != "" {
		if !filepath.IsAbs(sd) {
			return status.Errorf(codes.InvalidArgument, "stateDir: must be an absolute path, not %q", sd)
		}
		if err := os.MkdirAll(filepath.Join(sd, "vms"), 0o700); err != nil {
			return status.Errorf(codes.FailedPrecondition, "state dir: %v", err)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.configured {
		if bytes.Equal(d.rawConfig, req.GetConfig()) && d.stateDir == req.GetStateDir() {
			return nil
		}
		return status.Error(codes.FailedPrecondition, "already configured with another configuration")
	}
	d.configured = true
	d.rawConfig = append([]byte(nil), req.GetConfig()...)
	d.cfg = cfg
	d.stateDir = req.GetStateDir()
	d.probe.Start(opts)
	d.log.Info("configured", "state_dir", d.stateDir, "qemu", cfg.QEMU, "disable_kvm", cfg.DisableKVM)
	return nil
}

// hostInfo waits for the probe's latest result (starting it with the defaults when Configure
// has not), which VM operations refuse on: a transient problem is probed again first
// (HostProbe.Settled).
func (d *Driver) hostInfo(ctx context.Context) (*HostInfo, error) {
	d.mu.Lock()
	opts, _ := d.cfg.probeOptions()
	d.mu.Unlock()
	return d.probe.Settled(ctx, opts, ProbeSettleWait)
}

// Fingerprint implements driver.Driver: health and attributes once the probe is done (which
// takes up to the probe timeout when KVM hangs), then again after each later probe (one whose
// result rested on a timeout runs again: HostProbe) until ctx is done. The attribute tpm
// (swtpm-<version>) says the node's VMs can have a TPM.
func (d *Driver) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	d.mu.Lock()
	opts, _ := d.cfg.probeOptions()
	d.mu.Unlock()
	return d.probe.Watch(ctx, opts, func(h *HostInfo) error {
		fp := h.Fingerprint()
		if s := d.swtpm(ctx); s.Path != "" {
			// The control plane places VMIs with a TPM on nodes with this attribute.
			fp.Attributes["tpm"] = TPMAttributeValue(s.Version)
		}
		return send(fp)
	})
}

// Close lets go of every VM without stopping it: QMP and console connections are closed, the
// VMs' processes go on running for a later driver to Recover, and this driver forgets them (it
// stays usable for new VMs). It is what the death of the driver process does, done in-process.
func (d *Driver) Close() error {
	d.mu.Lock()
	vms := make([]*vm, 0, len(d.vms))
	for _, v := range d.vms {
		vms = append(vms, v)
	}
	d.vms = map[string]*vm{}
	d.mu.Unlock()
	for _, v := range vms {
		v.mu.Lock()
		s := v.sess
		v.mu.Unlock()
		if s != nil {
			s.detachAndWait()
		}
	}
	return nil
}
