package hostdev_test

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
	"github.com/kubevisor/kubevisor/drivers/hostdev"
	"github.com/kubevisor/kubevisor/drivers/hostdev/hostdevtest"
)

func TestDiscoverPCIDevices(t *testing.T) {
	h := hostdevtest.New(t)
	devs, err := hostdev.DiscoverPCIDevices(h.SysRoot)
	if err != nil {
		t.Fatal(err)
	}
	want := []hostdev.PCIDevice{
		{Address: "0000:01:00.0", Vendor: "10de", Device: "1eb8", Driver: "vfio-pci", IOMMUGroup: "12", NUMANode: 0},
		{Address: "0000:02:00.0", Vendor: "10de", Device: "1eb8", Driver: "vfio-pci", IOMMUGroup: "13", NUMANode: -1},
		{Address: "0000:03:00.0", Vendor: "10de", Device: "1eb8", Driver: "nvidia", IOMMUGroup: "14", NUMANode: 0},
		{Address: "0000:04:00.0", Vendor: "8086", Device: "1572", Driver: "vfio-pci", IOMMUGroup: "15", NUMANode: 1},
		{Address: "0000:05:00.0", Vendor: "10de", Device: "1eb8", Driver: "", IOMMUGroup: "16", NUMANode: 0},
	}
	if !slices.Equal(devs, want) {
		t.Errorf("DiscoverPCIDevices =\n%+v\nwant\n%+v", devs, want)
	}
	if devs, err := hostdev.DiscoverPCIDevices(filepath.Join(h.SysRoot, "missing")); err != nil || devs != nil {
		t.Errorf("no sysfs: %v, %v; want nothing, no error", devs, err)
	}
}

// syncBuffer is a log sink tests read while the driver writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newDriver(t *testing.T, config []byte) (*hostdev.Driver, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	d := hostdev.New(hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug}))
	if err := d.Configure(t.Context(), &basev1.ConfigureRequest{Config: config}); err != nil {
		t.Fatalf("Configure(%s): %v", config, err)
	}
	return d, logs
}

// short describes a list as id=health, sorted.
func short(devs []*devicev1.HostDevice) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.GetResource()+"/"+d.GetId()+"="+strings.TrimPrefix(d.GetHealth().String(), "HEALTH_"))
	}
	slices.Sort(out)
	return out
}

func list(t *testing.T, d *hostdev.Driver, resource string) []*devicev1.HostDevice {
	t.Helper()
	devs, err := d.List(t.Context(), resource)
	if err != nil {
		t.Fatal(err)
	}
	return devs
}

