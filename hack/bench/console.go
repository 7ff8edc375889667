package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/controlplane/manager"
	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// Defaults of `kubevisor-bench console-latency`.
const (
	DefaultConsoleChars   = 200
	DefaultConsoleWarmup  = 10
	DefaultConsoleVNCRuns = 10
	DefaultConsoleTimeout = 5 * time.Minute
	DefaultKubeletRoot    = "/var/lib/kubelet"
	// apiPodLabel selects kubevisor-api's pods (manifests/install/api.yaml).
	apiPodLabel = "app.kubernetes.io/name=kubevisor-api"
	// keystrokeTimeout bounds the wait for one echo.
	keystrokeTimeout = 10 * time.Second
	// lineChars is how many measured keystrokes go on one shell line before Enter.
	lineChars = 40
)

const consoleUsage = `usage: kubevisor-bench console-latency [flags]

Runs on a node of a cluster where Kubevisor is installed, as root: creates a VMI of the test
guest (conformance/e2e's spec) in a new namespace, waits for its console's ready marker, and
opens its serial console on two paths, one at a time (a VMI has one interactive console: a
second session would take the first over):
  - through the API server, as vmctl console does (core/wsstream.Dial on the subresource
    subresources.kubevisor.io/v1alpha1 .../console with the kubeconfig's credentials: API
    server → kubevisor-api → the node handler's stream endpoint → the driver);
  - straight to the node handler's stream endpoint (core/nodeapi, port 8186, mutual TLS with
    kubevisor-api's client certificate, read from kubevisor-api's certificate directory: by
    default its emptyDir under the kubelet's root on this node) — the baseline.
It types --chars single characters into the guest's serial root shell on each path, in four
sessions per path taking turns, each character after the previous echo, and measures from the write to the arrival of its
echo on the same stream; lines are ": <letters>" (the shell's null command), ended with Enter
every 40 characters. Then it opens vnc --vnc-runs times on each path, alternating, and measures
from the dial to the first FramebufferUpdate (RFB 3.8, no authentication, raw encoding). Prints
p50/p99/max per path and the ratios API/node; no figure is asserted. At the end it deletes the
namespace.

Flags:
`

// ConsoleConfig is the configuration of `kubevisor-bench console-latency`, one field per flag.
type ConsoleConfig struct {
	// Kubeconfig reaches the cluster; its user needs the console and vnc subresources.
	Kubeconfig string
	// Chars is how many keystrokes are measured per path; Warmup more per path come first.
	Chars, Warmup int
	// VNCRuns is how many vnc sessions are opened per path.
	VNCRuns int
	// Image is the test guest's containerDisk image.
	Image string
	// Timeout bounds the VMI's boot to its console marker.
	Timeout time.Duration
	// CertDir is kubevisor-api's certificate directory ("": found under KubeletRoot).
	CertDir string
	// KubeletRoot is the kubelet's --root-dir on this node.
	KubeletRoot string
	// HandlerAddr is the handler's stream endpoint, host:port ("": the handler pod's IP on the
	// VMI's node and nodeapi.Port).
	HandlerAddr string
}

