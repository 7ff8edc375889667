package cluster

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/handler/internal/testpki"
	"github.com/kubevisor/kubevisor/core/handler/migrationproxy"
	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/core/nodeapi"
	"github.com/kubevisor/kubevisor/core/plugin"
	"github.com/kubevisor/kubevisor/internal/envtest"
	"github.com/kubevisor/kubevisor/internal/testbin"
)

// migrationNode is one node of the two-node agent tests: its own agent, handler (the fake
// hypervisor, which migrates over real sockets), host directory and migration proxy with a
// node certificate of the test CA; both nodes share one API server.
type migrationNode struct {
	name    string
	h       *handler.Handler
	hostDir string
	proxy   *migrationproxy.Proxy
	metrics *prometheus.Registry
}

// startMigrationNodes starts two nodes, node-1 and node-2, on one API server.
func startMigrationNodes(t *testing.T) (c client.Client, bin string, nodes [2]*migrationNode) {
	env := envtest.Start(t, envtest.Options{})
	dir, err := os.MkdirTemp("/tmp", "kvm-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	bin = filepath.Join(dir, "bin")
	if err := testbin.Build(bin, false,
		"github.com/kubevisor/kubevisor/cmd/kubevisor-driver-fake",
		"github.com/kubevisor/kubevisor/cmd/kubevisor-launcher",
		"github.com/kubevisor/kubevisor/core/handler/internal/testdriver"); err != nil {
		t.Fatal(err)
	}
	manifest := func(b, kind, name string, args ...string) plugin.Manifest {
		m, err := plugin.ManifestFor(filepath.Join(bin, b), kind, name)
		if err != nil {
			t.Fatal(err)
		}
		m.Args = args
		return m
	}
	ca := testpki.NewCA(t, "kubevisor-ca")
	for i := range nodes {
		name := fmt.Sprintf("node-%d", i+1)
		nd := filepath.Join(dir, name)
		n := &migrationNode{name: name, hostDir: filepath.Join(nd, "host"), metrics: prometheus.NewRegistry()}
		leaf := testpki.Leaf{CommonName: nodeapi.NodeCommonName(name), Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
		n.proxy, err = migrationproxy.New(migrationproxy.Config{NodeName: name, Addr: "127.0.0.1:0", CertDir: testpki.CertDir(t, ca, leaf, ca),
			Logger:     hclog.New(&hclog.LoggerOptions{Name: name + "-proxy", Level: hclog.Debug, Output: os.Stderr}),
			Registerer: n.metrics})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		pctx, pcancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = n.proxy.Serve(pctx, ln) }()
		t.Cleanup(func() { pcancel(); <-done })

		// Each agent runs as a user granted exactly the handler's +kubebuilder:rbac markers, as
		// its service account is in a cluster.
		cfg := env.ImpersonateWithMarkers(t, "kubevisor-handler-"+name, "agent.go")
		mgr, err := ctrl.NewManager(cfg, ctrl.Options{
			Scheme: envtest.Scheme(), Cache: CacheOptions(name),
			Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		})
		if err != nil {
			t.Fatal(err)
		}
		hctx, hcancel := context.WithTimeout(context.Background(), 30*time.Second)
		agent, err := NewAgent(hctx, mgr,
			AgentConfig{
				NodeName: name, HostStateDir: n.hostDir, Resync: 500 * time.Millisecond, DialTimeout: 2 * time.Second,
				Controller: controller.Options{SkipNameValidation: ptr.To(true)}, Log: testr.New(t).WithName(name),
				Migration: MigrationConfig{Proxy: n.proxy, Address: ln.Addr().String(), Poll: 100 * time.Millisecond},
			},
			handler.Config{
				NodeName: name, StateDir: filepath.Join(nd, "s"), RunDir: filepath.Join(nd, "r"),
				Drivers:      handler.DriverSet{Hypervisor: "fake", Network: "fake-net", Storage: "fake-storage"},
				ResyncPeriod: metav1.Duration{Duration: 500 * time.Millisecond},
			},
			handler.Options{
				Logger: hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Info, Output: os.Stderr}),
				Manifests: []plugin.Manifest{
					manifest("kubevisor-driver-fake", driver.KindHypervisor, "fake", driver.KindHypervisor),
					manifest("testdriver", driver.KindNetwork, "fake-net", driver.KindNetwork, "name=fake-net"),
					manifest("testdriver", driver.KindStorage, "fake-storage", driver.KindStorage, "name=fake-storage"),
				},
			})
		hcancel()
		if err != nil {
			t.Fatal(err)
		}
		n.h = agent.Handler()
		t.Cleanup(func() { _ = n.h.Close() })
		envtest.RunManager(t, mgr)
		nodes[i] = n
	}
	return env.Client, bin, nodes
}

