package fake

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
)

// DefaultDeviceCount is how many devices of each resource the fake device driver simulates
// unless DeviceConfig.Count says otherwise.
const DefaultDeviceCount = 4

// maxDeviceCount bounds DeviceConfig.Count.
const maxDeviceCount = 1 << 16

// deviceResource is one resource the fake device driver simulates.
type deviceResource struct {
	name string
	// node is the device file a container gets.
	node        string
	permissions string
}

// defaultDeviceResources are the resources of the fake device driver unless
// DeviceConfig.Resources names others.
var defaultDeviceResources = []deviceResource{
	{name: "kvm", node: "/dev/kvm", permissions: "rw"},
	{name: "tun", node: "/dev/net/tun", permissions: "rwm"},
	{name: "vhost-net", node: "/dev/vhost-net", permissions: "rw"},
}

// DeviceConfig is the JSON configuration of the fake device driver.
type DeviceConfig struct {
	// Count is how many devices of each resource there are, ids "<resource>-0" to
	// "<resource>-<Count-1>"; 0 means DefaultDeviceCount.
	Count int `json:"count,omitempty"`
	// Unhealthy lists device ids reported unhealthy; Allocate refuses them.
	Unhealthy []string `json:"unhealthy,omitempty"`
	// Resources names the resources simulated instead of kvm, tun and vhost-net (so that two
	// fake device drivers can serve one node). Their devices hand out /dev/null.
	Resources []string `json:"resources,omitempty"`
}

// Device is the fake device driver. It simulates the resources kvm, tun and vhost-net (or
// DeviceConfig.Resources), Count devices each, which share one device node per resource as the
// units of a kubelet device plugin do. Changing the configuration is seen by Watch streams.
type Device struct {
	base

	mu        sync.Mutex
	count     int
	unhealthy map[string]bool
	resources []deviceResource
}

var (
	_ driver.Device        = (*Device)(nil)
	_ driver.DeviceWatcher = (*Device)(nil)
)

// NewDevice returns a fake device driver with the default configuration.
func NewDevice() *Device {
	return &Device{
		base:      newBase(basev1.Kind_KIND_DEVICE, "simulated devices: kvm, tun and vhost-net units that are not backed by the host"),
		count:     DefaultDeviceCount,
		resources: defaultDeviceResources,
	}
}

// Capabilities implements driver.Driver: Watch, and the resources kvm, tun and vhost-net, or
// those the configuration names.
func (d *Device) Capabilities(context.Context) (*basev1.Capabilities, error) {
	caps := &basev1.Capabilities{Features: []basev1.Feature{basev1.Feature_FEATURE_DEVICE_WATCH}}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.resources {
		caps.Resources = append(caps.Resources, r.name)
	}
	return caps, nil
}

// Fingerprint implements driver.Driver.
func (d *Device) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	return d.fingerprint(ctx, send, func() *basev1.FingerprintResponse {
		return healthy("simulated devices: not backed by the host")
	})
}

// Configure implements driver.Driver. The configuration is a DeviceConfig.
func (d *Device) Configure(_ context.Context, req *basev1.ConfigureRequest) error {
	var cfg DeviceConfig
	if err := decodeConfig(req.GetConfig(), &cfg); err != nil {
		return err
	}
	if cfg.Count < 0 || cfg.Count > maxDeviceCount {
		return invalid("config: count %d is not between 0 and %d", cfg.Count, maxDeviceCount)
	}
	if cfg.Count == 0 {
		cfg.Count = DefaultDeviceCount
	}
	resources := defaultDeviceResources
	if len(cfg.Resources) > 0 {
		resources = nil
		for i, name := range cfg.Resources {
			if name == "" || strings.ContainsAny(name, "/ ") || slices.ContainsFunc(resources, func(r deviceResource) bool { return r.name == name }) {
				return invalid("config: resources[%d]: %q is empty, has a slash or space, or comes twice", i, name)
			}
			resources = append(resources, deviceResource{name: name, node: "/dev/null", permissions: "rw"})
		}
	}
	unhealthy := map[string]bool{}
	for i, id := range cfg.Unhealthy {
		if _, ok := lookupDevice(resources, id, cfg.Count); !ok {
			return invalid("config: unhealthy[%d]: no device %q", i, id)
		}
		unhealthy[id] = true
	}
	d.mu.Lock()
	d.count, d.unhealthy, d.resources = cfg.Count, unhealthy, resources
	d.mu.Unlock()
	d.base.mu.Lock()
	d.notifyLocked()
	d.base.mu.Unlock()
	return nil
}

