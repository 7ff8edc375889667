// Package hostdev is the hostdev device driver (kubevisor-driver-hostdev): it offers the host's
// shared character devices (/dev/kvm, /dev/net/tun, /dev/vhost-net, /dev/sev) and its VFIO PCI
// functions behind the device contract (core/driver Device), so that the kubelet device plugins
// (package deviceplugins) and the handler's pipeline get them from a driver plugin.
//
// Which devices become which devices.kubevisor.io/<name> resource is its configuration
// (Config), modelled on KubeVirt's permittedHostDevices: a character device is Slots
// interchangeable devices "<node>-<i>" that all hand out the one node; a PCI function matching
// a pciVendorSelector is one device, its PCI address, listed only while bound to vfio-pci in an
// IOMMU group, and healthy while it stays bound, its group's /dev/vfio/<group> node exists and
// no other member of the group is held by a host driver. Allocating a function hands the
// container /dev/vfio/vfio and its whole group's node, and lists the addresses in
// PCI_RESOURCE_<RESOURCE> as KubeVirt does.
//
// Health follows the device nodes through fsnotify on their directories and a poll (sysfs, which
// inotify does not see). A permittedHostDevices entry that selects no function bound to vfio-pci
// is reported in the fingerprint (HEALTH_DEGRADED, naming the entry) and logged, not ignored.
//
// permittedHostDevices are the one part of the configuration a running driver takes again
// (Configure): the live configuration (core/liveconfig) changes them on every node without a
// restart, and its resources follow. Anything else needs a new process.
package hostdev

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
)

// Name is the driver's name, as its manifest names it.
const Name = "hostdev"

// Version is the driver's release version reported in Info.
var Version = "0.1.0"

// Driver is the hostdev device driver. It is safe for concurrent use.
type Driver struct {
	log hclog.Logger

	mu  sync.Mutex
	cfg settings
	// configured is set by the first Configure, with the node name and state directory it
	// gave: a later Configure may change permittedHostDevices only.
	configured         bool
	nodeName, stateDir string
	// known holds every PCI function ever listed, by address, so that one that goes away is
	// reported Unhealthy rather than silently dropped.
	known map[string]knownPCI
	// problems are the configuration's entries that select nothing, as last logged.
	problems []string
	// changed is closed and replaced on a Configure that changes the configuration.
	changed chan struct{}
}

type knownPCI struct {
	dev      PCIDevice
	resource string
}

var (
	_ driver.Device        = (*Driver)(nil)
	_ driver.DeviceWatcher = (*Driver)(nil)
)

// New returns the driver with the default configuration (DefaultCharDevices, no PCI devices).
// A nil log discards.
func New(log hclog.Logger) *Driver {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	cfg, err := parseConfig(nil)
	if err != nil {
		panic(fmt.Sprintf("hostdev: default config: %v", err))
	}
	return &Driver{log: log, cfg: cfg, known: map[string]knownPCI{}, changed: make(chan struct{})}
}

// Info implements driver.Driver.
func (d *Driver) Info(context.Context) (*basev1.InfoResponse, error) {
	return &basev1.InfoResponse{
		Name:        Name,
		Kind:        basev1.Kind_KIND_DEVICE,
		Version:     Version,
		Description: "host devices: shared character devices and VFIO PCI functions (permittedHostDevices)",
	}, nil
}

// Capabilities implements driver.Driver: Watch, and the resources of the configuration. Before
// Configure they are the default configuration's; the host asks again after each Configure
// (a change of permittedHostDevices changes them).
func (d *Driver) Capabilities(context.Context) (*basev1.Capabilities, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return &basev1.Capabilities{
		Features:  []basev1.Feature{basev1.Feature_FEATURE_DEVICE_WATCH},
		Resources: d.cfg.resources(),
	}, nil
}

// resources lists the configuration's resources: the character devices', then the PCI ones in
// order of first mention.
func (s settings) resources() []string {
	var out []string
	for _, c := range s.chars {
		out = append(out, c.ResourceName)
	}
	for _, p := range s.pci {
		if !slices.Contains(out, p.resource) {
			out = append(out, p.resource)
		}
	}
	return out
}

