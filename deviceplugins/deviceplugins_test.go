package deviceplugins

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/drivers/fake"
	"github.com/kubevisor/kubevisor/drivers/hostdev/hostdevtest"
)

const pciResource = "devices.kubevisor.io/pci-10de-1eb8"

// plugins returns the manager's plugins by resource, each with the driver's first list.
func plugins(t *testing.T, m *Manager) map[string]*Plugin {
	t.Helper()
	out := map[string]*Plugin{}
	for _, p := range m.Plugins() {
		p.listOnce(t.Context())
		out[p.ResourceName()] = p
	}
	return out
}

func TestAllocate(t *testing.T) {
	h := hostdevtest.New(t)
	ps := plugins(t, newManager(t, h, pluginDir(t), "1h"))
	if got := slices.Sorted(func(yield func(string) bool) {
		for k := range ps {
			yield(k)
		}
	}); !slices.Equal(got, []string{v1alpha1.KVMDeviceResource, pciResource, v1alpha1.SEVDeviceResource, v1alpha1.TunDeviceResource, v1alpha1.VhostNetDeviceResource}) {
		t.Fatalf("plugins %v", got)
	}
	ctx := context.Background()
	allocate := func(resource string, ids ...[]string) (*pluginapi.AllocateResponse, error) {
		req := &pluginapi.AllocateRequest{}
		for _, c := range ids {
			req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: c})
		}
		return ps[resource].Allocate(ctx, req)
	}

	t.Run("char devices", func(t *testing.T) {
		for resource, spec := range map[string]*pluginapi.DeviceSpec{
			v1alpha1.KVMDeviceResource:      {HostPath: "/dev/kvm", ContainerPath: "/dev/kvm", Permissions: "rw"},
			v1alpha1.TunDeviceResource:      {HostPath: "/dev/net/tun", ContainerPath: "/dev/net/tun", Permissions: "rw"},
			v1alpha1.VhostNetDeviceResource: {HostPath: "/dev/vhost-net", ContainerPath: "/dev/vhost-net", Permissions: "rw"},
		} {
			ids := ps[resource].Devices()
			if len(ids) != 4 {
				t.Fatalf("%s: %d devices, want 4 slots", resource, len(ids))
			}
			resp, err := allocate(resource, []string{ids[0].ID, ids[3].ID}, []string{ids[1].ID})
			if err != nil {
				t.Fatalf("%s: %v", resource, err)
			}
			if len(resp.ContainerResponses) != 2 {
				t.Fatalf("%s: %d container responses, want 2", resource, len(resp.ContainerResponses))
			}
			for _, cr := range resp.ContainerResponses {
				// Two slots of one node still make one DeviceSpec.
				if len(cr.Devices) != 1 || !proto.Equal(cr.Devices[0], spec) || len(cr.Envs) != 0 {
					t.Errorf("%s: %v, want only %v", resource, cr, spec)
				}
			}
		}
	})

	t.Run("vfio", func(t *testing.T) {
		resp, err := allocate(pciResource, []string{"0000:02:00.0", "0000:01:00.0"}, []string{"0000:02:00.0"})
		if err != nil {
			t.Fatal(err)
		}
		spec := func(p string) *pluginapi.DeviceSpec {
			return &pluginapi.DeviceSpec{HostPath: p, ContainerPath: p, Permissions: "rw"}
		}
		want := []*pluginapi.ContainerAllocateResponse{
			{
				Devices: []*pluginapi.DeviceSpec{spec("/dev/vfio/vfio"), spec("/dev/vfio/12"), spec("/dev/vfio/13")},
				Envs:    map[string]string{"PCI_RESOURCE_DEVICES_KUBEVISOR_IO_PCI_10DE_1EB8": "0000:01:00.0,0000:02:00.0"},
			},
			{
				Devices: []*pluginapi.DeviceSpec{spec("/dev/vfio/vfio"), spec("/dev/vfio/13")},
				Envs:    map[string]string{"PCI_RESOURCE_DEVICES_KUBEVISOR_IO_PCI_10DE_1EB8": "0000:02:00.0"},
			},
		}
		for i, cr := range resp.ContainerResponses {
			if !proto.Equal(cr, want[i]) {
				t.Errorf("container %d:\n%v\nwant\n%v", i, cr, want[i])
			}
		}
		if devs := ps[pciResource].Devices(); len(devs) != 2 || devs[0].Topology.GetNodes()[0].GetID() != 0 || devs[1].Topology != nil {
			t.Errorf("devices %v: want 0000:01:00.0 on NUMA node 0, 0000:02:00.0 on none", devs)
		}
	})

	t.Run("unknown IDs", func(t *testing.T) {
		// The function bound to another driver and the one with another ID were never listed.
		_, err := allocate(pciResource, []string{"0000:01:00.0", "0000:03:00.0", "0000:04:00.0"})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "0000:03:00.0, 0000:04:00.0") {
			t.Errorf("err = %v, want InvalidArgument naming 0000:03:00.0 and 0000:04:00.0", err)
		}
		_, err = allocate(v1alpha1.KVMDeviceResource, []string{"kvm-0"}, []string{"kvm-99"})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "kvm-99") {
			t.Errorf("err = %v, want InvalidArgument naming kvm-99", err)
		}
	})

	t.Run("unhealthy", func(t *testing.T) {
		h.Remove(t, "/dev/vfio/12")
		ps[pciResource].listOnce(ctx)
		_, err := allocate(pciResource, []string{"0000:01:00.0"})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "0000:01:00.0") {
			t.Errorf("err = %v, want FailedPrecondition naming 0000:01:00.0", err)
		}
	})

	t.Run("the driver refuses", func(t *testing.T) {
		// Gone since the plugin's last list: the driver reads the host again and refuses,
		// and its code and words reach the kubelet.
		h.Remove(t, "/dev/kvm")
		_, err := allocate(v1alpha1.KVMDeviceResource, []string{"kvm-1"})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `device driver hostdev: allocate kvm-1: resource kvm: unhealthy device "kvm-1" (/dev/kvm: no such device node)`) {
			t.Errorf("err = %v, want the driver's FailedPrecondition naming kvm-1", err)
		}
	})
}