// lookupDevice returns the resource of a device id when the id exists among resources with
// count devices per resource.
func lookupDevice(resources []deviceResource, id string, count int) (deviceResource, bool) {
	for _, r := range resources {
		if n, ok := strings.CutPrefix(id, r.name+"-"); ok {
			var i int
			if _, err := fmt.Sscanf(n, "%d", &i); err == nil && fmt.Sprint(i) == n && i >= 0 && i < count {
				return r, true
			}
		}
	}
	return deviceResource{}, false
}

// List implements driver.Device. An unknown resource has no devices.
func (d *Device) List(_ context.Context, resource string) ([]*devicev1.HostDevice, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.listLocked(resource), nil
}

func (d *Device) listLocked(resource string) []*devicev1.HostDevice {
	var devs []*devicev1.HostDevice
	for _, r := range d.resources {
		if resource != "" && resource != r.name {
			continue
		}
		for i := range d.count {
			id := fmt.Sprintf("%s-%d", r.name, i)
			health := basev1.Health_HEALTH_HEALTHY
			if d.unhealthy[id] {
				health = basev1.Health_HEALTH_UNHEALTHY
			}
			devs = append(devs, &devicev1.HostDevice{
				Id:         id,
				Resource:   r.name,
				Health:     health,
				Attributes: map[string]string{SimulatedAttribute: "true"},
			})
		}
	}
	return devs
}

// Watch implements driver.DeviceWatcher: the list at once, then again whenever Configure
// changes it, until ctx is done.
func (d *Device) Watch(ctx context.Context, resource string, send func([]*devicev1.HostDevice) error) error {
	send = driver.ChangedDevices(send)
	for {
		d.base.mu.Lock()
		changed := d.changed
		d.base.mu.Unlock()
		d.mu.Lock()
		devs := d.listLocked(resource)
		d.mu.Unlock()
		if err := send(devs); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// Allocate implements driver.Device. Every device of a resource shares the resource's device
// node; the environment variable KUBEVISOR_FAKE_<RESOURCE> lists the ids allocated.
func (d *Device) Allocate(_ context.Context, req *devicev1.AllocateRequest) (*devicev1.AllocateResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	idx := slices.IndexFunc(d.resources, func(r deviceResource) bool { return r.name == req.GetResource() })
	if idx < 0 {
		return nil, notFound("no resource %q", req.GetResource())
	}
	r := d.resources[idx]
	if len(req.GetDeviceIds()) == 0 {
		return nil, invalid("device_ids: required")
	}
	for _, id := range req.GetDeviceIds() {
		if got, ok := lookupDevice(d.resources, id, d.count); !ok || got.name != r.name {
			return nil, notFound("no %s device %q", r.name, id)
		}
		if d.unhealthy[id] {
			return nil, precondition("device %q is unhealthy", id)
		}
	}
	env := "KUBEVISOR_FAKE_" + strings.ToUpper(strings.ReplaceAll(r.name, "-", "_"))
	return &devicev1.AllocateResponse{
		DeviceNodes: []*devicev1.DeviceNode{{HostPath: r.node, ContainerPath: r.node, Permissions: r.permissions}},
		Env:         map[string]string{env: strings.Join(req.GetDeviceIds(), ",")},
	}, nil
}
