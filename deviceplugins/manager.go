package deviceplugins

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/core/plugin"
)

// Source is a loaded device driver whose devices the plugins serve.
type Source struct {
	// Name is the driver's name, for messages.
	Name string
	// Device is the driver, usually the plugin host's client for it.
	Device driver.Device
}

// Manager runs one kubelet device plugin per resource of its device drivers, and follows the
// drivers' resources when asked (Resync).
type Manager struct {
	cfg     Config
	sources []Source
	log     hclog.Logger

	// resync serialises Resync.
	resync sync.Mutex

	mu      sync.Mutex
	plugins []*Plugin
	// run is the context of Run while it runs (nil before); started holds the plugins it
	// runs, each with what stops it and what says it stopped.
	run     context.Context
	started map[*Plugin]*runningPlugin
}

type runningPlugin struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// NewManager validates cfg (after defaulting its empty fields) and builds one plugin per
// resource the sources declare (Capabilities.resources), devices.kubevisor.io/<resource>. A
// resource with no device yet still gets a plugin, so that a device that appears later (a
// function bound to vfio-pci) needs no restart. Two drivers declaring one resource is an error.
func NewManager(ctx context.Context, cfg Config, sources []Source, log hclog.Logger) (*Manager, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("device plugin config: %w", err)
	}
	m := &Manager{cfg: cfg, sources: sources, log: log, started: map[*Plugin]*runningPlugin{}}
	want, _, err := m.declared(ctx, nil)
	if err != nil {
		return nil, err
	}
	for _, w := range want {
		m.plugins = append(m.plugins, newPlugin(cfg, w.resource, w.driverRes, w.src, log))
	}
	if len(m.plugins) == 0 {
		return nil, errors.New("device plugins: no device driver declares a resource")
	}
	return m, nil
}

// declaredResource is a resource a source declares.
type declaredResource struct {
	resource, driverRes string
	src                 Source
}

// declared asks every source for its resources, in order, and returns them with the sources
// whose Capabilities failed. A resource two drivers declare is an error naming both; it is kept
// for the driver that owns it now (owner: resource → driver name), else for the first to
// declare it, so the error need not stop the others.
func (m *Manager) declared(ctx context.Context, owner map[string]string) (out []declaredResource, failed []string, _ error) {
	var errs []error
	by := map[string]int{} // resource → index in out
	for _, s := range m.sources {
		caps, err := s.Device.Capabilities(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("device driver %q: capabilities: %w", s.Name, err))
			failed = append(failed, s.Name)
			continue
		}
		if len(caps.GetResources()) == 0 {
			m.log.Warn("device driver declares no resource", "driver", s.Name)
		}
		for _, r := range caps.GetResources() {
			d := declaredResource{resource: v1alpha1.DeviceResourcePrefix + r, driverRes: r, src: s}
			i, dup := by[r]
			if !dup {
				by[r] = len(out)
				out = append(out, d)
				continue
			}
			prev := out[i].src.Name
			errs = append(errs, fmt.Errorf("resource %q: declared by device drivers %q and %q", r, prev, s.Name))
			if owner[d.resource] == s.Name {
				out[i] = d
			}
		}
	}
	return out, failed, errors.Join(errs...)
}

// Plugins returns the plugins the manager runs now.
func (m *Manager) Plugins() []*Plugin {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.plugins)
}

// Run runs every plugin until ctx ends, and those Resync adds meanwhile. If one of the first
// cannot start, it stops the others and returns that error; a plugin Resync adds that cannot
// start is logged.
func (m *Manager) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		once     sync.Once
		firstErr error
	)
	m.mu.Lock()
	if m.run != nil {
		m.mu.Unlock()
		return errors.New("device plugins: already running")
	}
	m.run = ctx
	for _, p := range m.plugins {
		m.startLocked(p, func(err error) {
			once.Do(func() { firstErr = fmt.Errorf("%s: %w", p.ResourceName(), err) })
			cancel()
		})
	}
	m.mu.Unlock()
	<-ctx.Done()
	m.mu.Lock()
	running := make([]*runningPlugin, 0, len(m.started))
	for _, r := range m.started {
		running = append(running, r)
	}
	m.mu.Unlock()
	for _, r := range running {
		<-r.done
	}
	return firstErr
}

// startLocked runs p in a goroutine of its own under Run's context; failed gets the error of a
// plugin that cannot start. m.mu must be held and Run running.
func (m *Manager) startLocked(p *Plugin, failed func(error)) {
	ctx, cancel := context.WithCancel(m.run)
	r := &runningPlugin{cancel: cancel, done: make(chan struct{})}
	m.started[p] = r
	go func() {
		defer close(r.done)
		if err := p.Run(ctx); err != nil {
			failed(err)
		}
	}()
}