func TestListSelectsVFIOBoundFunctions(t *testing.T) {
	h := hostdevtest.New(t)
	h.Remove(t, "/dev/sev")
	d, _ := newDriver(t, h.Config(t, "1h", 2, "10de:1eb8=gpu", "8086:1572=devices.kubevisor.io/nic"))
	caps, _ := d.Capabilities(t.Context())
	if want := []string{"kvm", "tun", "vhost-net", "sev", "gpu", "nic"}; !slices.Equal(caps.GetResources(), want) {
		t.Errorf("resources %v, want %v", caps.GetResources(), want)
	}
	want := []string{
		"gpu/0000:01:00.0=HEALTHY", "gpu/0000:02:00.0=HEALTHY",
		"kvm/kvm-0=HEALTHY", "kvm/kvm-1=HEALTHY",
		"nic/0000:04:00.0=HEALTHY",
		"sev/sev-0=UNHEALTHY", "sev/sev-1=UNHEALTHY",
		"tun/tun-0=HEALTHY", "tun/tun-1=HEALTHY",
		"vhost-net/vhost-net-0=HEALTHY", "vhost-net/vhost-net-1=HEALTHY",
	}
	if got := short(list(t, d, "")); !slices.Equal(got, want) {
		t.Errorf("List =\n%v\nwant\n%v", got, want)
	}
	gpus := list(t, d, "gpu")
	wantGPU := &devicev1.HostDevice{Id: "0000:01:00.0", Resource: "gpu", Health: basev1.Health_HEALTH_HEALTHY,
		PciAddress: "0000:01:00.0", NumaNode: 0, Attributes: map[string]string{"group": "12", "vendorDevice": "10de:1eb8"}}
	if !proto.Equal(gpus[0], wantGPU) {
		t.Errorf("List(gpu)[0] = %v, want %v", gpus[0], wantGPU)
	}
	if gpus[1].GetNumaNode() != -1 {
		t.Errorf("unknown NUMA node reads %d, want -1", gpus[1].GetNumaNode())
	}

	// Unbound from vfio-pci, its group node gone, or its group held by a host driver:
	// listed, but Unhealthy.
	h.Rebind(t, "0000:01:00.0", "nvidia")
	h.Remove(t, "/dev/vfio/13")
	h.AddPCI(t, hostdevtest.PCI{Addr: "0000:04:00.1", Vendor: "0x8086", Device: "0x0001", Driver: "e1000e", Group: "15", NUMA: "1"})
	want = []string{"gpu/0000:01:00.0=UNHEALTHY", "gpu/0000:02:00.0=UNHEALTHY", "nic/0000:04:00.0=UNHEALTHY"}
	if got := short(append(list(t, d, "gpu"), list(t, d, "nic")...)); !slices.Equal(got, want) {
		t.Errorf("after unbinding: %v, want %v", got, want)
	}
	_, err := d.Allocate(t.Context(), &devicev1.AllocateRequest{Resource: "nic", DeviceIds: []string{"0000:04:00.0"}})
	expectCode(t, err, codes.FailedPrecondition, `"0000:04:00.0" (IOMMU group 15 is not viable: 0000:04:00.1 is bound to e1000e)`)
	_, err = d.Allocate(t.Context(), &devicev1.AllocateRequest{Resource: "gpu", DeviceIds: []string{"0000:01:00.0", "0000:02:00.0"}})
	expectCode(t, err, codes.FailedPrecondition, `"0000:01:00.0" (no longer bound to vfio-pci), "0000:02:00.0" (IOMMU group 13: /dev/vfio/13: no such device node)`)
}

func expectCode(t *testing.T, err error, code codes.Code, contains string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), contains) {
		t.Errorf("error %v, want %s containing %q", err, code, contains)
	}
}

func TestAllocate(t *testing.T) {
	h := hostdevtest.New(t)
	h.Remove(t, "/dev/sev")
	d, _ := newDriver(t, h.Config(t, "1h", 4, "10de:1eb8=gpu"))
	ctx := t.Context()
	alloc := func(resource string, ids ...string) (*devicev1.AllocateResponse, error) {
		return d.Allocate(ctx, &devicev1.AllocateRequest{Resource: resource, DeviceIds: ids})
	}

	resp, err := alloc("kvm", "kvm-3", "kvm-0")
	if err != nil {
		t.Fatal(err)
	}
	want := &devicev1.AllocateResponse{DeviceNodes: []*devicev1.DeviceNode{{HostPath: "/dev/kvm", ContainerPath: "/dev/kvm", Permissions: "rw"}}}
	if !proto.Equal(resp, want) {
		t.Errorf("Allocate(kvm) = %v, want %v (two slots, one node, the host's path)", resp, want)
	}

	resp, err = alloc("gpu", "0000:02:00.0", "0000:01:00.0")
	if err != nil {
		t.Fatal(err)
	}
	node := func(p string) *devicev1.DeviceNode {
		return &devicev1.DeviceNode{HostPath: p, ContainerPath: p, Permissions: "rw"}
	}
	want = &devicev1.AllocateResponse{
		DeviceNodes:  []*devicev1.DeviceNode{node("/dev/vfio/vfio"), node("/dev/vfio/12"), node("/dev/vfio/13")},
		Env:          map[string]string{"PCI_RESOURCE_DEVICES_KUBEVISOR_IO_GPU": "0000:01:00.0,0000:02:00.0"},
		PciAddresses: []string{"0000:01:00.0", "0000:02:00.0"},
	}
	if !proto.Equal(resp, want) {
		t.Errorf("Allocate(gpu) =\n%v\nwant\n%v", resp, want)
	}

	// Functions never listed (bound to another driver, no driver, another ID) are unknown.
	_, err = alloc("gpu", "0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:04:00.0")
	expectCode(t, err, codes.NotFound, `resource gpu: no device "0000:03:00.0", "0000:04:00.0", "0000:05:00.0"`)
	_, err = alloc("kvm", "kvm-4")
	expectCode(t, err, codes.NotFound, `"kvm-4"`)
	_, err = alloc("kvm", "tun-0")
	expectCode(t, err, codes.NotFound, `"tun-0"`)
	_, err = alloc("sev", "sev-0")
	expectCode(t, err, codes.FailedPrecondition, `resource sev: unhealthy device "sev-0" (/dev/sev: no such device node)`)
	_, err = alloc("nic", "0000:04:00.0")
	expectCode(t, err, codes.NotFound, `no resource "nic"`)
	_, err = alloc("kvm")
	expectCode(t, err, codes.InvalidArgument, "device_ids")

	// A node gone since the last List is refused at once: Allocate reads the host again.
	h.Remove(t, "/dev/kvm")
	_, err = alloc("kvm", "kvm-0")
	expectCode(t, err, codes.FailedPrecondition, `"kvm-0" (/dev/kvm: no such device node)`)
}

