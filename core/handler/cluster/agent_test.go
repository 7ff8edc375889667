package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/core/plugin"
	"github.com/kubevisor/kubevisor/internal/envtest"
	"github.com/kubevisor/kubevisor/internal/testbin"
)

const node = "node-1"

// agentNode is one node of the agent tests: a real API server, a handler with simulated
// drivers as plugin processes, the agent in a manager, and real launcher processes standing in
// for the launcher pods' containers.
type agentNode struct {
	t       *testing.T
	c       client.Client
	h       *handler.Handler
	agent   *Agent
	bin     string // directory of the built binaries
	hostDir string
}

// newAgentNode starts a node; localStorage runs the real local storage driver instead of the
// simulated one.
func newAgentNode(t *testing.T, localStorage bool) *agentNode {
	return newAgentNodeWith(t, localStorage)
}

// newAgentNodeWith is newAgentNode with more hypervisor drivers besides the fake (the
// default): testdriver hypervisors of those names.
func newAgentNodeWith(t *testing.T, localStorage bool, moreHypervisors ...string) *agentNode {
	env := envtest.Start(t, envtest.Options{})
	dir, err := os.MkdirTemp("/tmp", "kva-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	n := &agentNode{t: t, bin: filepath.Join(dir, "bin"), hostDir: filepath.Join(dir, "host")}
	if err := testbin.Build(n.bin, false,
		"github.com/kubevisor/kubevisor/cmd/kubevisor-driver-fake",
		"github.com/kubevisor/kubevisor/cmd/kubevisor-driver-local",
		"github.com/kubevisor/kubevisor/cmd/kubevisor-launcher",
		"github.com/kubevisor/kubevisor/cmd/kubevisor-containerdisk",
		"github.com/kubevisor/kubevisor/cmd/kubevisor-probe",
		"github.com/kubevisor/kubevisor/core/handler/internal/testdriver"); err != nil {
		t.Fatal(err)
	}
	manifest := func(bin, kind, name string, args ...string) plugin.Manifest {
		m, err := plugin.ManifestFor(filepath.Join(n.bin, bin), kind, name)
		if err != nil {
			t.Fatal(err)
		}
		m.Args = args
		return m
	}

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: envtest.Scheme(), Cache: CacheOptions(node),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	storage := manifest("testdriver", driver.KindStorage, "fake-storage", driver.KindStorage, "name=fake-storage")
	if localStorage {
		storage = manifest("kubevisor-driver-local", driver.KindStorage, "local")
	}
	var more []plugin.Manifest
	for _, name := range moreHypervisors {
		more = append(more, manifest("testdriver", driver.KindHypervisor, name, driver.KindHypervisor, "name="+name))
	}
	hctx, hcancel := context.WithTimeout(ctx, 30*time.Second)
	defer hcancel()
	agent, err := NewAgent(hctx, mgr,
		AgentConfig{
			NodeName: node, HostStateDir: n.hostDir, Resync: 500 * time.Millisecond,
			Controller: controller.Options{SkipNameValidation: ptr.To(true)}, Log: testr.New(t),
		},
		handler.Config{
			StateDir: filepath.Join(dir, "s"), RunDir: filepath.Join(dir, "r"),
			Drivers:      handler.DriverSet{Hypervisor: "fake", Hypervisors: moreHypervisors, Network: "fake-net", Storage: storage.Name},
			ResyncPeriod: metav1.Duration{Duration: 500 * time.Millisecond},
		},
		handler.Options{
			Logger: hclog.New(&hclog.LoggerOptions{Name: "handler", Level: hclog.Warn, Output: os.Stderr}),
			Manifests: append([]plugin.Manifest{
				manifest("kubevisor-driver-fake", driver.KindHypervisor, "fake", driver.KindHypervisor),
				manifest("testdriver", driver.KindNetwork, "fake-net", driver.KindNetwork, "name=fake-net"),
				storage,
			}, more...),
		})
	if err != nil {
		t.Fatal(err)
	}
	n.h, n.agent = agent.Handler(), agent
	// Cleanups run last first: the manager stops, then the handler closes.
	t.Cleanup(func() { _ = n.h.Close() })
	envtest.RunManager(t, mgr)
	n.c = env.Client
	return n
}

// vmi creates a VMI labelled with the node, as the VMI controller leaves it once its launcher
// pod is scheduled, and returns it as stored. Its disk is the volume root: an emptyDisk unless
// root is given.
func (n *agentNode) vmi(name string, root ...v1alpha1.VolumeSource) *v1alpha1.VirtualMachineInstance {
	return n.vmiWith(name, nil, root...)
}

// vmiWith is vmi with change applied to the VMI before it is created.
func (n *agentNode) vmiWith(name string, change func(*v1alpha1.VirtualMachineInstance), root ...v1alpha1.VolumeSource) *v1alpha1.VirtualMachineInstance {
	src := v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("1Mi")}}
	if len(root) > 0 {
		src = root[0]
	}
	mem := resource.MustParse("64Mi")
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{v1alpha1.NodeNameLabel: node}},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Domain: v1alpha1.DomainSpec{
				Memory: &v1alpha1.Memory{Guest: &mem},
				Devices: v1alpha1.Devices{
					Disks: []v1alpha1.Disk{{Name: "root", DiskDevice: v1alpha1.DiskDevice{Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}}},
					Interfaces: []v1alpha1.Interface{{Name: "default", InterfaceBindingMethod: v1alpha1.InterfaceBindingMethod{
						Masquerade: &v1alpha1.InterfaceMasquerade{}}}},
				},
			},
			Volumes:  []v1alpha1.Volume{{Name: "root", VolumeSource: src}},
			Networks: []v1alpha1.Network{{Name: "default", NetworkSource: v1alpha1.NetworkSource{Pod: &v1alpha1.PodNetwork{}}}},
		},
	}
	if change != nil {
		change(vmi)
	}
	if err := n.c.Create(context.Background(), vmi); err != nil {
		n.t.Fatalf("create VMI %s: %v", name, err)
	}
	vmi.Status.Phase, vmi.Status.NodeName = v1alpha1.Scheduled, node
	if err := n.c.Status().Update(context.Background(), vmi); err != nil {
		n.t.Fatalf("VMI %s Scheduled: %v", name, err)
	}
	return vmi
}

