package fake_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
	"github.com/kubevisor/kubevisor/drivers/fake"
)

func TestDeviceCountAndHealth(t *testing.T) {
	d := fake.NewDevice()
	devs, _ := d.List(t.Context(), "")
	if len(devs) != 3*fake.DefaultDeviceCount {
		t.Errorf("default: %d devices, want %d", len(devs), 3*fake.DefaultDeviceCount)
	}
	configure(t, d, `{"count": 2, "unhealthy": ["vhost-net-1"]}`)
	devs, _ = d.List(t.Context(), "vhost-net")
	var got []string
	for _, dev := range devs {
		got = append(got, dev.GetId()+"="+dev.GetHealth().String())
	}
	if want := []string{"vhost-net-0=HEALTH_HEALTHY", "vhost-net-1=HEALTH_UNHEALTHY"}; !slices.Equal(got, want) {
		t.Errorf("List(vhost-net) = %v, want %v", got, want)
	}
	if devs, _ := d.List(t.Context(), "gpu"); len(devs) != 0 {
		t.Errorf("List of an unknown resource = %v", devs)
	}

	resp, err := d.Allocate(t.Context(), &devicev1.AllocateRequest{Resource: "tun", DeviceIds: []string{"tun-0", "tun-1"}})
	if err != nil {
		t.Fatal(err)
	}
	if n := resp.GetDeviceNodes(); len(n) != 1 || n[0].GetContainerPath() != "/dev/net/tun" || resp.GetEnv()["KUBEVISOR_FAKE_TUN"] != "tun-0,tun-1" {
		t.Errorf("Allocate(tun) = %v", resp)
	}
	for _, c := range []struct {
		req  *devicev1.AllocateRequest
		code codes.Code
	}{
		{&devicev1.AllocateRequest{Resource: "vhost-net", DeviceIds: []string{"vhost-net-1"}}, codes.FailedPrecondition},
		{&devicev1.AllocateRequest{Resource: "kvm", DeviceIds: []string{"kvm-2"}}, codes.NotFound},
		{&devicev1.AllocateRequest{Resource: "kvm", DeviceIds: []string{"tun-0"}}, codes.NotFound},
		{&devicev1.AllocateRequest{Resource: "kvm", DeviceIds: []string{"kvm-01"}}, codes.NotFound},
		{&devicev1.AllocateRequest{Resource: "gpu", DeviceIds: []string{"gpu-0"}}, codes.NotFound},
		{&devicev1.AllocateRequest{Resource: "kvm"}, codes.InvalidArgument},
	} {
		_, err := d.Allocate(t.Context(), c.req)
		expectCode(t, err, c.code, "")
	}
	for _, config := range []string{`{"unhealthy": ["kvm-9"]}`, `{"count": -1}`, `{"count": 1000000}`,
		`{"resources": ["a", "a"]}`, `{"resources": ["a/b"]}`, `{"resources": ["gpu"], "unhealthy": ["kvm-0"]}`} {
		expectCode(t, fake.NewDevice().Configure(t.Context(), configReq(config)), codes.InvalidArgument, "config")
	}
}

func TestDeviceWatchSeesConfigure(t *testing.T) {
	d := fake.NewDevice()
	ctx, cancel := context.WithCancel(t.Context())
	lists := make(chan []*devicev1.HostDevice, 8)
	done := make(chan error, 1)
	go func() {
		done <- d.Watch(ctx, "kvm", func(devs []*devicev1.HostDevice) error { lists <- devs; return nil })
	}()
	if first := <-lists; len(first) != fake.DefaultDeviceCount {
		t.Fatalf("first list has %d devices", len(first))
	}
	configure(t, d, `{"unhealthy": ["kvm-0"]}`)
	select {
	case devs := <-lists:
		if devs[0].GetHealth() != basev1.Health_HEALTH_UNHEALTHY {
			t.Errorf("after Configure, kvm-0 is %s", devs[0].GetHealth())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Watch did not send the changed list")
	}
	// A change of another resource does not resend the kvm list.
	configure(t, d, `{"unhealthy": ["kvm-0", "tun-0"]}`)
	select {
	case devs := <-lists:
		t.Errorf("Watch(kvm) sent an unchanged list: %v", devs)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Watch after cancel: %v", err)
	}
}

// TestDeviceResources: the configuration names the resources simulated, which Capabilities,
// List and Allocate follow.
func TestDeviceResources(t *testing.T) {
	d := fake.NewDevice()
	configure(t, d, `{"count": 2, "resources": ["gpu", "fpga"], "unhealthy": ["fpga-1"]}`)
	caps, err := d.Capabilities(t.Context())
	if err != nil || !slices.Equal(caps.GetResources(), []string{"gpu", "fpga"}) {
		t.Fatalf("Capabilities = %v, %v; want resources gpu, fpga", caps, err)
	}
	if devs, _ := d.List(t.Context(), "kvm"); len(devs) != 0 {
		t.Errorf("List(kvm) = %v, want none", devs)
	}
	resp, err := d.Allocate(t.Context(), &devicev1.AllocateRequest{Resource: "gpu", DeviceIds: []string{"gpu-1"}})
	if err != nil || resp.GetEnv()["KUBEVISOR_FAKE_GPU"] != "gpu-1" || resp.GetDeviceNodes()[0].GetContainerPath() != "/dev/null" {
		t.Errorf("Allocate(gpu-1) = %v, %v", resp, err)
	}
	_, err = d.Allocate(t.Context(), &devicev1.AllocateRequest{Resource: "fpga", DeviceIds: []string{"fpga-1"}})
	expectCode(t, err, codes.FailedPrecondition, "unhealthy")
}
