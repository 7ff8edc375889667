package libvirt

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/core/driver/launcher"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

// Name is the driver's name, as in its plugin manifest.
const Name = "libvirt"

// Version is the driver's release version.
var Version = "0.1.0"

// Config is the driver's configuration (ConfigureRequest.config, JSON). The zero value is the
// default.
type Config struct {
	// Libvirtd is the libvirtd binary as the launcher sees it. Default /usr/sbin/libvirtd.
	Libvirtd string `json:"libvirtd,omitempty"`
	// Setpriv is the util-linux setpriv the launcher drops to User with. Default
	// /usr/bin/setpriv.
	Setpriv string `json:"setpriv,omitempty"`
	// QEMU is the qemu-system-x86_64 binary (the domains' emulator); empty searches PATH.
	QEMU string `json:"qemu,omitempty"`
	// User is who each VM's libvirtd, and so its QEMU, runs as: a user of the node (and of the
	// launcher image) other than root, since libvirt runs a root daemon in system mode. Default
	// "nobody".
	User string `json:"user,omitempty"`
	// OVMF overrides the UEFI firmware files (qmp.DefaultOVMF: Debian's ovmf package).
	OVMF *qmp.OVMF `json:"ovmf,omitempty"`
	// KVMDevice, DisableKVM and ProbeTimeout are as the qmp driver's: the node's accelerators
	// are probed by booting a test guest with the same QEMU.
	KVMDevice    string `json:"kvmDevice,omitempty"`
	DisableKVM   bool   `json:"disableKVM,omitempty"`
	ProbeTimeout string `json:"probeTimeout,omitempty"`
}

// DefaultUser is the user of Config.User.
const DefaultUser = "nobody"

// Driver is the libvirt hypervisor driver. It implements driver.Hypervisor and the optional
// Pauser, Rebooter, Consoler, Recoverer and Migrator.
type Driver struct {
	log    hclog.Logger
	local  launcher.Starter
	prober *qmp.Prober

	mu         sync.Mutex
	configured bool
	rawConfig  []byte
	cfg        Config
	user       vmUser
	stateDir   string
	probe      *qmp.HostProbe
	vms        map[string]*vm

	events driver.Broadcaster
}

var (
	_ driver.Hypervisor = (*Driver)(nil)
	_ driver.Pauser     = (*Driver)(nil)
	_ driver.Rebooter   = (*Driver)(nil)
	_ driver.Consoler   = (*Driver)(nil)
	_ driver.Recoverer  = (*Driver)(nil)
	_ driver.Migrator   = (*Driver)(nil)
)

// Option changes a Driver made by New.
type Option func(*Driver)

// WithLogger sets the logger (none by default).
func WithLogger(l hclog.Logger) Option { return func(d *Driver) { d.log = l } }

// WithLocalStarter sets how the daemons of VMs without a launcher are started
// (launcher.LocalStarter by default).
func WithLocalStarter(s launcher.Starter) Option { return func(d *Driver) { d.local = s } }

// New returns a driver. It probes QEMU at Configure (or at the first call that needs it).
func New(opts ...Option) *Driver {
	d := &Driver{log: hclog.NewNullLogger(), local: launcher.LocalStarter{}, prober: qmp.NewProber(), vms: map[string]*vm{}}
	for _, o := range opts {
		o(d)
	}
	d.probe = &qmp.HostProbe{Prober: d.prober, Log: func(h *qmp.HostInfo, took time.Duration) {
		d.log.Info("probed qemu", "qemu", h.QEMU, "version", h.Version, "kvm", h.KVM, "kvm_reason", h.KVMReason,
			"tcg", h.TCG, "problem", h.Problem, "transient", h.Transient, "took", took.String())
	}}
	return d
}

// Info implements driver.Driver.
func (d *Driver) Info(context.Context) (*basev1.InfoResponse, error) {
	return &basev1.InfoResponse{Name: Name, Version: Version, Description: "QEMU through a libvirt daemon per VM (libvirt.org/go/libvirt)"}, nil
}

// Capabilities implements driver.Driver. It declares the "tpm" device only when libvirt's
// emulated TPM can run on the node (swtpm, swtpm_setup and swtpm_ioctl).
func (d *Driver) Capabilities(ctx context.Context) (*basev1.Capabilities, error) {
	devices := append([]string(nil), supportedDevices...)
	if d.swtpmProblem(ctx) == "" {
		devices = append(devices, driver.DeviceTPM)
	}
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
		SecureBoot:   true,
		Vnc:          true,
		HostDevices:  true,
		Launcher:     true,
		Devices:      devices,
		// The TPM's state and the EFI variable store in persistent_state_dir (tpm.go).
		PersistentState: true,
		// Block copies into QEMU's storage daemon at the target (migratedisks.go).
		MigrationDisks: true,
		// libvirt refuses post-copy in a tunnelled migration (the package doc's "Live
		// migration").
		MigrationPostCopy: false,
	}, nil
}

