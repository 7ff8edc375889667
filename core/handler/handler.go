package handler

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/backoff"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/core/keyedmutex"
	"github.com/kubevisor/kubevisor/core/liveconfig"
	"github.com/kubevisor/kubevisor/core/mcs"
	"github.com/kubevisor/kubevisor/core/plugin"
)

// Options are what a program gives a Handler besides its Config.
type Options struct {
	// Logger receives the handler's and the plugins' logs. Default: hclog's default logger.
	Logger hclog.Logger
	// Manifests are drivers to offer besides those found in Config.PluginDir: the drivers of
	// the handler's own image. A manifest of the same name in the directory replaces one of
	// these, so that a driver image (which an init container installs there) can replace an
	// in-tree driver's binary without a new handler image: a driver-only upgrade.
	Manifests []plugin.Manifest
	// Sandboxes gives each VMI's sandbox. Default: none (the drivers run the VMs on the node,
	// without a network namespace).
	Sandboxes Sandboxes
	// Resolver finds images, claims, secrets and persistent state on the node. Default:
	// MapResolver over Config.Images, Config.Claims and Config.StateDir.
	Resolver Resolver
	// ContainerDisks, when set, finds the disks of containerDisk volumes by volume (in a
	// cluster, each has its own container); the other volumes still go to Resolver. Default:
	// Resolver.Image of the volume's image.
	ContainerDisks ContainerDiskResolver
	// OnStatus is called with a VMI's status every time it changes, in order. It must not call
	// Sync or Stop.
	OnStatus func(uid types.UID, st v1alpha1.VirtualMachineInstanceStatus)
	// OnEvent is called with every hypervisor event of a VMI the handler runs.
	OnEvent func(uid types.UID, ev *hypervisorv1.Event)
	// PluginMinBackoff and PluginMaxBackoff bound the restart backoff of crashed plugins
	// (plugin.HostConfig). Defaults: the plugin host's.
	PluginMinBackoff, PluginMaxBackoff time.Duration
	// Now is the clock of status timestamps. Default: time.Now.
	Now func() time.Time
	// SELinux labels the files made for a VMI with its sandbox's SELinux level
	// (SandboxSpec.SELinuxLevel), and its mode is the node label v1alpha1.SELinuxNodeLabel.
	// Default: mcs.NodeLabeler(), this machine's (labels nothing where SELinux is disabled).
	SELinux *mcs.Labeler
}

// Handler runs VMIs on one node through the configured driver plugins. It is safe for
// concurrent use; calls for one VMI are serialised.
type Handler struct {
	cfg    Config
	opts   Options
	log    hclog.Logger
	host   *plugin.Host
	states stateStore
	locks  keyedmutex.Mutex

	ctx    context.Context // background work; cancelled by Close and Detach
	cancel context.CancelFunc
	wg     sync.WaitGroup

	pubMu sync.Mutex // serialises publish, so that OnStatus sees changes in order

	// agentKick asks pollAgents for a round now (a VM started).
	agentKick chan struct{}

	mu           sync.Mutex
	loaded       map[string]string                      // name → kind of the drivers running
	configs      map[string]json.RawMessage             // name → the configuration a driver started with
	loadErrs     map[string]error                       // name → why the configured driver is not running
	caps         map[string]*basev1.Capabilities        // by driver name
	fingerprints map[string]*basev1.FingerprintResponse // by driver name
	vmis         map[types.UID]*entry
	closed       bool
	// labelProblems are the fingerprint attributes last reported as unpublishable, so that a
	// caller polling NodeLabels (the node labeler, every few seconds) logs each once.
	labelProblems []string
}

// entry is what the handler knows of one VMI. Its fields are guarded by Handler.mu; pipeline
// work on it is serialised by Handler.locks.
type entry struct {
	uid     types.UID
	vmi     *v1alpha1.VirtualMachineInstance // the last one seen; nil for a VMI only found on disk
	state   *vmiState                        // nil: nothing on the node
	vm      *hypervisorv1.VMStatus
	failure *Failure
	// stopping is set by Stop.
	stopping bool
	// sandbox is the VMI's sandbox once taken (sandboxOf); closing unfollow ends its follower.
	sandbox  Sandbox
	unfollow chan struct{}
	// sandboxExited says why the sandbox ended, when it did.
	sandboxExited string
	// heldVM is the end of the VM held back for the sandbox's (setVM), until settle fires.
	heldVM *hypervisorv1.VMStatus
	settle *time.Timer
	status v1alpha1.VirtualMachineInstanceStatus
	// timeline is the sync that started the VM, until TakeTimeline takes it.
	timeline *Timeline
	// agent is the hypervisor driver's last answer about the VM's guest agent (pollAgents).
	agent *hypervisorv1.GuestAgentInfoResponse
	// incoming is the migration SyncIncoming makes the VMI the target of, until its state
	// records it (vmiState.Incoming).
	incoming *Incoming
}

