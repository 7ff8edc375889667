package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/controlplane/launcherpod"
	"github.com/kubevisor/kubevisor/controlplane/manager"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// Defaults of `kubevisor-bench controlplane`.
const (
	DefaultControlPlaneVMIs    = 1000
	DefaultControlPlaneClients = 8
	DefaultControllerWorkers   = 4
	DefaultControlPlaneTimeout = 15 * time.Minute
	benchNamespace             = "default"
	// quietFor is how long the control plane must make no request after the last launcher pod
	// appeared for its work on the VMIs to count as done (status updates follow the pods).
	quietFor = 3 * time.Second
)

const controlPlaneUsage = `usage: kubevisor-bench controlplane [flags]

Starts a real kube-apiserver and etcd (internal/envtest: make k8s-bins builds them) with the
Kubevisor CRDs, runs kubevisor-controller's manager in this process (every controller, no leader
election) with a client that counts its API requests per verb and resource, creates a default
HypervisorClass and then --vmis VMIs from --clients concurrent clients, and waits until every VMI
has a launcher pod (watched by label). Prints a progress line every 100 launcher pods, then the
time until all have pods, the rate in VMIs/s, the p50 and p95 of create-request-to-pod-seen, the
control plane's API requests per VMI (total and by verb, then by verb and resource), and the
bench client's own requests as the baseline. No scheduler or kubelet runs: the pods stay Pending.

Flags:
`

// ControlPlaneConfig is the configuration of `kubevisor-bench controlplane`, one field per flag.
type ControlPlaneConfig struct {
	VMIs              int
	Clients           int
	ControllerWorkers int
	Timeout           time.Duration
}

func runControlPlane(args []string, stdout, stderr io.Writer) int {
	cfg := ControlPlaneConfig{}
	fs := flag.NewFlagSet("kubevisor-bench controlplane", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, controlPlaneUsage)
		fs.PrintDefaults()
	}
	fs.IntVar(&cfg.VMIs, "vmis", DefaultControlPlaneVMIs, "`number` of VMIs to create")
	fs.IntVar(&cfg.Clients, "clients", DefaultControlPlaneClients, "concurrent `workers` creating the VMIs")
	fs.IntVar(&cfg.ControllerWorkers, "controller-workers", DefaultControllerWorkers, "`objects` each controller reconciles at once (kubevisor-controller --workers)")
	fs.DurationVar(&cfg.Timeout, "timeout", DefaultControlPlaneTimeout, "how long the VMIs may take to get their launcher pods")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "kubevisor-bench controlplane: unexpected arguments %q\n", fs.Args())
		return ExitUsage
	case cfg.VMIs < 1 || cfg.Clients < 1 || cfg.ControllerWorkers < 1 || cfg.Timeout <= 0:
		fmt.Fprintln(stderr, "kubevisor-bench controlplane: --vmis, --clients, --controller-workers and --timeout must be positive")
		return ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := RunControlPlane(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "kubevisor-bench controlplane: %v\n", err)
		return ExitFail
	}
	return ExitOK
}

// requestCounter counts the API requests that pass through a rest.Config's transport.
type requestCounter struct {
	mu     sync.Mutex
	counts map[string]int // "verb resource"
	total  atomic.Int64
}

func newRequestCounter() *requestCounter { return &requestCounter{counts: map[string]int{}} }

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		verb, res := requestKind(req)
		c.mu.Lock()
		c.counts[verb+" "+res]++
		c.mu.Unlock()
		c.total.Add(1)
		return rt.RoundTrip(req)
	})
}

func (c *requestCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts)
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// requestKind names a request as Kubernetes' audit does: a verb (get, list, watch, create,
// update, patch, delete, deletecollection) and a resource with its API group and subresource
// ("virtualmachineinstances.kubevisor.io/status", "pods" for the core group);
// requests outside /api and /apis resources are "discovery".
func requestKind(req *http.Request) (verb, resource string) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	group := ""
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		group = "." + parts[1]
		parts = parts[3:]
	default:
		return strings.ToLower(req.Method), "discovery"
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	if len(parts) == 0 {
		return strings.ToLower(req.Method), "discovery"
	}
	resource = parts[0] + group
	named := len(parts) >= 2
	if len(parts) >= 3 {
		resource += "/" + parts[2]
	}
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
		if !named {
			verb = "deletecollection"
		}
	default:
		verb = strings.ToLower(req.Method)
	}
	return verb, resource
}

// diff returns after minus before, without zero entries.
func diff(after, before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

func byVerb(counts map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range counts {
		verb, _, _ := strings.Cut(k, " ")
		out[verb] += v
	}
	return out
}

func requestTotal(counts map[string]int) int {
	n := 0
	for _, v := range counts {
		n += v
	}
	return n
}

// benchVMI is the smallest VMI the VMI controller builds a launcher pod for.
func benchVMI(i int) *v1alpha1.VirtualMachineInstance {
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%05d", i), Namespace: benchNamespace},
		Spec: v1alpha1.VirtualMachineInstanceSpec{Domain: v1alpha1.DomainSpec{
			Memory: &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("128Mi"))},
		}},
	}
}

