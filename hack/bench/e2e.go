package bench

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/controlplane/manager"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
)

// Defaults of `kubevisor-bench e2e`.
const (
	DefaultE2EVMIs       = 20
	DefaultE2EImage      = "kubevisor/test-guest:latest"
	DefaultE2ETimeout    = 15 * time.Minute
	DefaultE2EHostState  = "/run/kubevisor"
	DefaultE2EBaseline   = 15 * time.Second
	DefaultE2EProgress   = 5
	DefaultE2ECPURequest = "10m"
	// handlerPodLabel selects the node handler's DaemonSet pods (manifests/).
	handlerPodLabel = "app.kubernetes.io/name=kubevisor-handler"
	// consolePoll is how often the bench looks for the console marker of the VMIs without it.
	consolePoll = 250 * time.Millisecond
)

const e2eUsage = `usage: kubevisor-bench e2e [flags]

Runs on a node of a cluster where Kubevisor is installed (make up), as root: creates --vmis VMIs
of the test guest at once (--memory, masquerade, cloud-init, as conformance/e2e's guestSpec) in a
new namespace and with a HypervisorClass of its own (a copy of the default class without its
per-pod CPU overhead, and --cpu-request per VMI, so that --vmis launcher pods fit the node's CPUs
for the scheduler; memory requests are unchanged). Prints a progress line every --progress VMIs,
then:
  - P50, P95 and max of creation-to-Running (the VMI's creationTimestamp, whole seconds, to the
    bench seeing phase Running on its watch) and of creation-to-console-marker
    (KUBEVISOR-GUEST-READY in the node's <host-state>/vmi/<uid>/console.log, the file the launcher
    writes and the guest-console-log container prints; --console logs reads the container's log
    through the API instead), both also from the bench's create request;
  - the timeline of the starts: P50, P95, min and max of when each phase was first seen after
    each VMI's create request (launcher pod created, scheduled, each container started, pod
    Running, the handler's sync and its steps from its Started event, Running, the console's
    first byte and marker), as kubevisor-bench start prints for one;
  - per VM, the memory (smaps_rollup RSS, PSS, anonymous) of the launcher pod's processes
    except QEMU (found by their cgroup, pod<UID>), the handler pod's and its driver plugins'
    share (/N), QEMU's own, and the verdict against 25 MiB beyond QEMU;
  - API requests per VMI counted by the kube-apiserver (apiserver_request_total from its
    /metrics), by verb and resource, from before the creates until all VMIs were Running with
    their marker, and for the deletion; the idle rate measured for --baseline before, and the
    bench's own requests.
At the end it deletes the namespace and the class and waits for the launcher pods to go; then,
in a namespace of its own, it measures the node's own pod start as the baseline: --vmis pods of
--baseline-containers containers (a launcher pod's count) of --baseline-image, with the launcher
pod's helper resources, created at once: create request to Running, P50/P95/max, and the VMIs'
against it; twice: idle pods, then busy ones whose first container spends, from its start, the
VMIs' median QEMU CPU time up to the console marker (pause -burn; read from /proc/<pid>/stat
twice after the markers, the idle guest's rate taken off): the contention the VMIs' pods met,
since every booting TCG guest keeps a core busy. VMI/busy baseline is what Kubevisor adds.

Flags:
`

// E2EConfig is the configuration of `kubevisor-bench e2e`, one field per flag.
type E2EConfig struct {
	// Kubeconfig reaches the cluster as its admin (/metrics of the API server).
	Kubeconfig string
	// VMIs is how many VMIs are created at once.
	VMIs int
	// Image is the test guest's containerDisk image.
	Image string
	// MemoryBytes is each VMI's guest memory.
	MemoryBytes uint64
	// CPURequest is each VMI's domain.resources.requests.cpu.
	CPURequest string
	// Timeout bounds creation to all VMIs Running with their console marker.
	Timeout time.Duration
	// HostState is the node's Kubevisor state directory (kubevisor-handler --host-state-dir).
	HostState string
	// Console is where the marker is looked for: "file" (the node's console.log) or "logs".
	Console string
	// Baseline is how long the API server's idle request rate is measured before the creates.
	Baseline time.Duration
	// Progress is the number of VMIs between progress lines.
	Progress int
	// BaselineImage and BaselineContainers make the node's pod start baseline: VMIs pods of
	// BaselineContainers containers of BaselineImage; none when BaselineContainers is 0.
	BaselineImage      string
	BaselineContainers int
}

