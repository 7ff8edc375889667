package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// The fault matrix (label Disruptive): each case does one thing to the cluster while two VMs
// run (one of each of two classes, on one node) and two VMI creations are in flight (created
// just before, not waited for), then waits until everything is right again and counts:
//
//   - lost: a running VM whose VMI is gone, another one, or not Running at the end;
//   - restarted: a running VM whose guest booted again (its boot id, read on its console);
//   - duplicates: VMIs that had two live launcher pods at a moment of the case (polled);
//   - converge: from the fault to every VMI, the in-flight ones too, Running and Ready with one
//     launcher pod, and the node's handler pod Ready.
//
// Cases that act on the node's processes (the API server, the kubelet, containerd) need the
// local cluster's scripts (-local-cluster, which make e2e sets for the local cluster); against
// another cluster they are reported as not run, and fail under CI=true.

// faultCase is one row of the matrix.
type faultCase struct {
	name string
	// local: the case runs hack/cluster scripts on this machine.
	local bool
	// prepare, when set, readies the cluster for the case before the VMI creations start.
	prepare func(ctx context.Context, f *Framework)
	// inject does the fault to node and returns once it is over (the component is back).
	inject func(ctx context.Context, f *Framework, node string)
}

// faultRow is what one case measured.
type faultRow struct {
	name                         string
	lost, restarted, duplicates  int
	converge                     time.Duration
	notRun                       string   // why the case did not run
	problems                     []string // what the case found wrong
	inFlight, inFlightNotRunning int
}

// faultCases are the matrix's cases, in the order they run.
func faultCases() []faultCase {
	cases := []faultCase{{
		name: "handler pod deleted",
		inject: func(ctx context.Context, f *Framework, node string) {
			old := f.handlerPodOn(ctx, node)
			Expect(f.Client.Delete(ctx, &old)).To(Succeed())
			// handlerPodOn fails the spec while the node has no handler pod: list instead.
			Eventually(func(g Gomega) {
				var pods corev1.PodList
				g.Expect(f.Client.List(ctx, &pods, client.InNamespace(handlerNamespace))).To(Succeed())
				ready := false
				for _, p := range pods.Items {
					ready = ready || p.Spec.NodeName == node && p.DeletionTimestamp == nil && p.UID != old.UID &&
						strings.HasPrefix(p.Name, "kubevisor-handler") && podReady(p)
				}
				g.Expect(ready).To(BeTrue(), "no new Ready handler pod on %s", node)
			}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
		},
	}}
	cases = append(cases, faultCase{
		name: "controller leader killed, two replicas",
		prepare: func(ctx context.Context, f *Framework) {
			f.patchKubevisor(ctx, `{"spec":{"infra":{"replicas":2}}}`)
			DeferCleanup(func(ctx SpecContext) { f.patchKubevisor(ctx, `{"spec":{"infra":{"replicas":null}}}`) })
			Eventually(func(g Gomega) {
				var d appsv1.Deployment
				g.Expect(f.Client.Get(ctx, types.NamespacedName{Namespace: handlerNamespace, Name: controllerDeployment}, &d)).To(Succeed())
				g.Expect(d.Status.ReadyReplicas).To(BeNumerically(">=", 2), "kubevisor-controller replicas ready")
				g.Expect(d.Status.UpdatedReplicas).To(Equal(d.Status.Replicas))
			}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
		},
		inject: func(ctx context.Context, f *Framework, node string) {
			leader := f.controllerLeader(ctx)
			By("SIGKILL of the leader " + leader + " (its pod deleted with no grace)")
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: handlerNamespace, Name: leader}}
			Expect(f.Client.Delete(ctx, pod, client.GracePeriodSeconds(0))).To(Succeed())
			Eventually(func() string { return f.controllerLeader(ctx) }).WithContext(ctx).
				WithTimeout(2*time.Minute).WithPolling(time.Second).ShouldNot(Or(BeEmpty(), Equal(leader)), "a new leader")
		},
	})
	for _, d := range []string{"qmp", "libvirt", "cni", "local", "hostdev"} {
		cases = append(cases, faultCase{
			name: "driver plugin " + d + " SIGKILLed",
			inject: func(ctx context.Context, f *Framework, node string) {
				k := f.killPlugin(ctx, f.handlerPodOn(ctx, node), d)
				GinkgoWriter.Printf("%s in %s:\n%s", k.container, k.handlerPod, k.raw)
			},
		})
	}
	for _, c := range []struct {
		name       string
		components []string
	}{
		{"kube-apiserver and etcd restarted", []string{"etcd", "kube-apiserver"}},
		{"kubelet restarted", []string{"kubelet"}},
		{"containerd restarted", []string{"containerd"}},
	} {
		cases = append(cases, faultCase{
			name:  c.name,
			local: true,
			inject: func(ctx context.Context, f *Framework, node string) {
				localCluster(ctx, "restart.sh", c.components...)
			},
		})
	}
	return cases
}

