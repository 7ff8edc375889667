package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// The specs of third-party drivers installed from driver images (docs/driver-authoring.md,
// section 12): each needs the cluster installed with the example's component, which
// hack/e2e-driver-images.sh (make e2e-driver-images) does before it runs the spec by its label.
const (
	// simResource is what examples/sim-device offers on a node.
	simResource = corev1.ResourceName(v1alpha1.DeviceResourcePrefix + "example-sim")
	// simDevices is how many devices it offers without configuration.
	simDevices = 3
	// simClass is the HypervisorClass (and driver) of the install's fake driver component
	// (manifests/install/drivers/fake): the simulated hypervisor, whose guests take a host
	// device with no PCI address and print it in their boot log.
	simClass = "fake"
	// envHostPathDisk names the test guest's bootable raw disk on the node, in a directory the
	// handler sees at the same path (under /var/lib/kubevisor), for the hostpath storage spec.
	envHostPathDisk = "E2E_HOSTPATH_DISK"
)

// handlerPods are the kubevisor-handler pods.
func (f *Framework) handlerPods(ctx context.Context) []corev1.Pod {
	GinkgoHelper()
	var pods corev1.PodList
	Expect(f.Client.List(ctx, &pods, client.InNamespace("kubevisor-system"),
		client.MatchingLabels{"app.kubernetes.io/name": "kubevisor-handler"})).To(Succeed())
	Expect(pods.Items).NotTo(BeEmpty(), "no kubevisor-handler pod")
	return pods.Items
}

// initContainerLog is the log of a handler pod's init container, which must have exited 0.
func (f *Framework) initContainerLog(ctx context.Context, pod corev1.Pod, name string) string {
	GinkgoHelper()
	var st *corev1.ContainerStatus
	for i, s := range pod.Status.InitContainerStatuses {
		if s.Name == name {
			st = &pod.Status.InitContainerStatuses[i]
		}
	}
	Expect(st).NotTo(BeNil(), "pod %s has no init container %s: was the driver's component installed?", pod.Name, name)
	Expect(st.State.Terminated).NotTo(BeNil(), "init container %s of %s: %+v", name, pod.Name, st.State)
	Expect(st.State.Terminated.ExitCode).To(BeZero(), "init container %s of %s", name, pod.Name)
	out, err := f.Kubectl(ctx, "", "-n", "kubevisor-system", "logs", pod.Name, "-c", name)
	Expect(err).NotTo(HaveOccurred(), out)
	return out
}