func runE2E(args []string, stdout, stderr io.Writer) int {
	cfg := E2EConfig{MemoryBytes: 128 << 20}
	fs := flag.NewFlagSet("kubevisor-bench e2e", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, e2eUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "admin `kubeconfig` of the cluster")
	fs.IntVar(&cfg.VMIs, "vmis", DefaultE2EVMIs, "`number` of VMIs created at once")
	fs.StringVar(&cfg.Image, "image", DefaultE2EImage, "containerDisk `image` of the test guest")
	fs.Var((*bytesFlag)(&cfg.MemoryBytes), "memory", "guest memory of each VMI, a `quantity`")
	fs.StringVar(&cfg.CPURequest, "cpu-request", DefaultE2ECPURequest, "CPU request of each VMI, a `quantity`")
	fs.DurationVar(&cfg.Timeout, "timeout", DefaultE2ETimeout, "how long the VMIs may take to be Running with their console marker")
	fs.StringVar(&cfg.HostState, "host-state", DefaultE2EHostState, "the node's Kubevisor state `directory`")
	fs.StringVar(&cfg.Console, "console", "file", "where to look for the console marker: file (the node's console.log) or logs (kubectl logs -c guest-console-log)")
	fs.DurationVar(&cfg.Baseline, "baseline", DefaultE2EBaseline, "how long to measure the API server's idle request rate first")
	fs.IntVar(&cfg.Progress, "progress", DefaultE2EProgress, "print a progress line every `n` VMIs")
	fs.StringVar(&cfg.BaselineImage, "baseline-image", DefaultE2EBaselineImage, "pause `image` of the node's pod start baseline")
	fs.IntVar(&cfg.BaselineContainers, "baseline-containers", DefaultE2EBaselineContainers, "containers per pod of the node's pod start baseline (those of a launcher pod of the bench's VMIs); 0: no baseline")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if err := cfg.validate(fs.Args()); err != nil {
		fmt.Fprintf(stderr, "kubevisor-bench e2e: %v\n", err)
		return ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := RunE2E(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "kubevisor-bench e2e: %v\n", err)
		return ExitFail
	}
	return ExitOK
}

func (cfg *E2EConfig) validate(rest []string) error {
	switch {
	case len(rest) > 0:
		return fmt.Errorf("unexpected arguments %q", rest)
	case cfg.VMIs < 1:
		return errors.New("--vmis: at least 1")
	case cfg.Timeout <= 0 || cfg.Baseline < 0 || cfg.Progress < 1 || cfg.BaselineContainers < 0:
		return errors.New("--timeout and --progress must be positive, --baseline and --baseline-containers not negative")
	case cfg.Console != "file" && cfg.Console != "logs":
		return fmt.Errorf("--console: %q, want file or logs", cfg.Console)
	case cfg.MemoryBytes < 64<<20:
		return errors.New("--memory: at least 64Mi")
	}
	if _, err := resource.ParseQuantity(cfg.CPURequest); err != nil {
		return fmt.Errorf("--cpu-request: %w", err)
	}
	return nil
}

// e2eVMI is VMI i of the bench: the test guest as the cluster conformance suite runs it
// (conformance/e2e/guest) with the bench's class, memory and CPU request.
func e2eVMI(cfg E2EConfig, ns, class string, i int) (*v1alpha1.VirtualMachineInstance, error) {
	cpu, err := resource.ParseQuantity(cfg.CPURequest)
	if err != nil {
		return nil, fmt.Errorf("--cpu-request: %w", err)
	}
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("bench-%03d", i), Namespace: ns,
			Labels: map[string]string{"app": "kubevisor-bench-e2e"},
		},
		Spec: guest.Spec(guest.Options{
			Image: cfg.Image, Memory: resource.NewQuantity(int64(cfg.MemoryBytes), resource.BinarySI),
			CPURequest: &cpu, UserData: fmt.Sprintf("kubevisor-bench e2e VMI %d", i), HypervisorClass: class,
		}),
	}, nil
}

// e2eVM is what the bench saw of one VMI.
type e2eVM struct {
	name      string
	uid       types.UID
	sent      time.Time // just before the create request
	created   time.Time // metadata.creationTimestamp (whole seconds)
	running   time.Time // first seen Running on the watch
	marker    time.Time // first seen the console marker
	node      string
	failed    string
	launcher  *corev1.Pod
	qemu      MemUsage
	qemuPID   int
	bootCPU   time.Duration       // QEMU's CPU time up to the marker (e2ecpu.go)
	pod       MemUsage            // the launcher pod's processes but QEMU
	byPart    map[string]MemUsage // the same by container name (and "pause" for the sandbox)
	shim      MemUsage            // the pod's containerd-shim, outside the pod's cgroup
	podProcsN int
	// timeline is the VMI's start as the bench's watches saw it.
	timeline *vmiTimeline
}

// e2eBench runs one `kubevisor-bench e2e`.
type e2eBench struct {
	cfg     E2EConfig
	out     io.Writer
	c       client.WithWatch
	cs      kubernetes.Interface
	counter *requestCounter
	ns      string
	class   string
	start   time.Time

	mu  sync.Mutex
	vms map[types.UID]*e2eVM
	// byName holds the VMIs created so far, for the watch to match events to.
	byName map[string]*e2eVM
}