// Configure implements driver.Driver. The configuration is a Config; every problem is an
// InvalidArgument naming its field.
//
// Once configured, the driver takes another request only when it differs in
// permittedHostDevices alone (the live configuration's, core/liveconfig): from then on
// Capabilities lists the new resources, List, Watch and Allocate go by the new selection (a
// resource no longer configured lists no device, and an open Watch of it sends an empty list),
// and nothing handed out before is touched (a container keeps the VFIO nodes it was given;
// the driver keeps no allocation). Another change (devRoot, sysfsRoot, pollInterval,
// charDevices, the node name or the state directory) is FailedPrecondition naming the fields,
// and the configuration before it stays.
func (d *Driver) Configure(_ context.Context, req *basev1.ConfigureRequest) error {
	cfg, err := parseConfig(req.GetConfig())
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.configured {
		fixed := d.cfg.fixedFields(cfg)
		if req.GetNodeName() != d.nodeName {
			fixed = append(fixed, "nodeName")
		}
		if req.GetStateDir() != d.stateDir {
			fixed = append(fixed, "stateDir")
		}
		if len(fixed) > 0 {
			return status.Errorf(codes.FailedPrecondition, "already configured: only config.permittedHostDevices changes without a restart of the driver, and %s differ", strings.Join(fixed, ", "))
		}
		if slices.Equal(cfg.pci, d.cfg.pci) {
			return nil // the same request: nothing changes
		}
		before := d.cfg.resources()
		// The functions known under a selection that stays are still reported Unhealthy when
		// they go; the others are no longer this driver's.
		maps.DeleteFunc(d.known, func(_ string, k knownPCI) bool {
			return !slices.ContainsFunc(cfg.pci, func(s pciSelector) bool {
				return s.vendor == k.dev.Vendor && s.device == k.dev.Device && s.resource == k.resource
			})
		})
		d.cfg = cfg
		after := d.cfg.resources()
		d.log.Info("permitted host devices changed", "resources", strings.Join(after, ","),
			"added", strings.Join(slices.DeleteFunc(slices.Clone(after), func(r string) bool { return slices.Contains(before, r) }), ","),
			"removed", strings.Join(slices.DeleteFunc(slices.Clone(before), func(r string) bool { return slices.Contains(after, r) }), ","))
	} else {
		d.configured, d.nodeName, d.stateDir = true, req.GetNodeName(), req.GetStateDir()
		d.cfg = cfg
		d.known = map[string]knownPCI{}
	}
	d.problems = nil
	close(d.changed)
	d.changed = make(chan struct{})
	d.scanLocked() // log what the new configuration selects, or does not
	return nil
}

// Fingerprint implements driver.Driver: healthy, or degraded naming every permittedHostDevices
// entry that selects no PCI function bound to vfio-pci. It reads the host again every poll
// interval.
func (d *Driver) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	d.mu.Lock()
	poll := d.cfg.poll
	d.mu.Unlock()
	return driver.WatchFingerprint(ctx, poll, func(context.Context) (*basev1.FingerprintResponse, <-chan struct{}) {
		d.mu.Lock()
		defer d.mu.Unlock()
		snap := d.scanLocked()
		fp := &basev1.FingerprintResponse{Health: basev1.Health_HEALTH_HEALTHY, HealthDescription: snap.summary()}
		if len(snap.problems) > 0 {
			fp.Health = basev1.Health_HEALTH_DEGRADED
			fp.HealthDescription = strings.Join(snap.problems, "; ")
		}
		return fp, d.changed
	}, send)
}

// device is one listed device and, when unhealthy, why.
type device struct {
	dev   *devicev1.HostDevice
	why   string
	group string // IOMMU group of a PCI function
}

// snapshot is one reading of the host.
type snapshot struct {
	devs     []device
	problems []string
}

func (s snapshot) summary() string {
	healthy := 0
	for _, d := range s.devs {
		if d.dev.GetHealth() == basev1.Health_HEALTH_HEALTHY {
			healthy++
		}
	}
	return fmt.Sprintf("%d of %d devices healthy", healthy, len(s.devs))
}

func (s snapshot) list(resource string) []*devicev1.HostDevice {
	var out []*devicev1.HostDevice
	for _, d := range s.devs {
		if resource == "" || d.dev.GetResource() == resource {
			out = append(out, proto.CloneOf(d.dev))
		}
	}
	return out
}

