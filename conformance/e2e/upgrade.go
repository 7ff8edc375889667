package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// The install the operator keeps (hack/install.sh names it so).
const kubevisorName = "kubevisor"

// kubevisor reads the cluster's Kubevisor object.
func (f *Framework) kubevisor(ctx context.Context) *v1alpha1.Kubevisor {
	GinkgoHelper()
	var kv v1alpha1.Kubevisor
	Expect(f.Client.Get(ctx, types.NamespacedName{Name: kubevisorName}, &kv)).To(Succeed(),
		"the Kubevisor object %q: is Kubevisor installed through its operator (make up, make install)?", kubevisorName)
	return &kv
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

// conditionLog records every change of a Kubevisor's conditions while it runs.
type conditionLog struct {
	mu      sync.Mutex
	entries []string // "type=status reason"
	cancel  context.CancelFunc
	done    chan struct{}
}

func (f *Framework) logConditions(ctx context.Context) *conditionLog {
	ctx, cancel := context.WithCancel(ctx)
	l := &conditionLog{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		last := map[string]string{}
		for ctx.Err() == nil {
			var kv v1alpha1.Kubevisor
			if err := f.Client.Get(ctx, types.NamespacedName{Name: kubevisorName}, &kv); err == nil {
				for _, c := range kv.Status.Conditions {
					e := fmt.Sprintf("%s=%s %s", c.Type, c.Status, c.Reason)
					if last[c.Type] != e {
						last[c.Type] = e
						l.mu.Lock()
						l.entries = append(l.entries, e+": "+c.Message)
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
func (l *conditionLog) Stop() []string {
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.entries)
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

		guests := f.bootOneOfEach(ctx, "upgrade", false)
		uids := map[string]types.UID{}
		beats := map[string]int{}
		for _, g := range guests {
			uids[g.name] = g.vmi.UID
			beats[g.name] = len(f.heartbeats(ctx, g))
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
		GinkgoWriter.Printf("upgrade %s -> %s: %s; conditions seen:\n  %s\n", from, Cfg.UpgradeTag, took.Round(100*time.Millisecond), strings.Join(log, "\n  "))

		By("the status went Progressing and stayed Available, never Degraded")
		Expect(log).To(ContainElement(HavePrefix("Progressing=True RollingOut")))
		Expect(log).NotTo(ContainElement(HavePrefix("Available=False")))
		Expect(log).NotTo(ContainElement(HavePrefix("Degraded=True")))
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

		By("each VM ran on undisturbed: the same VMI, launcher pod and guest boot, its heartbeat without a gap, its console served")
		for _, g := range guests {
			f.expectUndisturbed(ctx, g, beats[g.name])
			GinkgoWriter.Printf("VM %s (%s): longest heartbeat gap from the upgrade on: %.1fs\n", g.name, g.class.Driver,
				maxHeartbeatGap(f.heartbeats(ctx, g), beats[g.name]))
		}
		bad, events := watch.Stop()
		Expect(bad).To(BeEmpty(), "the VMIs were not Running and Ready throughout (%d events)", events)

		By("a VMI made now runs in a launcher pod of the new version")
		vmi := f.bootGuest(ctx, "upgrade-new")
		pods2 := f.LauncherPods(ctx, vmi.UID)
		Expect(pods2).To(HaveLen(1))
		Expect(imagesOf(pods2[0])).To(ContainElement(HaveSuffix("kubevisor-launcher:"+Cfg.UpgradeTag)))
	})
})
