//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/featuregate"
	"github.com/kubevisor/kubevisor/core/liveconfig"
)

// setFeatureGates sets the Kubevisor's spec.configuration.featureGates (a merge patch replaces
// the list whole; nil removes it) and waits until the operator has written them into the live
// configuration ConfigMap.
func (f *Framework) setFeatureGates(ctx context.Context, gates []string) {
	GinkgoHelper()
	raw, err := json.Marshal(map[string]any{"spec": map[string]any{"configuration": map[string]any{"featureGates": gates}}})
	Expect(err).NotTo(HaveOccurred())
	f.patchKubevisor(ctx, string(raw))
	Eventually(func(g Gomega) {
		var cm corev1.ConfigMap
		g.Expect(f.Client.Get(ctx, types.NamespacedName{Namespace: liveconfig.Namespace, Name: liveconfig.Name}, &cm)).To(Succeed())
		c, err := liveconfig.Parse(cm.Data)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(c.FeatureGates).To(ConsistOf(gates), "the live configuration's featureGates")
	}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(),
		"the operator did not render featureGates %q into %s/%s", gates, liveconfig.Namespace, liveconfig.Name)
}

var _ = Describe("Feature gates", Label("Operator", "FeatureGates"), func() {
	f := NewFramework()

	It("are live: without HostDisk a VMI with a hostDisk volume is refused naming the gate, with it admitted, no component restarted", func(ctx SpecContext) {
		before := f.kubevisor(ctx).Spec.Configuration.FeatureGates
		DeferCleanup(func(ctx SpecContext) {
			By("the Kubevisor's featureGates as they were")
			f.setFeatureGates(ctx, before)
		})
		without := slices.DeleteFunc(slices.Clone(before), func(g string) bool { return g == featuregate.HostDisk })
		with := append(slices.Clone(without), featuregate.HostDisk)
		apiPods := func() []string {
			var pods corev1.PodList
			Expect(f.Client.List(ctx, &pods, client.InNamespace("kubevisor-system"),
				client.MatchingLabels{"app.kubernetes.io/name": "kubevisor-api"})).To(Succeed())
			var uids []string
			for _, p := range pods.Items {
				uids = append(uids, string(p.UID))
			}
			slices.Sort(uids)
			return uids
		}
		podsBefore := apiPods()

		spec := guestSpecOf(guest.Options{UserData: "featuregates"})
		spec.Volumes[0].VolumeSource = v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{
			Path: "/var/lib/kubevisor/e2e-featuregates-absent.img", Type: v1alpha1.HostDiskExists}}
		vmi := func() *v1alpha1.VirtualMachineInstance {
			return &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: f.Namespace, Name: "featuregates"}, Spec: *spec.DeepCopy()}
		}

		By("HostDisk removed from the Kubevisor's featureGates " + describeGates(without))
		f.setFeatureGates(ctx, without)
		Eventually(func() string {
			err := f.Client.Create(ctx, vmi())
			if err == nil {
				// A kubevisor-api replica that had not read the ConfigMap yet admitted it.
				f.deleteVMI(ctx, "featuregates")
				return "admitted"
			}
			return err.Error()
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(
			ContainSubstring("spec.volumes[0].hostDisk: Forbidden: feature gate HostDisk is not enabled (add it to the Kubevisor's spec.configuration.featureGates)"))

		By("HostDisk back " + describeGates(with))
		f.setFeatureGates(ctx, with)
		Eventually(func() error { return f.Client.Create(ctx, vmi()) }).WithContext(ctx).WithTimeout(time.Minute).
			WithPolling(2*time.Second).Should(Succeed(), "a VMI with a hostDisk volume is refused with HostDisk enabled")
		f.deleteVMI(ctx, "featuregates")

		By("no kubevisor-api pod was replaced: the gates are live")
		Expect(apiPods()).To(Equal(podsBefore))
	})
})

// deleteVMI deletes the VMI name of the spec's namespace and waits until it is gone.
func (f *Framework) deleteVMI(ctx context.Context, name string) {
	GinkgoHelper()
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: f.Namespace, Name: name}}
	Expect(client.IgnoreNotFound(f.Client.Delete(ctx, vmi))).To(Succeed())
	f.WaitGone(ctx, name)
}

func describeGates(g []string) string {
	b, _ := json.Marshal(g)
	return string(b)
}
