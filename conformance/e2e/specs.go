package e2e

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	gomegatypes "github.com/onsi/gomega/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
)

// guestSpecOf is the test guest's VMI spec (conformance/e2e/guest) of o, with the suite's
// guest image and HypervisorClass (Cfg) where o names none.
func guestSpecOf(o guest.Options) v1alpha1.VirtualMachineInstanceSpec {
	if o.Image == "" {
		o.Image = Cfg.GuestImage
	}
	if o.HypervisorClass == "" {
		o.HypervisorClass = Cfg.HypervisorClass
	}
	return guest.Spec(o)
}

// guestSpec is the YAML of the test guest's VMI spec (guestSpecOf) at column 0, with userData
// in its cloud-init user-data.
func guestSpec(userData string) string {
	b, err := yaml.Marshal(guestSpecOf(guest.Options{UserData: userData}))
	if err != nil {
		panic(err) // an API struct always marshals
	}
	return string(b)
}

// indent puts n spaces before every line of s.
func indent(s string, n int) string {
	pad := strings.Repeat(" ", n)
	return pad + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n"+pad) + "\n"
}

// consoleField is the rest of the last console line that starts with marker, trimmed; "" when
// there is none.
func consoleField(console, marker string) string {
	out := ""
	for _, l := range strings.Split(console, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), marker); ok {
			out = strings.TrimSpace(rest)
		}
	}
	return out
}

// template is a VMI template labelled app=label with the test guest's spec, at column 0.
func template(label, userData string) string {
	return "template:\n  metadata:\n    labels:\n      app: " + label + "\n  spec:\n" + indent(guestSpec(userData), 4)
}

// vmManifest is a VM of the test guest.
func vmManifest(name, runStrategy, userData string) string {
	return "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachine\nmetadata:\n  name: " + name +
		"\nspec:\n  runStrategy: " + runStrategy + "\n" + indent(template(name, userData), 2)
}

