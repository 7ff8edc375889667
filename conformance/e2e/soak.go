package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/metricsauth"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// The soak (label Soak, make e2e-soak): for Cfg.SoakDuration, VMIs are created and deleted in
// a loop on the local cluster's first node, one real guest at a time (the default class, qmp)
// beside batches of simulated ones (the class fake, whose VMs still get a launcher pod, a tap
// from the network driver and disks from the storage driver, but run no guest); then the node's
// census (census.go) is taken again and compared with one from before the loop. Nothing may be
// left: a count above its before (past the handler's small slack) is a leak and fails the spec.

// soakClass is one loop of the soak: VMIs of a class, batch at a time.
type soakClass struct {
	name, class string
	batch       int
	cpu         *resource.Quantity
}

// soakStats is what one loop did.
type soakStats struct {
	cycles, vmis        int
	toRunning, toGone   time.Duration // sums
	maxRunning, maxGone time.Duration
	failures            []string
}

// soakBatchFake is how many simulated VMIs each cycle of the fake loop runs at once.
const soakBatchFake = 5

var _ = Describe("Soak", Label("Soak"), func() {
	f := NewFramework()

	It("leaves nothing on the node after VMIs are created and deleted in a loop: pods, network namespaces, links, packet filter rules, mounts, per-VMI and run directories, driver state records, processes, the handler's goroutines and file descriptors", func(ctx SpecContext) {
		if Cfg.LocalCluster == "" {
			Expect(testenv.CI()).To(BeFalse(), "CI=true: the soak counts what is left on this machine and needs the local cluster (-local-cluster)")
			Skip("the soak's census reads this machine: it needs the local cluster (-local-cluster)")
		}
		hostname, err := os.Hostname()
		Expect(err).NotTo(HaveOccurred())
		var node corev1.Node
		Expect(f.Client.Get(ctx, types.NamespacedName{Name: hostname}, &node)).To(Succeed(),
			"the local cluster's first node is this machine, named %s", hostname)

		f.ensureFakeClass(ctx)
		handler := f.handlerPodOn(ctx, node.Name)
		token := f.metricsToken(ctx)

		classes := []soakClass{
			{name: "real", class: Cfg.HypervisorClass, batch: 1},
			{name: "fake", class: "fake", batch: soakBatchFake, cpu: ptr.To(resource.MustParse("10m"))},
		}
		By("a first cycle of each class, so that what the handler makes once (connections, caches) is made before the census")
		for _, c := range classes {
			var st soakStats
			f.soakCycle(ctx, c, node.Name, "warm", &st)
			Expect(st.failures).To(BeEmpty(), "the first %s cycle", c.name)
		}
		before := f.settledCensus(ctx, node.Name, handler, token, nil)
		GinkgoWriter.Printf("census before the soak:\n%s", censusTable(before, before))

		By(fmt.Sprintf("VMIs created and deleted for %s", Cfg.SoakDuration))
		stats := make([]soakStats, len(classes))
		loopCtx, cancel := context.WithTimeout(ctx, Cfg.SoakDuration)
		defer cancel()
		start := time.Now()
		var wg sync.WaitGroup
		for i, c := range classes {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				for n := 0; loopCtx.Err() == nil; n++ {
					// A cycle runs to its end past the deadline, so no VMI is left half made.
					f.soakCycle(ctx, c, node.Name, fmt.Sprint(n), &stats[i])
				}
			}()
		}
		progress := time.NewTicker(30 * time.Second)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
	wait:
		for {
			select {
			case <-done:
				break wait
			case <-progress.C:
				GinkgoWriter.Printf("soak %s: real %d VMIs, fake %d VMIs, failures %d\n", time.Since(start).Round(time.Second),
					stats[0].vmis, stats[1].vmis, len(stats[0].failures)+len(stats[1].failures))
			}
		}
		progress.Stop()
		elapsed := time.Since(start)

		after := f.settledCensus(ctx, node.Name, f.handlerPodOn(ctx, node.Name), token, before)
		GinkgoWriter.Printf("soak: %s\n", elapsed.Round(time.Second))
		for i, c := range classes {
			s := stats[i]
			GinkgoWriter.Printf("  %s (class %q): %d cycles, %d VMIs; creation to Running mean %s max %s; deletion to gone (VMI and launcher pod) mean %s max %s; %d failures\n",
				c.name, c.class, s.cycles, s.vmis, mean(s.toRunning, s.vmis), s.maxRunning.Round(100*time.Millisecond),
				mean(s.toGone, s.vmis), s.maxGone.Round(100*time.Millisecond), len(s.failures))
		}
		GinkgoWriter.Printf("census before and after:\n%s", censusTable(before, after))
		for i, c := range classes {
			Expect(stats[i].failures).To(BeEmpty(), "the %s loop", c.name)
			Expect(stats[i].vmis).To(BeNumerically(">", 0), "the %s loop ran no VMI", c.name)
		}
		Expect(leaks(before, after)).To(BeEmpty(), "left on node %s after %d VMIs", node.Name, stats[0].vmis+stats[1].vmis)
	})
})