// New starts the configured drivers through a plugin host on cfg.StateDir (reattaching to the
// plugins an earlier handler left running), reads the VMIs an earlier handler left on this
// node and re-adopts their VMs (Recover; none is started again). A configured driver that is
// not installed or fails to start does not stop the handler: the VMIs that need it fail with
// DriverNotFound, and Drivers says why. ctx bounds the drivers' first start.
func New(ctx context.Context, cfg Config, opts Options) (*Handler, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("handler config: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = hclog.Default()
	}
	if opts.Resolver == nil {
		opts.Resolver = MapResolver{Images: cfg.Images, Claims: cfg.Claims, StateDir: cfg.StateDir}
	}
	if opts.ContainerDisks != nil {
		opts.Resolver = byVolume{Resolver: opts.Resolver, ContainerDiskResolver: opts.ContainerDisks}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.SELinux == nil {
		opts.SELinux = mcs.NodeLabeler()
	}
	if opts.SELinux.Mode == "" {
		opts.SELinux.Mode = mcs.ModeDisabled
	}
	for _, dir := range []string{cfg.StateDir, filepath.Join(cfg.StateDir, "vmis"), cfg.RunDir, cfg.VolumeDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("new handler: %w", err)
		}
	}
	if err := os.Chmod(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("new handler: %w", err)
	}
	host, err := plugin.NewHost(plugin.HostConfig{
		StateDir: cfg.StateDir, NodeName: cfg.NodeName, Logger: opts.Logger.Named("plugins"),
		MinBackoff: opts.PluginMinBackoff, MaxBackoff: opts.PluginMaxBackoff,
	})
	if err != nil {
		return nil, fmt.Errorf("new handler: %w", err)
	}
	h := &Handler{
		cfg: cfg, opts: opts, log: opts.Logger, host: host,
		states:       stateStore{dir: filepath.Join(cfg.StateDir, "vmis")},
		loaded:       map[string]string{},
		configs:      map[string]json.RawMessage{},
		loadErrs:     map[string]error{},
		caps:         map[string]*basev1.Capabilities{},
		fingerprints: map[string]*basev1.FingerprintResponse{},
		vmis:         map[types.UID]*entry{},
		agentKick:    make(chan struct{}, 1),
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	if opts.SELinux.Enabled() {
		h.log.Info("SELinux: the files of each VMI are labelled with its sandbox's level", "selinux", opts.SELinux.Mode)
	} else {
		h.log.Info("SELinux: disabled; the files of VMIs are not labelled", "selinux", opts.SELinux.Mode)
	}
	h.loadDrivers(ctx)

	states, err := h.states.loadAll()
	if err != nil {
		h.log.Error("some VMI states cannot be read; those VMIs are left alone", "error", err)
	}
	for _, st := range states {
		h.vmis[st.UID] = &entry{uid: st.UID, state: st}
		h.log.Info("found VMI state", "vmi", st.Namespace+"/"+st.Name, "uid", st.UID, "started", st.Started)
	}

	hypervisors := 0
	for name, kind := range h.loaded {
		if kind == driver.KindHypervisor {
			hypervisors++
			h.wg.Go(func() { h.watchHypervisor(name) })
		}
		h.wg.Go(func() { h.watchFingerprint(name) })
	}
	if hypervisors > 0 {
		h.wg.Go(h.resync)
		h.wg.Go(h.pollAgents)
	}
	return h, nil
}

// loadDrivers starts the configured drivers, in parallel.
func (h *Handler) loadDrivers(ctx context.Context) {
	manifests := map[string]plugin.Manifest{}
	for _, m := range h.opts.Manifests {
		manifests[m.Name] = m
	}
	if h.cfg.PluginDir != "" {
		found, err := plugin.Discover(h.cfg.PluginDir)
		if err != nil {
			h.log.Warn("plugin directory", "dir", h.cfg.PluginDir, "error", err)
		}
		for _, m := range found {
			if own, ok := manifests[m.Name]; ok {
				h.log.Info("driver from the plugin directory replaces the handler image's", "driver", m.Name,
					"binary", m.Binary, "sha256", m.SHA256, "replaced", own.Binary)
			}
			manifests[m.Name] = m
		}
	}
	var wg sync.WaitGroup
	for _, d := range h.cfg.Drivers.all() {
		kind, name := d.kind, d.name
		m, ok := manifests[name]
		switch {
		case !ok:
			where := "no plugin directory is configured"
			if h.cfg.PluginDir != "" {
				where = "no manifest of that name in " + h.cfg.PluginDir
			}
			h.setLoadErr(name, fmt.Errorf("%s driver %q is not installed: %s", kind, name, where))
			continue
		case m.Kind != kind:
			h.setLoadErr(name, fmt.Errorf("driver %q is a %s driver, configured as the %s driver", name, m.Kind, kind))
			continue
		}
		if raw, ok := h.cfg.DriverConfig[name]; ok {
			m.Config = raw
		}
		wg.Go(func() {
			if err := h.host.Start(ctx, m); err != nil {
				h.setLoadErr(name, fmt.Errorf("%s driver %q did not start: %w", kind, name, err))
				return
			}
			caps, err := h.driverCaps(ctx, name)
			if err != nil {
				h.setLoadErr(name, fmt.Errorf("%s driver %q: capabilities: %w", kind, name, err))
				return
			}
			h.mu.Lock()
			h.loaded[name] = kind
			h.configs[name] = m.Config
			h.caps[name] = caps
			h.mu.Unlock()
			h.log.Info("driver loaded", "kind", kind, "driver", name, "binary", m.Binary, "sha256", m.SHA256,
				"pid", h.host.Status(name).Pid, "reattached", h.host.Status(name).Reattached)
		})
	}
	wg.Wait()
}

func (h *Handler) driverCaps(ctx context.Context, name string) (*basev1.Capabilities, error) {
	d, err := h.host.Driver(name)
	if err != nil {
		return nil, err
	}
	return d.Capabilities(ctx)
}

func (h *Handler) setLoadErr(name string, err error) {
	h.log.Error("driver not loaded", "driver", name, "error", err)
	h.mu.Lock()
	h.loadErrs[name] = err
	h.mu.Unlock()
}

// SetPermittedHostDevices gives the node's hostdev driver (liveconfig.HostDevicesDriver, when
// it is a loaded device driver here) permitted in place of the permittedHostDevices of the
// configuration it started with (driverConfig.hostdev, or its manifest's); nil means that
// configuration's own. The driver takes it while it runs (plugin.Host.Reconfigure), and the
// handler reads its resources again: a VMI synced from then on allocates a resource it
// permits, and is refused one it no longer does (the device step fails naming the resource).
// VMIs already running keep their devices: their allocation is done, and nothing is asked of
// the driver again for them. A change the driver refuses is returned (with its code and the
// field it names) and changes nothing. Without a hostdev driver it does nothing. The live
// configuration's watcher calls it (liveconfig.HostDevices).
func (h *Handler) SetPermittedHostDevices(ctx context.Context, permitted *v1alpha1.PermittedHostDevices) error {
	name := liveconfig.HostDevicesDriver
	if !slices.Contains(h.cfg.Drivers.DeviceNames(), name) {
		return nil
	}
	h.mu.Lock()
	loaded, base, loadErr := h.loaded[name] == driver.KindDevice, h.configs[name], h.loadErrs[name]
	h.mu.Unlock()
	if !loaded {
		if loadErr != nil {
			return fmt.Errorf("device driver %q is not loaded: %w", name, loadErr)
		}
		return fmt.Errorf("device driver %q is not loaded", name)
	}
	config, err := liveconfig.MergeHostDevices(base, permitted)
	if err != nil {
		return err
	}
	if err := h.host.Reconfigure(ctx, name, config); err != nil {
		return err
	}
	caps, err := h.driverCaps(ctx, name)
	if err != nil {
		return fmt.Errorf("device driver %q: capabilities: %w", name, err)
	}
	h.mu.Lock()
	h.caps[name] = caps
	h.mu.Unlock()
	h.log.Info("permitted host devices taken", "driver", name, "resources", caps.GetResources())
	return nil
}

// DriverStatus is one configured driver as Drivers reports it.
type DriverStatus struct {
	Kind, Name string
	// Loaded is true once the driver started; Error says why it did not.
	Loaded bool
	Error  string
	Plugin plugin.PluginStatus
}

// Drivers reports on every configured driver, by kind (the hypervisor drivers in their
// configured order).
func (h *Handler) Drivers() []DriverStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []DriverStatus
	for _, d := range h.cfg.Drivers.all() {
		ds := DriverStatus{Kind: d.kind, Name: d.name, Loaded: h.loaded[d.name] != "", Plugin: h.host.Status(d.name)}
		if err := h.loadErrs[d.name]; err != nil {
			ds.Error = err.Error()
		}
		out = append(out, ds)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Kind < out[j].Kind })
	return out
}