// controllerDeployment is kubevisor-controller's Deployment; its Lease has the same name.
const controllerDeployment = "kubevisor-controller"

// controllerLeader is the pod name of kubevisor-controller's leader, from its Lease's holder
// (controller-runtime's identity: <pod name>_<uuid>); "" when none holds it.
func (f *Framework) controllerLeader(ctx context.Context) string {
	var l coordinationv1.Lease
	if err := f.Client.Get(ctx, types.NamespacedName{Namespace: handlerNamespace, Name: controllerDeployment}, &l); err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	name, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
	return name
}

// nonAlnum is what a case's name loses in its VMIs' names.
var nonAlnum = regexp.MustCompile(`[^a-z0-9]+`)

// localCluster runs script of the local cluster's scripts (Cfg.LocalCluster) with args.
func localCluster(ctx context.Context, script string, args ...string) {
	GinkgoHelper()
	cmd := exec.CommandContext(ctx, filepath.Join(Cfg.LocalCluster, script), args...)
	cmd.Dir = filepath.Join(Cfg.LocalCluster, "..", "..")
	out, err := cmd.CombinedOutput()
	GinkgoWriter.Printf("%s %s:\n%s", script, strings.Join(args, " "), out)
	Expect(err).NotTo(HaveOccurred(), "%s %s", script, strings.Join(args, " "))
}

// podReady says whether pod's Ready condition is True.
func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

var _ = Describe("Fault matrix", Label("Disruptive", "TwoClasses"), func() {
	f := NewFramework()

	It("loses no VM, restarts none and makes no second launcher pod when the handler pod is deleted, the controller's leader is killed with a second replica waiting, each driver plugin is SIGKILLed, and the API server and etcd, the kubelet or containerd restart, with VMs running and VMI creations in flight; with the disk under the per-VMI directories full, new VMIs say so in their status and the running ones go on", func(ctx SpecContext) {
		guests := f.bootOneOfEach(ctx, "fault", true)
		node := guests[0].vmi.Status.NodeName
		var rows []faultRow
		for _, c := range faultCases() {
			if c.local && Cfg.LocalCluster == "" {
				rows = append(rows, faultRow{name: c.name, notRun: "needs the local cluster (-local-cluster)"})
				continue
			}
			rows = append(rows, f.runFault(ctx, c, guests, node))
		}
		if Cfg.LocalCluster == "" {
			rows = append(rows, faultRow{name: "disk under the per-VMI directories full", notRun: "needs the local cluster (-local-cluster)"})
		} else {
			rows = append(rows, f.runDiskFull(ctx, guests, node))
		}
		GinkgoWriter.Printf("fault matrix:\n%s", faultTable(rows))
		for _, r := range rows {
			if r.notRun != "" {
				Expect(testenv.CI()).To(BeFalse(), "CI=true, and case %q did not run: %s", r.name, r.notRun)
				continue
			}
			Expect(r.problems).To(BeEmpty(), "case %q", r.name)
		}
	})
})