// soakCycle creates c.batch VMIs of c's class on node, waits until each is Running, deletes
// them and waits until each VMI and its launcher pods are gone; what goes wrong is added to
// st.failures (the loop goes on) and the cycle's VMIs are deleted anyway.
func (f *Framework) soakCycle(ctx context.Context, c soakClass, node, cycle string, st *soakStats) {
	names := make([]string, c.batch)
	uids := make([]types.UID, c.batch)
	created := make([]time.Time, c.batch)
	fail := func(format string, args ...any) {
		st.failures = append(st.failures, fmt.Sprintf(format, args...))
		GinkgoWriter.Printf("soak: "+format+"\n", args...)
	}
	for i := range c.batch {
		names[i] = fmt.Sprintf("soak-%s-%s-%d", c.name, cycle, i)
		spec := guestSpecOf(guest.Options{HypervisorClass: c.class, CPURequest: c.cpu, UserData: names[i]})
		spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
		vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: f.Namespace, Name: names[i]}, Spec: spec}
		created[i] = time.Now()
		if err := f.Client.Create(ctx, vmi); err != nil {
			fail("create VMI %s: %v", names[i], err)
			names[i] = ""
			continue
		}
		uids[i] = vmi.UID
		st.vmis++
	}
	for i, name := range names {
		if name == "" {
			continue
		}
		if err := f.untilPhase(ctx, name, v1alpha1.Running, Cfg.BootTimeout); err != nil {
			fail("VMI %s: %v", name, err)
			continue
		}
		// Creation to Running as seen here: the batch's VMIs are polled one after the other.
		took := time.Since(created[i])
		st.toRunning += took
		st.maxRunning = max(st.maxRunning, took)
	}
	for i, name := range names {
		if name == "" {
			continue
		}
		deleted := time.Now()
		err := client.IgnoreNotFound(f.Client.Delete(ctx, &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: f.Namespace, Name: name}}))
		if err == nil {
			err = f.untilGone(ctx, name, uids[i], 3*time.Minute)
		}
		if err != nil {
			fail("delete VMI %s: %v", name, err)
			continue
		}
		took := time.Since(deleted)
		st.toGone += took
		st.maxGone = max(st.maxGone, took)
	}
	st.cycles++
}