// Resync asks the device drivers for their resources again (Capabilities), after a driver's
// configuration changed (the hostdev driver's permitted host devices), and makes the plugins
// follow: each new resource gets a plugin, which registers with the kubelet as at start; a
// resource no driver declares any more has its plugin retired, and returns once it is gone.
// It returns the resources added and removed.
//
// Retiring a plugin: its ListAndWatch streams send an empty list (the kubelet then counts no
// device of the resource, capacity and allocatable 0) and end, the plugin stops serving and its
// socket is removed. The kubelet takes that as the plugin going away: it keeps the resource in
// the node's capacity at 0 for its endpoint grace period (5 minutes in kubelet 1.37) and then
// drops it from the Node. Pods holding devices of the resource keep them: the kubelet does not
// take back what it allocated, and nothing here touches a device. A device driver's error, or a
// resource two drivers declare (which stays with its current driver, or is not added), is
// returned, after every other change is made.
func (m *Manager) Resync(ctx context.Context) (added, removed []string, err error) {
	m.resync.Lock()
	defer m.resync.Unlock()
	m.mu.Lock()
	owner := map[string]string{}
	for _, p := range m.plugins {
		owner[p.resource] = p.src.Name
	}
	m.mu.Unlock()
	// The plugins of a driver whose capabilities are unknown now stay as they are.
	want, failed, err := m.declared(ctx, owner)

	m.mu.Lock()
	var keep, retire []*Plugin
	for _, p := range m.plugins {
		i := slices.IndexFunc(want, func(w declaredResource) bool { return w.resource == p.resource })
		switch {
		case i >= 0 && want[i].src.Name == p.src.Name, slices.Contains(failed, p.src.Name):
			keep = append(keep, p)
		default:
			retire = append(retire, p)
		}
	}
	m.plugins = keep
	var stopping []*runningPlugin
	for _, p := range retire {
		p.retire()
		if r := m.started[p]; r != nil {
			r.cancel()
			stopping = append(stopping, r)
			delete(m.started, p)
		}
		removed = append(removed, p.resource)
	}
	m.mu.Unlock()
	// A retired plugin's socket must be gone before a plugin of the same resource (another
	// driver's now) listens there.
	for _, r := range stopping {
		<-r.done
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	for _, w := range want {
		if slices.ContainsFunc(m.plugins, func(p *Plugin) bool { return p.resource == w.resource }) {
			continue
		}
		p := newPlugin(m.cfg, w.resource, w.driverRes, w.src, m.log)
		m.plugins = append(m.plugins, p)
		if m.run != nil && m.run.Err() == nil {
			m.startLocked(p, func(err error) { m.log.Error("device plugin did not start", "resource", p.resource, "error", err) })
		}
		added = append(added, w.resource)
	}
	if len(added) > 0 || len(removed) > 0 {
		m.log.Info("device plugins follow the drivers' resources", "added", strings.Join(added, ","), "removed", strings.Join(removed, ","))
	}
	return added, removed, err
}

// StartDrivers starts the device drivers of manifests in a new plugin host (hc) and returns
// them as sources, with the host, which the caller closes when the plugins stop. A manifest of
// another kind, or a driver that does not start, is an error naming it; the drivers started
// are stopped then.
func StartDrivers(ctx context.Context, hc plugin.HostConfig, manifests []plugin.Manifest) (*plugin.Host, []Source, error) {
	if len(manifests) == 0 {
		return nil, nil, errors.New("no device driver is configured")
	}
	host, err := plugin.NewHost(hc)
	if err != nil {
		return nil, nil, fmt.Errorf("plugin host: %w", err)
	}
	var sources []Source
	for _, mf := range manifests {
		if mf.Kind != driver.KindDevice {
			err = fmt.Errorf("driver %q is a %s driver, not a device driver", mf.Name, mf.Kind)
			break
		}
		if err = host.Start(ctx, mf); err != nil {
			err = fmt.Errorf("device driver %q did not start: %w", mf.Name, err)
			break
		}
		var dev driver.Device
		if dev, err = host.Device(mf.Name); err != nil {
			err = fmt.Errorf("device driver %q: %w", mf.Name, err)
			break
		}
		sources = append(sources, Source{Name: mf.Name, Device: dev})
	}
	if err != nil {
		return nil, nil, errors.Join(err, host.Close())
	}
	return host, sources, nil
}