// launcher starts a real launcher for vmi in node n's host directory, and a Running pod object
// for it bound to n, with labels besides the launcher pod's own.
func (n *migrationNode) launcher(t *testing.T, c client.Client, bin, pod string, vmi *v1alpha1.VirtualMachineInstance, labels map[string]string) *corev1.Pod {
	t.Helper()
	dir := layout.LauncherDir(n.hostDir, vmi.UID)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "kubevisor-launcher"), "--dir", dir, "--vmi", vmi.Namespace+"/"+vmi.Name, "--grace-period", "5s")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return runningPodOn(t, c, n.name, pod, vmi, labels)
}

func runningPodOn(t *testing.T, c client.Client, node, name string, vmi *v1alpha1.VirtualMachineInstance, labels map[string]string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: vmi.Namespace,
			Labels: map[string]string{v1alpha1.CreatedByLabel: string(vmi.UID), v1alpha1.VirtualMachineInstanceNameLabel: vmi.Name}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "compute", Image: "kubevisor-launcher"}}},
	}
	for k, v := range labels {
		p.Labels[k] = v
	}
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodRunning
	if err := c.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func waitFor(t *testing.T, c client.Client, name, what string, cond func(*v1alpha1.VirtualMachineInstance) bool) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	var vmi v1alpha1.VirtualMachineInstance
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: name}, &vmi); err == nil && cond(&vmi) {
			return &vmi
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("VMI %s: %s: status %+v", name, what, vmi.Status)
	return nil
}