// RunE2E runs the e2e benchmark and prints its figures to out.
func RunE2E(ctx context.Context, cfg E2EConfig, out, logOut io.Writer) (err error) {
	if cfg.Console == "file" {
		if _, err := os.Stat(layout.VMIsDir(cfg.HostState)); err != nil {
			return fmt.Errorf("--console file needs the node's %s/vmi (run on the node, as root, or use --console logs): %w", cfg.HostState, err)
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = cfg.Kubeconfig
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	rc.QPS, rc.Burst = -1, 0 // N creates at once, not paced by the client
	b := &e2eBench{cfg: cfg, out: out, counter: newRequestCounter(), vms: map[types.UID]*e2eVM{}, byName: map[string]*e2eVM{}}
	counted := rest.CopyConfig(rc)
	counted.Wrap(b.counter.wrap)
	if b.c, err = client.NewWithWatch(counted, client.Options{Scheme: manager.Scheme()}); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if b.cs, err = kubernetes.NewForConfig(counted); err != nil {
		return fmt.Errorf("clientset: %w", err)
	}

	handlerPod, err := b.handlerPod(ctx)
	if err != nil {
		return err
	}
	procs, err := readProcTree("/proc")
	if err != nil {
		return err
	}
	idleHandler, err := b.handlerMem(ctx, procs, handlerPod)
	if err != nil {
		return fmt.Errorf("handler memory before the VMIs: %w", err)
	}

	if err := b.makeClass(ctx); err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "kv-bench-e2e-", Labels: map[string]string{"kubevisor.io/bench": "e2e"}}}
	if err := b.c.Create(ctx, ns); err != nil {
		_ = b.c.Delete(context.Background(), &v1alpha1.HypervisorClass{ObjectMeta: metav1.ObjectMeta{Name: b.class}})
		return fmt.Errorf("create namespace: %w", err)
	}
	b.ns = ns.Name
	var deleteReqs, deleteBench map[string]float64
	var deleteTook time.Duration
	defer func() {
		var cerr error
		deleteReqs, deleteBench, deleteTook, cerr = b.cleanup()
		if cerr != nil && err == nil {
			err = cerr
		}
		if err == nil {
			b.printDelete(deleteReqs, deleteBench, deleteTook)
		}
		if err == nil && cfg.BaselineContainers > 0 {
			err = b.runBaseline(ctx)
		}
	}()

	fmt.Fprintf(out, "kubevisor-bench e2e: %d VMIs of %s (%d MiB, masquerade, cloud-init) created at once in namespace %s, class %s (the default class's copy without per-pod CPU overhead; VMI cpu request %s)\n",
		cfg.VMIs, cfg.Image, cfg.MemoryBytes>>20, b.ns, b.class, cfg.CPURequest)
	fmt.Fprintf(out, "  node: %s, handler pod %s/%s; console marker %s read from %s; load average %s\n",
		handlerPod.Spec.NodeName, handlerPod.Namespace, handlerPod.Name, conformance.GuestReadyMarker, b.consoleSource(), loadAvg())

	// The API server's idle request rate, then the counts from just before the creates.
	m0, err := b.metrics(ctx)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := sleep(ctx, cfg.Baseline); err != nil {
		return err
	}
	m1, err := b.metrics(ctx)
	if err != nil {
		return err
	}
	t1 := time.Now()
	idle := diffFloat(m1, m0)
	benchBefore := b.counter.snapshot()

	if err := b.createAll(ctx); err != nil {
		return err
	}
	if err := sleep(ctx, rssSettle); err != nil {
		return err
	}
	m2, err := b.metrics(ctx)
	if err != nil {
		return err
	}
	t2 := time.Now()
	benchAfter := b.counter.snapshot()

	if procs, err = readProcTree("/proc"); err != nil {
		return err
	}
	busyHandler, err := b.handlerMem(ctx, procs, handlerPod)
	if err != nil {
		return fmt.Errorf("handler memory with the VMIs: %w", err)
	}
	if err := b.readVMs(ctx, procs); err != nil {
		return err
	}
	if err := b.readBootCPU(ctx); err != nil {
		return err
	}

	b.printLatency()
	b.printMemory(idleHandler, busyHandler)
	b.printRequests(diffFloat(m2, m1), idle, t1.Sub(t0), t2.Sub(t1), asServerKeys(diff(benchAfter, benchBefore)))
	fmt.Fprintf(out, "\nload average after the run: %s\n", loadAvg())
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *e2eBench) consoleSource() string {
	if b.cfg.Console == "file" {
		return b.cfg.HostState + "/vmi/<uid>/console.log on the node"
	}
	return "the launcher pods' " + layout.ConsoleLogContainer + " container logs (through the API: counted in the bench's requests)"
}

// handlerPod finds the node handler's pod (one node: the first Running one).
func (b *e2eBench) handlerPod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := b.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: handlerPodLabel})
	if err != nil {
		return nil, fmt.Errorf("list handler pods: %w", err)
	}
	for i := range pods.Items {
		if pods.Items[i].Status.Phase == corev1.PodRunning {
			if len(pods.Items) > 1 {
				fmt.Fprintf(b.out, "warning: %d handler pods; the bench reads the memory of %s's only\n", len(pods.Items), pods.Items[i].Spec.NodeName)
			}
			return &pods.Items[i], nil
		}
	}
	return nil, fmt.Errorf("no Running pod with %s", handlerPodLabel)
}