func TestPreferredAllocationKeepsIOMMUGroupsTogether(t *testing.T) {
	h := hostdevtest.New(t)
	// Group 12 gets a second function; group 20 has three.
	h.AddPCI(t, hostdevtest.PCI{Addr: "0000:01:00.1", Vendor: "0x10de", Device: "0x1eb8", Driver: "vfio-pci", Group: "12", NUMA: "0"})
	for _, a := range []string{"0000:06:00.0", "0000:06:00.1", "0000:06:00.2"} {
		h.AddPCI(t, hostdevtest.PCI{Addr: a, Vendor: "0x10de", Device: "0x1eb8", Driver: "vfio-pci", Group: "20", NUMA: "0"})
	}
	h.Touch(t, "/dev/vfio/20")
	p := plugins(t, newManager(t, h, pluginDir(t), "1h"))[pciResource]
	if opts, _ := p.GetDevicePluginOptions(context.Background(), &pluginapi.Empty{}); !opts.GetPreferredAllocationAvailable {
		t.Errorf("options %v: want GetPreferredAllocationAvailable", opts)
	}
	all := []string{"0000:01:00.0", "0000:01:00.1", "0000:02:00.0", "0000:06:00.0", "0000:06:00.1", "0000:06:00.2"}
	for _, c := range []struct {
		name        string
		available   []string
		mustInclude []string
		size        int
		want        []string
	}{
		{"one: the single-function group", all, nil, 1, []string{"0000:02:00.0"}},
		{"two: a whole group of two", all, nil, 2, []string{"0000:01:00.0", "0000:01:00.1"}},
		{"three: the group of three", all, nil, 3, []string{"0000:06:00.0", "0000:06:00.1", "0000:06:00.2"}},
		{"group-mates of a must-include", all, []string{"0000:06:00.1"}, 3, []string{"0000:06:00.1", "0000:06:00.0", "0000:06:00.2"}},
		{"must-include, then by address", all, []string{"0000:02:00.0"}, 2, []string{"0000:02:00.0", "0000:01:00.0"}},
		{"a group half in use comes last", slices.DeleteFunc(slices.Clone(all), func(s string) bool { return s == "0000:01:00.1" }), nil, 1, []string{"0000:02:00.0"}},
	} {
		resp, err := p.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{
			ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: c.available, MustIncludeDeviceIDs: c.mustInclude, AllocationSize: int32(c.size)}},
		})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := resp.ContainerResponses[0].DeviceIDs; !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// watchList follows a plugin's ListAndWatch as the kubelet does.