// handOff writes the migration state as the migration controller does at the hand-off.
func handOff(t *testing.T, c client.Client, vmi *v1alpha1.VirtualMachineInstance, s v1alpha1.VirtualMachineInstanceMigrationState) {
	t.Helper()
	body, err := v1alpha1.StatusApply(vmi, &v1alpha1.VirtualMachineInstanceStatus{MigrationState: &s}, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Status().Apply(context.Background(), client.ApplyConfigurationFromUnstructured(body), client.FieldOwner(v1alpha1.MigrationControllerFieldManager)); err != nil {
		t.Fatal(err)
	}
}

func migratingVMI(t *testing.T, c client.Client, name string) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	mem := resource.MustParse("64Mi")
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{v1alpha1.NodeNameLabel: "node-1"}},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Domain: v1alpha1.DomainSpec{
				Memory: &v1alpha1.Memory{Guest: &mem},
				Devices: v1alpha1.Devices{
					Disks: []v1alpha1.Disk{{Name: "root", DiskDevice: v1alpha1.DiskDevice{Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}}},
				},
			},
			Volumes: []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("1Mi")}}}},
		},
	}
	ctx := context.Background()
	if err := c.Create(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	vmi.Status.Phase, vmi.Status.NodeName = v1alpha1.Scheduled, "node-1"
	if err := c.Status().Update(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	return vmi
}

// TestAgentsMigrate: a VMI moves between two nodes' agents as the migration controller and
// the VMI controller drive it. At the hand-off the target node prepares its VM (waiting) in the
// target pod's sandbox and publishes its proxy's address; the source node migrates through both
// proxies (the fake hypervisor streams over the sockets, the emptyDisk on the disks channel),
// writes startTimestamp and completed, and stops writing the VMI's status. Once the VMI is
// moved to the target node, the target's handler writes its status (Running, under its field
// manager) and the source's lets its VM go.
func TestAgentsMigrate(t *testing.T) {
	c, bin, nodes := startMigrationNodes(t)
	src, dst := nodes[0], nodes[1]
	ctx := context.Background()
	vmi := migratingVMI(t, c, "mover")
	source := src.launcher(t, c, bin, "launcher-src", vmi, nil)
	waitFor(t, c, "mover", "Running on node-1", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })

	const mig = "mig-1"
	target := dst.launcher(t, c, bin, "launcher-dst", vmi, map[string]string{v1alpha1.MigrationUIDLabel: mig})
	cfg := &v1alpha1.MigrationConfiguration{AllowPostCopy: ptr.To(false), ProgressTimeout: ptr.To[int64](30), CompletionTimeoutPerGiB: ptr.To[int64](60)}
	handOff(t, c, vmi, v1alpha1.VirtualMachineInstanceMigrationState{
		MigrationUID: mig, SourceNode: src.name, SourcePod: source.Name, TargetNode: dst.name, TargetPod: target.Name, MigrationConfiguration: cfg,
	})
	got := waitFor(t, c, "mover", "the migration completed", func(v *v1alpha1.VirtualMachineInstance) bool {
		s := v.Status.MigrationState
		return s != nil && (s.Completed || s.Failed)
	})
	s := got.Status.MigrationState
	if s.Failed || s.TargetNodeAddress == "" || s.TargetNodeDomainReadyTimestamp == nil || s.StartTimestamp == nil || s.EndTimestamp == nil || s.Mode != v1alpha1.MigrationPreCopy {
		t.Fatalf("migration state %+v: want completed, with the target's address and ready time, start, end and mode", s)
	}
	if got.Status.Phase != v1alpha1.Running {
		t.Errorf("phase %s while the VMI moves, want Running (the source's VM stopped as migrated does not end it)", got.Status.Phase)
	}
	for _, n := range nodes {
		// A proxy counts a connection once it has passed it on (the disks channel's may end
		// after the memory's).
		pollUntil(t, n.name+"'s proxy carried the memory and the disks streams", 10*time.Second, func() bool { return carriedConns(t, n.metrics) >= 2 })
	}
	if _, waiting := dst.h.IncomingOf(vmi.UID); !waiting {
		t.Error("the target's VM does not count as incoming before the VMI moved")
	}
	// The hypervisor's figures are in a Migrated event of the VMI.
	pollUntil(t, "a Migrated event with the migration's figures on the VMI", 10*time.Second, func() bool {
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(evs.Items, func(e eventsv1.Event) bool {
			return e.Regarding.UID == vmi.UID && e.Reason == v1alpha1.ReasonMigrated && strings.Contains(e.Note, "downtime") && strings.Contains(e.Note, "to node node-2")
		})
	})

	// The VMI controller moves the VMI to the target and deletes the source pod.
	var cur v1alpha1.VirtualMachineInstance
	if err := c.Get(ctx, client.ObjectKeyFromObject(vmi), &cur); err != nil {
		t.Fatal(err)
	}
	cur.Labels[v1alpha1.NodeNameLabel] = dst.name
	if err := c.Update(ctx, &cur); err != nil {
		t.Fatal(err)
	}
	body, err := v1alpha1.StatusApply(&cur, &v1alpha1.VirtualMachineInstanceStatus{NodeName: dst.name, LauncherPodName: target.Name}, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(body), client.FieldOwner(v1alpha1.VMIControllerFieldManager), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, source); err != nil {
		t.Fatal(err)
	}
	// The target's handler follows the VMI from now on (what the source wrote is what it
	// would write, so it writes nothing until something changes).
	waitFor(t, c, "mover", "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })
	// The agent stops the VM (the handler forgets it), then removes the VMI's directory.
	pollUntil(t, "the source's handler lets go of the VM that migrated away and its node removes the VMI's directory", 30*time.Second, func() bool {
		_, err := os.Stat(layout.VMIDir(src.hostDir, vmi.UID))
		return !slices.Contains(src.h.VMIs(), vmi.UID) && os.IsNotExist(err)
	})
	if _, waiting := dst.h.IncomingOf(vmi.UID); waiting {
		t.Error("the target still records the incoming migration once the VMI is its own")
	}
	if st, ok := dst.h.Status(vmi.UID); !ok || st.Phase != v1alpha1.Running {
		t.Errorf("target handler's status %v, %v", st.Phase, ok)
	}
	defer func() {
		// The VMI ends on the target: its pod deleted, the target's handler stops the VM and
		// writes the VMI's end under its field manager.
		if err := c.Delete(ctx, target); err != nil {
			t.Fatal(err)
		}
		end := waitFor(t, c, "mover", "Succeeded", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Succeeded })
		if !slices.Contains(v1alpha1.FieldManagers(end, "f:status", "f:phase"), v1alpha1.HandlerFieldManager(dst.name)) {
			t.Errorf("the VMI's end was not written by node-2's handler: %+v", end.ManagedFields)
		}
	}()
	// The target node writes the guest's serial console into the VMI's directory there, for
	// its launcher pod's console log container.
	logFile := layout.ConsoleLog(dst.hostDir, vmi.UID)
	pollUntil(t, "the migrated guest's output in the target's console log "+logFile, 10*time.Second, func() bool {
		b, _ := os.ReadFile(logFile)
		return strings.Contains(string(b), "migrated in")
	})
}