// makeClass creates the bench's HypervisorClass: the default class without per-pod CPU
// overhead (its 100m per pod would let only a few launcher pods onto a 2-CPU node).
func (b *e2eBench) makeClass(ctx context.Context) error {
	var list v1alpha1.HypervisorClassList
	if err := b.c.List(ctx, &list); err != nil {
		return fmt.Errorf("list HypervisorClasses: %w", err)
	}
	var base *v1alpha1.HypervisorClass
	for i := range list.Items {
		if list.Items[i].Annotations[v1alpha1.IsDefaultHypervisorClassAnnotation] == "true" {
			base = &list.Items[i]
		}
	}
	if base == nil {
		return errors.New("no default HypervisorClass (make install)")
	}
	class := &v1alpha1.HypervisorClass{
		ObjectMeta:      metav1.ObjectMeta{GenerateName: "kubevisor-bench-e2e-"},
		Driver:          base.Driver,
		Parameters:      base.Parameters,
		Scheduling:      base.Scheduling,
		DeviceResources: base.DeviceResources,
	}
	if base.Overhead != nil {
		class.Overhead = base.Overhead.DeepCopy()
		delete(class.Overhead.PodFixed, corev1.ResourceCPU)
	}
	if err := b.c.Create(ctx, class); err != nil {
		return fmt.Errorf("create HypervisorClass: %w", err)
	}
	b.class = class.Name
	return nil
}

// metrics reads apiserver_request_total from the API server.
func (b *e2eBench) metrics(ctx context.Context) (map[string]float64, error) {
	raw, err := b.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics of the API server: %w", err)
	}
	m, err := ParseRequestTotal(raw)
	if err != nil {
		return nil, fmt.Errorf("/metrics of the API server: %w", err)
	}
	return m, nil
}

