package deviceplugins

import (
	"context"
	"errors"
	"fmt"
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

// Manager runs one kubelet device plugin per resource of its device drivers.
type Manager struct {
	plugins []*Plugin
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
	m := &Manager{}
	owner := map[string]string{}
	var errs []error
	for _, s := range sources {
		caps, err := s.Device.Capabilities(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("device driver %q: capabilities: %w", s.Name, err))
			continue
		}
		if len(caps.GetResources()) == 0 {
			log.Warn("device driver declares no resource", "driver", s.Name)
		}
		for _, r := range caps.GetResources() {
			if prev, ok := owner[r]; ok {
				errs = append(errs, fmt.Errorf("resource %q: declared by device drivers %q and %q", r, prev, s.Name))
				continue
			}
			owner[r] = s.Name
			m.plugins = append(m.plugins, newPlugin(cfg, v1alpha1.DeviceResourcePrefix+r, r, s, log))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if len(m.plugins) == 0 {
		return nil, errors.New("device plugins: no device driver declares a resource")
	}
	return m, nil
}

// Plugins returns the plugins the manager runs.
func (m *Manager) Plugins() []*Plugin { return m.plugins }

// Run runs every plugin until ctx ends. If one cannot start, it stops the others and returns
// that error.
func (m *Manager) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for _, p := range m.plugins {
		wg.Go(func() {
			if err := p.Run(ctx); err != nil {
				once.Do(func() { firstErr = fmt.Errorf("%s: %w", p.ResourceName(), err) })
				cancel()
			}
		})
	}
	wg.Wait()
	return firstErr
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
