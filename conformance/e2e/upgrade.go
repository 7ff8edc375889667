package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// The install the operator keeps (hack/install.sh names it so), and the reason of its
// conditions while it rolls out (controlplane/operator.ReasonRollingOut: the suite reads the
// API, not the operator's package).
const (
	kubevisorName            = "kubevisor"
	operatorReasonRollingOut = "RollingOut"
)

// kubevisor reads the cluster's Kubevisor object.
func (f *Framework) kubevisor(ctx context.Context) *v1alpha1.Kubevisor {
	GinkgoHelper()
	var kv v1alpha1.Kubevisor
	Expect(f.Client.Get(ctx, types.NamespacedName{Name: kubevisorName}, &kv)).To(Succeed(),
		"the Kubevisor object %q: is Kubevisor installed through its operator (make up, make install)?", kubevisorName)
	return &kv
}

// patchKubevisor merge-patches the Kubevisor with patch.
func (f *Framework) patchKubevisor(ctx context.Context, patch string) {
	GinkgoHelper()
	kv := &v1alpha1.Kubevisor{ObjectMeta: metav1.ObjectMeta{Name: kubevisorName}}
	Expect(f.Client.Patch(ctx, kv, client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
}

// setImageTag sets the Kubevisor's spec.imageTag ("" removes it: the operator's own version).
func (f *Framework) setImageTag(ctx context.Context, tag string) {
	GinkgoHelper()
	patch := `{"spec":{"imageTag":null}}`
	if tag != "" {
		patch = fmt.Sprintf(`{"spec":{"imageTag":%q}}`, tag)
	}
	kv := &v1alpha1.Kubevisor{ObjectMeta: metav1.ObjectMeta{Name: kubevisorName}}
	Expect(f.Client.Patch(ctx, kv, client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
}

// waitInstalled waits until the Kubevisor's status describes its latest spec, installed at
// version: Available, not Progressing.
func (f *Framework) waitInstalled(ctx context.Context, version string, timeout time.Duration) *v1alpha1.Kubevisor {
	GinkgoHelper()
	var kv *v1alpha1.Kubevisor
	Eventually(func(g Gomega) {
		kv = f.kubevisor(ctx)
		g.Expect(kv.Status.ObservedGeneration).To(Equal(kv.Generation), "the operator has not seen the latest spec")
		g.Expect(meta.IsStatusConditionTrue(kv.Status.Conditions, v1alpha1.KubevisorAvailable)).To(BeTrue(), "conditions %+v", kv.Status.Conditions)
		g.Expect(meta.IsStatusConditionFalse(kv.Status.Conditions, v1alpha1.KubevisorProgressing)).To(BeTrue(), "conditions %+v", kv.Status.Conditions)
		g.Expect(kv.Status.ObservedVersion).To(Equal(version))
	}).WithContext(ctx).WithTimeout(timeout).WithPolling(time.Second).Should(Succeed())
	return kv
}

// conditionChange is a change of one of a Kubevisor's conditions, seen at a time since the log
// started.
type conditionChange struct {
	at                           time.Duration
	typ, status, reason, message string
}

func (c conditionChange) String() string {
	return fmt.Sprintf("+%5.1fs %s=%s %s: %s", c.at.Seconds(), c.typ, c.status, c.reason, c.message)
}

// conditionLog records every change of a Kubevisor's conditions while it runs.
type conditionLog struct {
	mu      sync.Mutex
	changes []conditionChange
	cancel  context.CancelFunc
	done    chan struct{}
}

func (f *Framework) logConditions(ctx context.Context) *conditionLog {
	ctx, cancel := context.WithCancel(ctx)
	l := &conditionLog{cancel: cancel, done: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(l.done)
		last := map[string]string{}
		for ctx.Err() == nil {
			var kv v1alpha1.Kubevisor
			if err := f.Client.Get(ctx, types.NamespacedName{Name: kubevisorName}, &kv); err == nil {
				for _, c := range kv.Status.Conditions {
					if e := string(c.Status) + c.Reason; last[c.Type] != e {
						last[c.Type] = e
						l.mu.Lock()
						l.changes = append(l.changes, conditionChange{time.Since(start), c.Type, string(c.Status), c.Reason, c.Message})
						l.mu.Unlock()
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	return l
}

// Stop ends the log and returns it.
func (l *conditionLog) Stop() []conditionChange {
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.changes)
}

// unavailable is how long the log shows Available=False, in all.
func unavailable(log []conditionChange, end time.Duration) time.Duration {
	var total time.Duration
	var since time.Duration = -1
	for _, c := range log {
		if c.typ != v1alpha1.KubevisorAvailable {
			continue
		}
		switch {
		case c.status == string(metav1.ConditionFalse) && since < 0:
			since = c.at
		case c.status == string(metav1.ConditionTrue) && since >= 0:
			total += c.at - since
			since = -1
		}
	}
	if since >= 0 {
		total += end - since
	}
	return total
}

// imagesOf lists the images of a pod's containers and init containers.
func imagesOf(p corev1.Pod) []string {
	var out []string
	for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		out = append(out, c.Image)
	}
	return out
}

// maxHeartbeatGap is the longest time between two heartbeats of a guest's console from beat
// since on.
func maxHeartbeatGap(ups []float64, since int) float64 {
	gap := 0.0
	for i := max(since, 1); i < len(ups); i++ {
		gap = max(gap, ups[i]-ups[i-1])
	}
	return gap
}

// webPoll asks a guest's web server for its page every 200 ms from the test process while it
// runs, and records the failures and the longest run of them (an outage as a client sees it).
type webPoll struct {
	url        string
	mu         sync.Mutex
	ok, failed int
	longest    time.Duration
	lastOK     time.Time
	cancel     context.CancelFunc
	done       chan struct{}
}

// pollWeb starts a webPoll of the guest of vmi, or returns nil when the test process cannot
// reach it (a cluster whose pod network the suite's machine is not on).
func pollWeb(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) *webPoll {
	c := &http.Client{Timeout: time.Second}
	url := "http://" + GuestIP(vmi) + "/"
	get := func(ctx context.Context) bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false
		}
		resp, err := c.Do(req)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	if !get(ctx) {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &webPoll{url: url, cancel: cancel, done: make(chan struct{}), lastOK: time.Now()}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			ok := get(ctx)
			if ctx.Err() != nil {
				return
			}
			w.mu.Lock()
			if ok {
				w.ok++
				w.lastOK = time.Now()
			} else {
				w.failed++
				w.longest = max(w.longest, time.Since(w.lastOK))
			}
			w.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return w
}

// Stop ends the poll: answered and failed requests, the longest time without an answer.
func (w *webPoll) Stop() (ok, failed int, longest time.Duration) {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ok, w.failed, w.longest
}

var _ = Describe("Kubevisor upgrade through the operator", Label("Operator", "Upgrade"), func() {
	f := NewFramework()

	It("moves every component to the new version in order with VMs of each class running: no VM restarted or paused, the node handlers and their driver plugins replaced under them, consoles served by the new drivers, new VMIs on the new launcher", func(ctx SpecContext) {
		if Cfg.UpgradeTag == "" {
			Fail("no -upgrade-tag: make e2e-upgrade builds a second image set of this tree under a tag of its own and names it")
		}
		kv := f.kubevisor(ctx)
		from := kv.Status.ObservedVersion
		Expect(meta.IsStatusConditionTrue(kv.Status.Conditions, v1alpha1.KubevisorAvailable)).To(BeTrue(), "the install is not Available: %+v", kv.Status.Conditions)
		Expect(from).NotTo(Equal(Cfg.UpgradeTag), "the install already runs %s", Cfg.UpgradeTag)
		specTag := kv.Spec.ImageTag
		By(fmt.Sprintf("installed: version %s, drivers %v", from, kv.Status.Drivers))

		// A pair of VMs per -upgrade-pairs, one of each class (make e2e-upgrade UPGRADE_PAIRS=3
		// for the figures with six).
		var guests []*guestRun
		for i := range max(Cfg.UpgradePairs, 1) {
			guests = append(guests, f.bootOneOfEach(ctx, fmt.Sprintf("upgrade%d", i), false)...)
		}
		uids := map[string]types.UID{}
		beats := map[string]int{}
		polls := map[string]*webPoll{}
		for _, g := range guests {
			uids[g.name] = g.vmi.UID
			beats[g.name] = len(f.heartbeats(ctx, g))
			if p := pollWeb(ctx, g.vmi); p != nil {
				polls[g.name] = p
			} else {
				GinkgoWriter.Printf("VM %s: its web server does not answer the test process (not on the pod network): not polled\n", g.name)
			}
		}
		handlersBefore := map[types.UID]bool{}
		for _, p := range f.handlerPods(ctx) {
			handlersBefore[p.UID] = true
		}
		watch := f.watchSteady(ctx, uids)
		conds := f.logConditions(ctx)

		By(fmt.Sprintf("spec.imageTag %s: the operator rolls kubevisor-controller, the handlers, kubevisor-api", Cfg.UpgradeTag))
		DeferCleanup(func(ctx SpecContext) {
			By(fmt.Sprintf("back to %s", from))
			f.setImageTag(ctx, specTag)
			f.waitInstalled(ctx, from, 10*time.Minute)
		})
		start := time.Now()
		f.setImageTag(ctx, Cfg.UpgradeTag)
		kv = f.waitInstalled(ctx, Cfg.UpgradeTag, 10*time.Minute)
		took := time.Since(start)
		log := conds.Stop()
		var lines []string
		for _, c := range log {
			lines = append(lines, c.String())
		}
		down := unavailable(log, took)
		GinkgoWriter.Printf("upgrade %s -> %s: %s, Available=False for %s; conditions seen:\n  %s\n", from, Cfg.UpgradeTag,
			took.Round(100*time.Millisecond), down.Round(100*time.Millisecond), strings.Join(lines, "\n  "))

		By("the status went Progressing, never Degraded; Available only while a node had no handler serving")
		Expect(log).To(ContainElement(HaveField("String()", ContainSubstring("Progressing=True RollingOut"))))
		for _, c := range log {
			Expect(c.typ == v1alpha1.KubevisorDegraded && c.status == string(metav1.ConditionTrue)).To(BeFalse(), "%s", c)
			if c.typ == v1alpha1.KubevisorAvailable && c.status == string(metav1.ConditionFalse) {
				// A node's only handler restarts (a DaemonSet's rolling update): that node has
				// none serving for a moment, and the status says so, naming it.
				Expect(c.reason).To(Equal(operatorReasonRollingOut), "%s", c)
				Expect(c.message).To(ContainSubstring("daemonset kubevisor-handler"), "%s", c)
			}
		}
		Expect(kv.Status.TargetVersion).To(Equal(Cfg.UpgradeTag))
		for _, l := range kv.Status.Components {
			Expect(l.Version).To(Equal(Cfg.UpgradeTag), "component %+v", l)
			Expect(l.Ready).To(Equal(l.Desired), "component %+v", l)
		}

		By("every pod of the components runs the new images; the handler pods are new")
		var pods corev1.PodList
		Expect(f.Client.List(ctx, &pods, client.InNamespace("kubevisor-system"))).To(Succeed())
		for _, p := range pods.Items {
			name := p.Labels["app.kubernetes.io/name"]
			if name == "kubevisor-operator" || p.DeletionTimestamp != nil {
				continue
			}
			for _, img := range imagesOf(p) {
				Expect(img).To(HaveSuffix(":"+Cfg.UpgradeTag), "pod %s (%s)", p.Name, name)
			}
			if name == "kubevisor-handler" {
				Expect(handlersBefore).NotTo(HaveKey(p.UID), "handler pod %s was not replaced", p.Name)
			}
		}

		// The guest's serial output reaches its console log through the node handler and the
		// driver (layout.ConsoleLog), which the upgrade replaces: what the guest prints while the
		// node has no handler is not in the log, so the heartbeat's gap in the log measures
		// that, not the guest. The web server, polled throughout, shows the guest running.
		By("each VM ran on undisturbed: its web server answering throughout, the same VMI, launcher pod and guest boot, its heartbeat going on, its console served by the new driver")
		for _, g := range guests {
			if p := polls[g.name]; p != nil {
				ok, failed, longest := p.Stop()
				GinkgoWriter.Printf("VM %s (%s): web server polled during the upgrade: %d answered, %d failed, longest without an answer %s\n",
					g.name, g.class.Driver, ok, failed, longest.Round(10*time.Millisecond))
				Expect(failed).To(BeZero(), "VM %s: its web server did not answer %d times during the upgrade", g.name, failed)
			}
			ups := f.expectSameGuest(ctx, g, beats[g.name])
			GinkgoWriter.Printf("VM %s (%s): longest gap between heartbeats in the console log from the upgrade on: %.1fs\n",
				g.name, g.class.Driver, maxHeartbeatGap(ups, beats[g.name]))
		}
		bad, events := watch.Stop()
		Expect(bad).To(BeEmpty(), "the VMIs were not Running and Ready throughout (%d events)", events)

		// The install's workloadUpdateStrategy has no method: the VMIs are marked, nothing else
		// (their launcher pods are the same, as checked above).
		By("the workload updater marked each running VMI outdated, and the status counts them")
		Eventually(func(g Gomega) {
			for _, gr := range guests {
				vmi := f.VMI(ctx, gr.name)
				g.Expect(vmi).NotTo(BeNil(), "VMI %s is gone", gr.name)
				_, marked := vmi.Labels[v1alpha1.OutdatedLauncherImageLabel]
				g.Expect(marked).To(BeTrue(), "VMI %s is not marked %s", gr.name, v1alpha1.OutdatedLauncherImageLabel)
			}
			n := f.kubevisor(ctx).Status.OutdatedVirtualMachineInstanceWorkloads
			g.Expect(n).NotTo(BeNil(), "status.outdatedVirtualMachineInstanceWorkloads is not set")
			g.Expect(*n).To(BeNumerically(">=", len(guests)))
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())

		By("a VMI made now runs in a launcher pod of the new version (the VMs above deleted first: room on the node)")
		for _, g := range guests {
			Expect(client.IgnoreNotFound(f.Client.Delete(ctx, g.vmi))).To(Succeed())
		}
		for _, g := range guests {
			f.WaitGone(ctx, g.name)
		}
		vmi := f.bootGuest(ctx, "upgrade-new")
		pods2 := f.LauncherPods(ctx, vmi.UID)
		Expect(pods2).To(HaveLen(1))
		Expect(imagesOf(pods2[0])).To(ContainElement(HaveSuffix("kubevisor-launcher:" + Cfg.UpgradeTag)))
		Consistently(func() bool {
			cur := f.VMI(ctx, vmi.Name)
			if cur == nil {
				return false
			}
			_, marked := cur.Labels[v1alpha1.OutdatedLauncherImageLabel]
			return marked
		}).WithContext(ctx).WithTimeout(5*time.Second).WithPolling(time.Second).Should(BeFalse(), "a VMI on the new launcher is marked outdated")
	})

	// workloadUpdateStrategy Evict on the one-node cluster: the VMs on the old launcher are
	// evicted (through the Eviction API) one per batch, and their VMs start them again on the
	// new launcher. LiveMigrate needs a second node; the updater's envtest covers its choice.
	It("evicts the VMIs left on the old launcher one batch at a time when workloadUpdateStrategy says Evict: their VMs start again on the new launcher", func(ctx SpecContext) {
		if Cfg.UpgradeTag == "" {
			Fail("no -upgrade-tag: make e2e-upgrade builds a second image set of this tree under a tag of its own and names it")
		}
		const interval = 15 * time.Second
		f.workloadUpdateStrategy(ctx, v1alpha1.WorkloadUpdateMethodEvict, interval)

		guests := f.bootOneOfEach(ctx, "evict", true)
		old := map[string]types.UID{}
		for _, g := range guests {
			old[g.name] = g.vmi.UID
		}

		By(fmt.Sprintf("spec.imageTag %s", Cfg.UpgradeTag))
		start := time.Now()
		f.setImageTag(ctx, Cfg.UpgradeTag)
		f.waitInstalled(ctx, Cfg.UpgradeTag, 10*time.Minute)

		By("each VM runs a new VMI in a launcher pod of the new version, not marked; the status counts none")
		Eventually(func(g Gomega) {
			for _, gr := range guests {
				vmi := f.VMI(ctx, gr.name)
				g.Expect(vmi).NotTo(BeNil(), "VM %s has no VMI", gr.name)
				g.Expect(vmi.UID).NotTo(Equal(old[gr.name]), "VM %s still runs its VMI of the old launcher", gr.name)
				g.Expect(vmi.Status.Phase).To(Equal(v1alpha1.Running), "VMI %s", gr.name)
				g.Expect(vmi.Labels).NotTo(HaveKey(v1alpha1.OutdatedLauncherImageLabel), "VMI %s", gr.name)
				pods := f.LauncherPods(ctx, vmi.UID)
				g.Expect(pods).To(HaveLen(1), "launcher pods of VMI %s", gr.name)
				g.Expect(imagesOf(pods[0])).To(ContainElement(HaveSuffix("kubevisor-launcher:"+Cfg.UpgradeTag)), "VMI %s", gr.name)
			}
			n := f.kubevisor(ctx).Status.OutdatedVirtualMachineInstanceWorkloads
			g.Expect(n == nil || *n == 0).To(BeTrue(), "status.outdatedVirtualMachineInstanceWorkloads %v", n)
		}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
		GinkgoWriter.Printf("Evict, batches of 1 every %s: %d VMs on the new launcher %s after the imageTag change\n",
			interval, len(guests), time.Since(start).Round(100*time.Millisecond))

		By("one eviction per batch: the updater's eviction events are an interval apart")
		var events eventsv1.EventList
		Expect(f.Client.List(ctx, &events, client.InNamespace(f.Namespace))).To(Succeed())
		var at []time.Time
		for _, e := range events.Items {
			if e.Reason == "WorkloadUpdateEvicted" && old[e.Regarding.Name] == e.Regarding.UID && e.Regarding.UID != "" {
				at = append(at, e.EventTime.Time)
			}
		}
		slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
		Expect(at).To(HaveLen(len(guests)), "eviction events of the old VMIs")
		GinkgoWriter.Printf("evictions at %s after the imageTag change\n", func() (out []string) {
			for _, t := range at {
				out = append(out, t.Sub(start).Round(100*time.Millisecond).String())
			}
			return out
		}())
		for i := 1; i < len(at); i++ {
			// The interval is the updater's, counted from its previous batch; a second of slack
			// for the event's clock.
			Expect(at[i].Sub(at[i-1])).To(BeNumerically(">=", interval-time.Second), "evictions at %v", at)
		}
	})

	// workloadUpdateStrategy LiveMigrate on two nodes: after the upgrade, each VMI left on the
	// old launcher is live-migrated by the workload updater (once every handler runs the new
	// version) into a launcher pod of the new version on the other node: the same VMI and guest
	// boot, its heartbeat going on, unmarked afterwards.
	It("live-migrates the VMIs left on the old launcher to the other node when workloadUpdateStrategy says LiveMigrate: the same guests, now on the new launcher", Label("RequiresTwoNodes", "Migration"), func(ctx SpecContext) {
		if Cfg.UpgradeTag == "" {
			Fail("no -upgrade-tag: make e2e-upgrade builds a second image set of this tree under a tag of its own and names it")
		}
		first, second := f.RequireTwoNodes(ctx)
		const interval = 10 * time.Second
		f.workloadUpdateStrategy(ctx, v1alpha1.WorkloadUpdateMethodLiveMigrate, interval)

		By("two LiveMigratable VMIs boot on " + first + " (" + second + " cordoned meanwhile)")
		f.setUnschedulable(ctx, second, true)
		DeferCleanup(func(ctx context.Context) { f.setUnschedulable(ctx, second, false) })
		guests := []*migrant{f.bootMigrant(ctx, "upgrade-mig-a", nil), f.bootMigrant(ctx, "upgrade-mig-b", nil)}
		f.setUnschedulable(ctx, second, false)
		before := map[string][]float64{}
		for _, g := range guests {
			Expect(g.node).To(Equal(first), "VMI %s", g.name)
			before[g.name] = f.heartbeats(ctx, g.guestRun)
		}

		By(fmt.Sprintf("spec.imageTag %s", Cfg.UpgradeTag))
		start := time.Now()
		f.setImageTag(ctx, Cfg.UpgradeTag)
		f.waitInstalled(ctx, Cfg.UpgradeTag, 10*time.Minute)
		installed := time.Since(start)

		By("each VMI moves to " + second + " by a migration of the workload updater, into a launcher pod of the new version, and is unmarked")
		Eventually(func(g Gomega) {
			for _, gr := range guests {
				vmi := f.VMI(ctx, gr.name)
				g.Expect(vmi).NotTo(BeNil(), "VMI %s is gone", gr.name)
				g.Expect(vmi.UID).To(Equal(gr.vmi.UID), "VMI %s: another VMI", gr.name)
				g.Expect(vmi.Status.NodeName).To(Equal(second), "VMI %s: %s", gr.name, f.describeEvacuation(ctx, gr.name))
				pods := f.LauncherPods(ctx, vmi.UID)
				g.Expect(pods).To(HaveLen(1), "launcher pods of VMI %s", gr.name)
				g.Expect(imagesOf(pods[0])).To(ContainElement(HaveSuffix("kubevisor-launcher:"+Cfg.UpgradeTag)), "VMI %s", gr.name)
				g.Expect(vmi.Labels).NotTo(HaveKey(v1alpha1.OutdatedLauncherImageLabel), "VMI %s", gr.name)
			}
			n := f.kubevisor(ctx).Status.OutdatedVirtualMachineInstanceWorkloads
			g.Expect(n == nil || *n == 0).To(BeTrue(), "status.outdatedVirtualMachineInstanceWorkloads %v", n)
		}).WithContext(ctx).WithTimeout(2 * migrationTimeout).WithPolling(2 * time.Second).Should(Succeed())
		GinkgoWriter.Printf("LiveMigrate, batches of 1 every %s: install at %s in %s; %d VMIs on the new launcher on %s %s after the imageTag change\n",
			interval, Cfg.UpgradeTag, installed.Round(100*time.Millisecond), len(guests), second, time.Since(start).Round(100*time.Millisecond))

		By("the same guests: the same boot, the heartbeat going on from where it was")
		for _, g := range guests {
			f.expectMovedOn(ctx, g, before[g.name])
		}

		By("each moved by exactly one migration of the workload updater, which succeeded")
		var migs v1alpha1.VirtualMachineInstanceMigrationList
		Expect(f.Client.List(ctx, &migs, client.InNamespace(f.Namespace), client.MatchingLabels{v1alpha1.WorkloadUpdateLabel: "true"})).To(Succeed())
		for _, g := range guests {
			var mine []string
			for _, m := range migs.Items {
				if m.Spec.VMIName == g.name {
					mine = append(mine, m.Name+" "+string(m.Status.Phase))
					GinkgoWriter.Printf("VMI %s: workload update migration %s created %s after the imageTag change, %s\n", g.name, m.Name,
						m.CreationTimestamp.Sub(start).Round(time.Second), m.Status.Phase)
				}
			}
			Expect(mine).To(HaveExactElements(HaveSuffix(" Succeeded")), "VMI %s: workload update migrations", g.name)
		}
	})

	// Bad input: an imageTag no node has. The operator rolls kubevisor-controller first; its new
	// pod cannot get its image, so the rollout stops there with the old pod serving, Degraded
	// names the pod and why, the handlers and kubevisor-api are not touched, and setting the
	// tag back recovers.
	It("keeps the running install when imageTag names images the nodes do not have, says why in Degraded, and recovers when the tag is set back", func(ctx SpecContext) {
		kv := f.kubevisor(ctx)
		from, specTag := kv.Status.ObservedVersion, kv.Spec.ImageTag
		const missing = "e2e-no-such-tag"
		handlersBefore := map[types.UID]bool{}
		for _, p := range f.handlerPods(ctx) {
			handlersBefore[p.UID] = true
		}
		DeferCleanup(func(ctx SpecContext) {
			By(fmt.Sprintf("back to %s", from))
			f.setImageTag(ctx, specTag)
			f.waitInstalled(ctx, from, 10*time.Minute)
		})

		By(fmt.Sprintf("spec.imageTag %s", missing))
		f.setImageTag(ctx, missing)
		Eventually(func(g Gomega) {
			kv := f.kubevisor(ctx)
			c := meta.FindStatusCondition(kv.Status.Conditions, v1alpha1.KubevisorDegraded)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "Degraded: %+v", c)
			g.Expect(c.Message).To(ContainSubstring("kubevisor-controller"), "Degraded: %+v", c)
			g.Expect(c.Message).To(MatchRegexp("ErrImagePull|ImagePullBackOff|ErrImageNeverPull|InvalidImageName"), "Degraded: %+v", c)
			g.Expect(kv.Status.ObservedVersion).To(Equal(from))
		}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
		GinkgoWriter.Printf("Degraded: %s\n", meta.FindStatusCondition(f.kubevisor(ctx).Status.Conditions, v1alpha1.KubevisorDegraded).Message)

		By("the install still serves at the old version: a ready controller pod of it, the same handler pods, admission answering")
		var pods corev1.PodList
		Expect(f.Client.List(ctx, &pods, client.InNamespace("kubevisor-system"))).To(Succeed())
		readyOld := 0
		for _, p := range pods.Items {
			switch p.Labels["app.kubernetes.io/name"] {
			case "kubevisor-controller":
				if podIsReady(p) && slices.ContainsFunc(imagesOf(p), func(img string) bool { return strings.HasSuffix(img, ":"+from) }) {
					readyOld++
				}
			case "kubevisor-handler", "kubevisor-api":
				for _, img := range imagesOf(p) {
					Expect(img).NotTo(HaveSuffix(":"+missing), "pod %s was rolled before kubevisor-controller was ready", p.Name)
				}
			}
		}
		Expect(readyOld).To(BeNumerically(">=", 1), "no ready kubevisor-controller pod of %s", from)
		for _, p := range f.handlerPods(ctx) {
			Expect(handlersBefore).To(HaveKey(p.UID), "handler pod %s is new", p.Name)
		}
		probe := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: f.Namespace}, Spec: guestSpecOf(guest.Options{UserData: "probe"})}
		Expect(f.Client.Create(ctx, probe, client.DryRunAll)).To(Succeed(), "admission of a VMI")
	})

	// A driver-only upgrade: a driver image replaces the in-tree qmp driver's binary
	// (drivers[qmp].image), the handler and launcher images unchanged. The handler rollout
	// starts the new binary, which recovers the running VMs: no migration, no restart.
	It("replaces an in-tree driver's binary from a driver image with VMs running: the handler runs the image's binary, and the VMs keep their guest boot and launcher, their status and console served by it", func(ctx SpecContext) {
		if Cfg.UpgradeTag == "" {
			Fail("no -upgrade-tag: make e2e-upgrade builds the qmp driver image under a tag of its own and names it")
		}
		kv := f.kubevisor(ctx)
		from := kv.Status.ObservedVersion
		before := slices.Clone(kv.Spec.Drivers)
		i := slices.IndexFunc(before, func(d v1alpha1.KubevisorDriver) bool { return d.Name == "qmp" })
		if i < 0 {
			Skip("the install has no qmp driver")
		}
		image := "kubevisor/kubevisor-driver-qmp:" + Cfg.UpgradeTag
		guests := f.bootOneOfEach(ctx, "driverimage", false)
		beats := map[string]int{}
		for _, g := range guests {
			beats[g.name] = len(f.heartbeats(ctx, g))
		}
		handlersBefore := map[types.UID]bool{}
		for _, p := range f.handlerPods(ctx) {
			handlersBefore[p.UID] = true
		}
		DeferCleanup(func(ctx SpecContext) {
			By("the handler image's qmp driver again")
			f.setDrivers(ctx, before)
			f.waitInstalled(ctx, from, 10*time.Minute)
		})

		By(fmt.Sprintf("drivers[qmp].image %s", image))
		with := slices.Clone(before)
		with[i].Image = image
		start := time.Now()
		f.setDrivers(ctx, with)
		f.waitInstalled(ctx, from, 10*time.Minute)
		GinkgoWriter.Printf("driver-only upgrade of qmp: installed %s after the spec change\n", time.Since(start).Round(100*time.Millisecond))

		By("each node's new handler runs the qmp driver from the plugin directory, where the image's init container put it")
		for _, p := range f.handlerPods(ctx) {
			Expect(handlersBefore).NotTo(HaveKey(p.UID), "handler pod %s was not replaced", p.Name)
			Eventually(func(g Gomega) {
				out, err := f.Kubectl(ctx, "", "-n", handlerNamespace, "logs", p.Name, "-c", handlerContainer)
				g.Expect(err).NotTo(HaveOccurred())
				var loaded string
				for _, l := range strings.Split(out, "\n") {
					if strings.Contains(l, "driver loaded") && strings.Contains(l, "qmp") {
						loaded = l
					}
				}
				g.Expect(loaded).To(ContainSubstring("/etc/kubevisor/plugins/qmp/"), "handler %s: the qmp driver's load line: %q", p.Name, loaded)
			}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
		}

		By("each VM ran on: the same VMI, launcher pod and guest boot, its heartbeat going on, its console served by its driver")
		for _, g := range guests {
			f.expectSameGuest(ctx, g, beats[g.name])
			f.waitReadyCondition(ctx, g.name)
		}
	})
})

// setDrivers replaces the Kubevisor's spec.drivers (a merge patch replaces a list whole).
// workloadUpdateStrategy sets the Kubevisor's workloadUpdateStrategy to method, a batch of 1
// per interval, and waits until the install is Available again; at the spec's end it sets the
// strategy and imageTag back and waits for the version the install runs now (which must not be
// Cfg.UpgradeTag).
func (f *Framework) workloadUpdateStrategy(ctx context.Context, method v1alpha1.WorkloadUpdateMethod, interval time.Duration) {
	GinkgoHelper()
	kv := f.kubevisor(ctx)
	from, specTag := kv.Status.ObservedVersion, kv.Spec.ImageTag
	Expect(from).NotTo(Equal(Cfg.UpgradeTag), "the install already runs %s", Cfg.UpgradeTag)
	DeferCleanup(func(ctx SpecContext) {
		By(fmt.Sprintf("back to %s, with no workload update method", from))
		tag := "null"
		if specTag != "" {
			tag = fmt.Sprintf("%q", specTag)
		}
		f.patchKubevisor(ctx, `{"spec":{"workloadUpdateStrategy":null,"imageTag":`+tag+`}}`)
		f.waitInstalled(ctx, from, 10*time.Minute)
	})
	By(fmt.Sprintf("workloadUpdateStrategy: %s, a batch of 1 every %s", method, interval))
	f.patchKubevisor(ctx, fmt.Sprintf(`{"spec":{"workloadUpdateStrategy":{"workloadUpdateMethods":[%q],"batchEvictionSize":1,"batchEvictionInterval":%q}}}`, method, interval.String()))
	f.waitInstalled(ctx, from, 10*time.Minute)
}

func (f *Framework) setDrivers(ctx context.Context, drivers []v1alpha1.KubevisorDriver) {
	GinkgoHelper()
	raw, err := json.Marshal(map[string]any{"spec": map[string]any{"drivers": drivers}})
	Expect(err).NotTo(HaveOccurred())
	f.patchKubevisor(ctx, string(raw))
}

// podIsReady says p's Ready condition is True.
func podIsReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