// PluginStatus reports on the plugin process of the driver of a kind (of the hypervisor
// drivers, the default one).
func (h *Handler) PluginStatus(kind string) plugin.PluginStatus {
	return h.host.Status(h.cfg.Drivers.of(kind))
}

// DriverPluginStatus reports on the plugin process of a driver, by name.
func (h *Handler) DriverPluginStatus(name string) plugin.PluginStatus {
	return h.host.Status(name)
}

// NodeLabels returns the node labels of the configured drivers' current fingerprints (see
// package-level NodeLabels), and v1alpha1.SELinuxNodeLabel with the node's SELinux mode
// (Options.SELinux): enforcing, permissive or disabled.
func (h *Handler) NodeLabels() map[string]string {
	h.mu.Lock()
	var fps []DriverFingerprint
	for _, d := range h.cfg.Drivers.all() {
		fp, caps := h.fingerprints[d.name], h.caps[d.name]
		if h.loaded[d.name] == "" || !h.host.Status(d.name).Running {
			fp, caps = nil, nil
		}
		fps = append(fps, DriverFingerprint{Kind: d.kind, Name: d.name, Fingerprint: fp, Capabilities: caps})
	}
	h.mu.Unlock()
	labels, problems := NodeLabels(fps)
	labels[v1alpha1.SELinuxNodeLabel] = string(h.opts.SELinux.Mode)
	h.mu.Lock()
	fresh := newProblems(h.labelProblems, problems)
	h.labelProblems = problems
	h.mu.Unlock()
	for _, p := range fresh {
		h.log.Warn("fingerprint attribute not published", "problem", p)
	}
	return labels
}