var _ = Describe("VirtualMachine", Label("Conformance", "PodSecurity"), func() {
	// In a namespace that enforces Pod Security's restricted level: the launcher pod passes it.
	f := NewFramework(EnforcePodSecurity("restricted"))

	It("runs from kubectl apply in a namespace enforcing Pod Security restricted, answers HTTP from another pod, stops, starts and is deleted cleanly", func(ctx SpecContext) {
		const name = "guest"
		marker := "e2e-user-data-" + string(types.UID(f.Namespace))
		By("kubectl apply of a VM with runStrategy Always")
		f.Apply(ctx, vmManifest(name, "Always", marker))

		By("the VMI runs on a node, with an IP in its status")
		vmi := f.WaitRunning(ctx, name)
		Expect(vmi.Status.NodeName).NotTo(BeEmpty())

		By("its launcher pod runs as 107, not root, which the namespace's restricted level admitted")
		pods := f.LauncherPods(ctx, vmi.UID)
		Expect(pods).To(HaveLen(1))
		sc := pods[0].Spec.SecurityContext
		Expect(sc).NotTo(BeNil())
		Expect(sc.RunAsNonRoot).To(HaveValue(BeTrue()))
		Expect(sc.RunAsUser).To(HaveValue(BeEquivalentTo(107)))
		for _, v := range pods[0].Spec.Volumes {
			Expect(v.HostPath).To(BeNil(), "volume %s of the launcher pod", v.Name)
		}

		By("a VMI with a hostDisk, whose launcher pod needs a hostPath, is refused there, saying why")
		out, err := f.Kubectl(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: hostdisk\nspec:\n"+
			indent("domain:\n  memory:\n    guest: 64Mi\n  devices:\n    disks:\n    - name: host\n      disk: {bus: virtio}\n"+
				"volumes:\n- name: host\n  hostDisk:\n    path: /var/lib/kubevisor-e2e/disk.img\n    type: DiskOrCreate\n    capacity: 64Mi\n", 2),
			"apply", "-f", "-")
		Expect(err).To(HaveOccurred(), out)
		Expect(err.Error()).To(And(ContainSubstring("restricted"), ContainSubstring("hostPath")))
		Expect(GuestIP(vmi)).NotTo(BeEmpty(), "interfaces: %+v", vmi.Status.Interfaces)
		Eventually(func(g Gomega) {
			g.Expect(f.VM(ctx, name).Status.Ready).To(BeTrue())
		}).WithContext(ctx).WithTimeout(time.Minute).Should(Succeed())

		By("the serial console shows the guest's cloud-init user-data and its ready marker")
		Eventually(func() string { return f.Console(ctx, vmi) }).WithContext(ctx).
			WithTimeout(Cfg.BootTimeout).WithPolling(2 * time.Second).
			Should(And(ContainSubstring(marker), ContainSubstring(ReadyMarker)))

		By("HTTP to the guest from another pod")
		Expect(f.HTTPFromPod(ctx, "http://"+GuestIP(vmi)+"/")).To(ContainSubstring(guest.WebAnswer))

		By("runStrategy Halted: the VMI goes, the VM is stopped")
		_, err = f.Kubectl(ctx, "", "patch", "vm", name, "--type=merge", "-p", `{"spec":{"runStrategy":"Halted"}}`)
		Expect(err).NotTo(HaveOccurred())
		f.WaitGone(ctx, name)
		Eventually(func() v1alpha1.VirtualMachinePrintableStatus {
			return f.VM(ctx, name).Status.PrintableStatus
		}).WithContext(ctx).WithTimeout(time.Minute).Should(Equal(v1alpha1.VirtualMachineStatusStopped))
		Eventually(func() []corev1.Pod { return f.LauncherPods(ctx, vmi.UID) }).
			WithContext(ctx).WithTimeout(2 * time.Minute).Should(BeEmpty())

		By("runStrategy Always again: a new VMI runs")
		_, err = f.Kubectl(ctx, "", "patch", "vm", name, "--type=merge", "-p", `{"spec":{"runStrategy":"Always"}}`)
		Expect(err).NotTo(HaveOccurred())
		again := f.WaitRunning(ctx, name)
		Expect(again.UID).NotTo(Equal(vmi.UID))

		By("kubectl delete vm: VMI and launcher pod go")
		_, err = f.Kubectl(ctx, "", "delete", "vm", name, "--wait=true", "--timeout=3m")
		Expect(err).NotTo(HaveOccurred())
		f.WaitGone(ctx, name)
		Eventually(func() []corev1.Pod { return f.LauncherPods(ctx, again.UID) }).
			WithContext(ctx).WithTimeout(2 * time.Minute).Should(BeEmpty())
	})
})

// vmOf is a VM manifest (runStrategy Always) with spec as its VMI template's spec.
func vmOf(name string, spec v1alpha1.VirtualMachineInstanceSpec) string {
	b, err := yaml.Marshal(spec)
	Expect(err).NotTo(HaveOccurred())
	return "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachine\nmetadata:\n  name: " + name +
		"\nspec:\n  runStrategy: Always\n  template:\n    spec:\n" + indent(string(b), 6)
}

// kubectlGetStatus is the STATUS column of `kubectl get vm name`, as a KubeVirt user reads it;
// the columns must be KubeVirt's (NAME AGE STATUS READY).
func (f *Framework) kubectlGetStatus(ctx context.Context, name string) string {
	GinkgoHelper()
	out, err := f.Kubectl(ctx, "", "get", "vm", name)
	Expect(err).NotTo(HaveOccurred())
	lines := strings.Split(strings.TrimSpace(out), "\n")
	Expect(lines).To(HaveLen(2), "kubectl get vm %s:\n%s", name, out)
	Expect(strings.Fields(lines[0])).To(Equal([]string{"NAME", "AGE", "STATUS", "READY"}), "kubectl get vm %s:\n%s", name, out)
	row := strings.Fields(lines[1])
	Expect(row).To(HaveLen(4), "kubectl get vm %s:\n%s", name, out)
	return row[2]
}

