package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A node census counts what VMs leave on a node when they leak: pods, network namespaces,
// links, packet filter rules, mounts, the handler's per-VMI and run directories, the drivers'
// state records, the processes a VM brings (QEMU, launchers, container shims), and the node
// handler's goroutines, threads and file descriptors. The soak (soak.go) takes one before and
// one after its loop and compares them.
//
// It reads this machine: the local cluster's first node is this machine (hack/cluster), so the
// census is of that node only, and needs root (the packet filter, other processes' fds).

// censusItem is one count of a census.
type censusItem struct {
	name string
	n    int
	// slack is how much more than before the item may count after without being a leak: 0 for
	// what each VM makes and must remove; a little for the handler's goroutines and fds, which
	// idle connections and timers move without any VM (a leak of one per VM, over a soak's
	// hundred VMs, is far above it).
	slack int
}

// census is a node's counts, in a fixed order.
type census []censusItem

// censusPaths are the node directories a census counts, as the handler DaemonSet mounts them
// (manifests/install/handler.yaml, handler.d/00-base.yaml).
type censusPaths struct {
	proc, netns, vmiDirs, runDirs, driverState, mountinfo string
}

var nodePaths = censusPaths{
	proc:        "/proc",
	netns:       "/run/netns",
	vmiDirs:     "/run/kubevisor/vmi",
	runDirs:     "/run/kubevisor/run",
	driverState: "/var/lib/kubevisor/drivers",
	mountinfo:   "/proc/1/mountinfo",
}

// handlerSlack is what the handler's goroutines and fds may move without a leak.
const handlerSlack = 10

// takeCensus counts node's. handler is the node's handler pod; metricsToken, when not empty, a
// token allowed get on /metrics, for the handler's goroutines (go_goroutines).
func (f *Framework) takeCensus(ctx context.Context, node string, handler corev1.Pod, metricsToken string) (census, error) {
	var c census
	add := func(name string, n int, err error) error {
		if err != nil {
			return fmt.Errorf("census %s: %w", name, err)
		}
		c = append(c, censusItem{name: name, n: n})
		return nil
	}
	var pods corev1.PodList
	if err := f.Client.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node}); err != nil {
		return nil, fmt.Errorf("census pods: %w", err)
	}
	if err := add("pods on the node", len(pods.Items), nil); err != nil {
		return nil, err
	}
	p := nodePaths
	for _, d := range []struct{ name, dir string }{
		{"network namespaces (" + p.netns + ")", p.netns},
		{"per-VMI directories (" + p.vmiDirs + ")", p.vmiDirs},
		{"run directories (" + p.runDirs + ")", p.runDirs},
	} {
		n, err := entries(d.dir)
		if err := add(d.name, n, err); err != nil {
			return nil, err
		}
	}
	states, err := driverStates(p.driverState)
	if err != nil {
		return nil, err
	}
	c = append(c, states...)
	links, err := commandLines(ctx, nil, "ip", "-o", "link", "show")
	if err := add("network links (host)", len(links), err); err != nil {
		return nil, err
	}
	rules, err := filterRules(ctx)
	if err := add("packet filter rules (iptables-save, nft backend)", rules, err); err != nil {
		return nil, err
	}
	mounts, err := os.ReadFile(p.mountinfo)
	if err := add("mounts (host mount namespace)", bytes.Count(mounts, []byte{'\n'}), err); err != nil {
		return nil, err
	}
	procs, err := processes(p.proc)
	if err != nil {
		return nil, err
	}
	for _, k := range []struct{ name, base string }{
		{"QEMU processes", "qemu-system-"},
		{"launcher processes", "kubevisor-launcher"},
		{"container shims", "containerd-shim"},
		{"driver plugin processes", "kubevisor-driver-"},
	} {
		c = append(c, censusItem{name: k.name, n: procs.count(k.base)})
	}
	pid := procs.podProcess(p.proc, string(handler.UID), "kubevisor-handler")
	if pid == 0 {
		return nil, fmt.Errorf("census: no kubevisor-handler process of pod %s (uid %s) under %s", handler.Name, handler.UID, p.proc)
	}
	fds, err := entries(filepath.Join(p.proc, strconv.Itoa(pid), "fd"))
	if err != nil {
		return nil, fmt.Errorf("census handler fds: %w", err)
	}
	c = append(c, censusItem{name: "handler file descriptors", n: fds, slack: handlerSlack})
	threads, err := entries(filepath.Join(p.proc, strconv.Itoa(pid), "task"))
	if err != nil {
		return nil, fmt.Errorf("census handler threads: %w", err)
	}
	c = append(c, censusItem{name: "handler threads", n: threads, slack: handlerSlack})
	pluginFDs := 0
	for _, pp := range procs.matching("kubevisor-driver-") {
		n, err := entries(filepath.Join(p.proc, strconv.Itoa(pp), "fd"))
		if err == nil {
			pluginFDs += n
		}
	}
	c = append(c, censusItem{name: "driver plugins' file descriptors", n: pluginFDs, slack: handlerSlack})
	if metricsToken != "" {
		g, err := handlerGoroutines(ctx, handler, metricsToken)
		if err != nil {
			return nil, err
		}
		c = append(c, censusItem{name: "handler goroutines (go_goroutines)", n: g, slack: handlerSlack})
	}
	return c, nil
}

// entries counts the entries of dir (0 when it does not exist).
func entries(dir string) (int, error) {
	es, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return 0, nil
	}
	return len(es), err
}

