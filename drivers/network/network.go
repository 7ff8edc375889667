// Package network is the "cni" network driver: it connects a VMI's interfaces inside the
// sandbox's network namespace with KubeVirt's bridge and masquerade bindings, runs secondary
// networks' CNI network lists with libcni, and serves each guest its address with a DHCP
// server that runs in the driver process, bound to the in-namespace bridge.
//
// What Setup makes in the namespace, per interface (P is the pod interface: eth0 for the pod
// network, net1, net2, ... for secondary networks in the order of the request):
//
//	bridge      bridge k6t-P (169.254.75.1x/32), tap tapP in it, P in it without its IPv4
//	            addresses; the guest gets P's MAC and P a MAC derived from (vmi, interface);
//	            DHCP hands the guest P's address, gateway, routes, DNS and MTU
//	masquerade  bridge k6t-P (10.0.2.1/24, fd10:0:2::1/120), tap tapP in it; nftables table
//	            "kubevisor_P" (ip, and ip6 when P has a global IPv6 address): masquerade of the
//	            guest out P, DNAT of the declared ports (all when none) to 10.0.2.2; DHCP hands
//	            the guest 10.0.2.2/24
//
// Every link it makes carries the alias "kubevisor:<vmi id>", so that Check and Teardown
// touch only what this VMI's Setup made. What Setup found (P's MAC, addresses and routes
// before it changed them) is kept in a state file per VMI, written before P is changed, so
// that Teardown restores P and a new driver process can answer Setup and Check the same way.
package network

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/core/keyedmutex"
)

// DriverName is the driver's name, as in its plugin manifest and in Info.
const DriverName = "cni"

// Version is the driver's own release version.
const Version = "0.1.0"

// Bindings, as in Capabilities.bindings and Interface.binding.
const (
	BindingBridge     = "bridge"
	BindingMasquerade = "masquerade"
)

// Bindings are the interface bindings the driver supports.
var Bindings = []string{BindingBridge, BindingMasquerade}

// Defaults of Config.
const (
	DefaultCNIConfDir   = "/etc/kubevisor/cni/net.d"
	DefaultCNICacheDir  = "/var/lib/kubevisor/cni"
	DefaultPodInterface = "eth0"
)

// DefaultCNIBinDirs are the directories searched for CNI plugins when the configuration
// names none: the CNI convention and Debian's (containerd's default there).
var DefaultCNIBinDirs = []string{"/opt/cni/bin", "/usr/lib/cni"}

// fingerprintInterval is how often Fingerprint looks again at the plugins and the kernel.
const fingerprintInterval = time.Minute

// Logger is the part of the SDK's logger (driver.NewLogger) the driver uses.
type Logger interface {
	Info(msg string, args ...any)
	Warn(msg string, args ...any)
}

type nopLogger struct{}

func (nopLogger) Info(string, ...any) {}
func (nopLogger) Warn(string, ...any) {}

// Config is the driver's configuration, the JSON the host passes to Configure.
type Config struct {
	// CNIConfDir holds the network lists (*.conflist) of the secondary networks. Default:
	// DefaultCNIConfDir.
	CNIConfDir string `json:"cniConfDir,omitempty"`
	// CNIBinDir are the directories searched for CNI plugins. Default: DefaultCNIBinDirs.
	CNIBinDir []string `json:"cniBinDir,omitempty"`
	// CNICacheDir is libcni's cache of ADD results, which DEL and CHECK read. Default:
	// DefaultCNICacheDir.
	CNICacheDir string `json:"cniCacheDir,omitempty"`
	// PodInterface is the sandbox's interface on the pod network. Default: eth0.
	PodInterface string `json:"podInterface,omitempty"`
	// TapOwner and TapGroup own the taps Setup makes: a process of that user (or group) may
	// open them without CAP_NET_ADMIN. Default: 0 (root). A Setup request's sandbox_user (an
	// unprivileged launcher's, 107 as KubeVirt's qemu) takes their place for its taps.
	TapOwner uint32 `json:"tapOwner,omitempty"`
	TapGroup uint32 `json:"tapGroup,omitempty"`
}

func (c Config) withDefaults() Config {
	if c.CNIConfDir == "" {
		c.CNIConfDir = DefaultCNIConfDir
	}
	if len(c.CNIBinDir) == 0 {
		c.CNIBinDir = slices.Clone(DefaultCNIBinDirs)
	}
	if c.CNICacheDir == "" {
		c.CNICacheDir = DefaultCNICacheDir
	}
	if c.PodInterface == "" {
		c.PodInterface = DefaultPodInterface
	}
	return c
}

func (c Config) validate() error {
	for _, d := range append([]string{c.CNIConfDir, c.CNICacheDir}, c.CNIBinDir...) {
		if !filepath.IsAbs(d) {
			return fmt.Errorf("directory %q is not an absolute path", d)
		}
	}
	if err := validLinkName(c.PodInterface); err != nil {
		return fmt.Errorf("podInterface: %w", err)
	}
	return nil
}

// Option changes how New builds the driver.
type Option func(*Driver)