var _ = Describe("VirtualMachine status", Label("Conformance"), func() {
	f := NewFramework()

	It("says ErrImagePull within 30 s when its containerDisk image cannot be pulled, and its VMI's Ready names the image", func(ctx SpecContext) {
		const image = "registry.invalid/kubevisor/no-such-disk:v1"
		spec := guestSpecOf(guest.Options{UserData: "never"})
		found := false
		for i := range spec.Volumes {
			if cd := spec.Volumes[i].ContainerDisk; cd != nil {
				cd.Image, found = image, true
			}
		}
		Expect(found).To(BeTrue(), "the test guest has no containerDisk volume")
		f.Apply(ctx, vmOf("nopull", spec))
		Eventually(func(g Gomega) {
			vmi := f.VMI(ctx, "nopull")
			g.Expect(vmi).NotTo(BeNil())
			c := v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
			g.Expect(c).NotTo(BeNil(), "no Ready condition: %+v", vmi.Status.Conditions)
			g.Expect(c.Status).To(Equal(corev1.ConditionFalse))
			g.Expect(c.Reason).To(BeElementOf(v1alpha1.ReasonErrImagePull, v1alpha1.ReasonImagePullBackOff), "Ready: %+v", c)
			g.Expect(c.Message).To(ContainSubstring(image))
			g.Expect(f.VM(ctx, "nopull").Status.PrintableStatus).To(BeElementOf(
				v1alpha1.VirtualMachineStatusErrImagePull, v1alpha1.VirtualMachineStatusImagePullBackOff))
		}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Succeed())
		Expect(f.kubectlGetStatus(ctx, "nopull")).To(BeElementOf("ErrImagePull", "ImagePullBackOff"))
		Expect(f.VMI(ctx, "nopull").Status.Phase).To(Equal(v1alpha1.Scheduling))
	})

	It("says ErrorPvcNotFound naming the claim while a claim does not exist, with no launcher pod, then waits for the claim to bind", func(ctx SpecContext) {
		const claim = "e2e-data"
		spec := guestSpecOf(guest.Options{UserData: "never"})
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "data"})
		spec.Volumes = append(spec.Volumes, v1alpha1.Volume{Name: "data", VolumeSource: v1alpha1.VolumeSource{
			PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
				PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}})
		f.Apply(ctx, vmOf("noclaim", spec))
		var vmi *v1alpha1.VirtualMachineInstance
		Eventually(func(g Gomega) {
			vmi = f.VMI(ctx, "noclaim")
			g.Expect(vmi).NotTo(BeNil())
			c := v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceLauncherPodCreated)
			g.Expect(c).NotTo(BeNil(), "no LauncherPodCreated condition: %+v", vmi.Status.Conditions)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonFailedPvcNotFound), "LauncherPodCreated: %+v", c)
			g.Expect(c.Message).To(ContainSubstring(f.Namespace + "/" + claim + " (volume data) does not exist"))
			g.Expect(f.VM(ctx, "noclaim").Status.PrintableStatus).To(Equal(v1alpha1.VirtualMachineStatusPvcNotFound))
		}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Succeed())
		Expect(f.kubectlGetStatus(ctx, "noclaim")).To(Equal("ErrorPvcNotFound"))
		Expect(f.LauncherPods(ctx, vmi.UID)).To(BeEmpty())

		By("the claim, which no storage class binds: the launcher pod is created and the VMI says it waits for the claim")
		f.Apply(ctx, `apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: `+claim+`
spec:
  storageClassName: kubevisor-e2e-none
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
`)
		Eventually(func(g Gomega) {
			vmi := f.VMI(ctx, "noclaim")
			c := v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
			g.Expect(c).NotTo(BeNil(), "no Ready condition: %+v", vmi.Status.Conditions)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonWaitingForVolumeBinding), "Ready: %+v", c)
			g.Expect(c.Message).To(ContainSubstring(f.Namespace + "/" + claim + " (volume data) is not bound"))
			g.Expect(f.LauncherPods(ctx, vmi.UID)).To(HaveLen(1))
			// KubeVirt's order: the scheduler's refusal of a pod with an unbound claim comes first.
			g.Expect(f.VM(ctx, "noclaim").Status.PrintableStatus).To(BeElementOf(
				v1alpha1.VirtualMachineStatusWaitingForVolumeBinding, v1alpha1.VirtualMachineStatusUnschedulable))
		}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Succeed())
	})
})

