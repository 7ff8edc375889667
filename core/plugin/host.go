package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
)

// Defaults of HostConfig.
const (
	DefaultMinBackoff   = 200 * time.Millisecond
	DefaultMaxBackoff   = 30 * time.Second
	DefaultStartTimeout = 10 * time.Second
)

// backoffReset is how long a plugin must have run for its restart backoff to start over.
const backoffReset = time.Minute

// maxSocketPath is the longest unix socket path Linux accepts (sun_path less its NUL), and
// socketNameLen the length of the names go-plugin gives its sockets ("plugin" + up to 10 digits).
const (
	maxSocketPath = 107
	socketNameLen = 16
)

// HostConfig configures a Host.
type HostConfig struct {
	// StateDir is the host's root-only state directory (created 0700 if missing). The host
	// keeps reattach records in StateDir/plugins/<name>.json, plugin sockets in
	// StateDir/sockets, and gives each driver StateDir/drivers/<name> (all 0700). Required.
	StateDir string
	// NodeName is passed to each driver's Configure.
	NodeName string
	// Logger is the host's logger; each plugin logs under Logger.Named(name), and the JSON log
	// lines a plugin writes on stderr are re-logged there with their level. Default: hclog's
	// default logger.
	Logger hclog.Logger
	// MinBackoff and MaxBackoff bound the delay before a crashed plugin is started again: it
	// starts at MinBackoff and doubles on every failure up to MaxBackoff, and starts over once
	// a plugin has stayed up for a minute. Defaults: 200ms and 30s.
	MinBackoff, MaxBackoff time.Duration
	// StartTimeout bounds starting one plugin: launch, handshake, Info and Configure.
	// Default: 10s.
	StartTimeout time.Duration
}

// PluginStatus is what Host.Status reports about one driver.
type PluginStatus struct {
	Name string
	Kind string
	// Running is true while a plugin process serves the driver.
	Running bool
	// Pid is the plugin process's pid while it runs.
	Pid int
	// Restarts counts the times the host started the plugin again after it exited
	// unexpectedly (each attempt, successful or not).
	Restarts int
	// LastError is why the plugin last failed (exited, or failed to start again). It stays
	// after a successful restart, until the next failure replaces it.
	LastError string
	// Reattached is true when the running process was started by an earlier host and this host
	// reattached to it.
	Reattached bool
}

type hostState int

const (
	hostOpen hostState = iota
	hostClosed
	hostDetached
)

func (s hostState) String() string {
	switch s {
	case hostClosed:
		return "host closed"
	case hostDetached:
		return "host detached"
	}
	return "not started"
}

// Host starts, supervises and connects to driver plugins. It is safe for concurrent use.
type Host struct {
	cfg       HostConfig
	log       hclog.Logger
	recordDir string
	socketDir string
	driverDir string
	lock      *os.File

	mu      sync.RWMutex
	state   hostState
	plugins map[string]*managed
}

// NewHost prepares the state directory and returns a Host with no plugins. Only one Host may
// use a state directory at a time: NewHost fails while another holds it (the lock is released
// by Close, Detach, or the host process's end).
func NewHost(cfg HostConfig) (*Host, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("new plugin host: StateDir is required")
	}
	stateDir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("new plugin host: %w", err)
	}
	cfg.StateDir = stateDir
	if cfg.Logger == nil {
		cfg.Logger = hclog.Default()
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		return nil, fmt.Errorf("new plugin host: MaxBackoff %s is less than MinBackoff %s", cfg.MaxBackoff, cfg.MinBackoff)
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	h := &Host{
		cfg:       cfg,
		log:       cfg.Logger,
		recordDir: filepath.Join(stateDir, "plugins"),
		socketDir: filepath.Join(stateDir, "sockets"),
		driverDir: filepath.Join(stateDir, "drivers"),
		plugins:   map[string]*managed{},
	}
	if n := len(h.socketDir) + 1 + socketNameLen; n > maxSocketPath {
		return nil, fmt.Errorf("new plugin host: state dir %s is too long for unix socket paths (%d > %d bytes)", stateDir, n, maxSocketPath)
	}
	for _, dir := range []string{stateDir, h.recordDir, h.socketDir, h.driverDir} {
		if err := privateDir(dir); err != nil {
			return nil, fmt.Errorf("new plugin host: %w", err)
		}
	}
	lock, err := lockFile(filepath.Join(stateDir, "host.lock"))
	if err != nil {
		return nil, fmt.Errorf("new plugin host: state dir %s: %w", stateDir, err)
	}
	h.lock = lock
	h.removeStaleSockets()
	return h, nil
}

