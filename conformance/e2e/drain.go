package e2e

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// Node drain (docs/migration.md, "Node drain"): kubectl drain evicts the launcher pods of a
// node; kubevisor-api's eviction webhook turns the eviction of a VMI with evictionStrategy
// LiveMigrate into a live migration (answered 429, which kubectl drain retries), and the drain
// completes once the VMI controller deleted the source pods of the completed migrations.

// drainTimeout bounds a drain of two test guests off one node: two migrations at most
// (parallelOutboundMigrationsPerNode 2), target pod start included, and the drain's retries.
const drainTimeout = 8 * time.Minute

// bootEvictable runs the test guest as VMI name with evictionStrategy LiveMigrate (bootMigrant's
// guest with the strategy).
func (f *Framework) bootEvictable(ctx context.Context, name string) *migrant {
	GinkgoHelper()
	return f.bootMigrant(ctx, name, nil, func(spec *v1alpha1.VirtualMachineInstanceSpec) {
		live := v1alpha1.EvictionStrategyLiveMigrate
		spec.EvictionStrategy = &live
	})
}

// setUnschedulable cordons (true) or uncordons the node.
func (f *Framework) setUnschedulable(ctx context.Context, node string, on bool) {
	GinkgoHelper()
	verb := "uncordon"
	if on {
		verb = "cordon"
	}
	out, err := f.Kubectl(ctx, "", verb, node)
	Expect(err).NotTo(HaveOccurred(), out)
}