var _ = Describe("VirtualMachineInstanceReplicaSet", Label("Conformance"), func() {
	f := NewFramework()

	It("runs 3 replicas and scales to 1", func(ctx SpecContext) {
		f.Apply(ctx, `apiVersion: kubevisor.io/v1alpha1
kind: VirtualMachineInstanceReplicaSet
metadata:
  name: web
spec:
  replicas: 3
  selector:
    matchLabels:
      app: web
`+indent(template("web", "replica"), 2))
		running := func() int {
			var list v1alpha1.VirtualMachineInstanceList
			Expect(f.Client.List(ctx, &list, client.InNamespace(f.Namespace))).To(Succeed())
			n := 0
			for _, v := range list.Items {
				if v.Status.Phase == v1alpha1.Running && v.DeletionTimestamp == nil {
					n++
				}
			}
			return n
		}
		Eventually(running).WithContext(ctx).WithTimeout(Cfg.BootTimeout).WithPolling(2 * time.Second).Should(Equal(3))
		_, err := f.Kubectl(ctx, "", "scale", "vmirs", "web", "--replicas=1")
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() int {
			var list v1alpha1.VirtualMachineInstanceList
			Expect(f.Client.List(ctx, &list, client.InNamespace(f.Namespace))).To(Succeed())
			return len(list.Items)
		}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(2 * time.Second).Should(Equal(1))
		Expect(running()).To(Equal(1))
	})
})