// scanLocked reads the devices and their health from the host. d.mu must be held.
func (d *Driver) scanLocked() snapshot {
	var snap snapshot
	for _, c := range d.cfg.chars {
		health, why := basev1.Health_HEALTH_HEALTHY, ""
		if _, err := os.Stat(filepath.Join(d.cfg.devRoot, c.Path)); err != nil {
			health, why = basev1.Health_HEALTH_UNHEALTHY, fmt.Sprintf("%s: %v", c.Path, describeStat(err))
		}
		// Ids carry the node's base name so that kubelet logs and checkpoints say what they are.
		base := filepath.Base(c.Path)
		for i := range c.Slots {
			snap.devs = append(snap.devs, device{dev: &devicev1.HostDevice{
				Id: base + "-" + strconv.Itoa(i), Resource: c.ResourceName, Health: health,
				Attributes: map[string]string{"path": c.Path},
			}, why: why})
		}
	}
	if len(d.cfg.pci) > 0 {
		d.scanPCILocked(&snap)
	}
	if !slices.Equal(snap.problems, d.problems) {
		for _, p := range snap.problems {
			d.log.Warn("permitted host device selects nothing", "problem", p)
		}
		if len(snap.problems) == 0 && len(d.problems) > 0 {
			d.log.Info("every permitted host device entry selects a device again")
		}
		d.problems = snap.problems
	}
	return snap
}

func (d *Driver) scanPCILocked(snap *snapshot) {
	all, err := DiscoverPCIDevices(d.cfg.sysfsRoot)
	if err != nil {
		// Keep what is known; a transient sysfs error must not empty the node's capacity.
		d.log.Warn("discover pci devices", "sysfs", d.cfg.sysfsRoot, "error", err)
	}
	present := map[string]bool{}
	for _, sel := range d.cfg.pci {
		var bound, other []string
		for _, p := range all {
			if p.Vendor != sel.vendor || p.Device != sel.device {
				continue
			}
			if p.Driver != VFIODriver || p.IOMMUGroup == "" {
				drv := p.Driver
				if drv == "" {
					drv = "no driver"
				} else if p.Driver == VFIODriver {
					drv = "no IOMMU group"
				}
				other = append(other, p.Address+" ("+drv+")")
				continue
			}
			bound = append(bound, p.Address)
			present[p.Address] = true
			d.known[p.Address] = knownPCI{dev: p, resource: sel.resource}
		}
		switch {
		case len(bound) > 0:
		case len(other) > 0:
			snap.problems = append(snap.problems, fmt.Sprintf("%s: no function is bound to %s: %s", sel.field(), VFIODriver, strings.Join(other, ", ")))
		default:
			snap.problems = append(snap.problems, fmt.Sprintf("%s: no PCI function %s on this node", sel.field(), sel.id()))
		}
	}
	for _, addr := range slices.Sorted(maps.Keys(d.known)) {
		k := d.known[addr]
		p := k.dev
		health, why := basev1.Health_HEALTH_HEALTHY, ""
		node := filepath.Join(vfioDir, p.IOMMUGroup)
		_, statErr := os.Stat(filepath.Join(d.cfg.devRoot, node))
		switch {
		case !present[addr]:
			health, why = basev1.Health_HEALTH_UNHEALTHY, fmt.Sprintf("no longer bound to %s", VFIODriver)
		case statErr != nil:
			health, why = basev1.Health_HEALTH_UNHEALTHY, fmt.Sprintf("IOMMU group %s: %s: %v", p.IOMMUGroup, node, describeStat(statErr))
		default:
			if b := groupBlocker(p.IOMMUGroup, all); b != nil {
				health, why = basev1.Health_HEALTH_UNHEALTHY, fmt.Sprintf("IOMMU group %s is not viable: %s is bound to %s", p.IOMMUGroup, b.Address, b.Driver)
			}
		}
		numa := int32(-1)
		if p.NUMANode >= 0 {
			numa = int32(p.NUMANode)
		}
		snap.devs = append(snap.devs, device{dev: &devicev1.HostDevice{
			Id: addr, Resource: k.resource, Health: health, PciAddress: addr, NumaNode: numa,
			Attributes: map[string]string{driver.DeviceGroupAttribute: p.IOMMUGroup, "vendorDevice": p.ID()},
		}, why: why, group: p.IOMMUGroup})
	}
}