// launcherPod starts a real launcher in the VMI's host directory and creates a Running pod
// object for it, bound to the node, as the kubelet would report it.
func (n *agentNode) launcherPod(vmi *v1alpha1.VirtualMachineInstance, labels ...map[string]string) *corev1.Pod {
	n.t.Helper()
	n.startLauncher(vmi)
	return n.runningPod(vmi, labels...)
}

// startLauncher starts a real launcher in the VMI's host directory.
func (n *agentNode) startLauncher(vmi *v1alpha1.VirtualMachineInstance) {
	n.t.Helper()
	cmd := exec.Command(filepath.Join(n.bin, "kubevisor-launcher"), "--dir", layout.LauncherDir(n.hostDir, vmi.UID),
		"--vmi", vmi.Namespace+"/"+vmi.Name, "--grace-period", "5s")
	cmd.Stderr = os.Stderr
	if err := os.MkdirAll(filepath.Dir(layout.LauncherDir(n.hostDir, vmi.UID)), 0o700); err != nil {
		n.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// runningPod creates a Running launcher pod object for the VMI, bound to the node, as the
// kubelet would report it, with labels besides the launcher pod's own.
func (n *agentNode) runningPod(vmi *v1alpha1.VirtualMachineInstance, labels ...map[string]string) *corev1.Pod {
	n.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "virt-launcher-" + vmi.Name, Namespace: vmi.Namespace,
			Labels: map[string]string{v1alpha1.CreatedByLabel: string(vmi.UID), v1alpha1.VirtualMachineInstanceNameLabel: vmi.Name},
		},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "compute", Image: "kubevisor-launcher"}}},
	}
	for _, l := range labels {
		maps.Copy(pod.Labels, l)
	}
	ctx := context.Background()
	if err := n.c.Create(ctx, pod); err != nil {
		n.t.Fatal(err)
	}
	n.setPodPhase(pod, corev1.PodRunning)
	return pod
}