func runConsole(args []string, stdout, stderr io.Writer) int {
	cfg := ConsoleConfig{}
	fs := flag.NewFlagSet("kubevisor-bench console-latency", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, consoleUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "`kubeconfig` of the cluster")
	fs.IntVar(&cfg.Chars, "chars", DefaultConsoleChars, "measured keystrokes per path")
	fs.IntVar(&cfg.Warmup, "warmup", DefaultConsoleWarmup, "keystrokes per path before them, not counted")
	fs.IntVar(&cfg.VNCRuns, "vnc-runs", DefaultConsoleVNCRuns, "vnc sessions per path (0 skips vnc)")
	fs.StringVar(&cfg.Image, "image", DefaultE2EImage, "containerDisk `image` of the test guest")
	fs.DurationVar(&cfg.Timeout, "timeout", DefaultConsoleTimeout, "how long the VMI may take to show its console marker")
	fs.StringVar(&cfg.CertDir, "cert-dir", "", "kubevisor-api's certificate `directory` (client.crt, client.key, ca-bundle.crt; default: its pod's emptyDir under --kubelet-root)")
	fs.StringVar(&cfg.KubeletRoot, "kubelet-root", DefaultKubeletRoot, "the kubelet's root `directory` on this node")
	fs.StringVar(&cfg.HandlerAddr, "handler-addr", "", "the handler's stream endpoint `host:port` (default: its pod's IP on the VMI's node, port 8186)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if err := cfg.validate(fs.Args()); err != nil {
		fmt.Fprintf(stderr, "kubevisor-bench console-latency: %v\n", err)
		return ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := RunConsole(ctx, cfg, stdout); err != nil {
		fmt.Fprintf(stderr, "kubevisor-bench console-latency: %v\n", err)
		return ExitFail
	}
	return ExitOK
}

func (cfg *ConsoleConfig) validate(rest []string) error {
	switch {
	case len(rest) > 0:
		return fmt.Errorf("unexpected arguments %q", rest)
	case cfg.Chars < 1 || cfg.Warmup < 0 || cfg.VNCRuns < 0:
		return errors.New("--chars must be positive, --warmup and --vnc-runs not negative")
	case cfg.Timeout <= 0:
		return errors.New("--timeout: must be positive")
	}
	return nil
}

// RunConsole runs the console-latency benchmark and prints its figures to out.
func RunConsole(ctx context.Context, cfg ConsoleConfig, out io.Writer) (err error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = cfg.Kubeconfig
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	c, err := client.New(rc, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("clientset: %w", err)
	}
	certDir, err := apiCertDir(ctx, cs, cfg)
	if err != nil {
		return err
	}
	tlsCfg, err := nodeTLS(certDir)
	if err != nil {
		return fmt.Errorf("%w (in %s; --cert-dir names another)", err, certDir)
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "kv-bench-console-", Labels: map[string]string{"kubevisor.io/bench": "console"}}}
	if err := c.Create(ctx, ns); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if derr := c.Delete(dctx, ns); client.IgnoreNotFound(derr) != nil && err == nil {
			err = fmt.Errorf("delete namespace %s: %w", ns.Name, derr)
		}
	}()
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "console", Namespace: ns.Name},
		Spec:       guest.Spec(guest.Options{Image: cfg.Image, UserData: "kubevisor-bench console-latency"}),
	}
	if err := c.Create(ctx, vmi); err != nil {
		return fmt.Errorf("create VMI: %w", err)
	}
	if vmi, err = waitRunning(ctx, c, vmi, cfg.Timeout); err != nil {
		return err
	}
	addr := cfg.HandlerAddr
	if addr == "" {
		if addr, err = handlerAddr(ctx, cs, vmi.Status.NodeName); err != nil {
			return err
		}
	}
	api, err := apiPath(rc, vmi.Namespace, vmi.Name)
	if err != nil {
		return err
	}
	paths := []streamPath{api, nodePath(tlsCfg, addr, vmi.Namespace, vmi.Name)}
	fmt.Fprintf(out, "kubevisor-bench console-latency: VMI %s/%s of %s on node %s; load average %s\n",
		vmi.Namespace, vmi.Name, cfg.Image, vmi.Status.NodeName, loadAvg())
	fmt.Fprintf(out, "  paths: %s (%s), and %s with kubevisor-api's client certificate from %s (the baseline)\n",
		paths[0].name, rc.Host, paths[1].name, certDir)

	keys, err := measureKeystrokes(ctx, paths, cfg)
	if err != nil {
		return err
	}
	printLatencies(out, fmt.Sprintf("\nkeystroke → echo on the serial console (%d per path in %d sessions each, the paths taking turns, after %d warm-up per session):", cfg.Chars, keystrokeRounds, cfg.Warmup), paths, keys)
	if cfg.VNCRuns == 0 {
		return nil
	}
	vnc, size, err := measureVNC(ctx, paths, cfg.VNCRuns)
	if err != nil {
		return err
	}
	printLatencies(out, fmt.Sprintf("\nvnc: dial → first FramebufferUpdate (%d sessions per path, alternating; framebuffer %s):", cfg.VNCRuns, size), paths, vnc)
	return nil
}