// privateDir creates dir (0700) or makes an existing one 0700.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// Start runs the driver m describes and keeps it running. It verifies the binary's checksum,
// then reattaches to the process an earlier host left running (when its reattach record names a
// live process of the same binary) or launches a new one; checks that Info reports the
// manifest's name and kind; calls Configure with m.Config, the node name, the driver's state
// directory and the negotiated protocol version; persists the reattach record; and supervises
// the process from then on, restarting it when it exits. ctx bounds this first start only.
//
// The plugin runs in its state directory, in its own process group, with a minimal environment
// (PATH, TMPDIR, TZ, LANG, LC_ALL and the Go runtime's GO* settings of the host, not the rest).
func (h *Host) Start(ctx context.Context, m Manifest) error {
	if err := m.normalize(); err != nil {
		return fmt.Errorf("driver %q: invalid manifest: %w", m.Name, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("driver %q: %w", m.Name, err)
	}
	kind, _ := driver.ParseKind(m.Kind) // normalize checked it
	mp := &managed{
		h:      h,
		m:      m,
		kind:   kind,
		log:    h.log.Named(m.Name),
		done:   make(chan struct{}),
		config: m.Config,
	}
	mp.ctx, mp.cancel = context.WithCancel(context.Background())
	mp.down = "starting"

	h.mu.Lock()
	switch {
	case h.state != hostOpen:
		h.mu.Unlock()
		return fmt.Errorf("driver %q: %s", m.Name, h.state)
	case h.plugins[m.Name] != nil:
		h.mu.Unlock()
		return fmt.Errorf("driver %q: already started", m.Name)
	}
	h.plugins[m.Name] = mp // reserve the name; Conn answers "not running: starting" meanwhile
	h.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(mp.ctx, cancel) // Stop, Close and Detach abort a start
	defer stop()

	inst, err := mp.startFirst(ctx)
	if err == nil && mp.ctx.Err() != nil {
		mp.kill(inst)
		err = fmt.Errorf("driver %q: %s during start", m.Name, h.stateOf())
	}
	if err != nil {
		h.mu.Lock()
		if h.plugins[m.Name] == mp {
			delete(h.plugins, m.Name)
		}
		h.mu.Unlock()
		mp.cancel()
		close(mp.done)
		return err
	}
	mp.setRunning(inst)
	go mp.supervise(inst)
	return nil
}

func (h *Host) stateOf() hostState {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.state
}

// lookup returns the managed plugin of a name, or an error saying why there is none.
func (h *Host) lookup(name string) (*managed, error) {
	h.mu.RLock()
	mp, state := h.plugins[name], h.state
	h.mu.RUnlock()
	if mp == nil {
		if state == hostOpen {
			return nil, fmt.Errorf("driver %q: not started", name)
		}
		return nil, fmt.Errorf("driver %q: %s", name, state)
	}
	return mp, nil
}

// current returns the live process of a driver, or a codes.Unavailable error saying why the
// driver is not running.
func (h *Host) current(name string) (*managed, *instance, error) {
	h.mu.RLock()
	mp, state := h.plugins[name], h.state
	h.mu.RUnlock()
	if mp == nil {
		reason := "stopped"
		if state != hostOpen {
			reason = state.String()
		}
		return nil, nil, status.Errorf(codes.Unavailable, "driver %q is not running: %s", name, reason)
	}
	inst := mp.cur.Load()
	if inst == nil {
		return nil, nil, status.Errorf(codes.Unavailable, "driver %q is not running: %s", name, mp.downReason())
	}
	return mp, inst, nil
}

// Conn returns a connection to a started driver that stays valid across restarts of its
// plugin (and across Stop and Start of the same name): each call goes to the plugin process
// running at that moment. While none runs, calls fail at once with codes.Unavailable "driver
// <name> is not running: <cause>"; callers retry. Every error of a call keeps its status code
// and names the driver in its message. A stream lives as long as the process that serves it.
func (h *Host) Conn(name string) (grpc.ClientConnInterface, error) {
	if _, err := h.lookup(name); err != nil {
		return nil, err
	}
	return &conn{h: h, name: name}, nil
}

// Driver returns the client of a started driver, of its kind (a *driver.HypervisorClient, ...),
// on Conn(name).
func (h *Host) Driver(name string) (driver.Driver, error) {
	mp, err := h.lookup(name)
	if err != nil {
		return nil, err
	}
	return mp.client(), nil
}

// Hypervisor returns the client of a started hypervisor driver.
func (h *Host) Hypervisor(name string) (driver.Hypervisor, error) {
	return typed[driver.Hypervisor](h, name, basev1.Kind_KIND_HYPERVISOR)
}

// Network returns the client of a started network driver.
func (h *Host) Network(name string) (driver.Network, error) {
	return typed[driver.Network](h, name, basev1.Kind_KIND_NETWORK)
}

// Storage returns the client of a started storage driver.
func (h *Host) Storage(name string) (driver.Storage, error) {
	return typed[driver.Storage](h, name, basev1.Kind_KIND_STORAGE)
}

// Device returns the client of a started device driver.
func (h *Host) Device(name string) (driver.Device, error) {
	return typed[driver.Device](h, name, basev1.Kind_KIND_DEVICE)
}

func typed[T driver.Driver](h *Host, name string, kind basev1.Kind) (T, error) {
	var zero T
	mp, err := h.lookup(name)
	if err != nil {
		return zero, err
	}
	if mp.kind != kind {
		return zero, fmt.Errorf("driver %q is a %s driver, not a %s driver", name, driver.KindName(mp.kind), driver.KindName(kind))
	}
	c, ok := mp.client().(T)
	if !ok {
		return zero, fmt.Errorf("driver %q: client %T is not a %s client", name, mp.client(), driver.KindName(kind))
	}
	return c, nil
}

// Reconfigure configures the running plugin of a started driver again (Configure), with
// config in place of its configuration (the manifest's, or the last one a Reconfigure set); the
// node name, state directory and protocol version stay. It is how a host hands a driver a
// change the driver can take while it runs (core/driver's Configure contract: a device
// driver's permitted host devices).
//
// When the driver accepts it, config is the driver's configuration from then on: a plugin
// process the host starts again after a crash is configured with it, and the host's client of
// the driver (Driver, Device, ...) asks Capabilities again. When the driver refuses it (its
// error, with its code: FailedPrecondition for a change it does not take while it runs,
// InvalidArgument for a configuration it cannot use), or no process runs (Unavailable), the
// configuration before it stays. The same configuration as the current one is not sent again.
// Calls for one driver are serialised, and with the Configure of a plugin being started again.
//
// Limits: what Reconfigure sets lives in this host only. A host that reattaches after a restart
// configures the running process with its manifest's configuration again, which the driver
// takes or refuses like any other request (a refusal kills that process and starts a new one);
// whoever called Reconfigure calls it again on the new host.
func (h *Host) Reconfigure(ctx context.Context, name string, config json.RawMessage) error {
	mp, err := h.lookup(name)
	if err != nil {
		return fmt.Errorf("reconfigure: %w", err)
	}
	if len(config) > 0 && !json.Valid(config) {
		return status.Errorf(codes.InvalidArgument, "reconfigure driver %q: config is not valid JSON", name)
	}
	if bytes.Equal(bytes.TrimSpace(config), []byte("null")) {
		config = nil
	}
	mp.configuring.Lock()
	defer mp.configuring.Unlock()
	if bytes.Equal(config, mp.configuration()) {
		return nil
	}
	_, inst, err := h.current(name)
	if err != nil {
		return err
	}
	req, err := mp.configureRequest(config, inst.version)
	if err != nil {
		return status.Errorf(codes.Internal, "reconfigure: %v", err)
	}
	// Through the client the callers share, so that its Capabilities cache is dropped.
	if err := mp.client().Configure(ctx, req); err != nil {
		return err
	}
	mp.mu.Lock()
	mp.config = slices.Clone(config)
	mp.mu.Unlock()
	mp.log.Info("driver reconfigured", "pid", inst.pid)
	return nil
}

// Status reports on one driver. For a name that is not started it returns only the name.
func (h *Host) Status(name string) PluginStatus {
	h.mu.RLock()
	mp := h.plugins[name]
	h.mu.RUnlock()
	if mp == nil {
		return PluginStatus{Name: name}
	}
	return mp.status()
}

// Stop ends supervision of a driver, kills its plugin process (asking it to exit first) and
// removes its reattach record. The name can be started again.
func (h *Host) Stop(name string) error {
	h.mu.Lock()
	mp := h.plugins[name]
	if mp == nil {
		h.mu.Unlock()
		return fmt.Errorf("stop driver %q: not started", name)
	}
	delete(h.plugins, name)
	h.mu.Unlock()
	mp.shutdown()
	return nil
}

// Close kills every plugin and removes their reattach records: the normal shutdown of a node
// that stops running VMs. The Host cannot be used afterwards.
func (h *Host) Close() error {
	return h.end(hostClosed)
}

// Detach stops supervising and disconnects from every plugin but leaves the processes running
// and their reattach records in place, so that the next host on this state directory (after a
// restart or an upgrade) reattaches to them. The Host cannot be used afterwards.
func (h *Host) Detach() error {
	return h.end(hostDetached)
}

func (h *Host) end(to hostState) error {
	h.mu.Lock()
	if h.state != hostOpen {
		h.mu.Unlock()
		return nil
	}
	h.state = to
	all := make([]*managed, 0, len(h.plugins))
	for _, mp := range h.plugins {
		all = append(all, mp)
	}
	clear(h.plugins)
	h.mu.Unlock()

	var wg sync.WaitGroup
	for _, mp := range all {
		wg.Go(func() {
			if to == hostDetached {
				mp.detach()
			} else {
				mp.shutdown()
			}
		})
	}
	wg.Wait()
	// Releasing the lock last lets the next host in only once every plugin is dealt with.
	return h.lock.Close()
}