var _ = Describe("HypervisorClass scheduling", Label("Conformance"), func() {
	f := NewFramework()

	It("leaves a VMI whose class no node offers Pending with a condition saying why", func(ctx SpecContext) {
		class := &v1alpha1.HypervisorClass{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "nowhere-"},
			Driver:     "no-such-driver",
		}
		Expect(f.Client.Create(ctx, class)).To(Succeed())
		DeferCleanup(func(ctx context.Context) { _ = f.Client.Delete(ctx, class) })
		b, err := yaml.Marshal(guestSpecOf(guest.Options{UserData: "never", HypervisorClass: class.Name}))
		Expect(err).NotTo(HaveOccurred())
		f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: nowhere\nspec:\n"+indent(string(b), 2))
		Eventually(func(g Gomega) {
			vmi := f.VMI(ctx, "nowhere")
			g.Expect(vmi).NotTo(BeNil())
			g.Expect(vmi.Status.Phase).To(BeElementOf(v1alpha1.Pending, v1alpha1.Scheduling))
			var found bool
			for _, c := range vmi.Status.Conditions {
				if c.Status == corev1.ConditionFalse && c.Reason == v1alpha1.ReasonUnschedulable {
					found = strings.Contains(c.Message, "node")
				}
			}
			g.Expect(found).To(BeTrue(), "no Unschedulable condition naming nodes: %+v", vmi.Status.Conditions)
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
		Consistently(func() v1alpha1.VirtualMachineInstancePhase { return f.VMI(ctx, "nowhere").Status.Phase }).
			WithContext(ctx).WithTimeout(5 * time.Second).ShouldNot(Equal(v1alpha1.Running))
	})
})

var _ = Describe("VirtualMachineInstance start", Label("Conformance"), func() {
	f := NewFramework()

	It("gives the guest what KubeVirt's device and platform fields ask for (rng, chassis, features, clock, inputs, watchdog, balloon, sound, an interface's PCI address and link state, multi-queue interfaces, transitional virtio, a TPM from swtpm in the launcher pod); without them, none", func(ctx SpecContext) {
		tz := v1alpha1.ClockOffsetTimezone("Asia/Kolkata") // +05:30 all year
		for _, c := range []struct {
			name string
			edit func(*v1alpha1.VirtualMachineInstanceSpec)
		}{{"rng", func(s *v1alpha1.VirtualMachineInstanceSpec) {
			d := &s.Domain
			d.Devices.Rng = &v1alpha1.Rng{}
			d.Chassis = &v1alpha1.Chassis{Manufacturer: "Kubevisor e2e", Serial: "e2e-chassis-1", Asset: "asset-e2e"}
			d.Features = &v1alpha1.Features{ACPI: v1alpha1.FeatureState{}, SMM: &v1alpha1.FeatureState{Enabled: ptr.To(true)}}
			d.Clock = &v1alpha1.Clock{ClockOffset: v1alpha1.ClockOffset{Timezone: &tz}, Timer: &v1alpha1.Timer{HPET: &v1alpha1.HPETTimer{Enabled: ptr.To(false)}}}
			d.Devices.Inputs = []v1alpha1.Input{{Name: "tablet", Type: v1alpha1.InputTypeTablet, Bus: v1alpha1.InputBusVirtio}, {Name: "usb", Type: v1alpha1.InputTypeTablet}}
			d.Devices.Watchdog = &v1alpha1.Watchdog{Name: "wd", I6300ESB: &v1alpha1.I6300ESBWatchdog{Action: v1alpha1.WatchdogActionPoweroff}}
			d.Devices.Interfaces[0].PciAddress = "0000:00:10.0"
			d.Devices.Sound = &v1alpha1.SoundDevice{Name: "audio"}
			d.Devices.TPM = &v1alpha1.TPMDevice{}
			d.Devices.NetworkInterfaceMultiQueue = ptr.To(true)
			d.CPU = &v1alpha1.CPU{Cores: 2}
		}}, {"norng", func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.Devices.AutoattachMemBalloon = ptr.To(false)
			s.Domain.Devices.UseVirtioTransitional = ptr.To(true)
			s.Domain.Devices.Interfaces[0].State = v1alpha1.InterfaceStateDown
			s.Domain.Devices.TPM = &v1alpha1.TPMDevice{Enabled: ptr.To(false)}
		}}} {
			spec := guestSpecOf(guest.Options{UserData: c.name})
			c.edit(&spec)
			b, err := yaml.Marshal(spec)
			Expect(err).NotTo(HaveOccurred())
			f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: "+c.name+"\nspec:\n"+indent(string(b), 2))
		}
		// PCI IDs: 8086:25ab i6300esb, 1af4:1052 virtio input, 1af4:1045 virtio balloon (modern
		// only, as every virtio device without useVirtioTransitional), 1af4:1041 a modern virtio
		// NIC and 1af4:1000 a transitional one, 1b36:000d the USB controller of the usb
		// tablet, 8086:293e the ich9 sound card.
		for name, want := range map[string][]string{
			"rng": {"KUBEVISOR-RNG: virtio_rng", "KUBEVISOR-DMI: chassis_vendor=Kubevisor e2e", "KUBEVISOR-DMI: chassis_serial=e2e-chassis-1",
				"KUBEVISOR-DMI: chassis_asset_tag=asset-e2e", "KUBEVISOR-INPUT: QEMU Virtio Tablet", "KUBEVISOR-ACPI: on",
				"KUBEVISOR-NIC: eth0 pci=0000:00:10.0 acpi_index=none carrier=1 queues=2", "KUBEVISOR-TPM: tpm0 version=2 driver=tpm_crb pcr0="},
			"norng": {"KUBEVISOR-RNG: none", "KUBEVISOR-ACPI: on", "carrier=0", "KUBEVISOR-TPM: none"},
		} {
			vmi := f.WaitRunning(ctx, name)
			matchers := []gomegatypes.GomegaMatcher{ContainSubstring(ReadyMarker)}
			for _, w := range want {
				matchers = append(matchers, ContainSubstring(w))
			}
			var console string
			Eventually(func() string { console = f.Console(ctx, vmi); return console }).WithContext(ctx).
				WithTimeout(Cfg.BootTimeout).WithPolling(2*time.Second).
				Should(And(matchers...), "VMI %s", name)
			now := time.Now()
			pci := " " + consoleField(console, "KUBEVISOR-PCI:") + " "
			clock := consoleField(console, "KUBEVISOR-CLOCK:")
			var rtc int64
			_, err := fmt.Sscanf(clock, "rtc=%d", &rtc)
			Expect(err).NotTo(HaveOccurred(), "VMI %s: clock line %q", name, clock)
			ahead := time.Unix(rtc, 0).Sub(now)
			if name == "rng" {
				Expect(pci).To(And(ContainSubstring(" 8086:25ab "), ContainSubstring(" 1af4:1052 "), ContainSubstring(" 1af4:1045 "), ContainSubstring(" 1b36:000d "),
					ContainSubstring(" 8086:293e "), ContainSubstring(" 1af4:1041 ")), "VMI rng: PCI devices")
				Expect(pci).NotTo(Or(ContainSubstring(" 1af4:1000 "), ContainSubstring(" 1af4:1001 "), ContainSubstring(" 1af4:1002 "), ContainSubstring(" 1af4:1005 ")),
					"VMI rng: no transitional virtio device")
				Expect(clock).NotTo(ContainSubstring("hpet"), "VMI rng: the HPET is off")
				Expect(ahead).To(BeNumerically("~", 5*time.Hour+30*time.Minute, 2*time.Minute), "VMI rng: the clock starts in Asia/Kolkata")
			} else {
				Expect(pci).NotTo(Or(ContainSubstring(" 8086:25ab "), ContainSubstring(" 1af4:1052 "), ContainSubstring(" 1af4:1002 "), ContainSubstring(" 1af4:1045 "),
					ContainSubstring(" 1af4:1041 ")), "VMI norng: PCI devices")
				Expect(pci).To(ContainSubstring(" 1af4:1000 "), "VMI norng: a transitional virtio NIC (useVirtioTransitional)")
				Expect(clock).To(ContainSubstring("hpet"), "VMI norng: the HPET is there by default")
				Expect(ahead).To(BeNumerically("~", 0, 2*time.Minute), "VMI norng: the clock starts at UTC")
			}
		}
	})

	It("with logSerialConsole false runs without a guest-console-log container, and vmctl console still reaches the guest", func(ctx SpecContext) {
		spec := guestSpecOf(guest.Options{UserData: "no console log"})
		spec.Domain.Devices.LogSerialConsole = ptr.To(false)
		b, err := yaml.Marshal(spec)
		Expect(err).NotTo(HaveOccurred())
		f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: nolog\nspec:\n"+indent(string(b), 2))
		vmi := f.WaitRunning(ctx, "nolog")
		pods := f.LauncherPods(ctx, vmi.UID)
		Expect(pods).To(HaveLen(1))
		var names []string
		for _, c := range pods[0].Spec.Containers {
			names = append(names, c.Name)
		}
		Expect(names).NotTo(ContainElement(layout.ConsoleLogContainer))
		Expect(names).To(ContainElement(layout.ComputeContainer))
		c := f.OpenConsole(ctx, "nolog")
		c.WaitFor(ctx, ReadyMarker, Cfg.BootTimeout)
	})
})