// DriverHealth is a configured driver's health as its last fingerprint says, with the
// fingerprint's description: what a degraded or unhealthy driver finds wrong (the hostdev
// driver names each permittedHostDevices entry that selects no device).
type DriverHealth struct {
	Kind, Name string
	// Health is HealthHealthy, HealthDegraded or HealthUnhealthy (a driver not running, or
	// without a fingerprint yet, is unhealthy).
	Health      string
	Description string
}

// DriverHealth returns the health of every configured driver, in the configured order.
func (h *Handler) DriverHealth() []DriverHealth {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []DriverHealth
	for _, d := range h.cfg.Drivers.all() {
		dh := DriverHealth{Kind: d.kind, Name: d.name, Health: HealthUnhealthy}
		fp := h.fingerprints[d.name]
		switch {
		case h.loaded[d.name] == "":
			dh.Description = "not loaded"
			if err := h.loadErrs[d.name]; err != nil {
				dh.Description = err.Error()
			}
		case !h.host.Status(d.name).Running:
			dh.Description = "the plugin process is not running"
		case fp == nil:
			dh.Description = "no fingerprint yet"
		default:
			dh.Description = fp.GetHealthDescription()
			switch fp.GetHealth() {
			case basev1.Health_HEALTH_HEALTHY:
				dh.Health = HealthHealthy
			case basev1.Health_HEALTH_DEGRADED:
				dh.Health = HealthDegraded
			}
		}
		out = append(out, dh)
	}
	return out
}