// Configure implements driver.Driver: it checks the configuration and the user, and starts the
// accelerator probe in the background.
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
	u, err := lookupUser(cfg.User)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "config: user: %v", err)
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
	d.cfg, d.user, d.stateDir = cfg, u, req.GetStateDir()
	d.probe.Start(opts)
	d.log.Info("configured", "state_dir", d.stateDir, "user", u.Name, "uid", u.UID)
	return nil
}

func (c Config) probeOptions() (qmp.ProbeOptions, error) {
	o := qmp.ProbeOptions{QEMU: c.QEMU, KVMDevice: c.KVMDevice, DisableKVM: c.DisableKVM}
	if c.ProbeTimeout != "" {
		t, err := time.ParseDuration(c.ProbeTimeout)
		if err != nil || t <= 0 {
			return o, fmt.Errorf("probeTimeout: %q is not a positive duration", c.ProbeTimeout)
		}
		o.Timeout = t
	}
	return o, nil
}

// lookupUser resolves Config.User; root is refused (its daemon would be libvirt's system one).
func lookupUser(name string) (vmUser, error) {
	if name == "" {
		name = DefaultUser
	}
	u, err := user.Lookup(name)
	if err != nil {
		return vmUser{}, err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if uid == 0 {
		return vmUser{}, fmt.Errorf("%q is root: libvirt runs a root daemon as the node's system daemon; name an unprivileged user", name)
	}
	return vmUser{Name: name, UID: uid, GID: gid}, nil
}

func (d *Driver) vmUser() (vmUser, error) {
	d.mu.Lock()
	u := d.user
	d.mu.Unlock()
	if u.Name != "" {
		return u, nil
	}
	u, err := lookupUser("")
	if err != nil {
		return u, status.Errorf(codes.FailedPrecondition, "user: %v", err)
	}
	return u, nil
}

func (d *Driver) config() Config {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.cfg
	if c.Libvirtd == "" {
		c.Libvirtd = "/usr/sbin/libvirtd"
	}
	if c.Setpriv == "" {
		c.Setpriv = "/usr/bin/setpriv"
	}
	return c
}

// hostInfo waits for the probe's latest result (starting it with the defaults when Configure
// has not), which VM operations refuse on: a transient problem is probed again first
// (HostProbe.Settled).
func (d *Driver) hostInfo(ctx context.Context) (*qmp.HostInfo, error) {
	d.mu.Lock()
	opts, _ := d.cfg.probeOptions()
	d.mu.Unlock()
	return d.probe.Settled(ctx, opts, qmp.ProbeSettleWait)
}

// Fingerprint implements driver.Driver: QEMU's health and accelerator as the probe found them
// (kvm, or tcg where KVM is not usable), the libvirt library's version, and the tpm attribute
// where libvirt can run swtpm; again after each later probe (qmp.HostProbe).
func (d *Driver) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	d.mu.Lock()
	opts, _ := d.cfg.probeOptions()
	d.mu.Unlock()
	return d.probe.Watch(ctx, opts, func(h *qmp.HostInfo) error {
		fp := h.Fingerprint()
		if v := libvirtVersion(); v != "" {
			fp.Attributes["libvirt-version"] = v
		}
		// No check of Config.Libvirtd here: it is the launcher's (in a cluster, the launcher
		// image's), not this process's. A missing one fails Start, naming it.
		if d.swtpmProblem(ctx) == "" {
			// As the qmp driver's: VMIs with a TPM are placed on nodes with the attribute.
			fp.Attributes["tpm"] = qmp.TPMAttributeValue(d.prober.SWTPM(ctx, "").Version)
		}
		return send(fp)
	})
}

// Close lets go of every VM without stopping it, as the death of the driver process does: the
// connections to the daemons are closed, the daemons and their QEMUs go on running for a later
// driver to Recover.
func (d *Driver) Close() error {
	d.mu.Lock()
	vms := make([]*vm, 0, len(d.vms))
	for _, v := range d.vms {
		vms = append(vms, v)
	}
	d.vms = map[string]*vm{}
	d.mu.Unlock()
	for _, v := range vms {
		v.detach()
	}
	return nil
}

// lockOSThreadForGood keeps the calling goroutine on its thread until it exits, which then
// ends the thread: for a thread whose namespaces or credentials were changed.
func lockOSThreadForGood() { runtime.LockOSThread() }