// RunControlPlane runs the control-plane benchmark and prints its figures to stdout.
func RunControlPlane(ctx context.Context, cfg ControlPlaneConfig, stdout, stderr io.Writer) error {
	// The controllers' own logs would drown the figures; errors still reach the requests' results.
	ctrl.SetLogger(logr.Discard())
	fmt.Fprintln(stdout, "starting kube-apiserver and etcd (internal/envtest)")
	env, err := envtest.StartEnv(envtest.Options{})
	if err != nil {
		return err
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(stderr, "stop API server: %v\n", err)
		}
	}()

	cpCount, benchCount := newRequestCounter(), newRequestCounter()
	cpCfg := rest.CopyConfig(env.Config)
	cpCfg.QPS = -1 // as kubevisor-controller runs: no client-side limit, API priority and fairness decide
	cpCfg.Wrap(cpCount.wrap)
	benchCfg := rest.CopyConfig(env.Config)
	benchCfg.QPS = -1
	benchCfg.Wrap(benchCount.wrap)

	c, err := client.New(benchCfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		return fmt.Errorf("bench client: %w", err)
	}
	cs, err := kubernetes.NewForConfig(benchCfg)
	if err != nil {
		return fmt.Errorf("bench clientset: %w", err)
	}
	class := &v1alpha1.HypervisorClass{
		ObjectMeta: metav1.ObjectMeta{Name: "bench", Annotations: map[string]string{v1alpha1.IsDefaultHypervisorClassAnnotation: "true"}},
		Driver:     "qmp",
	}
	if err := c.Create(ctx, class); err != nil {
		return fmt.Errorf("create HypervisorClass: %w", err)
	}

	mgr, err := manager.New(manager.Config{
		RestConfig:      cpCfg,
		MetricsAddr:     "0",
		HealthProbeAddr: "0",
		Pod:             launcherpod.Config{LauncherImage: "kubevisor-launcher:bench"},
		Workers:         cfg.ControllerWorkers,
	})
	if err != nil {
		return err
	}
	mctx, mcancel := context.WithCancel(ctx)
	mdone := make(chan error, 1)
	go func() { mdone <- mgr.Start(mctx) }()
	defer func() {
		mcancel()
		if err := <-mdone; err != nil {
			fmt.Fprintf(stderr, "manager: %v\n", err)
		}
	}()
	// Start from a control plane at rest: caches synced, controllers running.
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	synced := mgr.GetCache().WaitForCacheSync(syncCtx)
	cancel()
	if !synced {
		return errors.New("the manager's cache did not sync within a minute")
	}
	if err := waitQuiet(ctx, cpCount, quietFor, time.Minute); err != nil {
		return err
	}
	cpStart, benchStart := cpCount.snapshot(), benchCount.snapshot()

	// Watch launcher pods from before the first create, so none is missed.
	pods, err := cs.CoreV1().Pods(benchNamespace).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.CreatedByLabel})
	if err != nil {
		return fmt.Errorf("list launcher pods: %w", err)
	}
	var (
		mu        sync.Mutex
		createdAt = make(map[types.UID]time.Time, cfg.VMIs)
		podSeen   = make(map[types.UID]time.Time, cfg.VMIs)
	)
	all := make(chan struct{})
	watchErr := make(chan error, 1)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	start := time.Now()
	go func() {
		watchErr <- watchPods(wctx, cs, pods.ResourceVersion, func(p *corev1.Pod, at time.Time) {
			uid := types.UID(p.Labels[v1alpha1.CreatedByLabel])
			mu.Lock()
			defer mu.Unlock()
			if _, ok := podSeen[uid]; ok {
				return
			}
			podSeen[uid] = at
			n := len(podSeen)
			if n%100 == 0 || n == cfg.VMIs {
				fmt.Fprintf(stdout, "  %5d/%d launcher pods after %6.2fs (%d VMIs created)\n", n, cfg.VMIs, at.Sub(start).Seconds(), len(createdAt))
			}
			if n == cfg.VMIs {
				close(all)
			}
		})
	}()

	fmt.Fprintf(stdout, "creating %d VMIs from %d clients; %d workers per controller\n", cfg.VMIs, cfg.Clients, cfg.ControllerWorkers)
	next := make(chan int)
	errs := make(chan error, cfg.Clients)
	var wg sync.WaitGroup
	for range cfg.Clients {
		wg.Go(func() {
			for i := range next {
				vmi := benchVMI(i)
				t := time.Now()
				if err := c.Create(ctx, vmi); err != nil {
					errs <- fmt.Errorf("create VMI %s: %w", vmi.Name, err)
					return
				}
				mu.Lock()
				createdAt[vmi.UID] = t
				mu.Unlock()
			}
		})
	}