// apiCertDir is kubevisor-api's certificate directory: cfg.CertDir, or the emptyDir of a
// kubevisor-api pod on this node under the kubelet's root.
func apiCertDir(ctx context.Context, cs kubernetes.Interface, cfg ConsoleConfig) (string, error) {
	if cfg.CertDir != "" {
		return cfg.CertDir, nil
	}
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: apiPodLabel})
	if err != nil {
		return "", fmt.Errorf("list kubevisor-api pods: %w", err)
	}
	var tried []string
	for _, p := range pods.Items {
		dir := podVolumeDir(cfg.KubeletRoot, string(p.UID), apiCertVolume)
		if _, err := os.Stat(dir + "/" + apiClientCert); err == nil {
			return dir, nil
		}
		tried = append(tried, dir)
	}
	return "", fmt.Errorf("kubevisor-api's client certificate is in none of %q (run the bench as root on the node of a kubevisor-api pod, or pass --cert-dir)", tried)
}

// handlerAddr is the stream endpoint of the handler pod on node.
func handlerAddr(ctx context.Context, cs kubernetes.Interface, node string) (string, error) {
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: handlerPodLabel, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return "", fmt.Errorf("list handler pods: %w", err)
	}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			return net.JoinHostPort(p.Status.PodIP, strconv.Itoa(nodeapi.Port)), nil
		}
	}
	return "", fmt.Errorf("no Running handler pod with an IP on node %s", node)
}

// waitRunning polls the VMI until it is Running.
func waitRunning(ctx context.Context, c client.Client, vmi *v1alpha1.VirtualMachineInstance, timeout time.Duration) (*v1alpha1.VirtualMachineInstance, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if err := c.Get(ctx, client.ObjectKeyFromObject(vmi), vmi); err != nil {
			return nil, fmt.Errorf("VMI %s: %w", vmi.Name, err)
		}
		switch vmi.Status.Phase {
		case v1alpha1.Running:
			return vmi, nil
		case v1alpha1.Failed, v1alpha1.Succeeded:
			return nil, fmt.Errorf("VMI %s is %s: %+v", vmi.Name, vmi.Status.Phase, vmi.Status.Conditions)
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return nil, fmt.Errorf("VMI %s not Running after %s (phase %q)", vmi.Name, timeout, vmi.Status.Phase)
		}
	}
}

// prompts end the guest shell's prompt (PS1 '\h:\w\$ ').
var prompts = [][]byte{[]byte("# "), []byte("$ ")}

// keystrokeRounds is how many console sessions each path gets: the paths take turns, a block of
// keystrokes each, because a VMI has one interactive console (a second session would take the
// first one over), so the two paths cannot be open at once.
const keystrokeRounds = 4

// measureKeystrokes types cfg.Chars single characters on each path, in keystrokeRounds blocks
// per path taking turns, and returns the keystroke-to-echo latencies per path, sorted.
func measureKeystrokes(ctx context.Context, paths []streamPath, cfg ConsoleConfig) ([][]time.Duration, error) {
	lat := make([][]time.Duration, len(paths))
	for r := range keystrokeRounds {
		// cfg.Chars split over the rounds, the first ones taking the remainder.
		per := cfg.Chars / keystrokeRounds
		if r < cfg.Chars%keystrokeRounds {
			per++
		}
		if per == 0 {
			continue
		}
		for p, path := range paths {
			got, err := keystrokeBlock(ctx, path, cfg, per)
			if err != nil {
				return nil, err
			}
			lat[p] = append(lat[p], got...)
		}
	}
	for _, l := range lat {
		slices.Sort(l)
	}
	return lat, nil
}