func (n *agentNode) setPodPhase(pod *corev1.Pod, phase corev1.PodPhase) {
	n.t.Helper()
	ctx := context.Background()
	if err := n.c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		n.t.Fatal(err)
	}
	pod.Status.Phase = phase
	if err := n.c.Status().Update(ctx, pod); err != nil {
		n.t.Fatalf("pod %s %s: %v", pod.Name, phase, err)
	}
}

// waitVMI polls the stored VMI until cond holds.
func (n *agentNode) waitVMI(name, what string, cond func(*v1alpha1.VirtualMachineInstance) bool) *v1alpha1.VirtualMachineInstance {
	n.t.Helper()
	var vmi v1alpha1.VirtualMachineInstance
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if err := n.c.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: name}, &vmi); err == nil && cond(&vmi) {
			return &vmi
		}
		time.Sleep(100 * time.Millisecond)
	}
	n.t.Fatalf("VMI %s: %s: status %+v", name, what, vmi.Status)
	return nil
}

// waitHandlerForgets polls until the handler no longer runs the VMI.
// stopLeavingNoMounts deletes the launcher pod of the VMI name (uid), waits for the VMI to
// succeed and the handler to forget it, and fails the test when a mount is left under the
// node's state directory 30 s later.
func (n *agentNode) stopLeavingNoMounts(ctx context.Context, pod *corev1.Pod, name string, uid types.UID) {
	n.t.Helper()
	if err := n.c.Delete(ctx, pod); err != nil {
		n.t.Fatal(err)
	}
	n.waitVMI(name, "Succeeded", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Succeeded })
	n.waitHandlerForgets(uid)
	deadline := time.Now().Add(30 * time.Second)
	for len(mountsUnder(n.t, n.hostDir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if got := mountsUnder(n.t, n.hostDir); len(got) != 0 {
		n.t.Errorf("mounts left after the VMI stopped: %v", got)
	}
}

func (n *agentNode) waitHandlerForgets(uid types.UID) {
	n.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if !slices.Contains(n.h.VMIs(), uid) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	n.t.Fatalf("the handler still runs VMI %s", uid)
}

func condition(vmi *v1alpha1.VirtualMachineInstance, t v1alpha1.VirtualMachineInstanceConditionType) *v1alpha1.VirtualMachineInstanceCondition {
	for i := range vmi.Status.Conditions {
		if vmi.Status.Conditions[i].Type == t {
			return &vmi.Status.Conditions[i]
		}
	}
	return nil
}

// TestAgent drives VMIs through the agent on a real API server: a running launcher pod gets
// its VMI Running with status written to the API; deleting the pod stops the VM and leaves the
// VMI Succeeded; a pod that fails under a running VM, or whose launcher container ends while
// the pod still runs, fails the VMI naming the launcher; a VMI deleted from the API has its VM
// stopped.
func TestAgent(t *testing.T) {
	n := newAgentNode(t, false)
	ctx := context.Background()

	t.Run("pod running: VMI Running", func(t *testing.T) {
		n.t = t
		vmi := n.vmi("a")
		n.vmi("waiting") // no launcher pod yet: the agent leaves it Scheduled
		pod := n.launcherPod(vmi)
		got := n.waitVMI("a", "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })
		if c := condition(got, v1alpha1.VirtualMachineInstanceReady); c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("Ready = %+v, want True", c)
		}
		if got.Status.NodeName != node || len(got.Status.Interfaces) != 1 || got.Status.Interfaces[0].Name != "default" {
			t.Errorf("status nodeName %q interfaces %+v", got.Status.NodeName, got.Status.Interfaces)
		}
		// By now the agent has reconciled "waiting" too (same node, earlier): with no launcher
		// pod it must have left it as it was.
		var waiting v1alpha1.VirtualMachineInstance
		if err := n.c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "waiting"}, &waiting); err != nil {
			t.Fatal(err)
		}
		if waiting.Status.Phase != v1alpha1.Scheduled || slices.Contains(n.h.VMIs(), waiting.UID) {
			t.Errorf("a VMI without a running launcher pod went %s (handler runs it: %v)", waiting.Status.Phase, slices.Contains(n.h.VMIs(), waiting.UID))
		}
		// One Started event with the handler's timeline, as the agent's.
		var started []eventsv1.Event
		deadline := time.Now().Add(30 * time.Second)
		for {
			var evs eventsv1.EventList
			if err := n.c.List(ctx, &evs, client.InNamespace("default")); err != nil {
				t.Fatal(err)
			}
			started = started[:0]
			for _, e := range evs.Items {
				if e.Regarding.UID == vmi.UID && e.Reason == v1alpha1.ReasonStarted {
					started = append(started, e)
				}
			}
			if len(started) > 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if len(started) != 1 || started[0].ReportingController != EventSource || started[0].Related == nil || started[0].Related.Name != pod.Name {
			t.Fatalf("Started events of the VMI: %+v, want one from %s about pod %s", started, EventSource, pod.Name)
		}
		if tl, err := handler.ParseTimelineNote(started[0].Note); err != nil || len(tl.Steps) < 6 {
			t.Errorf("Started event note %q: %+v, %v; want the sync's timeline", started[0].Note, tl, err)
		}

		// The serial console reaches the VMI directory's console log (guest-console-log).
		consoleLog := layout.ConsoleLog(n.hostDir, vmi.UID)
		deadline = time.Now().Add(30 * time.Second)
		for {
			b, _ := os.ReadFile(consoleLog)
			if strings.Contains(string(b), "Kubevisor fake guest") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("console log %s: %q, want the guest's boot output", consoleLog, b)
			}
			time.Sleep(100 * time.Millisecond)
		}

		// The pod is deleted (the VMI controller does this when the VMI goes): bound to a
		// node, it stays Terminating, and the agent stops the VM within the grace period.
		if err := n.c.Delete(ctx, pod); err != nil {
			t.Fatal(err)
		}
		n.waitVMI("a", "Succeeded", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Succeeded })
		n.waitHandlerForgets(vmi.UID)
	})

	t.Run("exec and guestAgentPing probes: kubevisor-probe through the guest probe socket", func(t *testing.T) {
		n.t = t
		vmi := n.vmiWith("probed", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.LivenessProbe = &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"exit", "3"}}}}
			v.Spec.ReadinessProbe = &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{GuestAgentPing: &v1alpha1.GuestAgentPing{}}}
		})
		pod := n.launcherPod(vmi)
		n.waitVMI("probed", "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })
		socket := layout.GuestProbeSocket(n.hostDir, vmi.UID)
		waitExists(t, socket)
		fi, err := os.Lstat(filepath.Dir(socket))
		if err != nil {
			t.Fatal(err)
		}
		launcherDir, err := os.Lstat(layout.LauncherDir(n.hostDir, vmi.UID))
		if err != nil {
			t.Fatal(err)
		}
		if !fi.IsDir() || fi.Mode().Perm() != 0o700 || fi.Sys().(*syscall.Stat_t).Uid != launcherDir.Sys().(*syscall.Stat_t).Uid {
			t.Errorf("socket directory %v uid %d, want 0700 and the launcher's uid %d", fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid, launcherDir.Sys().(*syscall.Stat_t).Uid)
		}
		// The compute container's probes, as controlplane/launcherpod writes them.
		probe := func(args ...string) (int, string, string) {
			t.Helper()
			cmd := exec.Command(filepath.Join(n.bin, layout.GuestProbeCommand), append([]string{"--socket", socket, "--timeout", "5s"}, args...)...)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if err != nil && !errors.As(err, &ee) {
				t.Fatal(err)
			}
			return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
		}
		if code, _, stderr := probe("ping"); code != 0 {
			t.Errorf("ping: exit %d, %s", code, stderr)
		}
		if code, _, stderr := probe("exec", "--", "exit", "3"); code != 1 || !strings.Contains(stderr, `command ["exit" "3"] in the guest exited with status 3`) {
			t.Errorf("exec exit 3 (the liveness probe's): exit %d, stderr %q", code, stderr)
		}
		// Only the VMI's own probe commands: the socket is no way into the guest for any other.
		for _, cmd := range [][]string{{"echo", "alive"}, {"exit"}, {"exit", "3", "x"}} {
			if code, _, stderr := probe(append([]string{"exec", "--"}, cmd...)...); code != 1 || !strings.Contains(stderr, fmt.Sprintf("command %q is not the exec command of one of the VMI's probes", cmd)) {
				t.Errorf("exec %q, not a probe's: exit %d, stderr %q", cmd, code, stderr)
			}
		}
		// A new handler process serves the socket again from its first reconcile of the VMI:
		// the socket gone (as after the old process ended), a change of the VMI brings it back.
		n.agent.probes.stop(vmi.UID)
		if _, err := os.Lstat(socket); !os.IsNotExist(err) {
			t.Fatalf("socket after stop: %v", err)
		}
		if code, _, stderr := probe("ping"); code != 1 || !strings.Contains(stderr, "cannot reach the node handler") {
			t.Errorf("ping with no socket: exit %d, stderr %q", code, stderr)
		}
		var cur v1alpha1.VirtualMachineInstance
		if err := n.c.Get(ctx, client.ObjectKeyFromObject(vmi), &cur); err != nil {
			t.Fatal(err)
		}
		cur.Annotations = map[string]string{"test": "reconcile"}
		if err := n.c.Update(ctx, &cur); err != nil {
			t.Fatal(err)
		}
		waitExists(t, socket)
		if code, _, stderr := probe("ping"); code != 0 {
			t.Errorf("ping after the socket came back: exit %d, %s", code, stderr)
		}
		// Stopping the VMI stops its socket.
		if err := n.c.Delete(ctx, pod); err != nil {
			t.Fatal(err)
		}
		n.waitVMI("probed", "Succeeded", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Succeeded })
		n.waitHandlerForgets(vmi.UID)
		waitGone(t, socket)
	})

	t.Run("pod failed under a running VM: VMI Failed naming the launcher", func(t *testing.T) {
		n.t = t
		vmi := n.vmi("b")
		pod := n.launcherPod(vmi)
		n.waitVMI("b", "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })
		n.setPodPhase(pod, corev1.PodFailed)
		got := n.waitVMI("b", "Failed", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Failed })
		if got.Status.Reason != handler.ReasonSandboxExited {
			t.Errorf("reason %q, want %q", got.Status.Reason, handler.ReasonSandboxExited)
		}
		n.waitHandlerForgets(vmi.UID)
	})

	t.Run("launcher container exited in a pod still running: VMI Failed naming the launcher", func(t *testing.T) {
		// A pod with containerDisk containers stays Running after its launcher ends.
		n.t = t
		vmi := n.vmi("e")
		pod := n.launcherPod(vmi)
		n.waitVMI("e", "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })
		if err := n.c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			t.Fatal(err)
		}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{
			{Name: "compute", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}},
			{Name: "volume-root", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
		}
		if err := n.c.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
		got := n.waitVMI("e", "Failed", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Failed })
		if got.Status.Reason != handler.ReasonSandboxExited {
			t.Errorf("reason %q, want %q", got.Status.Reason, handler.ReasonSandboxExited)
		}
		n.waitHandlerForgets(vmi.UID)
	})

	t.Run("launcher not answering yet: SandboxNotReady, the error counted and the sync retried", func(t *testing.T) {
		n.t = t
		errorsBefore := reconcileErrors(t)
		vmi := n.vmi("late")
		pod := n.runningPod(vmi) // the kubelet says Running; the launcher does not answer yet
		n.waitVMI("late", "SandboxNotReady", func(v *v1alpha1.VirtualMachineInstance) bool {
			c := condition(v, v1alpha1.VirtualMachineInstanceSynchronized)
			return c != nil && c.Status == corev1.ConditionFalse && c.Reason == handler.ReasonSandboxNotReady
		})
		deadline := time.Now().Add(30 * time.Second)
		for reconcileErrors(t) <= errorsBefore {
			if time.Now().After(deadline) {
				t.Fatalf("reconcile errors of the node agent stay at %v after a failed sync", errorsBefore)
			}
			time.Sleep(100 * time.Millisecond)
		}
		n.startLauncher(vmi) // the work queue's retry finds it
		got := n.waitVMI("late", "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })
		if c := condition(got, v1alpha1.VirtualMachineInstanceSynchronized); c != nil {
			t.Errorf("Synchronized = %+v once the sync succeeded", c)
		}
		if err := n.c.Delete(ctx, pod); err != nil {
			t.Fatal(err)
		}
		n.waitVMI("late", "Succeeded", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Succeeded })
		n.waitHandlerForgets(vmi.UID)
	})

	t.Run("VMI deleted from the API: VM stopped", func(t *testing.T) {
		n.t = t
		vmi := n.vmi("c")
		n.launcherPod(vmi)
		n.waitVMI("c", "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })
		if err := n.c.Delete(ctx, vmi); err != nil {
			t.Fatal(err)
		}
		n.waitHandlerForgets(vmi.UID)
		// Its directory on the node goes with it.
		waitGone(t, layout.VMIDir(n.hostDir, vmi.UID))
	})

	t.Run("directories left behind are swept, recent ones kept", func(t *testing.T) {
		n.t = t
		old, recent := layout.VMIDir(n.hostDir, "left-behind"), layout.VMIDir(n.hostDir, "being-made")
		for _, d := range []string{old, recent} {
			if err := os.MkdirAll(filepath.Join(d, "launcher"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		long := time.Now().Add(-time.Hour)
		if err := os.Chtimes(old, long, long); err != nil {
			t.Fatal(err)
		}
		waitGone(t, old)
		if _, err := os.Stat(recent); err != nil {
			t.Errorf("a new VMI directory (its VMI maybe not yet seen) was removed: %v", err)
		}
	})
	if left := n.h.VMIs(); len(left) != 0 {
		t.Errorf("the handler still runs %v", left)
	}
}

// TestAgentContainerDisk runs a VMI whose disk is a containerDisk through the agent, with the
// real local storage driver, a real kubevisor-containerdisk process standing in for the
// volume's container (in a mount namespace of its own, chrooted into a root with
// /disk/disk.qcow2) and a real launcher: the VMI runs; the image's disk is mounted read-only
// at containerdisks/root.img in the per-VMI directory; the storage driver's overlay is in the
// per-VMI directory (volumes/) with that mount as its backing file, and the run directory is
// there too (run/); once the pod is deleted the VM is stopped, the overlay and run directory
// are gone, nothing is mounted any more and the mount point is removed, while the launcher's
// directory is left alone.
func TestAgentContainerDisk(t *testing.T) {
	needRoot(t)
	n := newAgentNode(t, true)
	ctx := context.Background()
	disk := filepath.Join(n.hostDir, "disk", "disk.qcow2")
	if err := os.MkdirAll(filepath.Dir(disk), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", disk, "16M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	vmi := n.vmi("cd", v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "kubevisor/test-guest:latest"}})
	containerDiskStandIn(t, n.bin, n.hostDir, vmi.UID, "root")
	pod := n.launcherPod(vmi)
	n.waitVMI("cd", "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })

	vmiDir := layout.VMIDir(n.hostDir, vmi.UID)
	img := layout.ContainerDiskImage(n.hostDir, vmi.UID, "root")
	if got := mountsUnder(t, n.hostDir); len(got) != 1 || got[0] != img {
		t.Errorf("mounts under the host state directory %v, want just %s", got, img)
	}
	var a, b syscall.Stat_t
	if err := syscall.Stat(img, &a); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(disk, &b); err != nil {
		t.Fatal(err)
	}
	if a.Dev != b.Dev || a.Ino != b.Ino {
		t.Errorf("%s is not the image's /disk/disk.qcow2", img)
	}
	overlay := filepath.Join(vmiDir, handler.SandboxVolumesDir, "root.qcow2")
	out, err := exec.Command("qemu-img", "info", "-U", "--output=json", overlay).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", overlay, err)
	}
	var info struct {
		Backing string `json:"full-backing-filename"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	if info.Backing != img {
		t.Errorf("overlay backing file %q, want %s", info.Backing, img)
	}
	runDir := filepath.Join(vmiDir, handler.SandboxRunDir)
	if _, err := os.Stat(runDir); err != nil {
		t.Errorf("run directory: %v", err)
	}

	n.stopLeavingNoMounts(ctx, pod, "cd", vmi.UID)
	for _, p := range []string{img, overlay, runDir} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after the VMI stopped (%v)", p, err)
		}
	}
	if _, err := os.Stat(layout.LauncherDir(n.hostDir, vmi.UID)); err != nil {
		t.Errorf("the launcher's directory: %v", err)
	}
}

// TestServe runs the whole serve mode against a real API server: the driver plugins start
// and the node gets their capability labels and the schedulable label.
func TestServe(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	dir, err := os.MkdirTemp("/tmp", "kvs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	bin := filepath.Join(dir, "bin")
	if err := testbin.Build(bin, false, "github.com/kubevisor/kubevisor/cmd/kubevisor-driver-fake"); err != nil {
		t.Fatal(err)
	}
	m, err := plugin.ManifestFor(filepath.Join(bin, "kubevisor-driver-fake"), driver.KindHypervisor, "fake")
	if err != nil {
		t.Fatal(err)
	}
	m.Args = []string{driver.KindHypervisor}
	ctx, cancel := context.WithCancel(context.Background())
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2"}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, ServeConfig{
			Rest: env.Config,
			Handler: handler.Config{
				StateDir: filepath.Join(dir, "s"), RunDir: filepath.Join(dir, "r"), NodeName: "node-2",
				Drivers: handler.DriverSet{Hypervisor: "fake"},
			},
			Manifests:   []plugin.Manifest{m},
			Agent:       AgentConfig{HostStateDir: filepath.Join(dir, "host")},
			MetricsAddr: "0", HealthAddr: "0", StopDrivers: true,
			Logger: hclog.New(&hclog.LoggerOptions{Name: "serve", Level: hclog.Warn, Output: os.Stderr}),
			Log:    testr.New(t),
		})
	}()
	want := map[string]string{v1alpha1.DriverHealthLabel("hypervisor", "fake"): v1alpha1.DriverHealthy, v1alpha1.SchedulableNodeLabel: "true"}
	deadline := time.Now().Add(60 * time.Second)
	var labels map[string]string
	for time.Now().Before(deadline) {
		var n corev1.Node
		if err := env.Client.Get(ctx, types.NamespacedName{Name: "node-2"}, &n); err != nil {
			t.Fatal(err)
		}
		labels = n.Labels
		if labels[v1alpha1.DriverHealthLabel("hypervisor", "fake")] == v1alpha1.DriverHealthy && labels[v1alpha1.SchedulableNodeLabel] == "true" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("node label %s = %q, want %q (labels %v)", k, labels[k], v, labels)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("Serve did not return after its context ended")
	}
}

// reconcileErrors is the node agent controller's reconcile error count
// (controller_runtime_reconcile_errors_total), shared by the agents of this test process.
func reconcileErrors(t *testing.T) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "node-agent" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// waitGone polls until path no longer exists.
// waitExists waits for path to exist.
func waitExists(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Lstat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not exist", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitGone(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(path); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is still there", path)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
