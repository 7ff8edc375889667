package conformance

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
)

// Device runs the conformance checks of a device driver as subtests of t: the checks of
// every driver, then
//
//	List
//	Allocate/Known, Allocate/Unknown
//	Allocate/Unhealthy                 (when the driver lists an unhealthy device)
//	Watch/SendsAtOnce, Watch/StopsOnCancel   (FEATURE_DEVICE_WATCH)
func Device(t T, f DeviceFactory, opts ...Option) {
	t.Helper()
	s := &deviceSuite{newSuite(t, basev1.Kind_KIND_DEVICE, func(t T) driver.Driver { return nilIfNil(f(t)) }, opts)}
	s.baseChecks(t)
	t.Run("List", s.checkList)
	t.Run("Allocate", func(t T) {
		t.Run("Known", s.checkAllocateKnown)
		t.Run("Unknown", s.checkAllocateUnknown)
		t.Run("Unhealthy", s.checkAllocateUnhealthy)
	})
	t.Run("Watch", func(t T) {
		t.Run("SendsAtOnce", s.checkWatchSendsAtOnce)
		t.Run("StopsOnCancel", s.checkWatchStopsOnCancel)
	})
}

type deviceSuite struct{ *suite }

func (s *deviceSuite) device(t T) (driver.Device, *basev1.Capabilities) {
	t.Helper()
	d := s.driver(t).(driver.Device)
	return d, s.capabilities(t, d)
}

// list returns List of a resource, failing the check if it fails.
func (s *deviceSuite) list(t T, d driver.Device, resource string) []*devicev1.HostDevice {
	t.Helper()
	devs, err := d.List(s.ctx(t), resource)
	if err != nil {
		t.Fatalf("List(%q): %s", resource, describe(err))
	}
	return devs
}

// deviceKey identifies a device in comparisons of lists.
func deviceKey(d *devicev1.HostDevice) string {
	return d.GetResource() + "/" + d.GetId() + "/" + d.GetHealth().String()
}

func deviceKeys(devs []*devicev1.HostDevice) []string {
	keys := make([]string, len(devs))
	for i, d := range devs {
		keys[i] = deviceKey(d)
	}
	slices.Sort(keys)
	return keys
}

// checkList: List of all resources returns devices of declared resources, with unique ids and a
// health; List of one resource returns exactly that resource's devices.
func (s *deviceSuite) checkList(t T) {
	d, caps := s.device(t)
	all := s.list(t, d, "")
	ids := map[string]bool{}
	for _, dev := range all {
		key := dev.GetResource() + "/" + dev.GetId()
		switch {
		case dev.GetId() == "":
			t.Errorf("List returned a device of resource %q without an id", dev.GetResource())
		case ids[key]:
			t.Errorf("List returned device %q of resource %q twice", dev.GetId(), dev.GetResource())
		}
		ids[key] = true
		if !slices.Contains(caps.GetResources(), dev.GetResource()) {
			t.Errorf("List returned device %q of resource %q, which Capabilities do not declare (%v)", dev.GetId(), dev.GetResource(), caps.GetResources())
		}
		if dev.GetHealth() == basev1.Health_HEALTH_UNSPECIFIED {
			t.Errorf("device %q reports no health", dev.GetId())
		}
	}
	var union []*devicev1.HostDevice
	for _, r := range caps.GetResources() {
		devs := s.list(t, d, r)
		for _, dev := range devs {
			if dev.GetResource() != r {
				t.Errorf("List(%q) returned device %q of resource %q", r, dev.GetId(), dev.GetResource())
			}
		}
		union = append(union, devs...)
	}
	if a, b := deviceKeys(all), deviceKeys(union); !slices.Equal(a, b) {
		t.Errorf("List of all resources and the Lists of each differ:\nall:     %v\neach:    %v", a, b)
	}
	if len(all) == 0 {
		t.Logf("note: the driver lists no device")
	}
}

// firstDevice returns the first device of resource that has the given health, or nil.
func firstDevice(devs []*devicev1.HostDevice, health basev1.Health) *devicev1.HostDevice {
	for _, dev := range devs {
		if dev.GetHealth() == health {
			return dev
		}
	}
	return nil
}

// checkAllocateKnown: a healthy device of every resource allocates to something a container
// can use.
func (s *deviceSuite) checkAllocateKnown(t T) {
	d, caps := s.device(t)
	tried := 0
	for _, r := range caps.GetResources() {
		dev := firstDevice(s.list(t, d, r), basev1.Health_HEALTH_HEALTHY)
		if dev == nil {
			t.Logf("resource %s has no healthy device", r)
			continue
		}
		tried++
		resp, err := d.Allocate(s.ctx(t), &devicev1.AllocateRequest{Resource: r, DeviceIds: []string{dev.GetId()}})
		if err != nil {
			t.Errorf("Allocate of healthy device %q of resource %s: %s", dev.GetId(), r, describe(err))
			continue
		}
		if len(resp.GetDeviceNodes())+len(resp.GetMounts())+len(resp.GetEnv())+len(resp.GetPciAddresses()) == 0 {
			t.Errorf("Allocate of device %q of resource %s returned nothing for the container", dev.GetId(), r)
		}
		for _, n := range resp.GetDeviceNodes() {
			if !filepath.IsAbs(n.GetHostPath()) || !filepath.IsAbs(n.GetContainerPath()) {
				t.Errorf("device %q: device node %s -> %s: paths must be absolute", dev.GetId(), n.GetHostPath(), n.GetContainerPath())
			}
			if p := n.GetPermissions(); p == "" || strings.Trim(p, "rwm") != "" {
				t.Errorf("device %q: device node %s: permissions %q are not cgroup device permissions (r, w, m)", dev.GetId(), n.GetHostPath(), p)
			}
		}
		for _, m := range resp.GetMounts() {
			if !filepath.IsAbs(m.GetHostPath()) || !filepath.IsAbs(m.GetContainerPath()) {
				t.Errorf("device %q: mount %s -> %s: paths must be absolute", dev.GetId(), m.GetHostPath(), m.GetContainerPath())
			}
		}
	}
	if tried == 0 {
		t.Skipf("the driver lists no healthy device of a declared resource (%v)", caps.GetResources())
	}
}