// newProblems returns the problems of cur that prev did not have.
func newProblems(prev, cur []string) []string {
	return slices.DeleteFunc(slices.Clone(cur), func(p string) bool { return slices.Contains(prev, p) })
}

// watchFingerprint keeps the last fingerprint of a driver, reopening the stream whenever it
// ends (the plugin restarted).
func (h *Handler) watchFingerprint(name string) {
	d, err := h.host.Driver(name)
	if err != nil {
		return
	}
	b := backoff.NewRetry(retry)
	for h.ctx.Err() == nil {
		err := d.Fingerprint(h.ctx, func(fp *basev1.FingerprintResponse) error {
			h.mu.Lock()
			h.fingerprints[name] = fp
			h.mu.Unlock()
			b.Reset()
			return nil
		})
		if h.ctx.Err() != nil {
			return
		}
		h.log.Debug("fingerprint stream ended", "driver", name, "error", err)
		b.Wait(h.ctx)
	}
}

// Status returns the last status the handler derived for a VMI, and whether it knows it.
func (h *Handler) Status(uid types.UID) (v1alpha1.VirtualMachineInstanceStatus, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.vmis[uid]
	if e == nil {
		return v1alpha1.VirtualMachineInstanceStatus{}, false
	}
	return *e.status.DeepCopy(), true
}

// HypervisorDriver returns the hypervisor driver the VMI was set up with on this node, and
// whether the node has the VMI.
func (h *Handler) HypervisorDriver(uid types.UID) (string, bool) {
	st := h.entryState(uid)
	if st == nil {
		return "", false
	}
	return h.hypervisorName(st), true
}

// VMIs returns the UIDs of the VMIs the handler has on this node, sorted.
func (h *Handler) VMIs() []types.UID {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []types.UID
	for uid, e := range h.vmis {
		if e.state != nil {
			out = append(out, uid)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func (h *Handler) entryState(uid types.UID) *vmiState {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.vmis[uid]; e != nil {
		return e.state
	}
	return nil
}

// Close stops the handler's background work and the driver plugins, which leaves the VMs to
// what their drivers' processes' end does to them (the qmp driver's VMs keep running for a later
// Recover). Use Detach for a handler restart.
func (h *Handler) Close() error {
	return h.end(h.host.Close)
}

// Detach stops the handler's background work and disconnects from the driver plugins, leaving
// them and the VMs running for the next handler on the same state directory.
func (h *Handler) Detach() error {
	return h.end(h.host.Detach)
}

func (h *Handler) end(hostEnd func() error) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
	return hostEnd()
}

// publish derives the VMI's status and calls OnStatus when it changed. It returns the status.
func (h *Handler) publish(e *entry) v1alpha1.VirtualMachineInstanceStatus {
	h.pubMu.Lock()
	defer h.pubMu.Unlock()
	h.mu.Lock()
	obs := Observation{
		NodeName:      h.cfg.NodeName,
		Failure:       e.failure,
		VM:            e.vm,
		Stopping:      e.stopping,
		SandboxExited: e.sandboxExited,
		Agent:         e.agent,
	}
	if st := e.state; st != nil {
		obs.Created = st.began(stepHypervisor)
		results := map[string]*InterfaceObservation{}
		for _, r := range st.setupResponse().GetInterfaces() {
			results[r.GetName()] = &InterfaceObservation{Name: r.GetName(), Result: r}
		}
		for _, i := range st.setupRequest().GetInterfaces() {
			if r := results[i.GetName()]; r != nil {
				obs.Interfaces = append(obs.Interfaces, *r)
			}
		}
	}
	prev := e.status
	if prev.Phase == "" && e.vmi != nil {
		prev = *e.vmi.Status.DeepCopy()
	}
	st := DeriveStatus(prev, obs, h.opts.Now())
	changed := !equality.Semantic.DeepEqual(st, e.status)
	e.status = st
	h.mu.Unlock()
	if changed && h.opts.OnStatus != nil {
		h.opts.OnStatus(e.uid, *st.DeepCopy())
	}
	return *st.DeepCopy()
}

// retry is the delay between the handler's attempts to reopen a driver's stream (events,
// fingerprint, console): 100ms doubling up to 2s, from the start again after a stream worked.
var retry = backoff.Exponential{Initial: 100 * time.Millisecond, Max: 2 * time.Second}