// driverStates counts the files under each driver's state directory (dir/<driver>/...): the
// records a driver keeps per VM.
func driverStates(dir string) (census, error) {
	drivers, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("census driver state: %w", err)
	}
	var c census
	for _, d := range drivers {
		if !d.IsDir() {
			continue
		}
		n := 0
		err := filepath.WalkDir(filepath.Join(dir, d.Name()), func(_ string, e os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !e.IsDir() {
				n++
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("census driver state of %s: %w", d.Name(), err)
		}
		c = append(c, censusItem{name: "driver state files: " + d.Name(), n: n})
	}
	return c, nil
}

// commandLines runs a command and returns its non-empty output lines.
func commandLines(ctx context.Context, stdin io.Reader, name string, args ...string) ([]string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = stdin
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	var lines []string
	for l := range strings.SplitSeq(string(out), "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	return lines, nil
}

// filterRules counts the rules (-A lines) of iptables-save and ip6tables-save.
func filterRules(ctx context.Context) (int, error) {
	n := 0
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		lines, err := commandLines(ctx, nil, save)
		if err != nil {
			return 0, err
		}
		n += countRules(lines)
	}
	return n, nil
}

// countRules counts the rule lines of an iptables-save output.
func countRules(lines []string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "-A ") {
			n++
		}
	}
	return n
}

// procTable is the machine's processes: pid and the base name of argv[0].
type procTable map[int]string

// processes reads proc's process list (a process that ends meanwhile is left out).
func processes(proc string) (procTable, error) {
	es, err := os.ReadDir(proc)
	if err != nil {
		return nil, fmt.Errorf("census processes: %w", err)
	}
	t := procTable{}
	for _, e := range es {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join(proc, e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue // ended, or a kernel thread
		}
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		t[pid] = filepath.Base(string(argv0))
	}
	return t, nil
}

// count is how many processes' names start with prefix.
func (t procTable) count(prefix string) int {
	return len(t.matching(prefix))
}

// matching are the pids of the processes whose names start with prefix.
func (t procTable) matching(prefix string) []int {
	var pids []int
	for pid, name := range t {
		if strings.HasPrefix(name, prefix) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// podProcess is the pid of the process named name in the pod of UID podUID (its cgroup path
// names the pod: pod<uid> with the cgroupfs driver, pod<uid with underscores> with systemd's),
// 0 when there is none.
func (t procTable) podProcess(proc, podUID, name string) int {
	for _, pid := range t.matching(name) {
		cg, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "cgroup"))
		if err == nil && cgroupOfPod(string(cg), podUID) {
			return pid
		}
	}
	return 0
}

// cgroupOfPod says whether a /proc/<pid>/cgroup content is of the pod of UID uid.
func cgroupOfPod(cgroup, uid string) bool {
	return uid != "" && (strings.Contains(cgroup, "pod"+uid) || strings.Contains(cgroup, "pod"+strings.ReplaceAll(uid, "-", "_")))
}

// handlerGoroutines reads go_goroutines from the handler pod's /metrics (HTTPS on its
// https-metrics port, with a bearer token allowed get on /metrics). The certificate is the
// handler's self-signed one (docs/metrics.md): it is not verified, what is read is a count.
func handlerGoroutines(ctx context.Context, handler corev1.Pod, token string) (int, error) {
	port := int32(0)
	for _, ctr := range handler.Spec.Containers {
		for _, p := range ctr.Ports {
			if p.Name == "https-metrics" {
				port = p.ContainerPort
			}
		}
	}
	if port == 0 || handler.Status.PodIP == "" {
		return 0, fmt.Errorf("census: handler pod %s has no https-metrics port or no IP", handler.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	url := fmt.Sprintf("https://%s:%d/metrics", handler.Status.PodIP, port)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}} //nolint:gosec // a count is read; see above
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("census: %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("census: %s: %s", url, resp.Status)
	}
	return metricValue(resp.Body, "go_goroutines")
}

// metricValue is the value of an unlabelled metric in a Prometheus text exposition.
func metricValue(r io.Reader, metric string) (int, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || name != metric {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: %w", metric, err)
		}
		return int(v), nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no metric %s", metric)
}

// leaks are the items of after that count more than in before by more than their slack, and
// the items before had that after has not (or the reverse): "name: before → after".
func leaks(before, after census) []string {
	was := map[string]int{}
	for _, i := range before {
		was[i.name] = i.n
	}
	var out []string
	seen := map[string]bool{}
	for _, i := range after {
		seen[i.name] = true
		b, ok := was[i.name]
		if !ok {
			if i.n > 0 {
				out = append(out, fmt.Sprintf("%s: none before → %d", i.name, i.n))
			}
			continue
		}
		if i.n > b+i.slack {
			out = append(out, fmt.Sprintf("%s: %d → %d", i.name, b, i.n))
		}
	}
	for _, i := range before {
		if !seen[i.name] {
			out = append(out, fmt.Sprintf("%s: %d → not counted", i.name, i.n))
		}
	}
	return out
}

// censusTable is before and after side by side, with the difference.
func censusTable(before, after census) string {
	now := map[string]int{}
	for _, i := range after {
		now[i.name] = i.n
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "what\tbefore\tafter\tdifference\t")
	for _, i := range before {
		a, ok := now[i.name]
		if !ok {
			fmt.Fprintf(tw, "%s\t%d\t-\t-\t\n", i.name, i.n)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%+d\t\n", i.name, i.n, a, a-i.n)
	}
	_ = tw.Flush()
	return b.String()
}
