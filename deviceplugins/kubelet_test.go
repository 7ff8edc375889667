//go:build cluster

package deviceplugins

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// TestRealKubeletRestart runs the plugins against a real kubelet on this machine and restarts
// that kubelet. It needs (go test -tags cluster, as root):
//
//   - a running kubelet whose device plugin directory is KUBEVISOR_DEVICE_PLUGIN_DIR (default
//     /var/lib/kubelet/device-plugins; the kubelet always uses that path) and no other
//     Kubevisor device plugin serving there;
//   - KUBEVISOR_KUBELET_RESTART: a shell command that restarts it and returns (for example
//     "systemctl restart kubelet", or the local cluster's restart script);
//   - KUBEVISOR_KUBELET_PODRESOURCES: the kubelet's pod-resources socket (default
//     /var/lib/kubelet/pod-resources/kubelet.sock; <root-dir>/pod-resources/kubelet.sock),
//     through which the test reads what the kubelet counts as allocatable.
//
// It asserts that the kubelet takes every plugin's registration, reports the healthy devices
// of /dev/kvm and /dev/net/tun as allocatable, and after the restart (which deletes the
// plugin sockets) gets them again from the same plugin processes within 30 s.
func TestRealKubeletRestart(t *testing.T) {
	restart := os.Getenv("KUBEVISOR_KUBELET_RESTART")
	if restart == "" {
		t.Skip("KUBEVISOR_KUBELET_RESTART is not set")
	}
	dir := envOr("KUBEVISOR_DEVICE_PLUGIN_DIR", DefaultPluginDir)
	podRes := envOr("KUBEVISOR_KUBELET_PODRESOURCES", "/var/lib/kubelet/pod-resources/kubelet.sock")

	const slots = 7
	cfg := DefaultConfig()
	cfg.PluginDir = dir
	cfg.HealthPollInterval = metav1.Duration{Duration: time.Second}
	for i := range cfg.CharDevices {
		cfg.CharDevices[i].Slots = slots
	}
	m, err := NewManager(cfg, hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Debug, Output: testWriter{t}}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()

	// The resources whose device node exists here must become allocatable.
	want := map[string]int{}
	for _, d := range cfg.CharDevices {
		if exists(d.Path) {
			want[d.ResourceName] = slots
		}
	}
	if len(want) == 0 {
		t.Fatal("none of /dev/kvm, /dev/net/tun, /dev/vhost-net exists here")
	}

	waitRegistered := func(n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for _, p := range m.Plugins() {
			for p.Registrations() < n {
				if time.Now().After(deadline) {
					t.Fatalf("%s: %d registrations after 30s, want %d", p.ResourceName(), p.Registrations(), n)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	waitAllocatable := func(when string) {
		t.Helper()
		var got map[string]int
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			got = allocatable(t, podRes)
			if containsCounts(got, want) {
				t.Logf("%s: kubelet allocatable %v", when, got)
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
		t.Fatalf("%s: kubelet allocatable %v, want at least %v", when, got, want)
	}

	waitRegistered(1)
	waitAllocatable("first start")

	start := time.Now()
	out, err := exec.Command("sh", "-c", restart).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", restart, err, out)
	}
	waitRegistered(2)
	t.Logf("every plugin registered again %v after the restart command began", time.Since(start).Round(time.Millisecond))
	for _, p := range m.Plugins() {
		if _, err := os.Stat(p.SocketPath()); err != nil {
			t.Errorf("%s: socket after restart: %v", p.ResourceName(), err)
		}
	}
	waitAllocatable("after kubelet restart")
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// allocatable asks the kubelet's pod-resources API how many devices of each resource it can
// hand out; an error (kubelet down) reads as none.
func allocatable(t *testing.T, socket string) map[string]int {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Clean(socket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := podresources.NewPodResourcesListerClient(conn).GetAllocatableResources(ctx, &podresources.AllocatableResourcesRequest{})
	if err != nil {
		return nil
	}
	got := map[string]int{}
	for _, d := range resp.Devices {
		got[d.ResourceName] += len(d.DeviceIds)
	}
	return got
}

func containsCounts(got, want map[string]int) bool {
	for r, n := range want {
		if got[r] != n {
			return false
		}
	}
	return true
}