var _ = Describe("VirtualMachineInstance probes", Label("Conformance", "Probes"), func() {
	f := NewFramework()

	It("is Ready only while its readinessProbe succeeds, and ends Failed naming its livenessProbe when that fails", func(ctx SpecContext) {
		// 1234 is forwarded to the guest (masquerade lists its ports) but nothing listens there.
		const closed = 1234
		tcp := func(port int) v1alpha1.ProbeHandler {
			return v1alpha1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(port)}}
		}
		for _, c := range []struct {
			name string
			edit func(*v1alpha1.VirtualMachineInstanceSpec)
		}{{"ready", func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.ReadinessProbe = &v1alpha1.Probe{
				ProbeHandler:  v1alpha1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt(80)}},
				PeriodSeconds: 2, FailureThreshold: 2,
			}
		}}, {"unready", func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.ReadinessProbe = &v1alpha1.Probe{ProbeHandler: tcp(closed), PeriodSeconds: 2, FailureThreshold: 2}
		}}, {"unlive", func(s *v1alpha1.VirtualMachineInstanceSpec) {
			// The delay lets the guest start first; the short grace period ends the stopped
			// compute container soon after.
			s.LivenessProbe = &v1alpha1.Probe{ProbeHandler: tcp(closed), InitialDelaySeconds: 10, PeriodSeconds: 2, FailureThreshold: 2}
			s.TerminationGracePeriodSeconds = ptr.To[int64](2)
		}}} {
			spec := guestSpecOf(guest.Options{UserData: c.name})
			spec.Domain.Devices.Interfaces[0].Ports = append(spec.Domain.Devices.Interfaces[0].Ports, v1alpha1.Port{Port: closed})
			c.edit(&spec)
			b, err := yaml.Marshal(spec)
			Expect(err).NotTo(HaveOccurred())
			f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: "+c.name+"\nspec:\n"+indent(string(b), 2))
		}
		ready := func(name string) *v1alpha1.VirtualMachineInstanceCondition {
			vmi := f.VMI(ctx, name)
			if vmi == nil {
				return nil
			}
			return v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
		}

		By("an httpGet readinessProbe on the guest's web server: Ready")
		f.WaitRunning(ctx, "ready")
		Eventually(func(g Gomega) {
			c := ready("ready")
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(corev1.ConditionTrue), "Ready: %+v", c)
		}).WithContext(ctx).WithTimeout(Cfg.BootTimeout).WithPolling(time.Second).Should(Succeed())

		By("a readinessProbe on a closed port: Running, and Ready=False naming the probe")
		f.WaitRunning(ctx, "unready")
		notReady := func(g Gomega) {
			c := ready("unready")
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(corev1.ConditionFalse), "Ready: %+v", c)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonReadinessProbeFailed), "Ready: %+v", c)
			g.Expect(c.Message).To(ContainSubstring(fmt.Sprintf("readiness probe (tcpSocket port %d)", closed)), "Ready: %+v", c)
		}
		Eventually(notReady).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
		Consistently(notReady).WithContext(ctx).WithTimeout(10 * time.Second).WithPolling(2 * time.Second).Should(Succeed())
		Expect(f.VMI(ctx, "unready").Status.Phase).To(Equal(v1alpha1.Running))

		By("a livenessProbe on a closed port: Failed, naming the probe")
		Eventually(func(g Gomega) {
			vmi := f.VMI(ctx, "unlive")
			g.Expect(vmi).NotTo(BeNil())
			g.Expect(vmi.Status.Phase).To(Equal(v1alpha1.Failed), "status: %+v", vmi.Status)
			g.Expect(vmi.Status.Reason).To(Equal(v1alpha1.ReasonLivenessProbeFailed), "status: %+v", vmi.Status)
			c := v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Message).To(ContainSubstring(fmt.Sprintf("liveness probe (tcpSocket port %d) failed", closed)), "Ready: %+v", c)
		}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	})

	It("runs exec and guestAgentPing probes in the guest through its agent: Ready with both, Failed naming an exec liveness probe whose command exits 7", func(ctx SpecContext) {
		for _, c := range []struct {
			name string
			edit func(*v1alpha1.VirtualMachineInstanceSpec)
		}{{"agent-ready", func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.ReadinessProbe = &v1alpha1.Probe{
				ProbeHandler:  v1alpha1.ProbeHandler{GuestAgentPing: &v1alpha1.GuestAgentPing{}},
				PeriodSeconds: 2, TimeoutSeconds: 5, FailureThreshold: 2,
			}
			s.LivenessProbe = &v1alpha1.Probe{
				ProbeHandler:        v1alpha1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/proc/uptime"}}},
				InitialDelaySeconds: 10, PeriodSeconds: 5, TimeoutSeconds: 5, FailureThreshold: 3,
			}
		}}, {"agent-unlive", func(s *v1alpha1.VirtualMachineInstanceSpec) {
			// The delay lets the guest and its agent start first: a probe that fails only
			// because the agent is not up yet would fail the VMI for the wrong reason.
			s.LivenessProbe = &v1alpha1.Probe{
				ProbeHandler:        v1alpha1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "exit 7"}}},
				InitialDelaySeconds: 30, PeriodSeconds: 2, TimeoutSeconds: 5, FailureThreshold: 2,
			}
			s.TerminationGracePeriodSeconds = ptr.To[int64](2)
		}}} {
			spec := guestSpecOf(guest.Options{UserData: c.name})
			c.edit(&spec)
			b, err := yaml.Marshal(spec)
			Expect(err).NotTo(HaveOccurred())
			f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: "+c.name+"\nspec:\n"+indent(string(b), 2))
		}

		By("guestAgentPing readiness and an exec liveness probe that succeeds: Ready, and still Running after several liveness periods")
		vmi := f.WaitRunning(ctx, "agent-ready")
		Eventually(func(g Gomega) {
			c := v1alpha1.InstanceCondition(f.VMI(ctx, "agent-ready").Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(corev1.ConditionTrue), "Ready: %+v", c)
		}).WithContext(ctx).WithTimeout(Cfg.BootTimeout).WithPolling(time.Second).Should(Succeed())
		Consistently(func(g Gomega) {
			got := f.VMI(ctx, "agent-ready")
			g.Expect(got.UID).To(Equal(vmi.UID))
			g.Expect(got.Status.Phase).To(Equal(v1alpha1.Running))
		}).WithContext(ctx).WithTimeout(20 * time.Second).WithPolling(2 * time.Second).Should(Succeed())

		By("an exec liveness probe whose command exits 7: Failed, naming the probe")
		Eventually(func(g Gomega) {
			vmi := f.VMI(ctx, "agent-unlive")
			g.Expect(vmi).NotTo(BeNil())
			g.Expect(vmi.Status.Phase).To(Equal(v1alpha1.Failed), "status: %+v", vmi.Status)
			g.Expect(vmi.Status.Reason).To(Equal(v1alpha1.ReasonLivenessProbeFailed), "status: %+v", vmi.Status)
			c := v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Message).To(ContainSubstring(`liveness probe (exec ["sh" "-c" "exit 7"]) failed`), "Ready: %+v", c)
		}).WithContext(ctx).WithTimeout(Cfg.BootTimeout + time.Minute).WithPolling(time.Second).Should(Succeed())
	})

})