feed:
	for i := range cfg.VMIs {
		select {
		case next <- i:
		case err := <-errs:
			close(next)
			wg.Wait()
			return err
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	created := time.Since(start)

	select {
	case <-all:
	case err := <-watchErr:
		return fmt.Errorf("watch launcher pods: %w", err)
	case <-time.After(cfg.Timeout):
		mu.Lock()
		n := len(podSeen)
		mu.Unlock()
		return fmt.Errorf("only %d of %d VMIs had launcher pods after %s", n, cfg.VMIs, cfg.Timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
	mu.Lock()
	var last time.Time
	lat := make([]time.Duration, 0, cfg.VMIs)
	for uid, t := range createdAt {
		seen, ok := podSeen[uid]
		if !ok {
			continue
		}
		lat = append(lat, seen.Sub(t))
		if seen.After(last) {
			last = seen
		}
	}
	mu.Unlock()
	elapsed := last.Sub(start)
	wcancel()
	cpPods := diff(cpCount.snapshot(), cpStart)
	// The control plane goes on writing the VMIs' status after their pods exist: count until it rests.
	if err := waitQuiet(ctx, cpCount, quietFor, 2*time.Minute); err != nil {
		fmt.Fprintf(stderr, "warning: %v\n", err)
	}
	cpAll := diff(cpCount.snapshot(), cpStart)
	benchAll := diff(benchCount.snapshot(), benchStart)

	slices.Sort(lat)
	n := float64(cfg.VMIs)
	fmt.Fprintf(stdout, "\nVMIs:                     %d (created in %.2fs by %d clients)\n", cfg.VMIs, created.Seconds(), cfg.Clients)
	fmt.Fprintf(stdout, "all launcher pods after:  %.2fs\n", elapsed.Seconds())
	fmt.Fprintf(stdout, "rate:                     %.1f VMIs/s became launcher pods\n", n/elapsed.Seconds())
	fmt.Fprintf(stdout, "create-to-pod latency:    p50 %s, p95 %s, max %s (%d VMIs)\n",
		percentile(lat, 50), percentile(lat, 95), percentile(lat, 100), len(lat))
	fmt.Fprintf(stdout, "control plane requests:   %.2f per VMI until all pods existed (%d), %.2f per VMI until it rested (%d)\n",
		float64(requestTotal(cpPods))/n, requestTotal(cpPods), float64(requestTotal(cpAll))/n, requestTotal(cpAll))
	printCounts(stdout, "  by verb", byVerb(cpAll), n)
	printCounts(stdout, "  by verb and resource", cpAll, n)
	fmt.Fprintf(stdout, "bench client requests:    %.2f per VMI (%d): the baseline, one create per VMI plus its pod watch\n", float64(requestTotal(benchAll))/n, requestTotal(benchAll))
	printCounts(stdout, "  by verb and resource", benchAll, n)
	return nil
}

func printCounts(w io.Writer, title string, counts map[string]int, n float64) {
	fmt.Fprintln(w, title+":")
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		fmt.Fprintf(w, "    %-55s %7d  %6.2f/VMI\n", k, counts[k], float64(counts[k])/n)
	}
}

func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	i = min(max(i, 1), len(sorted))
	return sorted[i-1].Round(time.Millisecond)
}

// waitQuiet waits until the counter has not moved for quiet, or fails after limit.
func waitQuiet(ctx context.Context, c *requestCounter, quiet, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	last, since := c.total.Load(), time.Now()
	for time.Since(since) < quiet {
		if time.Now().After(deadline) {
			return fmt.Errorf("the control plane still made requests after %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if n := c.total.Load(); n != last {
			last, since = n, time.Now()
		}
	}
	return nil
}

// watchPods calls seen for every launcher pod added from rv on, re-watching when the server
// ends the watch, until ctx ends.
func watchPods(ctx context.Context, cs kubernetes.Interface, rv string, seen func(*corev1.Pod, time.Time)) error {
	for ctx.Err() == nil {
		w, err := cs.CoreV1().Pods(benchNamespace).Watch(ctx, metav1.ListOptions{
			LabelSelector: v1alpha1.CreatedByLabel, ResourceVersion: rv, AllowWatchBookmarks: true,
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Error:
				w.Stop()
				return fmt.Errorf("watch error: %v", ev.Object)
			case watch.Added, watch.Modified, watch.Bookmark:
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					continue
				}
				rv = p.ResourceVersion
				if ev.Type != watch.Bookmark {
					seen(p, time.Now())
				}
			}
		}
	}
	return nil
}
