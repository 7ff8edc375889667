package deviceplugins

import (
	"context"
	"fmt"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// Manager runs the set of device plugins one Config describes.
type Manager struct {
	plugins []*Plugin
}

// NewManager validates cfg (after defaulting its empty fields) and builds one plugin per
// character device and one per distinct PCI resource name. A PCI resource with no device bound
// to vfio-pci yet still gets a plugin, so binding one later (seen at the next poll) needs no
// restart.
func NewManager(cfg Config, log hclog.Logger) (*Manager, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("device plugin config: %w", err)
	}
	if len(cfg.CharDevices)+len(cfg.PCIDevices) == 0 {
		return nil, fmt.Errorf("device plugin config: no devices")
	}
	m := &Manager{}
	for _, d := range cfg.CharDevices {
		m.plugins = append(m.plugins, newPlugin(cfg, d.ResourceName, &charDevices{dev: d, devRoot: cfg.DevRoot}, log))
	}
	byName := map[string]*vfioDevices{}
	for _, s := range cfg.PCIDevices {
		v := byName[s.ResourceName]
		if v == nil {
			l := log.Named(s.ResourceName)
			v = &vfioDevices{resource: s.ResourceName, sysfsRoot: cfg.SysfsRoot, devRoot: cfg.DevRoot, log: l.Warn}
			byName[s.ResourceName] = v
			m.plugins = append(m.plugins, newPlugin(cfg, s.ResourceName, v, log))
		}
		v.selectors = append(v.selectors, s)
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
