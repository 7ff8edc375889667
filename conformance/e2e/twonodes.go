package e2e

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

var _ = Describe("Two nodes", Label("RequiresTwoNodes"), func() {
	f := NewFramework()

	It("runs a VMI pinned to the second node: its launcher pod there, its console through the API, its web server answering a pod on the first node at the VMI's IP", func(ctx SpecContext) {
		first, second := f.RequireTwoNodes(ctx)
		By("both nodes run a Ready handler pod, and each offers the handler's devices (" + v1alpha1.KVMDeviceResource + ", " + v1alpha1.TunDeviceResource + ")")
		hosts := map[string]string{}
		for _, name := range []string{first, second} {
			Eventually(func(g Gomega) {
				var n corev1.Node
				g.Expect(f.Client.Get(ctx, client.ObjectKey{Name: name}, &n)).To(Succeed())
				hosts[name] = n.Labels[corev1.LabelHostname]
				for _, r := range []string{v1alpha1.KVMDeviceResource, v1alpha1.TunDeviceResource} {
					q, ok := n.Status.Allocatable[corev1.ResourceName(r)]
					g.Expect(ok).To(BeTrue(), "node %s allocatable has no %s: %v", name, r, n.Status.Allocatable)
					g.Expect(q.IsZero()).To(BeFalse(), "node %s: %s", name, r)
				}
				var ready bool
				for _, p := range f.handlerPods(ctx) {
					if p.Spec.NodeName != name {
						continue
					}
					for _, c := range p.Status.Conditions {
						ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
					}
				}
				g.Expect(ready).To(BeTrue(), "no Ready kubevisor-handler pod on node %s", name)
			}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
			Expect(hosts[name]).NotTo(BeEmpty(), "node %s has no %s label", name, corev1.LabelHostname)
		}

		By("a VMI with nodeSelector " + corev1.LabelHostname + " of the second node runs there")
		spec := guestSpecOf(guest.Options{UserData: "second node"})
		spec.NodeSelector = map[string]string{corev1.LabelHostname: hosts[second]}
		b, err := yaml.Marshal(spec)
		Expect(err).NotTo(HaveOccurred())
		f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: pinned\nspec:\n"+indent(string(b), 2))
		vmi := f.WaitRunning(ctx, "pinned")
		Expect(vmi.Status.NodeName).To(Equal(second))
		pods := f.LauncherPods(ctx, vmi.UID)
		Expect(pods).To(HaveLen(1))
		Expect(pods[0].Spec.NodeName).To(Equal(second))
		Expect(GuestIP(vmi)).To(Equal(pods[0].Status.PodIP), "masquerade: the VMI's IP is its launcher pod's")

		By("its console log (kubectl logs: the API server to the second node's kubelet) shows the ready marker")
		f.WaitReady(ctx, vmi)
		By("vmctl console (kubevisor-api to the second node's handler) reaches the guest's shell")
		Expect(f.bootID(ctx, "pinned")).NotTo(BeEmpty())

		By("HTTP from a pod on the first node to the VMI's IP on the second node")
		Expect(f.HTTPFromPodOn(ctx, first, "http://"+GuestIP(vmi)+"/")).To(ContainSubstring(guest.WebAnswer))
	})
})