// runFault runs case c with guests running on node and returns what it measured. A guest the
// case lost or restarted is taken as it is afterwards, for the next case.
func (f *Framework) runFault(ctx context.Context, c faultCase, guests []*guestRun, node string) faultRow {
	GinkgoHelper()
	By("fault: " + c.name)
	row := faultRow{name: c.name}
	var n corev1.Node
	Expect(f.Client.Get(ctx, types.NamespacedName{Name: node}, &n)).To(Succeed())
	if c.prepare != nil {
		c.prepare(ctx, f)
	}

	// Two VMI creations in flight: made just before the fault, not waited for.
	slug := strings.Trim(nonAlnum.ReplaceAllString(strings.ToLower(c.name), "-"), "-")
	var flight []string
	for i := range 2 {
		name := fmt.Sprintf("flight%d-%s", i, slug)
		if len(name) > 50 {
			name = name[:50]
		}
		name = strings.TrimRight(name, "-")
		spec := guestSpecOf(guest.Options{UserData: name})
		spec.NodeSelector = map[string]string{corev1.LabelHostname: n.Labels[corev1.LabelHostname]}
		b, err := yaml.Marshal(spec)
		Expect(err).NotTo(HaveOccurred())
		f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: "+name+"\nspec:\n"+indent(string(b), 2))
		flight = append(flight, name)
	}
	row.inFlight = len(flight)

	dups := f.watchLaunchers(ctx)
	start := time.Now()
	c.inject(ctx, f, node)

	names := append([]string(nil), flight...)
	for _, g := range guests {
		names = append(names, g.name)
	}
	converged := f.waitConverged(ctx, names, node, 6*time.Minute)
	row.converge = time.Since(start)
	row.duplicates = len(dups.Stop())
	if !converged {
		row.problems = append(row.problems, fmt.Sprintf("not converged in %s", row.converge.Round(time.Second)))
	}
	if row.duplicates > 0 {
		row.problems = append(row.problems, fmt.Sprintf("VMIs with two live launcher pods: %v", dups.Stop()))
	}

	f.countGuests(ctx, guests, &row, "")
	for _, name := range flight {
		if vmi := f.VMI(ctx, name); vmi == nil || vmi.Status.Phase != v1alpha1.Running {
			row.inFlightNotRunning++
		}
	}
	if row.inFlightNotRunning > 0 {
		row.problems = append(row.problems, fmt.Sprintf("%d of the %d VMIs created in flight not Running", row.inFlightNotRunning, row.inFlight))
	}
	for _, name := range flight {
		Expect(client.IgnoreNotFound(f.Client.Delete(ctx, &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: f.Namespace, Name: name}}))).To(Succeed())
	}
	for _, name := range flight {
		f.WaitGone(ctx, name)
	}
	GinkgoWriter.Printf("fault %q: lost %d, restarted %d, duplicate launcher pods %d, converged in %s\n",
		c.name, row.lost, row.restarted, row.duplicates, row.converge.Round(100*time.Millisecond))
	return row
}

// countGuests counts in row the guests lost (their VMI gone, another one, or not Running) or
// restarted (another boot id) since they were taken; where ends the problems' lines. A guest lost
// or restarted is taken again as it runs now, so that the next case measures from there.
func (f *Framework) countGuests(ctx context.Context, guests []*guestRun, row *faultRow, where string) {
	GinkgoHelper()
	for _, g := range guests {
		vmi := f.VMI(ctx, g.name)
		switch {
		case vmi == nil || vmi.UID != g.vmi.UID || vmi.Status.Phase != v1alpha1.Running:
			row.lost++
			row.problems = append(row.problems, fmt.Sprintf("VM %s lost its VMI%s", g.name, where))
			f.refreshGuest(ctx, g)
		case f.bootID(ctx, g.name) != g.bootID:
			row.restarted++
			row.problems = append(row.problems, fmt.Sprintf("VM %s: the guest booted again%s", g.name, where))
			f.refreshGuest(ctx, g)
		}
	}
}

// refreshGuest takes g as it runs now (its VM's current VMI, launcher pod and boot), so that the
// next case measures from there.
func (f *Framework) refreshGuest(ctx context.Context, g *guestRun) {
	GinkgoHelper()
	g.vmi = f.WaitRunning(ctx, g.name)
	f.takeGuest(ctx, g)
}

// waitConverged waits, up to timeout, until every VMI of names is Running with its Ready
// condition True and exactly one launcher pod not being deleted, and node's handler pod is
// Ready. API errors (the API server restarting) are waited through.
func (f *Framework) waitConverged(ctx context.Context, names []string, node string, timeout time.Duration) bool {
	GinkgoHelper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if f.converged(ctx, names, node) == "" {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Second):
		}
	}
	GinkgoWriter.Printf("not converged: %s\n", f.converged(ctx, names, node))
	return false
}