func watchList(t *testing.T, ctx context.Context, k *fakeKubelet, endpoint, resource string) func() []*pluginapi.Device {
	s, err := k.client(t, endpoint).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	return func() []*pluginapi.Device {
		t.Helper()
		type result struct {
			r   *pluginapi.ListAndWatchResponse
			err error
		}
		ch := make(chan result, 1)
		go func() { r, err := s.Recv(); ch <- result{r, err} }()
		select {
		case res := <-ch:
			if res.err != nil {
				t.Fatalf("%s: ListAndWatch: %v", resource, res.err)
			}
			return res.r.Devices
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no ListAndWatch update within 5s", resource)
			return nil
		}
	}
}

func healthOf(devs []*pluginapi.Device) map[string]string {
	m := map[string]string{}
	for _, d := range devs {
		m[d.ID] = d.Health
	}
	return m
}

func allHealth(devs []*pluginapi.Device) []string {
	var hs []string
	for _, d := range devs {
		if !slices.Contains(hs, d.Health) {
			hs = append(hs, d.Health)
		}
	}
	return hs
}

// TestHealthFollowsDeviceNodes runs the plugins behind a fake kubelet and watches
// ListAndWatch as device nodes disappear and come back. The driver's poll interval and the
// plugins' are an hour, so the changes must arrive through the driver's Watch (its fsnotify).
func TestHealthFollowsDeviceNodes(t *testing.T) {
	h := hostdevtest.New(t)
	dir := pluginDir(t)
	k := startFakeKubelet(t, dir)
	runManager(t, newManager(t, h, dir, "1h"))
	regs := k.registrations(t, 5, 10*time.Second)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, c := range []struct{ resource, path string }{
		{v1alpha1.KVMDeviceResource, "/dev/kvm"},
		{v1alpha1.TunDeviceResource, "/dev/net/tun"},
	} {
		next := watchList(t, ctx, k, regs[c.resource].Endpoint, c.resource)
		if devs := next(); len(devs) != 4 || !slices.Equal(allHealth(devs), []string{pluginapi.Healthy}) {
			t.Fatalf("%s: first list %v, want 4 healthy slots", c.resource, devs)
		}
		h.Remove(t, c.path)
		if devs := next(); len(devs) != 4 || !slices.Equal(allHealth(devs), []string{pluginapi.Unhealthy}) {
			t.Fatalf("%s: after removing %s: %v, want 4 unhealthy slots", c.resource, c.path, devs)
		}
		h.Touch(t, c.path)
		if devs := next(); len(devs) != 4 || !slices.Equal(allHealth(devs), []string{pluginapi.Healthy}) {
			t.Fatalf("%s: after restoring %s: %v, want 4 healthy slots", c.resource, c.path, devs)
		}
	}

	next := watchList(t, ctx, k, regs[pciResource].Endpoint, pciResource)
	assertHealth := func(when string, got map[string]string, want map[string]string) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %v, want %v", when, got, want)
		}
		for id, h := range want {
			if got[id] != h {
				t.Fatalf("%s: %v, want %v", when, got, want)
			}
		}
	}
	assertHealth("first list", healthOf(next()), map[string]string{"0000:01:00.0": pluginapi.Healthy, "0000:02:00.0": pluginapi.Healthy})
	h.Remove(t, "/dev/vfio/13")
	assertHealth("group 13 node removed", healthOf(next()), map[string]string{"0000:01:00.0": pluginapi.Healthy, "0000:02:00.0": pluginapi.Unhealthy})
	h.Touch(t, "/dev/vfio/13")
	assertHealth("group 13 node restored", healthOf(next()), map[string]string{"0000:01:00.0": pluginapi.Healthy, "0000:02:00.0": pluginapi.Healthy})
}

// TestHealthFollowsSysfsBinding: inotify does not see sysfs, so driver rebinding reaches the
// kubelet through the driver's poll.
func TestHealthFollowsSysfsBinding(t *testing.T) {
	h := hostdevtest.New(t)
	dir := pluginDir(t)
	k := startFakeKubelet(t, dir)
	runManager(t, newManager(t, h, dir, "100ms"))
	regs := k.registrations(t, 5, 10*time.Second)
	s, err := k.client(t, regs[pciResource].Endpoint).ListAndWatch(t.Context(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := s.Recv(); err != nil || len(r.Devices) != 2 {
		t.Fatalf("first list %v, %v; want 2 devices", r, err)
	}
	// Binding the function that had another driver adds it; unbinding one marks it Unhealthy.
	h.Rebind(t, "0000:03:00.0", "vfio-pci")
	h.Rebind(t, "0000:01:00.0", "nvidia")
	want := []*pluginapi.Device{
		{ID: "0000:01:00.0", Health: pluginapi.Unhealthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 0}}}},
		{ID: "0000:02:00.0", Health: pluginapi.Healthy},
		{ID: "0000:03:00.0", Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 0}}}},
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if slices.EqualFunc(r.Devices, want, func(a, b *pluginapi.Device) bool { return proto.Equal(a, b) }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("last list %v, want %v", r.Devices, want)
		}
	}
}