// keystrokeBlock opens one console session on path, waits for the shell, types cfg.Warmup
// unmeasured and then chars measured characters, and ends the line before it closes the
// session, so that the next session starts at a prompt.
func keystrokeBlock(ctx context.Context, path streamPath, cfg ConsoleConfig, chars int) ([]time.Duration, error) {
	conn, err := path.dial(ctx, subv1.SubresourceConsole)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	s := tap(conn)
	streams := []*tapped{s}
	// The driver's backlog gives every new console what the guest printed so far.
	if _, err := s.waitFor(ctx, cfg.Timeout, []byte(conformance.GuestReadyMarker)); err != nil {
		return nil, fmt.Errorf("console through %s: %w", path.name, err)
	}
	s.drain()
	if err := enter(ctx, streams); err != nil {
		return nil, err
	}
	var lat []time.Duration
	n := 0 // keystrokes on the current line
	for k := range cfg.Warmup + chars {
		if n == 0 {
			if err := typeAndWait(ctx, streams, []byte(":"), []byte(":")); err != nil {
				return nil, err
			}
			if err := typeAndWait(ctx, streams, []byte(" "), []byte(" ")); err != nil {
				return nil, err
			}
		}
		c := byte('a' + k%26)
		s.drain()
		start := time.Now()
		if _, err := conn.Write([]byte{c}); err != nil {
			return nil, fmt.Errorf("type on %s: %w", path.name, err)
		}
		at, err := s.waitFor(ctx, keystrokeTimeout, []byte{c})
		if err != nil {
			return nil, fmt.Errorf("echo of %q on %s: %w", c, path.name, err)
		}
		if k >= cfg.Warmup {
			lat = append(lat, at.Sub(start))
		}
		if n++; n == lineChars {
			if err := enter(ctx, streams); err != nil {
				return nil, err
			}
			n = 0
		}
	}
	if n > 0 {
		if err := enter(ctx, streams); err != nil {
			return nil, err
		}
	}
	return lat, nil
}

// enter presses Enter on the first stream and waits for the shell's prompt on every stream,
// so that no late prompt passes for a measured echo.
func enter(ctx context.Context, streams []*tapped) error {
	return typeAndWait(ctx, streams, []byte("\r"), prompts...)
}

// typeAndWait types b on the first stream, unmeasured, and waits until every stream has one
// of wants.
func typeAndWait(ctx context.Context, streams []*tapped, b []byte, wants ...[]byte) error {
	for _, s := range streams {
		s.drain()
	}
	if _, err := streams[0].conn.Write(b); err != nil {
		return fmt.Errorf("type %q: %w", b, err)
	}
	for _, s := range streams {
		if _, err := s.waitFor(ctx, keystrokeTimeout, wants...); err != nil {
			return fmt.Errorf("after typing %q: %w", b, err)
		}
	}
	return nil
}

// measureVNC opens runs vnc sessions per path, the paths taking turns, and returns the time
// from each dial to its first FramebufferUpdate per path, sorted, and the framebuffer's size.
func measureVNC(ctx context.Context, paths []streamPath, runs int) ([][]time.Duration, string, error) {
	lat := make([][]time.Duration, len(paths))
	size := ""
	for k := range runs * len(paths) {
		p := k % len(paths)
		d, t, err := vncOnce(ctx, paths[p])
		if err != nil {
			return nil, "", fmt.Errorf("vnc through %s: %w", paths[p].name, err)
		}
		lat[p] = append(lat[p], d)
		size = fmt.Sprintf("%dx%d", t.Width, t.Height)
	}
	for _, l := range lat {
		slices.Sort(l)
	}
	return lat, size, nil
}

func vncOnce(ctx context.Context, p streamPath) (time.Duration, rfbTimes, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	conn, err := p.dial(ctx, subv1.SubresourceVNC)
	if err != nil {
		return 0, rfbTimes{}, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	t, err := rfbFirstUpdate(conn)
	if err != nil {
		return 0, t, err
	}
	return t.FirstUpdate.Sub(start), t, nil
}

// quantile is the p-th percentile of sorted (nearest rank), unrounded.
func quantile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	return sorted[min(max(i, 1), len(sorted))-1]
}

// msec prints a short duration in milliseconds with microseconds.
func msec(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d.Microseconds())/1000) }

// printLatencies prints p50, p99 and max per path, and the ratios of the first path to the
// last (the baseline).
func printLatencies(out io.Writer, title string, paths []streamPath, lat [][]time.Duration) {
	fmt.Fprintln(out, title)
	tab := table{w: out, widths: []int{48, 11, 11, 11, 5}}
	tab.row("", "p50", "p99", "max", "n")
	for i, p := range paths {
		tab.row("  "+p.name, msec(quantile(lat[i], 50)), msec(quantile(lat[i], 99)), msec(quantile(lat[i], 100)), strconv.Itoa(len(lat[i])))
	}
	first, base := lat[0], lat[len(lat)-1]
	r := func(q int) string {
		b := quantile(base, q)
		if b <= 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", quantile(first, q).Seconds()/b.Seconds())
	}
	fmt.Fprintf(out, "  ratio %s / %s: p50 %s, p99 %s\n", paths[0].name, paths[len(paths)-1].name, r(50), r(99))
}