// WithCNI replaces libcni (the CNI interface the driver runs network lists with): newCNI is
// called with the configuration whenever the driver is configured. Tests pass a fake.
func WithCNI(newCNI func(Config) libcni.CNI) Option {
	return func(d *Driver) { d.newCNI = newCNI }
}

// Driver is the cni network driver. Calls for different VMIs run in parallel; for the same
// VMI, one at a time.
type Driver struct {
	log    Logger
	newCNI func(Config) libcni.CNI
	locks  keyedmutex.Mutex
	dhcp   *dhcpServers

	mu       sync.RWMutex
	cfg      Config
	stateDir string
	cni      libcni.CNI
	// reconfigured is closed and replaced by Configure, so that Fingerprint looks again.
	reconfigured chan struct{}
}

var (
	_ driver.Network        = (*Driver)(nil)
	_ driver.NetworkChecker = (*Driver)(nil)
)

// New returns the driver with the default configuration until Configure says otherwise. log
// may be nil.
func New(log Logger, opts ...Option) *Driver {
	if log == nil {
		log = nopLogger{}
	}
	d := &Driver{
		log:          log,
		newCNI:       newLibCNI,
		dhcp:         newDHCPServers(log),
		reconfigured: make(chan struct{}),
	}
	for _, o := range opts {
		o(d)
	}
	d.cfg = Config{}.withDefaults()
	d.stateDir = filepath.Join(d.cfg.CNICacheDir, "kubevisor-state")
	d.cni = d.newCNI(d.cfg)
	return d
}

func newLibCNI(cfg Config) libcni.CNI {
	return libcni.NewCNIConfigWithCacheDir(cfg.CNIBinDir, cfg.CNICacheDir, nil)
}

// Close stops every DHCP server of the process. The namespaces are left as they are: a new
// driver process serves them again from Setup or Check.
func (d *Driver) Close() error {
	d.dhcp.stopAll()
	return nil
}

// Info implements driver.Driver.
func (d *Driver) Info(context.Context) (*basev1.InfoResponse, error) {
	return &basev1.InfoResponse{
		Name:        DriverName,
		Kind:        basev1.Kind_KIND_NETWORK,
		Version:     Version,
		Description: "KubeVirt bridge and masquerade bindings in the sandbox namespace (tap, bridge, DHCP, nftables); secondary networks from CNI network lists (libcni)",
	}, nil
}

// Capabilities implements driver.Driver: Check, the bridge and masquerade bindings,
// multi-queue taps, and an interface's DHCP options (both bindings' guests get their address from the driver's DHCP
// server).
func (d *Driver) Capabilities(context.Context) (*basev1.Capabilities, error) {
	return &basev1.Capabilities{
		Features:         []basev1.Feature{basev1.Feature_FEATURE_NETWORK_CHECK},
		Bindings:         slices.Clone(Bindings),
		InterfaceOptions: []string{driver.InterfaceDHCPOptions},
		MultiQueueTaps:   true,
	}, nil
}

// Configure implements driver.Driver. Unknown fields are rejected, so that a typo in a
// manifest does not go unnoticed. The state directory is the host's; without one, state is
// kept under the CNI cache directory.
func (d *Driver) Configure(_ context.Context, req *basev1.ConfigureRequest) error {
	var cfg Config
	if raw := bytes.TrimSpace(req.GetConfig()); len(raw) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return status.Errorf(codes.InvalidArgument, "config: %v", err)
		}
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return status.Errorf(codes.InvalidArgument, "config: %v", err)
	}
	stateDir := req.GetStateDir()
	if stateDir == "" {
		stateDir = filepath.Join(cfg.CNICacheDir, "kubevisor-state")
	}
	d.mu.Lock()
	d.cfg = cfg
	d.stateDir = stateDir
	d.cni = d.newCNI(cfg)
	close(d.reconfigured)
	d.reconfigured = make(chan struct{})
	d.mu.Unlock()
	d.log.Info("configured", "cniConfDir", cfg.CNIConfDir, "cniBinDir", cfg.CNIBinDir, "cniCacheDir", cfg.CNICacheDir, "stateDir", stateDir, "node", req.GetNodeName())
	return nil
}

// config returns the configuration, state directory and CNI runner as last configured.
func (d *Driver) config() (Config, string, libcni.CNI) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.cfg, d.stateDir, d.cni
}

// Fingerprint implements driver.Driver: HEALTHY when the driver can make what Setup makes
// (a network namespace with a bridge, a tap and an nftables table: see probeKernel), with the
// CNI plugins it finds as an attribute; UNHEALTHY saying why otherwise. It looks again after
// Configure and every minute, and sends when the answer changes.
func (d *Driver) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	return driver.WatchFingerprint(ctx, fingerprintInterval, func(context.Context) (*basev1.FingerprintResponse, <-chan struct{}) {
		d.mu.RLock()
		cfg, reconfigured := d.cfg, d.reconfigured
		d.mu.RUnlock()
		return fingerprint(cfg), reconfigured
	}, send)
}