// untilPhase polls the VMI until it is in phase, fails (its status), or timeout passes.
func (f *Framework) untilPhase(ctx context.Context, name string, phase v1alpha1.VirtualMachineInstancePhase, timeout time.Duration) error {
	start := time.Now()
	var last v1alpha1.VirtualMachineInstanceStatus
	for time.Since(start) < timeout {
		var vmi v1alpha1.VirtualMachineInstance
		err := f.Client.Get(ctx, types.NamespacedName{Namespace: f.Namespace, Name: name}, &vmi)
		switch {
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
		case vmi.Status.Phase == phase:
			return nil
		case vmi.Status.Phase == v1alpha1.Failed:
			return fmt.Errorf("failed: %+v", vmi.Status)
		default:
			last = vmi.Status
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("not %s after %s: %+v", phase, timeout, last)
}

// untilGone polls until the VMI and every launcher pod of uid are gone.
func (f *Framework) untilGone(ctx context.Context, name string, uid types.UID, timeout time.Duration) error {
	start := time.Now()
	for time.Since(start) < timeout {
		var vmi v1alpha1.VirtualMachineInstance
		err := f.Client.Get(ctx, types.NamespacedName{Namespace: f.Namespace, Name: name}, &vmi)
		if apierrors.IsNotFound(err) {
			var pods corev1.PodList
			err = f.Client.List(ctx, &pods, client.InNamespace(f.Namespace), client.MatchingLabels{v1alpha1.CreatedByLabel: string(uid)})
			if err == nil && len(pods.Items) == 0 {
				return nil
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("the VMI or its launcher pod still there %s after its deletion", timeout)
}

// settledCensus takes the node's census once nothing of the spec's namespace runs, and again
// (every 5 s, up to 2 min) while it shows leaks against before, so that what the node removes a
// moment after a pod is gone (its network namespace, the handler's records) is not counted as
// left. before nil: the census is taken twice 10 s apart, the second returned.
func (f *Framework) settledCensus(ctx context.Context, node string, handler corev1.Pod, token string, before census) census {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		var pods corev1.PodList
		g.Expect(f.Client.List(ctx, &pods, client.InNamespace(f.Namespace))).To(Succeed())
		g.Expect(pods.Items).To(BeEmpty(), "pods of the spec's namespace")
	}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	if before == nil {
		time.Sleep(10 * time.Second)
		c, err := f.takeCensus(ctx, node, handler, token)
		Expect(err).NotTo(HaveOccurred())
		return c
	}
	var c census
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var err error
		c, err = f.takeCensus(ctx, node, handler, token)
		Expect(err).NotTo(HaveOccurred())
		if len(leaks(before, c)) == 0 || time.Now().After(deadline) {
			return c
		}
		GinkgoWriter.Printf("census not back yet: %v\n", leaks(before, c))
		time.Sleep(5 * time.Second)
	}
}

// ensureFakeClass adds the simulated hypervisor driver (fake) to the install's driver set when
// its class is not installed, and removes it again after the spec.
func (f *Framework) ensureFakeClass(ctx context.Context) {
	GinkgoHelper()
	var hc v1alpha1.HypervisorClass
	err := f.Client.Get(ctx, types.NamespacedName{Name: "fake"}, &hc)
	if err == nil {
		return
	}
	Expect(apierrors.IsNotFound(err)).To(BeTrue(), "HypervisorClass fake: %v", err)
	kv := f.kubevisor(ctx)
	version := kv.Status.ObservedVersion
	drivers := slices.Clone(kv.Spec.Drivers)
	By("the simulated hypervisor driver (fake) added to the driver set")
	f.setDrivers(ctx, append(slices.Clone(drivers), v1alpha1.KubevisorDriver{Name: "fake"}))
	DeferCleanup(func(ctx SpecContext) {
		f.setDrivers(ctx, drivers)
		f.waitInstalled(ctx, version, 5*time.Minute)
	})
	f.waitInstalled(ctx, version, 5*time.Minute)
	Eventually(func() error { return f.Client.Get(ctx, types.NamespacedName{Name: "fake"}, &hc) }).
		WithContext(ctx).WithTimeout(time.Minute).Should(Succeed())
}

// metricsToken is a token of a ServiceAccount bound (for the spec) to the ClusterRole that may
// read /metrics.
func (f *Framework) metricsToken(ctx context.Context) string {
	GinkgoHelper()
	sa := f.ServiceAccount(ctx, "soak-metrics")
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "kv-e2e-soak-metrics-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: metricsauth.ReaderRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}},
	}
	Expect(f.Client.Create(ctx, crb)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(f.Client.Delete(ctx, crb))).To(Succeed()) })
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](7200)}}
	Expect(f.Client.SubResource("token").Create(ctx, sa, tr)).To(Succeed())
	return tr.Status.Token
}

// mean is sum/n, rounded ("-" for none).
func mean(sum time.Duration, n int) string {
	if n == 0 {
		return "-"
	}
	return (sum / time.Duration(n)).Round(100 * time.Millisecond).String()
}