// TestPermittedEntryWithoutDevice: an entry selecting nothing is named in the fingerprint and the
// logs, and the fingerprint turns healthy once a function is bound.
func TestPermittedEntryWithoutDevice(t *testing.T) {
	h := hostdevtest.New(t)
	d, logs := newDriver(t, h.Config(t, "50ms", 1, "10de:1eb8=gpu", "1af4:1041=virtio-net", "8086:1572=nic"))
	h.Rebind(t, "0000:01:00.0", "nvidia")
	h.Rebind(t, "0000:02:00.0", "nouveau")

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	fps := make(chan *basev1.FingerprintResponse, 16)
	go func() {
		_ = d.Fingerprint(ctx, func(fp *basev1.FingerprintResponse) error { fps <- fp; return nil })
	}()
	fp := <-fps
	if fp.GetHealth() != basev1.Health_HEALTH_DEGRADED {
		t.Errorf("fingerprint %v, want DEGRADED", fp)
	}
	for _, want := range []string{
		"permittedHostDevices.pciHostDevices[0] (10de:1eb8, resource gpu): no function is bound to vfio-pci: 0000:01:00.0 (nvidia), 0000:02:00.0 (nouveau), 0000:03:00.0 (nvidia), 0000:05:00.0 (no driver)",
		"permittedHostDevices.pciHostDevices[1] (1af4:1041, resource virtio-net): no PCI function 1af4:1041 on this node",
	} {
		if !strings.Contains(fp.GetHealthDescription(), want) {
			t.Errorf("fingerprint description %q does not say %q", fp.GetHealthDescription(), want)
		}
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs do not say %q:\n%s", want, logs)
		}
	}
	if strings.Contains(fp.GetHealthDescription(), "[2]") {
		t.Errorf("fingerprint names entry 2, which selects 0000:04:00.0: %q", fp.GetHealthDescription())
	}

	h.Rebind(t, "0000:01:00.0", "vfio-pci")
	deadline := time.After(10 * time.Second)
	for {
		select {
		case fp = <-fps:
		case <-deadline:
			t.Fatalf("fingerprint still %v", fp)
		}
		if !strings.Contains(fp.GetHealthDescription(), "[0]") {
			break
		}
	}
	if fp.GetHealth() != basev1.Health_HEALTH_DEGRADED || !strings.Contains(fp.GetHealthDescription(), "[1]") {
		t.Errorf("after binding 0000:01:00.0: %v, want DEGRADED for entry 1 only", fp)
	}
}