// TestRegistrationAndKubeletRestart plays the kubelet: it takes the registrations, dials each
// plugin back, lists and allocates; then it "restarts" as the kubelet does, deleting every
// socket in the directory before serving kubelet.sock again, and expects each plugin to serve
// again and register once more within a few seconds.
func TestRegistrationAndKubeletRestart(t *testing.T) {
	h := hostdevtest.New(t)
	dir := pluginDir(t)
	k := startFakeKubelet(t, dir)
	m := runManager(t, newManager(t, h, dir, "1h"))

	check := func(when string, regs map[string]*pluginapi.RegisterRequest) {
		t.Helper()
		for _, p := range m.Plugins() {
			r := regs[p.ResourceName()]
			if r == nil {
				t.Fatalf("%s: %s did not register", when, p.ResourceName())
			}
			if r.Version != pluginapi.Version || r.Endpoint != filepath.Base(p.SocketPath()) || strings.Contains(r.Endpoint, "/") {
				t.Errorf("%s: register request %v, want version %s and endpoint %s", when, r, pluginapi.Version, filepath.Base(p.SocketPath()))
			}
			if fi, err := os.Stat(filepath.Join(dir, r.Endpoint)); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != socketPermissions {
				t.Errorf("%s: endpoint %s: %v, %v; want a socket with mode %o", when, r.Endpoint, fi, err, socketPermissions)
			}
			c := k.client(t, r.Endpoint)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			s, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
			if err != nil {
				t.Fatalf("%s: %s: ListAndWatch: %v", when, r.ResourceName, err)
			}
			list, err := s.Recv()
			if err != nil || len(list.Devices) == 0 {
				t.Fatalf("%s: %s: ListAndWatch: %v, %v", when, r.ResourceName, list, err)
			}
			resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{list.Devices[0].ID}}}})
			if err != nil || len(resp.ContainerResponses) != 1 || len(resp.ContainerResponses[0].Devices) == 0 {
				t.Fatalf("%s: %s: Allocate: %v, %v", when, r.ResourceName, resp, err)
			}
			cancel()
		}
	}
	check("first start", k.registrations(t, 5, 10*time.Second))
	waitFor(t, "registrations answered", func() bool {
		for _, p := range m.Plugins() {
			if p.Registrations() != 1 {
				return false
			}
		}
		return true
	})

	// The kubelet restarts: it goes away, and the new one removes every socket before it serves.
	k.stop()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	removed := 0
	for _, e := range entries {
		if e.Type()&os.ModeSocket != 0 {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
			removed++
		}
	}
	if removed != 5 {
		t.Errorf("removed %d sockets, want the 5 plugins' (kubelet.sock is unlinked by its server)", removed)
	}
	time.Sleep(500 * time.Millisecond) // the plugins' first attempts find no kubelet
	start := time.Now()
	k = startFakeKubelet(t, dir)
	regs := k.registrations(t, 5, 5*time.Second)
	t.Logf("re-registered %v after the new kubelet started", time.Since(start).Round(time.Millisecond))
	check("after kubelet restart", regs)

	// One registration per restart: the plugins must not register again for the kubelet.sock
	// they already registered through.
	select {
	case r := <-k.reqs:
		t.Errorf("extra registration %v", r)
	case <-time.After(time.Second):
	}
	for _, p := range m.Plugins() {
		if n := p.Registrations(); n != 2 {
			t.Errorf("%s: %d registrations, want 2", p.ResourceName(), n)
		}
	}
}

