//go:build cluster

package deviceplugins

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/plugin"
	"github.com/kubevisor/kubevisor/internal/testenv"
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
//     through which the test reads what the kubelet counts as allocatable;
//   - optionally KUBEVISOR_KUBELET_STATIC_POD_DIR (the kubelet's staticPodPath) and
//     KUBEVISOR_TEST_IMAGE (default docker.io/kubevisor/pause:dev, already in the runtime, an
//     entrypoint that ignores its arguments and sleeps) for the pod part;
//   - /dev/kvm and /dev/net/tun on the host.
//
// It asserts that the kubelet takes every plugin's registration, reports the healthy devices
// of /dev/kvm and /dev/net/tun as allocatable, and after the restart (which deletes the
// plugin sockets) gets them again from the same plugin processes within 30 s. With a static
// pod directory it then runs an unprivileged pod limited to one kvm and one tun device and
// checks, through /proc/<pid>/root, that its container sees /dev/kvm and /dev/net/tun and
// not the host's other devices, and that the kubelet's pod-resources API lists them for it.
func TestRealKubeletRestart(t *testing.T) {
	restart := os.Getenv("KUBEVISOR_KUBELET_RESTART")
	if restart == "" {
		testenv.Missing(t, "KUBEVISOR_KUBELET_RESTART is not set: run deviceplugins/testdata/kubelet-sandbox.sh (make test-deviceplugins-kubelet)")
	}
	dir := envOr("KUBEVISOR_DEVICE_PLUGIN_DIR", DefaultPluginDir)
	podRes := envOr("KUBEVISOR_KUBELET_PODRESOURCES", "/var/lib/kubelet/pod-resources/kubelet.sock")

	// The devices come from kubevisor-driver-hostdev, a plugin process, as on a node.
	bin := os.Getenv("KUBEVISOR_HOSTDEV_DRIVER")
	if bin == "" {
		testenv.Missing(t, "KUBEVISOR_HOSTDEV_DRIVER (the kubevisor-driver-hostdev binary) is not set: run deviceplugins/testdata/kubelet-sandbox.sh (make test-deviceplugins-kubelet)")
	}
	const slots = 7
	man, err := plugin.ManifestFor(bin, "device", "hostdev")
	if err != nil {
		t.Fatal(err)
	}
	man.Config = []byte(fmt.Sprintf(`{"pollInterval": "1s", "charDevices": [
		{"resourceName": "kvm", "path": "/dev/kvm", "slots": %[1]d},
		{"resourceName": "tun", "path": "/dev/net/tun", "slots": %[1]d},
		{"resourceName": "vhost-net", "path": "/dev/vhost-net", "slots": %[1]d}]}`, slots))
	logger := hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Debug, Output: testWriter{t}})
	host, sources, err := StartDrivers(context.Background(), plugin.HostConfig{StateDir: t.TempDir(), Logger: logger}, []plugin.Manifest{man})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	cfg := Config{PluginDir: dir, HealthPollInterval: metav1.Duration{Duration: time.Second}}
	m, err := NewManager(context.Background(), cfg, sources, logger)
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
	for _, d := range [][2]string{{v1alpha1.KVMDeviceResource, "/dev/kvm"}, {v1alpha1.TunDeviceResource, "/dev/net/tun"}, {v1alpha1.VhostNetDeviceResource, "/dev/vhost-net"}} {
		if _, err := os.Stat(d[1]); err == nil {
			want[d[0]] = slots
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

	if podDir := os.Getenv("KUBEVISOR_KUBELET_STATIC_POD_DIR"); podDir != "" {
		runDevicePod(t, podDir, podRes)
	}
}

// runDevicePod runs a static pod that asks for one kvm and one tun device and looks at its
// container's /dev.
func runDevicePod(t *testing.T, podDir, podRes string) {
	image := envOr("KUBEVISOR_TEST_IMAGE", "docker.io/kubevisor/pause:dev")
	marker := fmt.Sprintf("kvdp-%d", time.Now().UnixNano())
	manifest := filepath.Join(podDir, marker+".yaml")
	pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: default}
spec:
  hostNetwork: true
  containers:
  - name: vm
    image: %[2]s
    imagePullPolicy: Never
    args: [%[1]s]
    resources:
      limits: {%[3]s: "1", %[4]s: "1"}
`, marker, image, v1alpha1.KVMDeviceResource, v1alpha1.TunDeviceResource)
	if err := os.WriteFile(manifest, []byte(pod), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(manifest)

	var pid string
	deadline := time.Now().Add(60 * time.Second)
	for pid == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no process with %s in its command line after 60s", marker)
		}
		time.Sleep(250 * time.Millisecond)
		pid = findProcess(marker)
	}
	root := filepath.Join("/proc", pid, "root")
	for _, dev := range []string{"/dev/kvm", "/dev/net/tun"} {
		fi, err := os.Stat(filepath.Join(root, dev))
		if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
			t.Errorf("container: %s: %v, %v; want a character device", dev, fi, err)
		}
	}
	// A privileged container would see every host device; this one must not.
	for _, dev := range []string{"/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/mem"} {
		if _, err := os.Stat(dev); err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, dev)); err == nil {
			t.Errorf("container sees the host's %s: not unprivileged", dev)
		}
	}

	conn, err := grpc.NewClient("unix://"+podRes, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := podresources.NewPodResourcesListerClient(conn).List(ctx, &podresources.ListPodResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, p := range list.PodResources {
		if !strings.HasPrefix(p.Name, marker) {
			continue
		}
		for _, c := range p.Containers {
			for _, d := range c.Devices {
				got[d.ResourceName] = append(got[d.ResourceName], d.DeviceIds...)
			}
		}
	}
	t.Logf("pod-resources: %s got %v", marker, got)
	if len(got[v1alpha1.KVMDeviceResource]) != 1 || len(got[v1alpha1.TunDeviceResource]) != 1 {
		t.Errorf("pod-resources for %s: %v, want one kvm and one tun device", marker, got)
	}
}

// findProcess returns the pid of a process whose command line contains marker.
func findProcess(marker string) string {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), marker) {
			return e.Name()
		}
	}
	return ""
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