var _ = Describe("VirtualMachineInstance CPU placement", Label("Conformance"), func() {
	f := NewFramework()

	It("with dedicatedCpuPlacement runs in a Guaranteed launcher pod on a node with the static CPU manager, its vCPU on an exclusive CPU", func(ctx SpecContext) {
		spec := guestSpecOf(guest.Options{UserData: "dedicated"})
		spec.Domain.CPU = &v1alpha1.CPU{DedicatedCPUPlacement: true}
		b, err := yaml.Marshal(spec)
		Expect(err).NotTo(HaveOccurred())
		f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: dedicated\nspec:\n"+indent(string(b), 2))
		// Running says the pinning happened: the handler fails a dedicated VMI whose launcher
		// may run on more CPUs than it has vCPUs (no static CPU manager gave it its own), and the
		// driver fails the start when it cannot pin.
		vmi := f.WaitRunning(ctx, "dedicated")
		f.WaitReady(ctx, vmi)
		pods := f.LauncherPods(ctx, vmi.UID)
		Expect(pods).To(HaveLen(1))
		pod := pods[0]
		Expect(pod.Status.QOSClass).To(Equal(corev1.PodQOSGuaranteed))
		Expect(pod.Spec.NodeSelector).To(HaveKeyWithValue(v1alpha1.CPUManagerNodeLabel, "true"))
		for _, c := range pod.Spec.Containers {
			if c.Name == layout.ComputeContainer {
				Expect(c.Resources.Limits.Cpu().String()).To(Equal("1"), "compute: %+v", c.Resources)
			}
		}
		var node corev1.Node
		Expect(f.Client.Get(ctx, client.ObjectKey{Name: pod.Spec.NodeName}, &node)).To(Succeed())
		Expect(node.Labels).To(HaveKeyWithValue(v1alpha1.CPUManagerNodeLabel, "true"))
	})
})