// describeStat is a stat error without the path, which the caller names.
func describeStat(err error) string {
	if errors.Is(err, os.ErrNotExist) {
		return "no such device node"
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// List implements driver.Device. An unknown resource has no devices.
func (d *Driver) List(_ context.Context, resource string) ([]*devicev1.HostDevice, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.scanLocked().list(resource), nil
}

// Watch implements driver.DeviceWatcher: the list at once, then again whenever it changes, seen
// through fsnotify on the device directories and a poll, until ctx is done.
func (d *Driver) Watch(ctx context.Context, resource string, send func([]*devicev1.HostDevice) error) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return status.Errorf(codes.Internal, "watch device directories: %v", err)
	}
	defer w.Close()
	d.mu.Lock()
	poll, dirs := d.cfg.poll, d.cfg.watchDirs()
	d.mu.Unlock()
	addWatches := func() {
		for _, dir := range dirs {
			if !slices.Contains(w.WatchList(), dir) {
				_ = w.Add(dir) // missing now: tried again at the next poll
			}
		}
	}
	addWatches()
	ticker := time.NewTicker(poll)
	defer ticker.Stop()
	send = driver.ChangedDevices(send)
	for {
		d.mu.Lock()
		devs, changed := d.scanLocked().list(resource), d.changed
		d.mu.Unlock()
		if err := send(devs); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			d.mu.Lock()
			poll, dirs = d.cfg.poll, d.cfg.watchDirs()
			d.mu.Unlock()
			ticker.Reset(poll)
			addWatches()
		case <-w.Events:
		case err := <-w.Errors:
			d.log.Debug("fsnotify", "error", err)
		case <-ticker.C:
			addWatches()
		}
	}
}

// watchDirs are the directories whose changes may change health.
func (s settings) watchDirs() []string {
	var dirs []string
	add := func(p string) {
		if !slices.Contains(dirs, p) {
			dirs = append(dirs, p)
		}
	}
	for _, c := range s.chars {
		add(filepath.Join(s.devRoot, filepath.Dir(c.Path)))
	}
	if len(s.pci) > 0 {
		add(filepath.Join(s.devRoot, vfioDir))
	}
	return dirs
}

// Allocate implements driver.Device. It reads the host again first, so that a device that went
// away since the last List is refused: NotFound naming the ids it does not know,
// FailedPrecondition naming the unhealthy ones and why.
func (d *Driver) Allocate(_ context.Context, req *devicev1.AllocateRequest) (*devicev1.AllocateResponse, error) {
	resource := req.GetResource()
	d.mu.Lock()
	defer d.mu.Unlock()
	resources := d.cfg.resources()
	if !slices.Contains(resources, resource) {
		return nil, status.Errorf(codes.NotFound, "no resource %q (this driver offers %s)", resource, strings.Join(resources, ", "))
	}
	ids := slices.Compact(slices.Sorted(slices.Values(req.GetDeviceIds())))
	if len(ids) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "resource %s: device_ids: required", resource)
	}
	byID := map[string]device{}
	for _, dev := range d.scanLocked().devs {
		if dev.dev.GetResource() == resource {
			byID[dev.dev.GetId()] = dev
		}
	}
	var unknown, unhealthy []string
	for _, id := range ids {
		dev, ok := byID[id]
		switch {
		case !ok:
			unknown = append(unknown, strconv.Quote(id))
		case dev.dev.GetHealth() != basev1.Health_HEALTH_HEALTHY:
			unhealthy = append(unhealthy, fmt.Sprintf("%q (%s)", id, dev.why))
		}
	}
	if len(unknown) > 0 {
		return nil, status.Errorf(codes.NotFound, "resource %s: no device %s", resource, strings.Join(unknown, ", "))
	}
	if len(unhealthy) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "resource %s: unhealthy device %s", resource, strings.Join(unhealthy, ", "))
	}
	for _, c := range d.cfg.chars {
		if c.ResourceName == resource {
			// The node once, however many slots the container asked for. The paths are the
			// host's, inside and outside the container, whatever devRoot the driver reads.
			return &devicev1.AllocateResponse{DeviceNodes: []*devicev1.DeviceNode{{
				HostPath: c.Path, ContainerPath: c.Path, Permissions: c.Permissions,
			}}}, nil
		}
	}
	// VFIO: the container node and each group node once; the addresses say which functions
	// of the groups are the VM's, since a group node alone does not.
	resp := &devicev1.AllocateResponse{
		DeviceNodes:  []*devicev1.DeviceNode{{HostPath: vfioContainer, ContainerPath: vfioContainer, Permissions: "rw"}},
		Env:          map[string]string{PCIResourceEnvVar(v1alpha1.DeviceResourcePrefix + resource): strings.Join(ids, ",")},
		PciAddresses: ids,
	}
	var groups []string
	for _, id := range ids {
		if g := byID[id].group; !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	slices.Sort(groups)
	for _, g := range groups {
		p := filepath.Join(vfioDir, g)
		resp.DeviceNodes = append(resp.DeviceNodes, &devicev1.DeviceNode{HostPath: p, ContainerPath: p, Permissions: "rw"})
	}
	return resp, nil
}