// TestAgentsMigrationTargetFails: a target pod whose VM cannot be prepared (no launcher
// answers in it) fails the migration with the target's reason on the VMI; the source's VM runs
// on, its status untouched, and nothing is left on the target node.
func TestAgentsMigrationTargetFails(t *testing.T) {
	c, bin, nodes := startMigrationNodes(t)
	src, dst := nodes[0], nodes[1]
	vmi := migratingVMI(t, c, "stayer")
	source := src.launcher(t, c, bin, "launcher-src", vmi, nil)
	before := waitFor(t, c, "stayer", "Running on node-1", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })

	const mig = "mig-2"
	target := runningPodOn(t, c, dst.name, "launcher-dst", vmi, map[string]string{v1alpha1.MigrationUIDLabel: mig}) // no launcher
	handOff(t, c, vmi, v1alpha1.VirtualMachineInstanceMigrationState{
		MigrationUID: mig, SourceNode: src.name, SourcePod: source.Name, TargetNode: dst.name, TargetPod: target.Name,
	})
	got := waitFor(t, c, "stayer", "the migration failed", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.MigrationState != nil && v.Status.MigrationState.Failed
	})
	if r := got.Status.MigrationState.FailureReason; !strings.Contains(r, "target node node-2") || !strings.Contains(r, "prepare the VM") {
		t.Errorf("failure reason %q, want the target node's", r)
	}
	if got.Status.MigrationState.StartTimestamp != nil {
		t.Error("the source started a migration to a target that failed")
	}
	if got.Status.Phase != v1alpha1.Running || got.Status.NodeName != src.name || !v1alpha1.HoldsLifecycle(got, v1alpha1.HandlerFieldManager(src.name)) {
		t.Errorf("VMI %s on %s, lifecycle held by the source: %v; want it running on as before (was %s)", got.Status.Phase, got.Status.NodeName,
			v1alpha1.HoldsLifecycle(got, v1alpha1.HandlerFieldManager(src.name)), before.Status.Phase)
	}
	if slices.Contains(dst.h.VMIs(), vmi.UID) {
		t.Error("the target's handler holds the VMI after its preparation failed")
	}
}

// carriedConns is how many connections a proxy's metrics count carried.
func carriedConns(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "kubevisor_migration_proxy_connections_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "carried" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// pollUntil fails the test when cond does not hold within timeout.
func pollUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestModeWord: the driver's modes as the VMI's migrationState.mode says them.
func TestModeWord(t *testing.T) {
	for m, want := range map[hypervisorv1.MigrationMode]v1alpha1.MigrationMode{
		hypervisorv1.MigrationMode_MIGRATION_MODE_PRE_COPY:    v1alpha1.MigrationPreCopy,
		hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY:   v1alpha1.MigrationPostCopy,
		hypervisorv1.MigrationMode_MIGRATION_MODE_PAUSED:      v1alpha1.MigrationPaused,
		hypervisorv1.MigrationMode_MIGRATION_MODE_UNSPECIFIED: v1alpha1.MigrationPreCopy,
	} {
		if got := modeWord(m); got != string(want) {
			t.Errorf("modeWord(%s) = %q, want %q", m, got, want)
		}
	}
}