var _ = Describe("Node drain", Label("RequiresTwoNodes", "Migration", "Drain"), func() {
	f := NewFramework()

	It("kubectl drain of a node live-migrates its VMIs with evictionStrategy LiveMigrate to the other node and completes: the same boots, the heartbeats go on, the handler stays", func(ctx SpecContext) {
		first, second := f.RequireTwoNodes(ctx)

		By("two VMIs with evictionStrategy LiveMigrate boot on " + first + " (" + second + " cordoned meanwhile)")
		f.setUnschedulable(ctx, second, true)
		DeferCleanup(func(ctx context.Context) { f.setUnschedulable(ctx, second, false) })
		a := f.bootEvictable(ctx, "drain-a")
		b := f.bootEvictable(ctx, "drain-b")
		f.setUnschedulable(ctx, second, false)
		guests := []*migrant{a, b}
		DeferCleanup(func(ctx context.Context) {
			if !CurrentSpecReport().Failed() {
				return
			}
			for _, g := range guests {
				GinkgoWriter.Printf("VMI %s: %s\n", g.name, f.describeEvacuation(ctx, g.name))
				if vmi := f.VMI(ctx, g.name); vmi != nil {
					for _, p := range f.LauncherPods(ctx, vmi.UID) {
						out, err := f.Kubectl(ctx, "", "logs", p.Name, "-c", "guest-console-log", "--tail=15")
						GinkgoWriter.Printf("pod %s on %s, console log tail (%v):\n%s\n", p.Name, p.Spec.NodeName, err, out)
					}
				}
			}
		})
		for _, g := range guests {
			Expect(g.node).To(Equal(first), "VMI %s", g.name)
		}

		By("each has a PodDisruptionBudget selecting its launcher pod")
		for _, g := range guests {
			Eventually(func(gm Gomega) {
				var pdbs policyv1.PodDisruptionBudgetList
				gm.Expect(f.Client.List(ctx, &pdbs, client.InNamespace(f.Namespace))).To(Succeed())
				var mine []policyv1.PodDisruptionBudget
				for _, p := range pdbs.Items {
					if metav1.IsControlledBy(&p, g.vmi) {
						mine = append(mine, p)
					}
				}
				gm.Expect(mine).To(HaveLen(1), "PodDisruptionBudgets of VMI %s", g.name)
				gm.Expect(mine[0].Spec.Selector.MatchLabels).To(HaveKeyWithValue(v1alpha1.CreatedByLabel, string(g.vmi.UID)))
				gm.Expect(mine[0].Status.CurrentHealthy).To(BeNumerically(">=", 1), "the disruption controller counted the launcher pod")
			}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
		}
		handlers := f.handlerPodsOn(ctx, first)
		Expect(handlers).NotTo(BeEmpty(), "a handler pod on %s", first)
		before := map[string][]float64{}
		for _, g := range guests {
			before[g.name] = f.heartbeats(ctx, g.guestRun)
		}

		By("kubectl drain " + first + " of these launcher pods completes")
		DeferCleanup(func(ctx context.Context) { f.setUnschedulable(ctx, first, false) })
		selector := fmt.Sprintf("%s in (%s,%s)", v1alpha1.CreatedByLabel, a.vmi.UID, b.vmi.UID)
		drainCtx, cancel := context.WithTimeout(ctx, drainTimeout)
		defer cancel()
		start := time.Now()
		out, err := f.Kubectl(drainCtx, "", "drain", first, "--ignore-daemonsets", "--delete-emptydir-data",
			"--pod-selector="+selector, "--timeout="+drainTimeout.String())
		GinkgoWriter.Printf("kubectl drain took %s:\n%s\n", time.Since(start).Round(time.Second), out)
		if err != nil {
			for _, g := range guests {
				GinkgoWriter.Printf("VMI %s: %s\n", g.name, f.describeEvacuation(ctx, g.name))
			}
		}
		Expect(err).NotTo(HaveOccurred(), "kubectl drain: %s", out)
		Expect(out).To(ContainSubstring("drained"))

		By("both run on " + second + ": the same VMI and boot, the heartbeat going on, the source pods gone")
		for _, g := range guests {
			vmi := f.expectMovedOn(ctx, g, before[g.name])
			Expect(vmi.Status.NodeName).To(Equal(second))
		}

		By("each moved by one evacuation migration, which succeeded; the marks are removed")
		var migs v1alpha1.VirtualMachineInstanceMigrationList
		Expect(f.Client.List(ctx, &migs, client.InNamespace(f.Namespace), client.MatchingLabels{v1alpha1.EvacuationLabel: first})).To(Succeed())
		for _, g := range guests {
			var mine []string
			for _, m := range migs.Items {
				if m.Spec.VMIName == g.name {
					mine = append(mine, m.Name+" "+string(m.Status.Phase))
				}
			}
			Expect(mine).To(ContainElement(HaveSuffix(" Succeeded")), "VMI %s: evacuation migrations %v", g.name, mine)
			Eventually(func() string { return f.VMI(ctx, g.name).Status.EvacuationNodeName }).WithContext(ctx).
				WithTimeout(time.Minute).WithPolling(time.Second).Should(BeEmpty(), "VMI %s still marked", g.name)
		}

		By("the handler DaemonSet's pod on " + first + " stayed")
		Expect(f.handlerPodsOn(ctx, first)).To(Equal(handlers))
	})
})

// handlerPodsOn lists the names of the handler pods (kubevisor-system) on node.
func (f *Framework) handlerPodsOn(ctx context.Context, node string) []string {
	GinkgoHelper()
	var pods corev1.PodList
	Expect(f.Client.List(ctx, &pods, client.InNamespace("kubevisor-system"))).To(Succeed())
	var out []string
	for _, p := range pods.Items {
		if p.Spec.NodeName == node && strings.Contains(p.Name, "handler") && p.DeletionTimestamp == nil {
			out = append(out, p.Name)
		}
	}
	return out
}

// describeEvacuation says where VMI name stands: node, mark, migration state and its migrations.
func (f *Framework) describeEvacuation(ctx context.Context, name string) string {
	vmi := f.VMI(ctx, name)
	if vmi == nil {
		return "gone"
	}
	s := fmt.Sprintf("phase %s node %s evacuationNodeName %q", vmi.Status.Phase, vmi.Status.NodeName, vmi.Status.EvacuationNodeName)
	var migs v1alpha1.VirtualMachineInstanceMigrationList
	if err := f.Client.List(ctx, &migs, client.InNamespace(f.Namespace)); err == nil {
		for i := range migs.Items {
			if m := &migs.Items[i]; m.Spec.VMIName == name {
				s += fmt.Sprintf("; migration %s %s (%s)", m.Name, m.Status.Phase, describeMigration(m))
			}
		}
	}
	return s
}