// converged says what is not right yet ("" when everything is).
func (f *Framework) converged(ctx context.Context, names []string, node string) string {
	var pods corev1.PodList
	if err := f.Client.List(ctx, &pods, client.InNamespace(handlerNamespace)); err != nil {
		return "list handler pods: " + err.Error()
	}
	handlerReady := false
	for _, p := range pods.Items {
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil && strings.HasPrefix(p.Name, "kubevisor-handler") && podReady(p) {
			handlerReady = true
		}
	}
	if !handlerReady {
		return "no Ready handler pod on " + node
	}
	for _, name := range names {
		var vmi v1alpha1.VirtualMachineInstance
		if err := f.Client.Get(ctx, types.NamespacedName{Namespace: f.Namespace, Name: name}, &vmi); err != nil {
			return "VMI " + name + ": " + err.Error()
		}
		if vmi.Status.Phase != v1alpha1.Running {
			return fmt.Sprintf("VMI %s is %s", name, vmi.Status.Phase)
		}
		ready := v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
		if ready == nil || ready.Status != corev1.ConditionTrue {
			return "VMI " + name + " is not Ready"
		}
		var lp corev1.PodList
		if err := f.Client.List(ctx, &lp, client.InNamespace(f.Namespace), client.MatchingLabels{v1alpha1.CreatedByLabel: string(vmi.UID)}); err != nil {
			return "list launcher pods: " + err.Error()
		}
		if live := liveLaunchers(lp.Items)[string(vmi.UID)]; live != 1 {
			return fmt.Sprintf("VMI %s has %d live launcher pods", name, live)
		}
	}
	return ""
}

// liveLaunchers counts, by VMI UID, the launcher pods that are not being deleted and have not
// ended.
func liveLaunchers(pods []corev1.Pod) map[string]int {
	n := map[string]int{}
	for _, p := range pods {
		uid := p.Labels[v1alpha1.CreatedByLabel]
		if uid == "" || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		n[uid]++
	}
	return n
}

// launcherWatch polls the spec namespace's launcher pods and records the VMIs that had more
// than one live launcher pod at a poll.
type launcherWatch struct {
	mu     sync.Mutex
	dups   map[string]bool
	cancel context.CancelFunc
	done   chan struct{}
}

// watchLaunchers starts a launcherWatch (every 500 ms; a failed list, while the API server
// restarts, is skipped); Stop ends it.
func (f *Framework) watchLaunchers(ctx context.Context) *launcherWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &launcherWatch{dups: map[string]bool{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			var pods corev1.PodList
			if err := f.Client.List(ctx, &pods, client.InNamespace(f.Namespace), client.HasLabels{v1alpha1.CreatedByLabel}); err == nil {
				w.mu.Lock()
				for uid, n := range liveLaunchers(pods.Items) {
					if n > 1 {
						w.dups[uid] = true
					}
				}
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return w
}

// Stop ends the watch and returns the UIDs of the VMIs seen with two live launcher pods, sorted.
func (w *launcherWatch) Stop() []string {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for uid := range w.dups {
		out = append(out, uid)
	}
	sort.Strings(out)
	return out
}

// faultTable is the matrix as a table: case, VMs lost, restarted, duplicate launcher pods, time
// to converge, and what was wrong.
func faultTable(rows []faultRow) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "case\tlost\trestarted\tduplicate pods\tin flight not running\tconverged in\tproblems")
	for _, r := range rows {
		if r.notRun != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\tnot run: %s\n", r.name, r.notRun)
			continue
		}
		problems := "none"
		if len(r.problems) > 0 {
			problems = strings.Join(r.problems, "; ")
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d/%d\t%s\t%s\n", r.name, r.lost, r.restarted, r.duplicates,
			r.inFlightNotRunning, r.inFlight, r.converge.Round(100*time.Millisecond), problems)
	}
	_ = tw.Flush()
	return b.String()
}

// nodeCutFor is how long the node-cut case keeps node 2 from the API server: past the node
// lifecycle controller's grace period (40 s), so the Node goes NotReady (Unknown) and its pods
// not Ready, and short of the pods' default toleration of unreachable (300 s), so nothing is
// evicted.
const nodeCutFor = 60 * time.Second