// createAll creates the VMIs at once and waits until every one is Running with its marker.
func (b *e2eBench) createAll(ctx context.Context) error {
	var list v1alpha1.VirtualMachineInstanceList
	if err := b.c.List(ctx, &list, client.InNamespace(b.ns)); err != nil {
		return fmt.Errorf("list VMIs: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	w, err := b.c.Watch(wctx, &v1alpha1.VirtualMachineInstanceList{}, client.InNamespace(b.ns),
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		return fmt.Errorf("watch VMIs: %w", err)
	}
	defer w.Stop()

	vmis := make([]*v1alpha1.VirtualMachineInstance, b.cfg.VMIs)
	for i := range vmis {
		if vmis[i], err = e2eVMI(b.cfg, b.ns, b.class, i); err != nil {
			return err
		}
		b.byName[vmis[i].Name] = &e2eVM{name: vmis[i].Name, timeline: newTimeline(vmis[i].Name)}
	}
	// The launcher pods' and the handler's Started events give each VMI's timeline.
	for _, wl := range []client.ObjectList{&corev1.PodList{}, &eventsv1.EventList{}} {
		tw, err := b.c.Watch(wctx, wl, client.InNamespace(b.ns))
		if err != nil {
			return fmt.Errorf("watch %T: %w", wl, err)
		}
		defer tw.Stop()
		go followTimelines(tw, b.timelineOf)
	}
	b.start = time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(vmis))
	for i, vmi := range vmis {
		wg.Go(func() {
			vm := b.byName[vmi.Name]
			sent := time.Now()
			vm.timeline.setSent(sent)
			if err := b.c.Create(wctx, vmi); err != nil {
				errs[i] = fmt.Errorf("create VMI %s: %w", vmi.Name, err)
				return
			}
			b.mu.Lock()
			vm.sent, vm.created, vm.uid = sent, vmi.CreationTimestamp.Time, vmi.UID
			b.vms[vmi.UID] = vm
			b.mu.Unlock()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Fprintf(b.out, "  %d VMIs created in %s\n", len(vmis), secs(time.Since(b.start)))

	consoleDone := make(chan struct{})
	go func() { defer close(consoleDone); b.watchConsoles(wctx) }()
	defer func() { cancel(); <-consoleDone }()

	tick := time.NewTicker(consolePoll)
	defer tick.Stop()
	lastRunning, lastMarker := 0, 0
	for {
		running, marked, failed := b.counts()
		if failed != "" {
			return errors.New(failed)
		}
		if running/b.cfg.Progress > lastRunning/b.cfg.Progress || marked/b.cfg.Progress > lastMarker/b.cfg.Progress ||
			(running == b.cfg.VMIs && lastRunning < running) || (marked == b.cfg.VMIs && lastMarker < marked) {
			fmt.Fprintf(b.out, "  %6.1fs: %2d/%d Running, %2d/%d with %s on the console (load %s)\n",
				time.Since(b.start).Seconds(), running, b.cfg.VMIs, marked, b.cfg.VMIs, conformance.GuestReadyMarker, loadAvg())
		}
		lastRunning, lastMarker = running, marked
		if running == b.cfg.VMIs && marked == b.cfg.VMIs {
			return nil
		}
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				if wctx.Err() != nil {
					return fmt.Errorf("after %s: %d/%d Running, %d/%d with the marker: %w", b.cfg.Timeout, running, b.cfg.VMIs, marked, b.cfg.VMIs, wctx.Err())
				}
				// The server ended the watch: watch again from the VMIs' state now.
				if w, err = b.rewatch(wctx); err != nil {
					return err
				}
				continue
			}
			b.observe(ev, time.Now())
		case <-tick.C:
		case <-wctx.Done():
			return fmt.Errorf("after %s: %d/%d Running, %d/%d with the marker: %w", b.cfg.Timeout, running, b.cfg.VMIs, marked, b.cfg.VMIs, wctx.Err())
		}
	}
}

// rewatch lists the VMIs (marking those already Running now) and watches from there.
func (b *e2eBench) rewatch(ctx context.Context) (watch.Interface, error) {
	var list v1alpha1.VirtualMachineInstanceList
	if err := b.c.List(ctx, &list, client.InNamespace(b.ns)); err != nil {
		return nil, fmt.Errorf("list VMIs: %w", err)
	}
	now := time.Now()
	for i := range list.Items {
		b.observe(watch.Event{Type: watch.Modified, Object: &list.Items[i]}, now)
	}
	return b.c.Watch(ctx, &v1alpha1.VirtualMachineInstanceList{}, client.InNamespace(b.ns),
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
}

// observe records a VMI's phase from a watch event seen at now.
func (b *e2eBench) observe(ev watch.Event, now time.Time) {
	if ev.Type != watch.Added && ev.Type != watch.Modified {
		return
	}
	vmi, ok := ev.Object.(*v1alpha1.VirtualMachineInstance)
	if !ok {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	vm := b.byName[vmi.Name]
	if vm == nil {
		return
	}
	if vm.uid == "" { // the watch saw it before its create returned
		vm.uid, vm.created = vmi.UID, vmi.CreationTimestamp.Time
		b.vms[vmi.UID] = vm
	}
	switch vmi.Status.Phase {
	case v1alpha1.Running:
		if vm.running.IsZero() {
			vm.running, vm.node = now, vmi.Status.NodeName
		}
		vm.timeline.mark(phaseVMIRunning, now)
	case v1alpha1.Failed, v1alpha1.Succeeded:
		vm.failed = fmt.Sprintf("VMI %s ended %s: %+v", vmi.Name, vmi.Status.Phase, vmi.Status.Conditions)
	}
}

// timelineOf returns the timeline of the bench's VMI called name, nil for another.
func (b *e2eBench) timelineOf(name string) *vmiTimeline {
	b.mu.Lock()
	defer b.mu.Unlock()
	if vm := b.byName[name]; vm != nil {
		return vm.timeline
	}
	return nil
}

func (b *e2eBench) counts() (running, marked int, failed string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, vm := range b.byName {
		if !vm.running.IsZero() {
			running++
		}
		if !vm.marker.IsZero() {
			marked++
		}
		if vm.failed != "" && failed == "" {
			failed = vm.failed
		}
	}
	return running, marked, failed
}

// watchConsoles looks for the marker on the console of every VMI without it, every
// consolePoll, until all have it or ctx ends.
func (b *e2eBench) watchConsoles(ctx context.Context) {
	marker := []byte(conformance.GuestReadyMarker)
	for ctx.Err() == nil {
		b.mu.Lock()
		var todo []*e2eVM
		for _, vm := range b.vms {
			if vm.marker.IsZero() {
				todo = append(todo, vm)
			}
		}
		b.mu.Unlock()
		if len(todo) == 0 && len(b.vms) == b.cfg.VMIs {
			return
		}
		for _, vm := range todo {
			text, err := b.console(ctx, vm)
			if err != nil || len(text) == 0 {
				continue
			}
			now := time.Now()
			vm.timeline.mark(phaseFirstByte, now)
			if !bytes.Contains(text, marker) {
				continue
			}
			vm.timeline.mark(phaseMarker, now)
			b.mu.Lock()
			vm.marker = now
			b.mu.Unlock()
		}
		_ = sleep(ctx, consolePoll)
	}
}

// console returns what the VMI's guest printed so far.
func (b *e2eBench) console(ctx context.Context, vm *e2eVM) ([]byte, error) {
	if b.cfg.Console == "file" {
		return os.ReadFile(layout.ConsoleLog(b.cfg.HostState, vm.uid))
	}
	pod, err := b.launcherPod(ctx, vm.uid)
	if err != nil {
		return nil, err
	}
	return b.cs.CoreV1().Pods(b.ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: layout.ConsoleLogContainer}).DoRaw(ctx)
}

// launcherPod returns the VMI's launcher pod.
func (b *e2eBench) launcherPod(ctx context.Context, uid types.UID) (*corev1.Pod, error) {
	pods, err := b.cs.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.CreatedByLabel + "=" + string(uid)})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i], nil
		}
	}
	return nil, fmt.Errorf("no launcher pod for VMI %s", uid)
}

// e2eHandler is the handler pod's memory: the driver plugins' processes, and the rest of the
// pod (the handler, the device plugins, the pause process).
type e2eHandler struct {
	drivers, rest MemUsage
	nDrivers      int
}

// handlerMem reads the handler pod's memory.
func (b *e2eBench) handlerMem(ctx context.Context, procs []nodeProc, pod *corev1.Pod) (e2eHandler, error) {
	ps := podProcs(procs, string(pod.UID))
	if len(ps) == 0 {
		return e2eHandler{}, fmt.Errorf("no process in the cgroup of pod %s/%s (run the bench on its node)", pod.Namespace, pod.Name)
	}
	mem := medianMems(ctx, pids(ps))
	var h e2eHandler
	for _, p := range ps {
		if isDriverPlugin(p.comm) {
			h.drivers = h.drivers.Add(mem[p.pid])
			h.nDrivers++
		} else {
			h.rest = h.rest.Add(mem[p.pid])
		}
	}
	return h, ctx.Err()
}

