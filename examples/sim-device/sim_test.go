package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
)

// TestConformance runs the device conformance kit against the driver across the plugin
// boundary (gRPC, in process), with one unhealthy device so that every check runs.
func TestConformance(t *testing.T) {
	conformance.DeviceTesting(t, New(nil), conformance.WithConfig([]byte(`{"count": 4, "unhealthy": ["sim-3"]}`)))
}

// client serves a new driver in process and configures it with config.
func client(t *testing.T, config string) driver.Device {
	t.Helper()
	c, stop, err := driver.InProcess(basev1.Kind_KIND_DEVICE, New(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	d := c.(driver.Device)
	if err := d.Configure(t.Context(), &basev1.ConfigureRequest{Config: []byte(config), NodeName: "node-1"}); err != nil {
		t.Fatalf("Configure(%s): %v", config, err)
	}
	return d
}

func TestListDefault(t *testing.T) {
	d := client(t, "")
	devs, err := d.List(t.Context(), Resource)
	if err != nil || len(devs) != DefaultCount {
		t.Fatalf("List = %v, %v; want %d devices", devs, err, DefaultCount)
	}
	for i, dev := range devs {
		if want := "sim-" + string(rune('0'+i)); dev.GetId() != want || dev.GetHealth() != basev1.Health_HEALTH_HEALTHY {
			t.Errorf("device %d = %s %s, want %s healthy", i, dev.GetId(), dev.GetHealth(), want)
		}
	}
	if other, err := d.List(t.Context(), "kvm"); err != nil || len(other) != 0 {
		t.Errorf("List(kvm) = %v, %v; want none", other, err)
	}
}

func TestAllocate(t *testing.T) {
	d := client(t, `{"count": 2, "unhealthy": ["sim-1"]}`)
	resp, err := d.Allocate(t.Context(), &devicev1.AllocateRequest{Resource: Resource, DeviceIds: []string{"sim-0"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetEnv()[EnvDevices]; got != "sim-0" {
		t.Errorf("env %s = %q, want sim-0", EnvDevices, got)
	}
	if len(resp.GetDeviceNodes())+len(resp.GetMounts()) != 0 {
		t.Errorf("a simulated device has no node or mount: %v", resp)
	}
	for _, c := range []struct {
		name string
		req  *devicev1.AllocateRequest
		code codes.Code
		say  string
	}{
		{"unhealthy", &devicev1.AllocateRequest{Resource: Resource, DeviceIds: []string{"sim-1"}}, codes.FailedPrecondition, `"sim-1": unhealthy`},
		{"unknown", &devicev1.AllocateRequest{Resource: Resource, DeviceIds: []string{"sim-0", "sim-7"}}, codes.NotFound, `"sim-7"`},
		{"other resource", &devicev1.AllocateRequest{Resource: "kvm", DeviceIds: []string{"sim-0"}}, codes.NotFound, `"kvm"`},
		{"no device", &devicev1.AllocateRequest{Resource: Resource}, codes.InvalidArgument, "no device"},
	} {
		_, err := d.Allocate(t.Context(), c.req)
		if status.Code(err) != c.code || !strings.Contains(err.Error(), c.say) {
			t.Errorf("%s: %v; want %s saying %s", c.name, err, c.code, c.say)
		}
	}
}

func TestConfigureRejects(t *testing.T) {
	d := client(t, "")
	for config, say := range map[string]string{
		`{"count": 0, "unhealthy": ["sim-0"]}`: "", // count 0 is the default: fine
		`{"count": 65}`:                        "config.count",
		`{"count": -1}`:                        "config.count",
		`{"count": 2, "unhealthy": ["sim-2"]}`: `"sim-2"`,
		`{"cuont": 2}`:                         "unknown field",
	} {
		err := d.Configure(t.Context(), &basev1.ConfigureRequest{Config: []byte(config)})
		switch {
		case say == "" && err != nil:
			t.Errorf("Configure(%s): %v", config, err)
		case say != "" && (status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), say)):
			t.Errorf("Configure(%s) = %v; want InvalidArgument naming %s", config, err, say)
		}
	}
}

// TestWatchFollowsConfigure: Watch sends the list at once, then again when a new configuration
// changes it.
func TestWatchFollowsConfigure(t *testing.T) {
	s := New(nil)
	ctx, cancel := context.WithCancel(t.Context())
	lists := make(chan int, 4)
	done := make(chan error, 1)
	go func() {
		done <- s.Watch(ctx, "", func(devs []*devicev1.HostDevice) error { lists <- len(devs); return nil })
	}()
	want := func(n int) {
		t.Helper()
		select {
		case got := <-lists:
			if got != n {
				t.Errorf("Watch sent %d devices, want %d", got, n)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Watch sent nothing, want %d devices", n)
		}
	}
	want(DefaultCount)
	if err := s.Configure(ctx, &basev1.ConfigureRequest{Config: []byte(`{"count": 5}`)}); err != nil {
		t.Fatal(err)
	}
	want(5)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Watch returned %v after cancel, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Watch did not return after cancel")
	}
}