// nodeCutCase cuts node 2 of the local cluster from the API server for nodeCutFor
// (hack/cluster/partition.sh) and heals it.
func nodeCutCase() faultCase {
	return faultCase{
		name:  fmt.Sprintf("node cut from the API server for %s", nodeCutFor),
		local: true,
		inject: func(ctx context.Context, f *Framework, node string) {
			localCluster(ctx, "partition.sh", "cut")
			healed := false
			DeferCleanup(func(ctx SpecContext) {
				if !healed {
					localCluster(ctx, "partition.sh", "heal")
				}
			})
			cut := time.Now()
			notReady := time.Duration(0)
			for time.Since(cut) < nodeCutFor {
				var n corev1.Node
				if notReady == 0 && f.Client.Get(ctx, types.NamespacedName{Name: node}, &n) == nil && !nodeReady(n) {
					notReady = time.Since(cut)
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
			localCluster(ctx, "partition.sh", "heal")
			healed = true
			if notReady > 0 {
				GinkgoWriter.Printf("node %s not Ready %s after the cut\n", node, notReady.Round(time.Second))
			} else {
				GinkgoWriter.Printf("node %s stayed Ready through the cut\n", node)
			}
		},
	}
}

// nodeReady says whether n's Ready condition is True.
func nodeReady(n corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

var _ = Describe("Fault matrix, node cut", Label("Disruptive", "RequiresTwoNodes", "TwoClasses"), func() {
	f := NewFramework()

	It("loses no VM, restarts none and makes no second launcher pod when the node is cut from the API server for 60 s, with VMs running and VMI creations in flight", func(ctx SpecContext) {
		if Cfg.LocalCluster == "" {
			Expect(testenv.CI()).To(BeFalse(), "CI=true, and the node cut needs the local cluster (-local-cluster)")
			Skip("the node cut needs the local cluster (-local-cluster)")
		}
		_, second := f.RequireTwoNodes(ctx)
		var n corev1.Node
		Expect(f.Client.Get(ctx, types.NamespacedName{Name: second}, &n)).To(Succeed())
		// The local cluster's node 2 is the one partition.sh cuts: named <node 1>-2.
		Expect(second).To(HaveSuffix("-2"), "node 2 of the local cluster")
		guests := f.bootOneOfEachOn(ctx, "cut", true, n.Labels[corev1.LabelHostname])
		row := f.runFault(ctx, nodeCutCase(), guests, second)
		GinkgoWriter.Printf("fault matrix:\n%s", faultTable([]faultRow{row}))
		Expect(row.problems).To(BeEmpty(), "case %q", row.name)
	})
})

// kubeletPodsDir is the kubelet's pods directory on the local cluster's first node, which holds
// the launcher pods' per-VMI directories (emptyDirs, bound by the handler onto
// /run/kubevisor/vmi/<uid>): the file system the full-disk case fills (hack/cluster/up.sh
// mounts one of its own there, KUBELET_PODS_SIZE).
const kubeletPodsDir = "/var/lib/kubelet/pods"

// noSpace is what a VMI's status says when the node's file system under its directory is full.
const noSpace = "no space left on device"

// runDiskFull is the full-disk case: with guests running on node (this machine, the local
// cluster's first node), the file system under the per-VMI directories is filled, two VMIs are
// created for node, and each must say in its status that the disk is full (a condition's message
// naming ENOSPC) without running, while the running guests go on (the same VMI, launcher pod and
// boot). Then the space is freed, the two are deleted, and a new VMI must run. converge is from
// the space freed to that VMI Running.
func (f *Framework) runDiskFull(ctx context.Context, guests []*guestRun, node string) faultRow {
	GinkgoHelper()
	const name = "disk under the per-VMI directories full"
	By("fault: " + name)
	row := faultRow{name: name}
	hostname, err := os.Hostname()
	Expect(err).NotTo(HaveOccurred())
	if node != hostname {
		row.notRun = fmt.Sprintf("the guests run on %s, not on this machine's node %s", node, hostname)
		return row
	}
	if why := ownFileSystem(kubeletPodsDir); why != "" {
		row.notRun = why
		return row
	}
	// In a running guest's per-VMI directory, which is on that file system: a file of the
	// kubelet's pods directory itself would be taken for a pod's.
	Expect(guests).NotTo(BeEmpty())
	fill := filepath.Join("/run/kubevisor/vmi", string(guests[0].vmi.UID), "e2e-disk-full")
	filled := fillFileSystem(fill)
	DeferCleanup(func() { _ = os.Remove(fill) })
	GinkgoWriter.Printf("%s filled: %d MiB in %s\n", kubeletPodsDir, filled>>20, fill)

	dups := f.watchLaunchers(ctx)
	var n corev1.Node
	Expect(f.Client.Get(ctx, types.NamespacedName{Name: node}, &n)).To(Succeed())
	var refused []string
	for i := range 2 {
		vmiName := fmt.Sprintf("full%d", i)
		spec := guestSpecOf(guest.Options{UserData: vmiName})
		spec.NodeSelector = map[string]string{corev1.LabelHostname: n.Labels[corev1.LabelHostname]}
		Expect(f.Client.Create(ctx, &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: f.Namespace, Name: vmiName}, Spec: spec})).To(Succeed())
		refused = append(refused, vmiName)
	}
	for _, vmiName := range refused {
		var said string
		Eventually(func(g Gomega) {
			vmi := f.VMI(ctx, vmiName)
			g.Expect(vmi).NotTo(BeNil())
			g.Expect(vmi.Status.Phase).NotTo(Equal(v1alpha1.Running), "VMI %s runs on a full disk", vmiName)
			said = statusSaying(vmi, noSpace)
			g.Expect(said).NotTo(BeEmpty(), "VMI %s's status does not say the disk is full: %+v", vmiName, vmi.Status)
		}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
		GinkgoWriter.Printf("VMI %s on the full disk: %s\n", vmiName, said)
		if vmi := f.VMI(ctx, vmiName); vmi != nil && vmi.Status.Phase == v1alpha1.Running {
			row.problems = append(row.problems, "VMI "+vmiName+" runs on a full disk")
		}
	}
	f.countGuests(ctx, guests, &row, " on the full disk")

	By("the space freed: a new VMI runs")
	Expect(os.Remove(fill)).To(Succeed())
	freed := time.Now()
	for _, vmiName := range refused {
		Expect(client.IgnoreNotFound(f.Client.Delete(ctx, &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: f.Namespace, Name: vmiName}}))).To(Succeed())
	}
	for _, vmiName := range refused {
		f.WaitGone(ctx, vmiName)
	}
	after := "full-after"
	spec := guestSpecOf(guest.Options{UserData: after})
	spec.NodeSelector = map[string]string{corev1.LabelHostname: n.Labels[corev1.LabelHostname]}
	Expect(f.Client.Create(ctx, &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: f.Namespace, Name: after}, Spec: spec})).To(Succeed())
	names := []string{after}
	for _, g := range guests {
		names = append(names, g.name)
	}
	if !f.waitConverged(ctx, names, node, 6*time.Minute) {
		row.problems = append(row.problems, "not converged once the space was freed")
	}
	row.converge = time.Since(freed)
	row.duplicates = len(dups.Stop())
	if row.duplicates > 0 {
		row.problems = append(row.problems, fmt.Sprintf("VMIs with two live launcher pods: %v", dups.Stop()))
	}
	Expect(f.Client.Delete(ctx, &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: f.Namespace, Name: after}})).To(Succeed())
	f.WaitGone(ctx, after)
	GinkgoWriter.Printf("fault %q: lost %d, restarted %d, duplicate launcher pods %d, a new VMI ran %s after the space was freed\n",
		name, row.lost, row.restarted, row.duplicates, row.converge.Round(100*time.Millisecond))
	return row
}