// isDriverPlugin tells a driver plugin process (kubevisor-driver-<name>, cut to 15 bytes).
func isDriverPlugin(comm string) bool { return strings.HasPrefix(comm, "kubevisor-drive") }

func pids(ps []nodeProc) []int {
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = p.pid
	}
	return out
}

// medianMems reads the memory of every pid rssSamples times, rssInterval apart, all of them
// in each round, and returns each one's median; a process that exited is left out.
func medianMems(ctx context.Context, pids []int) map[int]MemUsage {
	samples := map[int][]MemUsage{}
	for i := range rssSamples {
		if i > 0 && sleep(ctx, rssInterval) != nil {
			break
		}
		for _, pid := range pids {
			if m, err := readMem(pid); err == nil {
				samples[pid] = append(samples[pid], m)
			}
		}
	}
	out := map[int]MemUsage{}
	for pid, ms := range samples {
		var rss, pss, anon []uint64
		for _, m := range ms {
			rss, pss, anon = append(rss, m.RSS), append(pss, m.PSS), append(anon, m.Anon)
		}
		out[pid] = MemUsage{RSS: Median(rss), PSS: Median(pss), Anon: Median(anon)}
	}
	return out
}

// readVMs finds each VMI's launcher pod and reads its processes' memory.
func (b *e2eBench) readVMs(ctx context.Context, procs []nodeProc) error {
	type found struct {
		vm   *e2eVM
		ps   []nodeProc
		shim []nodeProc
		ids  map[string]string // container ID → name
	}
	var all []found
	var every []int
	for _, vm := range b.vms {
		pod, err := b.launcherPod(ctx, vm.uid)
		if err != nil {
			return err
		}
		vm.launcher = pod
		ps := podProcs(procs, string(pod.UID))
		if len(ps) == 0 {
			return fmt.Errorf("VMI %s: no process in the cgroup of its launcher pod %s (is the bench on its node?)", vm.name, pod.Name)
		}
		ids := map[string]string{}
		for _, s := range slices.Concat(pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses) {
			if _, id, ok := strings.Cut(s.ContainerID, "://"); ok {
				ids[id] = s.Name
			}
		}
		f := found{vm: vm, ps: ps, shim: podShims(procs, ps), ids: ids}
		all = append(all, f)
		every = append(every, pids(ps)...)
		every = append(every, pids(f.shim)...)
	}
	mem := medianMems(ctx, every)
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, f := range all {
		f.vm.byPart = map[string]MemUsage{}
		qemus := 0
		for _, p := range f.ps {
			m := mem[p.pid]
			if isQEMU(p.comm) {
				f.vm.qemu = f.vm.qemu.Add(m)
				f.vm.qemuPID = p.pid
				qemus++
				continue
			}
			part := containerOf(p.cgroup, f.ids)
			f.vm.byPart[part] = f.vm.byPart[part].Add(m)
			f.vm.pod = f.vm.pod.Add(m)
			f.vm.podProcsN++
		}
		if qemus != 1 {
			return fmt.Errorf("VMI %s: %d QEMU processes in its launcher pod, want 1", f.vm.name, qemus)
		}
		for _, s := range f.shim {
			f.vm.shim = f.vm.shim.Add(mem[s.pid])
		}
	}
	return nil
}

// containerOf names the container of a cgroup path from the pod's container IDs; the pod
// sandbox's (pause) ID is not among them.
func containerOf(cgroup string, ids map[string]string) string {
	for id, name := range ids {
		if strings.Contains(cgroup, id) {
			return name
		}
	}
	return "pause (sandbox)"
}

// sortedVMs returns the VMs by name.
func (b *e2eBench) sortedVMs() []*e2eVM {
	return slices.SortedFunc(maps.Values(b.byName), func(a, c *e2eVM) int { return strings.Compare(a.name, c.name) })
}

// e2eLatencies returns, sorted, the time from each VM's start (by from) to its event (by to).
func e2eLatencies(vms []*e2eVM, from, to func(*e2eVM) time.Time) []time.Duration {
	var out []time.Duration
	for _, vm := range vms {
		f, t := from(vm), to(vm)
		if f.IsZero() || t.IsZero() {
			continue
		}
		out = append(out, t.Sub(f))
	}
	slices.Sort(out)
	return out
}