// checkAllocateUnknown: Allocate of an unknown id is NotFound.
func (s *deviceSuite) checkAllocateUnknown(t T) {
	d, caps := s.device(t)
	if len(caps.GetResources()) == 0 {
		t.Skipf("driver declares no resource (Capabilities.resources)")
	}
	for _, r := range caps.GetResources() {
		_, err := d.Allocate(s.ctx(t), &devicev1.AllocateRequest{Resource: r, DeviceIds: []string{"conformance-no-such-device"}})
		expectCode(t, err, codes.NotFound, fmt.Sprintf("Allocate of an unknown device of resource %s", r))
	}
}

// checkAllocateUnhealthy: Allocate of an unhealthy device is FailedPrecondition.
func (s *deviceSuite) checkAllocateUnhealthy(t T) {
	d, _ := s.device(t)
	dev := firstDevice(s.list(t, d, ""), basev1.Health_HEALTH_UNHEALTHY)
	if dev == nil {
		t.Skipf("the driver lists no unhealthy device (configure one, with WithConfig, to run this check)")
	}
	_, err := d.Allocate(s.ctx(t), &devicev1.AllocateRequest{Resource: dev.GetResource(), DeviceIds: []string{dev.GetId()}})
	expectCode(t, err, codes.FailedPrecondition, fmt.Sprintf("Allocate of unhealthy device %q", dev.GetId()))
}

// watchStream is a Watch call running in the background.
type watchStream struct {
	lists  chan []*devicev1.HostDevice
	cancel context.CancelFunc
	done   chan error
}

func (s *deviceSuite) startWatch(t T, w driver.DeviceWatcher) *watchStream {
	ctx, cancel := context.WithCancel(t.Context())
	ws := &watchStream{lists: make(chan []*devicev1.HostDevice, 16), cancel: cancel, done: make(chan error, 1)}
	go func() {
		ws.done <- w.Watch(ctx, "", func(devs []*devicev1.HostDevice) error {
			select {
			case ws.lists <- devs:
			default:
			}
			return nil
		})
	}()
	t.Cleanup(func() { _ = ws.stop(s.opts.Timeout) })
	return ws
}

func (ws *watchStream) first(t T, timeout time.Duration) []*devicev1.HostDevice {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case devs := <-ws.lists:
		return devs
	case err := <-ws.done:
		ws.done <- err
		t.Fatalf("Watch returned before sending anything: %s", describe(err))
	case <-timer.C:
		t.Fatalf("Watch sent nothing within %s; it must send the list at once", timeout)
	}
	return nil
}

func (ws *watchStream) stop(timeout time.Duration) error {
	ws.cancel()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-ws.done:
		ws.done <- err
		if err != nil {
			return fmt.Errorf("returned %s, want nil", describe(err))
		}
		return nil
	case <-timer.C:
		return fmt.Errorf("did not return within %s", timeout)
	}
}

// checkWatchSendsAtOnce: Watch sends the full list at once.
func (s *deviceSuite) checkWatchSendsAtOnce(t T) {
	d, caps := s.device(t)
	requireFeature(t, caps, basev1.Feature_FEATURE_DEVICE_WATCH)
	w := optional[driver.DeviceWatcher](t, d, basev1.Feature_FEATURE_DEVICE_WATCH)
	ws := s.startWatch(t, w)
	got := ws.first(t, s.opts.Timeout)
	want := s.list(t, d, "")
	if a, b := deviceKeys(got), deviceKeys(want); !slices.Equal(a, b) {
		t.Errorf("Watch first sent a list other than List's:\nWatch: %v\nList:  %v", a, b)
	}
}

// checkWatchStopsOnCancel: Watch returns nil once its context is done.
func (s *deviceSuite) checkWatchStopsOnCancel(t T) {
	d, caps := s.device(t)
	requireFeature(t, caps, basev1.Feature_FEATURE_DEVICE_WATCH)
	w := optional[driver.DeviceWatcher](t, d, basev1.Feature_FEATURE_DEVICE_WATCH)
	ws := s.startWatch(t, w)
	ws.first(t, s.opts.Timeout)
	if err := ws.stop(s.opts.Timeout); err != nil {
		t.Errorf("Watch after its context was cancelled: %v", err)
	}
}