// ownFileSystem says why dir is not a file system of its own ("" when it is): the full-disk
// case fills it, and must not fill the machine's.
func ownFileSystem(dir string) string {
	var d, parent syscall.Stat_t
	if err := syscall.Stat(dir, &d); err != nil {
		return err.Error()
	}
	if err := syscall.Stat(filepath.Dir(dir), &parent); err != nil {
		return err.Error()
	}
	if d.Dev == parent.Dev {
		return dir + " is not a file system of its own (the local cluster's up.sh mounts one)"
	}
	return ""
}

// fillFileSystem allocates what is free in file's file system to file, and returns how much.
func fillFileSystem(file string) int64 {
	GinkgoHelper()
	var st syscall.Statfs_t
	Expect(syscall.Statfs(filepath.Dir(file), &st)).To(Succeed())
	free := int64(st.Bavail) * st.Bsize
	fd, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	Expect(err).NotTo(HaveOccurred())
	defer fd.Close()
	Expect(syscall.Fallocate(int(fd.Fd()), 0, 0, free)).To(Succeed(), "fallocate %d bytes", free)
	// What is freed meanwhile (a log rotated) is taken too, a block at a time.
	block := make([]byte, st.Bsize)
	for {
		if _, err := fd.WriteAt(block, free); err != nil {
			break
		}
		free += st.Bsize
	}
	Expect(syscall.Statfs(filepath.Dir(file), &st)).To(Succeed())
	Expect(st.Bavail).To(BeZero(), "%s still has %d blocks free", filepath.Dir(file), st.Bavail)
	return free
}

// statusSaying is the first of the VMI's status messages (its conditions', its reason) that
// contains s, as "<type>: <message>"; "" when none does.
func statusSaying(vmi *v1alpha1.VirtualMachineInstance, s string) string {
	for _, c := range vmi.Status.Conditions {
		if strings.Contains(c.Message, s) {
			return string(c.Type) + "=" + string(c.Status) + " " + c.Reason + ": " + c.Message
		}
	}
	return ""
}