func (b *e2eBench) printLatency() {
	vms := b.sortedVMs()
	created := func(vm *e2eVM) time.Time { return vm.created }
	sent := func(vm *e2eVM) time.Time { return vm.sent }
	running := func(vm *e2eVM) time.Time { return vm.running }
	marker := func(vm *e2eVM) time.Time { return vm.marker }
	fmt.Fprintf(b.out, "\nlatency of %d VMIs created at once (%d CPUs; creationTimestamp has whole seconds and is set after admission: its rows may differ from those from the bench's create request by up to 1 s):\n", len(vms), runtime.NumCPU())
	tab := table{w: b.out, widths: []int{46, 9, 9, 9, 5}}
	tab.row("", "P50", "P95", "max", "VMIs")
	row := func(name string, d []time.Duration) {
		tab.row(name, secs(percentile(d, 50)), secs(percentile(d, 95)), secs(percentile(d, 100)), fmt.Sprint(len(d)))
	}
	row("creationTimestamp → Running (watch)", e2eLatencies(vms, created, running))
	row("creationTimestamp → console marker", e2eLatencies(vms, created, marker))
	row("create request → Running (watch)", e2eLatencies(vms, sent, running))
	row("create request → console marker", e2eLatencies(vms, sent, marker))
	row("Running → console marker", e2eLatencies(vms, running, marker))
	var last time.Time
	for _, vm := range vms {
		if vm.marker.After(last) {
			last = vm.marker
		}
	}
	fmt.Fprintf(b.out, "all %d Running with the marker %s after the first create request\n", len(vms), secs(last.Sub(b.start)))
	fmt.Fprintf(b.out, "\ntimeline of the %d starts (seconds after each VMI's create request, from the bench's watches of VMIs, launcher pods and the handler's Started events; the handler's steps end at the offsets shown):\n", len(vms))
	tls := make([]*vmiTimeline, len(vms))
	for i, vm := range vms {
		tls[i] = vm.timeline
	}
	printPhases(b.out, tls)
}

func (b *e2eBench) printMemory(idle, busy e2eHandler) {
	vms := b.sortedVMs()
	n := float64(len(vms))
	var qemu, pod, shim MemUsage
	parts := map[string]MemUsage{}
	procsN := 0
	for _, vm := range vms {
		qemu, pod, shim = qemu.Add(vm.qemu), pod.Add(vm.pod), shim.Add(vm.shim)
		for k, v := range vm.byPart {
			parts[k] = parts[k].Add(v)
		}
		procsN += vm.podProcsN
	}
	fmt.Fprintf(b.out, "\nmemory on the node with %d VMs running (smaps_rollup, median of %d readings %s apart; processes found by their cgroup: the kubelet's pod<UID>):\n",
		len(vms), rssSamples, rssInterval)
	fmt.Fprintf(b.out, "per VM, mean over the %d launcher pods (%.1f processes each besides QEMU), by container:\n", len(vms), float64(procsN)/n)
	tab := table{w: b.out, widths: []int{42, 10, 10, 10}}
	tab.row("", "RSS", "PSS", "anonymous")
	mrow := func(name string, m MemUsage, div float64) {
		tab.row(name, mib(float64(m.RSS)/div), mib(float64(m.PSS)/div), mib(float64(m.Anon)/div))
	}
	for _, k := range slices.Sorted(maps.Keys(parts)) {
		mrow("  "+k, parts[k], n)
	}
	mrow("  launcher pod but QEMU", pod, n)
	mrow("  QEMU", qemu, n)
	mrow("  containerd-shim (outside the pod)", shim, n)
	fmt.Fprintf(b.out, "node handler pod (%d driver plugins), before the VMIs → with them:\n", busy.nDrivers)
	mrow("  handler, device plugins, pause: before", idle.rest, 1)
	mrow("  handler, device plugins, pause: with VMs", busy.rest, 1)
	mrow("  driver plugins: before", idle.drivers, 1)
	mrow("  driver plugins: with VMs", busy.drivers, 1)

	fmt.Fprintf(b.out, "\nper running VM (handler share: the handler pod's processes but the drivers / N; drivers' share: the driver plugins / N; N = %d):\n", len(vms))
	t2 := table{w: b.out, widths: []int{17, 10, 12, 13, 14, 18, 24}}
	t2.row("", "QEMU", "launcher pod", "handler share", "drivers' share", "Kubevisor overhead", "aim ≤ 25 MiB beyond QEMU")
	for _, acc := range []accounting{byRSS, byPSS, byAnon} {
		f := memoryFigures{
			qemu:     float64(acc.of(qemu)) / n,
			launcher: float64(acc.of(pod)) / n,
			handler:  float64(acc.of(busy.rest)) / n,
			drivers:  float64(acc.of(busy.drivers)) / n,
		}
		growth := (float64(acc.of(busy.rest)+acc.of(busy.drivers)) - float64(acc.of(idle.rest)+acc.of(idle.drivers))) / n
		t2.row(acc.name, mib(f.qemu), mib(f.launcher), mib(f.handler), mib(f.drivers), mib(f.overhead()), verdict(f.overhead()))
		fmt.Fprintf(b.out, "%-17s   (handler pod's growth with the VMs, per VM: %s; with the containerd-shim, Kubernetes' per pod, the overhead is %s)\n",
			"", signedMiB(growth), mib(f.overhead()+float64(acc.of(shim))/n))
	}
	fmt.Fprintf(b.out, "(the launcher pod counts its launcher, guest-console-log, volume-containerdisk and pause processes; aim as kubevisor-bench memory's, KubeVirt budgets %s per VMI)\n", mib(KubeVirtOverhead))
}