// TestKubeletSocketRecreated covers a kubelet that restarts without deleting the plugin's
// socket: the new kubelet.sock alone must bring a new registration.
func TestKubeletSocketRecreated(t *testing.T) {
	dir := pluginDir(t)
	k := startFakeKubelet(t, dir)
	m, err := NewManager(t.Context(), testConfig(dir, time.Hour), []Source{{Name: "fake", Device: kvmOnly(t)}}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	p := runManager(t, m).Plugins()[0]
	k.registrations(t, 1, 10*time.Second)
	// Wait for the plugin to hear the answer, lest the restart below cut it off and the
	// plugin retry for that reason instead.
	waitFor(t, "first registration answered", func() bool { return p.Registrations() == 1 })
	k.stop()
	k = startFakeKubelet(t, dir)
	regs := k.registrations(t, 1, 5*time.Second)
	if regs[p.ResourceName()] == nil {
		t.Errorf("registrations %v, want %s", regs, p.ResourceName())
	}
	waitFor(t, "second registration answered", func() bool { return p.Registrations() == 2 })
}

func TestNewManager(t *testing.T) {
	h := hostdevtest.New(t)
	hd := hostdevSource(t, h.Config(t, "1h", 1))
	// Two drivers declaring one resource.
	_, err := NewManager(t.Context(), testConfig(pluginDir(t), time.Hour), []Source{hd, {Name: "fake", Device: fake.NewDevice()}}, nil)
	if err == nil || !strings.Contains(err.Error(), `resource "kvm": declared by device drivers "hostdev" and "fake"`) {
		t.Errorf("NewManager(two kvm drivers) = %v, want an error naming both", err)
	}
	_, err = NewManager(t.Context(), testConfig(pluginDir(t), time.Hour), nil, nil)
	if err == nil || !strings.Contains(err.Error(), "no device driver declares a resource") {
		t.Errorf("NewManager(no drivers) = %v", err)
	}
	_, err = NewManager(t.Context(), Config{PluginDir: "relative"}, []Source{hd}, nil)
	if err == nil || !strings.Contains(err.Error(), `pluginDir "relative"`) {
		t.Errorf("NewManager(relative dir) = %v", err)
	}
	if got := socketName("devices.kubevisor.io/vhost-net"); got != "kubevisor-devices.kubevisor.io_vhost-net.sock" {
		t.Errorf("socketName = %s", got)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestUnionOfDeviceDrivers: with several device drivers the plugins serve the union of their
// resources, each plugin listing and allocating through the driver that declares its resource.
func TestUnionOfDeviceDrivers(t *testing.T) {
	h := hostdevtest.New(t)
	sim := fake.NewDevice()
	if err := sim.Configure(t.Context(), &basev1.ConfigureRequest{Config: []byte(`{"count": 3, "resources": ["example-sim"]}`)}); err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(t.Context(), testConfig(pluginDir(t), time.Hour),
		[]Source{hostdevSource(t, h.Config(t, "1h", 2, "10de:1eb8=pci-10de-1eb8")), {Name: "sim", Device: sim}}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ps := plugins(t, m)
	got := slices.Sorted(maps.Keys(ps))
	want := []string{"devices.kubevisor.io/example-sim", v1alpha1.KVMDeviceResource, pciResource, v1alpha1.SEVDeviceResource, v1alpha1.TunDeviceResource, v1alpha1.VhostNetDeviceResource}
	if !slices.Equal(got, want) {
		t.Fatalf("plugins %v, want %v", got, want)
	}
	if n := len(ps["devices.kubevisor.io/example-sim"].Devices()); n != 3 {
		t.Errorf("example-sim: %d devices, want the sim driver's 3", n)
	}
	if n := len(ps[v1alpha1.KVMDeviceResource].Devices()); n != 2 {
		t.Errorf("kvm: %d devices, want hostdev's 2 slots", n)
	}
	resp, err := ps["devices.kubevisor.io/example-sim"].Allocate(t.Context(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"example-sim-2"}}}})
	if err != nil || resp.ContainerResponses[0].Envs["KUBEVISOR_FAKE_EXAMPLE_SIM"] != "example-sim-2" {
		t.Errorf("Allocate(example-sim-2) = %v, %v; want the sim driver's answer", resp, err)
	}
	resp, err = ps[v1alpha1.KVMDeviceResource].Allocate(t.Context(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{ps[v1alpha1.KVMDeviceResource].Devices()[0].ID}}}})
	if err != nil || resp.ContainerResponses[0].Devices[0].HostPath != "/dev/kvm" {
		t.Errorf("Allocate(kvm) = %v, %v; want hostdev's /dev/kvm", resp, err)
	}
}
