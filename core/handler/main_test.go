package handler

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	"github.com/kubevisor/kubevisor/core/plugin"
	"github.com/kubevisor/kubevisor/internal/testbin"
)

// bins are the driver plugins the tests run, built once by TestMain.
var bins struct {
	fake, qmp, local, testdriver string
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testbin.FuzzOnly() { // the fuzz targets need no driver binaries
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "kubevisor-handler-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	err = testbin.Build(dir, false,
		"github.com/kubevisor/kubevisor/cmd/kubevisor-driver-fake",
		"github.com/kubevisor/kubevisor/cmd/kubevisor-driver-qmp",
		"github.com/kubevisor/kubevisor/cmd/kubevisor-driver-local",
		"github.com/kubevisor/kubevisor/core/handler/internal/testdriver")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	bins.fake = filepath.Join(dir, "kubevisor-driver-fake")
	bins.qmp = filepath.Join(dir, "kubevisor-driver-qmp")
	bins.local = filepath.Join(dir, "kubevisor-driver-local")
	bins.testdriver = filepath.Join(dir, "testdriver")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Names of the test drivers.
const (
	fakeHV      = "fake"         // kubevisor-driver-fake hypervisor
	testHV      = "fake-hv"      // testdriver hypervisor
	testNetwork = "fake-net"     // testdriver network
	testStorage = "fake-storage" // testdriver storage
)

// manifest is the manifest of a driver binary, its digest computed now.
func manifest(t *testing.T, bin, kind, name string, args ...string) plugin.Manifest {
	t.Helper()
	m, err := plugin.ManifestFor(bin, kind, name)
	if err != nil {
		t.Fatal(err)
	}
	m.Args = args
	return m
}

// fakeManifests are the drivers of most tests: the real fake hypervisor and the testdriver's
// network and storage, failing as fail asks ("Setup:substring", ...).
func fakeManifests(t *testing.T, fail ...string) []plugin.Manifest {
	var failArgs []string
	for _, f := range fail {
		failArgs = append(failArgs, "fail="+f)
	}
	return []plugin.Manifest{
		manifest(t, bins.fake, driver.KindHypervisor, fakeHV, driver.KindHypervisor),
		manifest(t, bins.testdriver, driver.KindNetwork, testNetwork, append([]string{driver.KindNetwork, "name=" + testNetwork}, failArgs...)...),
		manifest(t, bins.testdriver, driver.KindStorage, testStorage, append([]string{driver.KindStorage, "name=" + testStorage}, failArgs...)...),
		manifest(t, bins.testdriver, driver.KindHypervisor, testHV, append([]string{driver.KindHypervisor, "name=" + testHV}, failArgs...)...),
	}
}

// env is one node of a test: directories, a configuration, and a recorder of status changes.
type env struct {
	t    *testing.T
	dir  string
	cfg  Config
	opts Options
	rec  *recorder
	// disk is a small file the VMIs' containerDisks name.
	disk string
}

// newEnv makes a node with a short directory (unix socket paths are short) running drivers.
func newEnv(t *testing.T, drivers DriverSet, manifests []plugin.Manifest) *env {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "kvh-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	e := &env{t: t, dir: dir, rec: newRecorder(), disk: filepath.Join(dir, "disk.img")}
	if err := os.WriteFile(e.disk, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	e.cfg = Config{
		StateDir: filepath.Join(dir, "s"), RunDir: filepath.Join(dir, "r"),
		NodeName: "node-1", Drivers: drivers,
		ResyncPeriod: metav1.Duration{Duration: 500 * time.Millisecond},
	}
	e.opts = Options{
		Logger:           hclog.New(&hclog.LoggerOptions{Name: "handler", Output: testWriter{t}, Level: hclog.Debug}),
		Manifests:        manifests,
		OnStatus:         e.rec.record,
		PluginMinBackoff: 50 * time.Millisecond,
		PluginMaxBackoff: 500 * time.Millisecond,
	}
	return e
}

// start makes a Handler, closed (plugins stopped) when the test ends unless detached.
func (e *env) start() *Handler {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := New(ctx, e.cfg, e.opts)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	e.t.Cleanup(func() { _ = h.Close() })
	return h
}

// testWriter logs to the test until it ends.
type testWriter struct{ t *testing.T }

var logMu sync.Mutex

func (w testWriter) Write(p []byte) (int, error) {
	logMu.Lock()
	defer logMu.Unlock()
	defer func() { _ = recover() }() // a log line after the test ended
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// recorder keeps every status a handler published, per VMI.
type recorder struct {
	mu   sync.Mutex
	seen map[types.UID][]v1alpha1.VirtualMachineInstanceStatus
}

func newRecorder() *recorder {
	return &recorder{seen: map[types.UID][]v1alpha1.VirtualMachineInstanceStatus{}}
}

func (r *recorder) record(uid types.UID, st v1alpha1.VirtualMachineInstanceStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen[uid] = append(r.seen[uid], st)
}

// phases returns the phases a VMI went through, without repeats.
func (r *recorder) phases(uid types.UID) []v1alpha1.VirtualMachineInstancePhase {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []v1alpha1.VirtualMachineInstancePhase
	for _, st := range r.seen[uid] {
		if len(out) == 0 || out[len(out)-1] != st.Phase {
			out = append(out, st.Phase)
		}
	}
	return out
}

func (r *recorder) last(uid types.UID) (v1alpha1.VirtualMachineInstanceStatus, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.seen[uid]
	if len(s) == 0 {
		return v1alpha1.VirtualMachineInstanceStatus{}, false
	}
	return s[len(s)-1], true
}

// waitFor waits until cond holds for the VMI's last published status.
func (r *recorder) waitFor(t *testing.T, uid types.UID, what string, timeout time.Duration, cond func(v1alpha1.VirtualMachineInstanceStatus) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st, ok := r.last(uid)
		if ok && cond(st) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("VMI %s: not %s within %s; phases %v, last status %+v", uid, what, timeout, r.phases(uid), st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// eventually waits until cond returns nil.
func eventually(t *testing.T, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testVMI is a VMI with a containerDisk over disk, a cloud-init seed on a scsi cdrom and a
// masquerade interface on the pod network.
func testVMI(name string, uid types.UID, disk string) *v1alpha1.VirtualMachineInstance {
	mem := resource.MustParse("128Mi")
	return &v1alpha1.VirtualMachineInstance{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachineInstance"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uid},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			Domain: v1alpha1.DomainSpec{
				Memory: &v1alpha1.Memory{Guest: &mem},
				Devices: v1alpha1.Devices{
					Disks: []v1alpha1.Disk{
						{Name: "containerdisk", DiskDevice: v1alpha1.DiskDevice{Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}},
						{Name: "cloudinitdisk", DiskDevice: v1alpha1.DiskDevice{CDRom: &v1alpha1.CDRomTarget{Bus: v1alpha1.DiskBusSCSI}}},
					},
					Interfaces: []v1alpha1.Interface{
						{Name: "default", InterfaceBindingMethod: v1alpha1.InterfaceBindingMethod{Masquerade: &v1alpha1.InterfaceMasquerade{}}},
					},
				},
			},
			Volumes: []v1alpha1.Volume{
				{Name: "containerdisk", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: disk}}},
				{Name: "cloudinitdisk", VolumeSource: v1alpha1.VolumeSource{CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config\n"}}},
			},
			Networks: []v1alpha1.Network{{Name: "default", NetworkSource: v1alpha1.NetworkSource{Pod: &v1alpha1.PodNetwork{}}}},
		},
	}
}

// doSync runs Handler.Sync with a timeout.
func doSync(t *testing.T, h *Handler, vmi *v1alpha1.VirtualMachineInstance) (v1alpha1.VirtualMachineInstanceStatus, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return h.Sync(ctx, vmi)
}

// mustRun syncs vmi and fails the test unless it runs.
func mustRun(t *testing.T, h *Handler, vmi *v1alpha1.VirtualMachineInstance) v1alpha1.VirtualMachineInstanceStatus {
	t.Helper()
	st, err := doSync(t, h, vmi)
	if err != nil {
		t.Fatalf("Sync %s: %v", vmi.Name, err)
	}
	if st.Phase != v1alpha1.Running {
		t.Fatalf("Sync %s: phase %s, want Running (status %+v)", vmi.Name, st.Phase, st)
	}
	return st
}

// leftovers lists what the node still has of a VMI: its state file, run and work directories,
// the hypervisor's VM, the network driver's interfaces, the storage driver's files.
func leftovers(t *testing.T, h *Handler, uid types.UID) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []string
	for what, p := range map[string]string{
		"state file":     filepath.Join(h.cfg.StateDir, "vmis", string(uid)+".json"),
		"run directory":  filepath.Join(h.cfg.RunDir, string(uid)),
		"work directory": filepath.Join(h.cfg.VolumeDir, string(uid)),
	} {
		if _, err := os.Stat(p); err == nil {
			out = append(out, what+" "+p)
		}
	}
	for _, d := range h.cfg.Drivers.all() {
		name := d.name
		switch d.kind {
		case driver.KindHypervisor:
			hv, err := h.host.Hypervisor(name)
			if err != nil {
				continue
			}
			if _, err := hv.Status(ctx, string(uid)); status.Code(err) != codes.NotFound {
				out = append(out, fmt.Sprintf("VM in hypervisor driver %s (Status: %v)", name, err))
			}
		case driver.KindNetwork:
			n, err := h.host.Network(name)
			if err != nil {
				continue
			}
			if c, ok := driver.Optional[driver.NetworkChecker](ctx, n); ok {
				if _, err := c.Check(ctx, &networkv1.CheckRequest{VmiId: string(uid)}); status.Code(err) != codes.FailedPrecondition {
					out = append(out, fmt.Sprintf("interfaces in network driver %s (Check: %v)", name, err))
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// mustPauser is a hypervisor driver's Pauser, as the host reaches it.
func mustPauser(t *testing.T, hv driver.Hypervisor) driver.Pauser {
	t.Helper()
	p, ok := driver.Optional[driver.Pauser](context.Background(), hv)
	if !ok {
		t.Fatalf("hypervisor driver %T offers no Pauser", hv)
	}
	return p
}

func requireNothingLeft(t *testing.T, h *Handler, uid types.UID) {
	t.Helper()
	if left := leftovers(t, h, uid); len(left) > 0 {
		t.Errorf("VMI %s left behind: %v", uid, left)
	}
}