func (b *e2eBench) printRequests(reqs, idle map[string]float64, idleFor, window time.Duration, bench map[string]float64) {
	n := float64(b.cfg.VMIs)
	total := sumFloat(reqs)
	idleTotal := sumFloat(idle)
	scale := 0.0
	if idleFor > 0 {
		scale = window.Seconds() / idleFor.Seconds()
	}
	fmt.Fprintf(b.out, "\nAPI requests counted by the kube-apiserver (apiserver_request_total, every client: kubelet, scheduler, controller-manager, Kubevisor's controller, api and handler, and this bench), from before the creates until all VMIs were Running with their marker (%s):\n", secs(window))
	fmt.Fprintf(b.out, "  total %.0f, %.1f per VMI; the idle rate over %s before was %.2f/s, i.e. ~%.0f in this window (%.1f per VMI): beyond it, %.1f per VMI\n",
		total, total/n, secs(idleFor), idleTotal/idleFor.Seconds(), idleTotal*scale, idleTotal*scale/n, (total-idleTotal*scale)/n)
	what := "the creates, its VMI list and watch, a /metrics read"
	if b.cfg.Console == "logs" {
		what += ", the launcher pod lists and console log reads"
	}
	fmt.Fprintf(b.out, "  bench's own: %.0f (%.1f per VMI: %s)\n", sumFloat(bench), sumFloat(bench)/n, what)
	fmt.Fprintln(b.out, "  by verb:")
	verbs := map[string]float64{}
	for k, v := range reqs {
		verb, _, _ := strings.Cut(k, " ")
		verbs[verb] += v
	}
	for _, k := range slices.Sorted(maps.Keys(verbs)) {
		fmt.Fprintf(b.out, "    %-64s %7.0f  %6.2f/VMI\n", k, verbs[k], verbs[k]/n)
	}
	fmt.Fprintln(b.out, "  by verb and resource (idle: expected in this window at the idle rate; bench: the bench's own):")
	for _, k := range slices.Sorted(maps.Keys(reqs)) {
		fmt.Fprintf(b.out, "    %-64s %7.0f  %6.2f/VMI  idle %6.1f  bench %4.0f\n", k, reqs[k], reqs[k]/n, idle[k]*scale, bench[k])
	}
	fmt.Fprintln(b.out, "  (WATCH requests count when a watch ends; the bench's /metrics reads are \"get nonresource\")")
}

func sumFloat(m map[string]float64) float64 {
	t := 0.0
	for _, v := range m {
		t += v
	}
	return t
}

func (b *e2eBench) printDelete(reqs, bench map[string]float64, took time.Duration) {
	if reqs == nil {
		return
	}
	n := float64(b.cfg.VMIs)
	fmt.Fprintf(b.out, "\ndeletion: namespace %s deleted, its launcher pods gone after %s; API requests meanwhile %.0f (%.1f per VMI, the bench's own %.0f)\n",
		b.ns, secs(took), sumFloat(reqs), sumFloat(reqs)/n, sumFloat(bench))
	verbs := map[string]float64{}
	for k, v := range reqs {
		verb, _, _ := strings.Cut(k, " ")
		verbs[verb] += v
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(verbs)) {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, verbs[k]))
	}
	fmt.Fprintf(b.out, "  by verb: %s\n", strings.Join(parts, ", "))
}

// cleanup deletes the namespace and the class, waits for the launcher pods and the
// namespace to go, and returns the API requests of the deletion.
func (b *e2eBench) cleanup() (reqs, bench map[string]float64, took time.Duration, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	before, merr := b.metrics(ctx)
	benchBefore := b.counter.snapshot()
	start := time.Now()
	fmt.Fprintf(b.out, "\ndeleting namespace %s and class %s\n", b.ns, b.class)
	if err := b.c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns}}); client.IgnoreNotFound(err) != nil {
		return nil, nil, 0, fmt.Errorf("delete namespace %s: %w", b.ns, err)
	}
	var left int
	for {
		pods, perr := b.cs.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.CreatedByLabel})
		if perr == nil {
			left = len(pods.Items)
			if left == 0 {
				break
			}
		}
		if sleep(ctx, time.Second) != nil {
			return nil, nil, 0, fmt.Errorf("namespace %s: %d launcher pods left after 5m", b.ns, left)
		}
	}
	took = time.Since(start)
	var after map[string]float64
	if merr == nil {
		after, merr = b.metrics(ctx)
	}
	benchAfter := b.counter.snapshot()
	if err := b.c.Delete(ctx, &v1alpha1.HypervisorClass{ObjectMeta: metav1.ObjectMeta{Name: b.class}}); client.IgnoreNotFound(err) != nil {
		return nil, nil, 0, fmt.Errorf("delete HypervisorClass %s: %w", b.class, err)
	}
	for {
		var ns corev1.Namespace
		if gerr := b.c.Get(ctx, client.ObjectKey{Name: b.ns}, &ns); client.IgnoreNotFound(gerr) == nil && gerr != nil {
			break
		}
		if sleep(ctx, time.Second) != nil {
			return nil, nil, 0, fmt.Errorf("namespace %s still there after 5m", b.ns)
		}
	}
	if merr != nil {
		return nil, nil, took, nil
	}
	return diffFloat(after, before), asServerKeys(diff(benchAfter, benchBefore)), took, nil
}