// nodeWithLabel waits for a node with label key=value and returns it.
func (f *Framework) nodeWithLabel(ctx context.Context, key, value, why string) corev1.Node {
	GinkgoHelper()
	var node corev1.Node
	Eventually(func(g Gomega) {
		var nodes corev1.NodeList
		g.Expect(f.Client.List(ctx, &nodes, client.MatchingLabels{key: value})).To(Succeed())
		g.Expect(nodes.Items).NotTo(BeEmpty(), "no node labelled %s=%s: %s", key, value, why)
		node = nodes.Items[0]
	}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	return node
}

var _ = Describe("Driver from a driver image", Label("DriverImages"), func() {
	f := NewFramework()

	It("a device driver (examples/sim-device) is copied into the handler's plugin directory and loaded beside hostdev, its resource appears on the Node with hostdev's, and a VMI of the simulated class asking for it gets one allocated, named in the domain spec its hypervisor driver receives", Label("Device"), func(ctx SpecContext) {
		By("the init container driver-sim installed the image's binary with its manifest's digest")
		for _, pod := range f.handlerPods(ctx) {
			log := f.initContainerLog(ctx, pod, "driver-sim")
			Expect(log).To(ContainSubstring(`installed device driver "sim": /etc/kubevisor/plugins/sim/sim-device (sha256 `), "pod %s", pod.Name)
			Expect(log).NotTo(ContainSubstring("ERROR"), "pod %s", pod.Name)
		}
		By("the handler loaded it beside hostdev: both device drivers' health and fingerprints are node labels")
		node := f.nodeWithLabel(ctx, v1alpha1.DriverHealthLabel("device", "sim"), v1alpha1.DriverHealthy,
			"the handler did not load the device driver sim (kubectl -n kubevisor-system logs ds/kubevisor-handler -c handler)")
		Expect(node.Labels).To(HaveKeyWithValue(v1alpha1.CapabilityLabelPrefix+"sim.example-sim", "true"))
		Expect(node.Labels).To(HaveKeyWithValue(v1alpha1.DriverHealthLabel("device", "hostdev"), v1alpha1.DriverHealthy),
			"the node's other device driver, hostdev, is not loaded beside sim")
		f.nodeWithLabel(ctx, v1alpha1.DriverHealthLabel("hypervisor", simClass), v1alpha1.DriverHealthy,
			"the handler did not load the fake hypervisor driver (DRIVERS=...,fake)")

		By("the kubelet device plugins serve what both drivers list: " + string(simResource) + " and hostdev's kvm and tun on the Node")
		Eventually(func(g Gomega) {
			var n corev1.Node
			g.Expect(f.Client.Get(ctx, client.ObjectKeyFromObject(&node), &n)).To(Succeed())
			q, ok := n.Status.Allocatable[simResource]
			g.Expect(ok).To(BeTrue(), "node %s allocatable has no %s: %v", n.Name, simResource, n.Status.Allocatable)
			g.Expect(q.Value()).To(BeEquivalentTo(simDevices), "node %s: %s", n.Name, simResource)
			for _, r := range []string{v1alpha1.KVMDeviceResource, v1alpha1.TunDeviceResource} {
				q, ok := n.Status.Allocatable[corev1.ResourceName(r)]
				g.Expect(ok).To(BeTrue(), "node %s allocatable has no %s (hostdev's) beside %s: %v", n.Name, r, simResource, n.Status.Allocatable)
				g.Expect(q.IsZero()).To(BeFalse(), "node %s: %s", n.Name, r)
			}
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())

		By("a VMI of the simulated class asking for one in hostDevices gets one allocated: by the kubelet's device plugin and in the handler's pipeline")
		spec := guestSpecOf(guest.Options{UserData: "sim", HypervisorClass: simClass})
		spec.Domain.Devices.HostDevices = []v1alpha1.HostDevice{{Name: "sim", DeviceName: string(simResource)}}
		b, err := yaml.Marshal(spec)
		Expect(err).NotTo(HaveOccurred())
		since := time.Now().UTC().Truncate(time.Second).Format(time.RFC3339) // the logs of this VMI's allocation only
		f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: simvm\nspec:\n"+indent(string(b), 2))
		vmi := f.WaitRunning(ctx, "simvm")
		Expect(vmi.Status.HypervisorDriver).To(Equal(simClass))
		pods := f.LauncherPods(ctx, vmi.UID)
		Expect(pods).To(HaveLen(1))
		var compute *corev1.Container
		for i, c := range pods[0].Spec.Containers {
			if c.Name == "compute" {
				compute = &pods[0].Spec.Containers[i]
			}
		}
		Expect(compute).NotTo(BeNil(), "launcher pod %s has no compute container", pods[0].Name)
		Expect(compute.Resources.Limits).To(HaveKeyWithValue(simResource, resource.MustParse("1")))
		// The handler pod of the VMI's node (with two nodes, the other one allocated nothing).
		for _, pod := range []corev1.Pod{f.handlerPodOn(ctx, vmi.Status.NodeName)} {
			for _, c := range []string{"deviceplugins", "handler"} {
				out, err := f.Kubectl(ctx, "", "-n", "kubevisor-system", "logs", pod.Name, "-c", c, "--since-time="+since)
				Expect(err).NotTo(HaveOccurred(), out)
				Expect(out).To(MatchRegexp(`allocated.*devices"?[=:]"?sim-[0-9]`), "container %s of %s: the sim driver's Allocate of a device", c, pod.Name)
			}
		}

		By("the domain spec the hypervisor driver received names the device: the simulated guest's boot log on its console (vmctl console)")
		out := f.OpenConsole(ctx, "simvm").WaitFor(ctx, "kubevisor-fake login:", time.Minute)
		Expect(out).To(MatchRegexp(`hostdev sim resource=example-sim id=sim-[0-9]\r?\n`),
			"the fake hypervisor's boot log does not name the sim device")

		By("a VMI of the qmp class asking for the same device is refused by the qmp driver, naming the host device and why")
		spec = guestSpecOf(guest.Options{UserData: "simqmp", HypervisorClass: "qmp"})
		spec.Domain.Devices.HostDevices = []v1alpha1.HostDevice{{Name: "sim", DeviceName: string(simResource)}}
		b, err = yaml.Marshal(spec)
		Expect(err).NotTo(HaveOccurred())
		f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: simqmp\nspec:\n"+indent(string(b), 2))
		Eventually(func() string {
			vmi := f.VMI(ctx, "simqmp")
			var msgs []string
			for _, c := range vmi.Status.Conditions {
				msgs = append(msgs, c.Message)
			}
			return vmi.Status.Reason + " " + strings.Join(msgs, " ")
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(
			And(ContainSubstring(`hostDevices[0]: "sim" (resource "example-sim" of device driver "sim"`), ContainSubstring("has no PCI address")))
		Expect(f.VMI(ctx, "simvm").Status.Phase).To(Equal(v1alpha1.Running), "the simulated VMI after the refused one")
	})

	It("a storage driver (examples/hostpath-storage) serves a VMI's disks: the guest boots from its hostDisk and sees its emptyDisk", Label("Storage"), func(ctx SpecContext) {
		disk := os.Getenv(envHostPathDisk)
		Expect(disk).NotTo(BeEmpty(), "$%s must name the test guest's raw disk on the node, under /var/lib/kubevisor (hack/e2e-driver-images.sh)", envHostPathDisk)
		for _, pod := range f.handlerPods(ctx) {
			Expect(f.initContainerLog(ctx, pod, "driver-hostpath")).To(ContainSubstring(`installed storage driver "hostpath"`), "pod %s", pod.Name)
		}
		f.nodeWithLabel(ctx, v1alpha1.DriverHealthLabel("storage", "hostpath"), v1alpha1.DriverHealthy,
			"the handler did not load the storage driver hostpath (kubectl -n kubevisor-system logs ds/kubevisor-handler -c handler)")

		const scratch = 48 << 20
		spec := guestSpecOf(guest.Options{UserData: "hostpath"})
		spec.Domain.Devices.Disks = []v1alpha1.Disk{
			{Name: "boot", DiskDevice: v1alpha1.DiskDevice{Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}},
			{Name: "scratch", DiskDevice: v1alpha1.DiskDevice{Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}},
		}
		spec.Volumes = []v1alpha1.Volume{
			{Name: "boot", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: disk, Type: v1alpha1.HostDiskExists}}},
			{Name: "scratch", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: *resource.NewQuantity(scratch, resource.BinarySI)}}},
		}
		b, err := yaml.Marshal(spec)
		Expect(err).NotTo(HaveOccurred())
		f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: hostpath\nspec:\n"+indent(string(b), 2))
		vmi := f.WaitRunning(ctx, "hostpath")
		var console string
		Eventually(func() string { console = f.Console(ctx, vmi); return console }).WithContext(ctx).WithTimeout(Cfg.BootTimeout).
			WithPolling(2*time.Second).Should(ContainSubstring(ReadyMarker), "the guest did not boot from the hostpath driver's hostDisk %s", disk)
		disks := consoleField(console, "KUBEVISOR-DISKS:")
		Expect(strings.Fields(disks)).To(ContainElement(HaveSuffix(fmt.Sprintf("=%d", scratch))),
			"the guest sees no %d-byte disk (the emptyDisk the hostpath driver made): KUBEVISOR-DISKS: %s", scratch, disks)
	})

	It("a storage driver image whose manifest's sha256 is wrong is refused by name, and the node's other drivers are loaded and serve", Label("BadChecksum"), func(ctx SpecContext) {
		By("the installer copied it and said the digest differs")
		for _, pod := range f.handlerPods(ctx) {
			log := f.initContainerLog(ctx, pod, "driver-hostpath")
			Expect(log).To(ContainSubstring(`ERROR: driver "hostpath": binary /etc/kubevisor/plugins/hostpath/hostpath-storage has sha256 `), "pod %s", pod.Name)
			By("the handler refused to run it, naming it and the mismatch")
			Eventually(func(g Gomega) {
				out, err := f.Kubectl(ctx, "", "-n", "kubevisor-system", "logs", pod.Name, "-c", "handler")
				g.Expect(err).NotTo(HaveOccurred(), out)
				g.Expect(out).To(And(ContainSubstring(`storage driver \"hostpath\" did not start`), ContainSubstring("sha256 mismatch: manifest says")),
					"handler log of %s", pod.Name)
			}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(Succeed())
		}
		node := f.nodeWithLabel(ctx, v1alpha1.DriverHealthLabel("storage", "hostpath"), v1alpha1.DriverUnhealthy, "the refused driver is reported unhealthy")
		By("the other drivers are loaded: healthy, and the device driver's resources are on the Node")
		Eventually(func(g Gomega) {
			var n corev1.Node
			g.Expect(f.Client.Get(ctx, client.ObjectKeyFromObject(&node), &n)).To(Succeed())
			g.Expect(n.Labels).To(HaveKeyWithValue(v1alpha1.DriverHealthLabel("network", "cni"), v1alpha1.DriverHealthy))
			g.Expect(n.Labels).To(HaveKeyWithValue(v1alpha1.DriverHealthLabel("device", "hostdev"), v1alpha1.DriverHealthy))
			// Degraded: QEMU runs, KVM is not usable (TCG).
			g.Expect(n.Labels).To(HaveKeyWithValue(v1alpha1.DriverHealthLabel("hypervisor", "qmp"), BeElementOf(v1alpha1.DriverHealthy, v1alpha1.DriverDegraded)))
			g.Expect(n.Status.Allocatable).To(HaveKey(corev1.ResourceName(v1alpha1.KVMDeviceResource)))
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())

		By("a VMI fails with the reason, naming the storage driver")
		f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: nostorage\nspec:\n"+indent(guestSpec("nostorage"), 2))
		Eventually(func() string {
			vmi := f.VMI(ctx, "nostorage")
			var msgs []string
			for _, c := range vmi.Status.Conditions {
				msgs = append(msgs, c.Message)
			}
			return vmi.Status.Reason + " " + strings.Join(msgs, " ")
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(ContainSubstring(`storage driver "hostpath" did not start`))
	})
})