// TestWatchFollowsDeviceNodes: with an hour's poll, a device node's removal and return reach
// Watch through fsnotify; a sysfs rebinding (which inotify does not see) through the poll.
func TestWatchFollowsDeviceNodes(t *testing.T) {
	h := hostdevtest.New(t)
	for _, c := range []struct {
		name, poll string
		change     func()
		resource   string
		want       []string
	}{
		{"node removed", "1h", func() { h.Remove(t, "/dev/kvm") }, "kvm", []string{"kvm/kvm-0=UNHEALTHY", "kvm/kvm-1=UNHEALTHY"}},
		{"node back", "1h", func() { h.Touch(t, "/dev/kvm") }, "kvm", []string{"kvm/kvm-0=HEALTHY", "kvm/kvm-1=HEALTHY"}},
		{"group node removed", "1h", func() { h.Remove(t, "/dev/vfio/12") }, "gpu", []string{"gpu/0000:01:00.0=UNHEALTHY", "gpu/0000:02:00.0=HEALTHY"}},
		{"sysfs rebinding", "100ms", func() { h.Rebind(t, "0000:02:00.0", "nvidia") }, "gpu", []string{"gpu/0000:01:00.0=UNHEALTHY", "gpu/0000:02:00.0=UNHEALTHY"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, _ := newDriver(t, h.Config(t, c.poll, 2, "10de:1eb8=gpu"))
			ctx, cancel := context.WithCancel(t.Context())
			lists := make(chan []*devicev1.HostDevice, 16)
			done := make(chan error, 1)
			go func() {
				done <- d.Watch(ctx, c.resource, func(l []*devicev1.HostDevice) error { lists <- l; return nil })
			}()
			first := <-lists
			c.change()
			select {
			case l := <-lists:
				if got := short(l); !slices.Equal(got, c.want) {
					t.Errorf("after the change Watch sent %v, want %v (first %v)", got, c.want, short(first))
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("Watch sent nothing within 5s of the change (first %v)", short(first))
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Watch after cancel: %v", err)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []struct{ config, want string }{
		{`{"mediatedDevices": []}`, `unknown field "mediatedDevices"`},
		{`{"permittedHostDevices": {"usb": []}}`, `unknown field "usb"`},
		{`{"permittedHostDevices": {"pciHostDevices": [{"pciVendorSelector": "10de", "resourceName": "gpu"}]}}`, `config.permittedHostDevices.pciHostDevices[0].pciVendorSelector: Invalid value: "10de": want vendor:device`},
		{`{"permittedHostDevices": {"pciHostDevices": [{"pciVendorSelector": "10de:1eb8"}]}}`, `config.permittedHostDevices.pciHostDevices[0].resourceName: Required value`},
		{`{"permittedHostDevices": {"pciHostDevices": [{"pciVendorSelector": "10de:1eb8", "resourceName": "nvidia.com/T4"}]}}`, `pciHostDevices[0].resourceName: Invalid value: "nvidia.com/T4": the device plugins serve devices.kubevisor.io/<name> only`},
		{`{"permittedHostDevices": {"pciHostDevices": [{"pciVendorSelector": "10de:1eb8", "resourceName": "kvm"}]}}`, `resourceName "kvm": already a character device (config.charDevices[0])`},
		{`{"permittedHostDevices": {"pciHostDevices": [{"pciVendorSelector": "10de:1eb8", "resourceName": "a"}, {"pciVendorSelector": "10DE:1EB8", "resourceName": "b"}]}}`, `pciHostDevices[1].pciVendorSelector: Invalid value: "10DE:1EB8": already selected by config.permittedHostDevices.pciHostDevices[0]`},
		{`{"charDevices": [{"resourceName": "kvm", "path": "dev/kvm"}]}`, `config.charDevices[0].path "dev/kvm": not an absolute path`},
		{`{"charDevices": [{"resourceName": "kvm", "path": "/dev/kvm", "permissions": "rwx"}]}`, `config.charDevices[0].permissions "rwx"`},
		{`{"charDevices": [{"resourceName": "kvm", "path": "/dev/kvm"}, {"resourceName": "kvm", "path": "/dev/kvm2"}]}`, `config.charDevices[1].resourceName "kvm": already used by config.charDevices[0]`},
		{`{"pollInterval": "soon"}`, `config.pollInterval "soon"`},
	} {
		err := hostdev.New(nil).Configure(t.Context(), &basev1.ConfigureRequest{Config: []byte(c.config)})
		expectCode(t, err, codes.InvalidArgument, c.want)
	}
	// Two entries may share a resource; an empty charDevices list means none.
	d, _ := newDriver(t, []byte(`{"charDevices": [], "permittedHostDevices": {"pciHostDevices": [
		{"pciVendorSelector": "10de:1eb8", "resourceName": "gpu"}, {"pciVendorSelector": "10de:1eb9", "resourceName": "gpu"}]}}`))
	if caps, _ := d.Capabilities(t.Context()); !slices.Equal(caps.GetResources(), []string{"gpu"}) {
		t.Errorf("resources %v, want [gpu]", caps.GetResources())
	}
	// An empty configuration is the default character devices.
	d, _ = newDriver(t, nil)
	if caps, _ := d.Capabilities(t.Context()); !slices.Equal(caps.GetResources(), []string{"kvm", "tun", "vhost-net", "sev"}) {
		t.Errorf("default resources %v", caps.GetResources())
	}
}

// watchLists follows Watch of one resource until the test ends.
func watchLists(t *testing.T, d *hostdev.Driver, resource string) <-chan []string {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	lists := make(chan []string, 16)
	done := make(chan error, 1)
	go func() {
		done <- d.Watch(ctx, resource, func(l []*devicev1.HostDevice) error { lists <- short(l); return nil })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch(%s): %v", resource, err)
		}
	})
	return lists
}

func next(t *testing.T, lists <-chan []string, what string) []string {
	t.Helper()
	select {
	case l := <-lists:
		return l
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: Watch sent nothing within 5s", what)
		return nil
	}
}

// TestReconfigurePermittedHostDevices: a configured driver takes a request that changes only
// permittedHostDevices: a PCI resource removed lists nothing (an open Watch of it sends an
// empty list) and is no longer in Capabilities, a new one is listed and allocatable, and a
// resource that stays sends nothing new. Any other change, and a bad selection, are refused
// and leave the configuration as it was.
func TestReconfigurePermittedHostDevices(t *testing.T) {
	h := hostdevtest.New(t)
	gpuConfig := h.Config(t, "1h", 2, "10de:1eb8=gpu")
	d, logs := newDriver(t, gpuConfig)
	resources := func() []string {
		caps, err := d.Capabilities(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return caps.GetResources()
	}
	gpu, nic, kvm := watchLists(t, d, "gpu"), watchLists(t, d, "nic"), watchLists(t, d, "kvm")
	if got := next(t, gpu, "gpu"); !slices.Equal(got, []string{"gpu/0000:01:00.0=HEALTHY", "gpu/0000:02:00.0=HEALTHY"}) {
		t.Errorf("gpu first %v", got)
	}
	if got := next(t, nic, "nic"); len(got) != 0 {
		t.Errorf("nic before it is permitted: %v, want none", got)
	}
	kvmFirst := next(t, kvm, "kvm")
	alloc, err := d.Allocate(t.Context(), &devicev1.AllocateRequest{Resource: "gpu", DeviceIds: []string{"0000:01:00.0"}})
	if err != nil {
		t.Fatal(err)
	}

	// gpu out, nic in.
	nicConfig := h.Config(t, "1h", 2, "8086:1572=devices.kubevisor.io/nic")
	if err := d.Configure(t.Context(), &basev1.ConfigureRequest{Config: nicConfig}); err != nil {
		t.Fatalf("Configure changing only permittedHostDevices: %v", err)
	}
	if got, want := resources(), []string{"kvm", "tun", "vhost-net", "sev", "nic"}; !slices.Equal(got, want) {
		t.Errorf("resources after the change %v, want %v", got, want)
	}
	if got := next(t, gpu, "gpu after removal"); len(got) != 0 {
		t.Errorf("Watch(gpu) after gpu was removed: %v, want an empty list", got)
	}
	if got := next(t, nic, "nic after it was added"); !slices.Equal(got, []string{"nic/0000:04:00.0=HEALTHY"}) {
		t.Errorf("Watch(nic) after nic was added: %v", got)
	}
	select {
	case l := <-kvm:
		t.Errorf("Watch(kvm) sent %v after a change that keeps kvm (first %v): its devices must not be disturbed", l, kvmFirst)
	case <-time.After(300 * time.Millisecond):
	}
	if got := list(t, d, "gpu"); len(got) != 0 {
		t.Errorf("List(gpu) after removal: %v", short(got))
	}
	_, err = d.Allocate(t.Context(), &devicev1.AllocateRequest{Resource: "gpu", DeviceIds: []string{"0000:02:00.0"}})
	expectCode(t, err, codes.NotFound, `no resource "gpu"`)
	if _, err := d.Allocate(t.Context(), &devicev1.AllocateRequest{Resource: "nic", DeviceIds: []string{"0000:04:00.0"}}); err != nil {
		t.Errorf("Allocate of the new resource: %v", err)
	}
	if !strings.Contains(logs.String(), "added=nic") || !strings.Contains(logs.String(), "removed=gpu") {
		t.Errorf("the change is not logged with what it added and removed:\n%s", logs)
	}
	// What was handed out before stays as it was: the driver keeps no allocation, and the
	// answer named the host's paths.
	if len(alloc.GetDeviceNodes()) != 2 || alloc.GetDeviceNodes()[1].GetHostPath() != "/dev/vfio/12" {
		t.Errorf("allocation made before the change: %v", alloc)
	}

	// Refused: any other field, another node or state directory, a bad selection. The
	// configuration stays nic's.
	for _, c := range []struct {
		name string
		req  *basev1.ConfigureRequest
		code codes.Code
		want string
	}{
		{"slots", &basev1.ConfigureRequest{Config: h.Config(t, "1h", 3, "8086:1572=nic")}, codes.FailedPrecondition, "config.charDevices differ"},
		{"poll interval", &basev1.ConfigureRequest{Config: h.Config(t, "1m", 2, "8086:1572=nic")}, codes.FailedPrecondition, "config.pollInterval differ"},
		{"empty", &basev1.ConfigureRequest{}, codes.FailedPrecondition, "config.devRoot, config.sysfsRoot, config.pollInterval, config.charDevices differ"},
		{"node", &basev1.ConfigureRequest{Config: nicConfig, NodeName: "node-2"}, codes.FailedPrecondition, "nodeName differ"},
		{"bad selector", &basev1.ConfigureRequest{Config: h.Config(t, "1h", 2, "8086=nic")}, codes.InvalidArgument, "config.permittedHostDevices.pciHostDevices[0].pciVendorSelector"},
		{"character device's resource", &basev1.ConfigureRequest{Config: h.Config(t, "1h", 2, "8086:1572=kvm")}, codes.InvalidArgument, `resourceName "kvm": already a character device`},
	} {
		err := d.Configure(t.Context(), c.req)
		if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.want) {
			t.Errorf("%s: %v, want %s containing %q", c.name, err, c.code, c.want)
		}
		if got, want := resources(), []string{"kvm", "tun", "vhost-net", "sev", "nic"}; !slices.Equal(got, want) {
			t.Errorf("%s: resources %v after a refused Configure, want %v", c.name, got, want)
		}
	}

	// And back: the same request again changes nothing; gpu returns.
	if err := d.Configure(t.Context(), &basev1.ConfigureRequest{Config: nicConfig}); err != nil {
		t.Errorf("the same request again: %v", err)
	}
	if err := d.Configure(t.Context(), &basev1.ConfigureRequest{Config: gpuConfig}); err != nil {
		t.Fatal(err)
	}
	if got := next(t, gpu, "gpu back"); !slices.Equal(got, []string{"gpu/0000:01:00.0=HEALTHY", "gpu/0000:02:00.0=HEALTHY"}) {
		t.Errorf("Watch(gpu) after gpu came back: %v", got)
	}
	if got := next(t, nic, "nic removed"); len(got) != 0 {
		t.Errorf("Watch(nic) after nic was removed: %v", got)
	}
}
