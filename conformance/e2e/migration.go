package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// Live migration between the two nodes of the cluster (make up NODES=2): the guest's memory,
// device state and its containerDisk overlay move from one node's launcher pod to the other's
// through the drivers and the handlers' migration proxies.

// migrationTimeout bounds a migration of the test guest (TCG, 128 MiB) on the local cluster,
// target pod start included.
const migrationTimeout = 4 * time.Minute

// dirtyCommand makes the guest write 32 MiB of its memory (a tmpfs file) over and over.
const dirtyCommand = "while :; do dd if=/dev/zero of=/tmp/kv-dirty bs=1M count=32 2>/dev/null; done &\r"

// migrant is a running guest that a spec migrates.
type migrant struct {
	*guestRun
	node string // the node it ran on first
}

// bootMigrant runs the test guest as VMI name with labels (and its spec changed by change, when
// given), booted and Ready, LiveMigratable, its boot id read and its heartbeat printing on its
// console.
func (f *Framework) bootMigrant(ctx context.Context, name string, labels map[string]string, change ...func(*v1alpha1.VirtualMachineInstanceSpec)) *migrant {
	GinkgoHelper()
	spec := guestSpecOf(guest.Options{UserData: name})
	for _, c := range change {
		c(&spec)
	}
	b, err := yaml.Marshal(spec)
	Expect(err).NotTo(HaveOccurred())
	meta := "  name: " + name + "\n"
	if len(labels) > 0 {
		meta += "  labels:\n"
		for k, v := range labels {
			meta += fmt.Sprintf("    %s: %q\n", k, v)
		}
	}
	f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n"+meta+"spec:\n"+indent(string(b), 2))
	g := &guestRun{name: name}
	g.vmi = f.WaitRunning(ctx, name)
	f.WaitReady(ctx, g.vmi)
	g.vmi = f.waitReadyCondition(ctx, name)
	Eventually(func() string {
		c := v1alpha1.InstanceCondition(f.VMI(ctx, name).Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable)
		if c == nil {
			return "no condition"
		}
		return string(c.Status) + " " + c.Reason + " " + c.Message
	}).WithContext(ctx).WithTimeout(time.Minute).Should(HavePrefix("True"), "VMI %s LiveMigratable", name)
	pods := f.LauncherPods(ctx, g.vmi.UID)
	Expect(pods).To(HaveLen(1))
	g.launcher = pods[0]
	g.bootID = f.bootID(ctx, name)
	c := f.OpenConsole(ctx, name)
	c.Send("\r")
	c.Send(heartbeatCommand)
	Eventually(func() int { return len(f.heartbeats(ctx, g)) }).WithContext(ctx).
		WithTimeout(30*time.Second).WithPolling(time.Second).Should(BeNumerically(">=", 2), "VM %s: no heartbeat", name)
	c.Close()
	return &migrant{guestRun: g, node: g.vmi.Status.NodeName}
}

// migrationPolicy creates a MigrationPolicy named after the spec's namespace with the given
// spec lines, selecting the VMIs labelled kv-e2e-policy=<its name>, deleted when the spec ends;
// it returns the name (the label's value).
func (f *Framework) migrationPolicy(ctx context.Context, prefix, specLines string) string {
	GinkgoHelper()
	name := prefix + "-" + f.Namespace
	f.Apply(ctx, fmt.Sprintf("apiVersion: kubevisor.io/v1alpha1\nkind: MigrationPolicy\nmetadata:\n  name: %s\nspec:\n%s  selectors:\n    virtualMachineInstanceSelector:\n      kv-e2e-policy: %s\n",
		name, specLines, name))
	DeferCleanup(func(ctx context.Context) {
		_ = f.Client.Delete(ctx, &v1alpha1.MigrationPolicy{ObjectMeta: metaName(name)})
	})
	return name
}

// migrate creates a VirtualMachineInstanceMigration of VMI vmi named name.
func (f *Framework) migrate(ctx context.Context, name, vmi string) {
	GinkgoHelper()
	f.Apply(ctx, fmt.Sprintf("apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstanceMigration\nmetadata:\n  name: %s\nspec:\n  vmiName: %s\n", name, vmi))
}

// migration reads migration name, nil when it does not exist.
func (f *Framework) migration(ctx context.Context, name string) *v1alpha1.VirtualMachineInstanceMigration {
	GinkgoHelper()
	m := &v1alpha1.VirtualMachineInstanceMigration{}
	err := f.Client.Get(ctx, types.NamespacedName{Namespace: f.Namespace, Name: name}, m)
	if apierrors.IsNotFound(err) {
		return nil
	}
	Expect(err).NotTo(HaveOccurred())
	return m
}

// waitMigrationPhase waits until migration name is in phase p (or final in another, which fails).
func (f *Framework) waitMigrationPhase(ctx context.Context, name string, p v1alpha1.VirtualMachineInstanceMigrationPhase, timeout time.Duration) *v1alpha1.VirtualMachineInstanceMigration {
	GinkgoHelper()
	var m *v1alpha1.VirtualMachineInstanceMigration
	Eventually(func(g Gomega) {
		m = f.migration(ctx, name)
		g.Expect(m).NotTo(BeNil(), "migration %s", name)
		final := m.Status.Phase == v1alpha1.MigrationSucceeded || m.Status.Phase == v1alpha1.MigrationFailed
		if final && m.Status.Phase != p {
			StopTrying(fmt.Sprintf("migration %s ended %s, want %s: %s", name, m.Status.Phase, p, describeMigration(m))).Now()
		}
		g.Expect(m.Status.Phase).To(Equal(p), "migration %s: %s", name, describeMigration(m))
	}).WithContext(ctx).WithTimeout(timeout).WithPolling(time.Second).Should(Succeed())
	return m
}

func describeMigration(m *v1alpha1.VirtualMachineInstanceMigration) string {
	s := m.Status.MigrationState
	if s == nil {
		return "no migration state"
	}
	return fmt.Sprintf("source %s/%s, target %s/%s, failed %v %q", s.SourceNode, s.SourcePod, s.TargetNode, s.TargetPod, s.Failed, s.FailureReason)
}

// expectMovedOn checks that g's guest runs on another node than g.node after its migration: the
// same VMI and guest boot, the VMI's node and launcher pod those of the migration's target, the
// source pod gone, the heartbeat going on with no gap longer than maxGap plus the switch-over.
func (f *Framework) expectMovedOn(ctx context.Context, g *migrant, beatsBefore []float64) *v1alpha1.VirtualMachineInstance {
	GinkgoHelper()
	By("the VMI controller moves the VMI to the target pod and node")
	var vmi *v1alpha1.VirtualMachineInstance
	Eventually(func(gm Gomega) {
		vmi = f.VMI(ctx, g.name)
		gm.Expect(vmi).NotTo(BeNil())
		ms := vmi.Status.MigrationState
		gm.Expect(ms).NotTo(BeNil())
		gm.Expect(vmi.Status.LauncherPodName).To(Equal(ms.TargetPod))
	}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	Expect(vmi.UID).To(Equal(g.vmi.UID), "the same VMI")
	Expect(vmi.Status.Phase).To(Equal(v1alpha1.Running))
	ms := vmi.Status.MigrationState
	Expect(ms).NotTo(BeNil())
	Expect(ms.Completed).To(BeTrue())
	Expect(ms.Failed).To(BeFalse())
	Expect(ms.SourceNode).To(Equal(g.node))
	Expect(ms.StartTimestamp).NotTo(BeNil())
	Expect(ms.EndTimestamp).NotTo(BeNil())
	Expect(ms.MigrationConfiguration).NotTo(BeNil())
	Expect(vmi.Status.NodeName).To(Equal(ms.TargetNode))
	Expect(vmi.Status.NodeName).NotTo(Equal(g.node), "nodeName changed")
	Expect(vmi.Labels[v1alpha1.NodeNameLabel]).To(Equal(ms.TargetNode))
	Expect(vmi.Status.LauncherPodName).To(Equal(ms.TargetPod))

	By("the source launcher pod is gone; the target pod runs on the target node")
	Eventually(func(g Gomega) {
		pods := f.LauncherPods(ctx, vmi.UID)
		g.Expect(pods).To(HaveLen(1))
		g.Expect(pods[0].Name).To(Equal(ms.TargetPod))
		g.Expect(pods[0].Spec.NodeName).To(Equal(ms.TargetNode))
	}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())

	By("the same guest boot (boot id) answers on the console through the target node's handler")
	Expect(f.bootID(ctx, g.name)).To(Equal(g.bootID), "another boot id: the guest booted again")

	By("the heartbeat goes on in the target pod's console log, its uptime rising from where the source's stopped")
	g.vmi = vmi
	Eventually(func() int { return len(f.heartbeats(ctx, g.guestRun)) }).WithContext(ctx).
		WithTimeout(time.Minute).WithPolling(time.Second).Should(BeNumerically(">=", 3), "no heartbeat on the target")
	after := f.heartbeats(ctx, g.guestRun)
	console := f.Console(ctx, vmi)
	Expect(strings.Count(console, ReadyMarker)).To(BeZero(), "a ready marker on the target: the guest booted again")
	// A guest whose memory arrived damaged goes on for a while; its kernel notices first.
	Expect(conformance.GuestKernelTrouble.FindAllString(console, -1)).To(BeEmpty(), "the guest's kernel reports damage on the target")
	if len(beatsBefore) > 0 {
		last := beatsBefore[len(beatsBefore)-1]
		Expect(after[0]).To(BeNumerically(">", last), "uptime went back: %v after %v", after, beatsBefore)
	}
	for i := 1; i < len(after); i++ {
		Expect(after[i]-after[i-1]).To(BeNumerically("<", maxGap.Seconds()), "uptimes %v: a gap on the target", after)
	}
	return vmi
}

var _ = Describe("Live migration", Label("RequiresTwoNodes", "Migration"), func() {
	f := NewFramework()

	It("moves a running VMI to the other node: the same boot, its heartbeat goes on, its web server answers a pod afterwards, nodeName changed, the source pod gone", func(ctx SpecContext) {
		f.RequireTwoNodes(ctx)
		g := f.bootMigrant(ctx, "migrant", nil)
		before := f.heartbeats(ctx, g.guestRun)

		By("a VirtualMachineInstanceMigration of it succeeds")
		f.migrate(ctx, "migrant-1", "migrant")
		m := f.waitMigrationPhase(ctx, "migrant-1", v1alpha1.MigrationSucceeded, migrationTimeout)
		Expect(m.Status.MigrationState).NotTo(BeNil())
		Expect(m.Status.MigrationState.Completed).To(BeTrue())
		vmi := f.expectMovedOn(ctx, g, before)

		By("the target node's handler reports the VMI's new address (masquerade: the target pod's), and its web server answers a pod on the source node there")
		Eventually(func() string {
			vmi = f.VMI(ctx, "migrant")
			return GuestIP(vmi)
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal(f.LauncherPods(ctx, vmi.UID)[0].Status.PodIP))
		Expect(f.HTTPFromPodOn(ctx, g.node, "http://"+GuestIP(vmi)+"/")).To(ContainSubstring(guest.WebAnswer))

		By("and it migrates back")
		back := &migrant{guestRun: g.guestRun, node: vmi.Status.NodeName}
		before = f.heartbeats(ctx, g.guestRun)
		f.migrate(ctx, "migrant-2", "migrant")
		f.waitMigrationPhase(ctx, "migrant-2", v1alpha1.MigrationSucceeded, migrationTimeout)
		vmi = f.expectMovedOn(ctx, back, before)
		Expect(vmi.Status.NodeName).To(Equal(g.node))
	})

	It("moves a guest that dirties its memory, switching to post-copy where the MigrationPolicy allows it and the driver can (else copying it paused or pre-copy)", func(ctx SpecContext) {
		f.RequireTwoNodes(ctx)
		policy := "kv-e2e-postcopy-" + f.Namespace
		g := f.bootMigrant(ctx, "dirty", map[string]string{"kv-e2e-policy": policy})
		postCopy := f.driverPostCopies(ctx, g.vmi.Status.HypervisorDriver)
		if postCopy {
			// 1 s per GiB (1 s) cannot copy 128 MiB at 16 MiB/s: the driver switches to post-copy.
			f.migrationPolicy(ctx, "kv-e2e-postcopy", "  allowPostCopy: true\n  bandwidthPerMigration: 16Mi\n  completionTimeoutPerGiB: 1\n")
		} else {
			// The permission goes unused: the copy has the time it takes.
			f.migrationPolicy(ctx, "kv-e2e-postcopy", "  allowPostCopy: true\n  bandwidthPerMigration: 16Mi\n")
		}
		By(fmt.Sprintf("driver %s (post-copy %v): the guest writes 32 MiB of its memory over and over", g.vmi.Status.HypervisorDriver, postCopy))
		c := f.OpenConsole(ctx, "dirty")
		c.Send("\r")
		c.Send(dirtyCommand)
		c.Close()
		before := f.heartbeats(ctx, g.guestRun)

		f.migrate(ctx, "dirty-1", "dirty")
		m := f.waitMigrationPhase(ctx, "dirty-1", v1alpha1.MigrationSucceeded, migrationTimeout)
		vmi := f.expectMovedOn(ctx, g, before)
		Expect(vmi.Status.MigrationState.MigrationPolicyName).NotTo(BeNil())
		Expect(*vmi.Status.MigrationState.MigrationPolicyName).To(Equal(policy))
		Expect(*vmi.Status.MigrationState.MigrationConfiguration.AllowPostCopy).To(BeTrue())
		if postCopy {
			Expect(vmi.Status.MigrationState.Mode).To(Equal(v1alpha1.MigrationPostCopy),
				"the completion timeout (1 s per GiB: 1 s) cannot copy 128 MiB at 16 MiB/s: the migration switches to post-copy (%s)", describeMigration(m))
		} else {
			Expect(vmi.Status.MigrationState.Mode).NotTo(Equal(v1alpha1.MigrationPostCopy), "driver %s declares no post-copy", g.vmi.Status.HypervisorDriver)
		}
	})

	It("cancelled by deleting the migration while it copies, leaves the VMI running on the source as it was", func(ctx SpecContext) {
		f.RequireTwoNodes(ctx)
		policy := f.migrationPolicy(ctx, "kv-e2e-slow", "  bandwidthPerMigration: 1Mi\n")
		g := f.bootMigrant(ctx, "stayer", map[string]string{"kv-e2e-policy": policy})
		f.migrate(ctx, "stayer-1", "stayer")
		f.waitMigrationPhase(ctx, "stayer-1", v1alpha1.MigrationRunning, migrationTimeout)
		time.Sleep(3 * time.Second)

		By("the migration is deleted while it runs (1 MiB/s)")
		Expect(f.Client.Delete(ctx, &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metaNamespaced(f.Namespace, "stayer-1")})).To(Succeed())
		Eventually(func() *v1alpha1.VirtualMachineInstanceMigration { return f.migration(ctx, "stayer-1") }).
			WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(BeNil())
		f.expectStayed(ctx, g)
	})

	It("whose target pod fails, fails with the reason and leaves the VMI running on the source as it was", func(ctx SpecContext) {
		f.RequireTwoNodes(ctx)
		policy := f.migrationPolicy(ctx, "kv-e2e-slow2", "  bandwidthPerMigration: 1Mi\n")
		g := f.bootMigrant(ctx, "orphan", map[string]string{"kv-e2e-policy": policy})
		f.migrate(ctx, "orphan-1", "orphan")
		m := f.waitMigrationPhase(ctx, "orphan-1", v1alpha1.MigrationRunning, migrationTimeout)

		By("the target pod is deleted at once, as a node going away would")
		target := &corev1.Pod{ObjectMeta: metaNamespaced(f.Namespace, m.Status.MigrationState.TargetPod)}
		Expect(f.Client.Delete(ctx, target, client.GracePeriodSeconds(0))).To(Succeed())
		m = f.waitMigrationPhase(ctx, "orphan-1", v1alpha1.MigrationFailed, 2*time.Minute)
		Expect(m.Status.MigrationState.Failed).To(BeTrue())
		Expect(m.Status.MigrationState.FailureReason).NotTo(BeEmpty())
		f.expectStayed(ctx, g)
		vmi := f.VMI(ctx, "orphan")
		Expect(vmi.Status.MigrationState.Failed).To(BeTrue(), "the VMI's migrationState says the migration failed")
		Expect(vmi.Status.MigrationState.FailureReason).NotTo(BeEmpty())
	})

	It("refuses a VMI that is not LiveMigratable, with the condition's reason, and leaves it running", func(ctx SpecContext) {
		spec := guestSpecOf(guest.Options{UserData: "bridged"})
		spec.Domain.Devices.Interfaces[0].InterfaceBindingMethod = v1alpha1.InterfaceBindingMethod{Bridge: &v1alpha1.InterfaceBridge{}}
		spec.Domain.Devices.Interfaces[0].Ports = nil // port forwarding is masquerade's
		b, err := yaml.Marshal(spec)
		Expect(err).NotTo(HaveOccurred())
		f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: bridged\nspec:\n"+indent(string(b), 2))
		vmi := f.WaitRunning(ctx, "bridged")
		f.migrate(ctx, "bridged-1", "bridged")
		m := f.waitMigrationPhase(ctx, "bridged-1", v1alpha1.MigrationFailed, time.Minute)
		Expect(m.Status.MigrationState).NotTo(BeNil())
		Expect(m.Status.MigrationState.FailureReason).To(And(ContainSubstring("NotLiveMigratable"), ContainSubstring(v1alpha1.ReasonInterfaceNotLiveMigratable)))
		Expect(f.LauncherPods(ctx, vmi.UID)).To(HaveLen(1), "no target pod was made")
		after := f.VMI(ctx, "bridged")
		Expect(after.Status.Phase).To(Equal(v1alpha1.Running))
		Expect(after.Status.NodeName).To(Equal(vmi.Status.NodeName))
	})

	It("moves a VMI of each other class whose driver migrates (libvirt beside qmp), its writable disks copied: the same boot, its heartbeat goes on, its web server answers a pod afterwards, what it wrote on its containerDisk and an emptyDisk reads back on the target", func(ctx SpecContext) {
		f.RequireTwoNodes(ctx)
		for _, class := range f.otherMigratingClasses(ctx) {
			name := "disks-" + class.Name
			By(fmt.Sprintf("class %s (driver %s): a VMI with its containerDisk's overlay and a %d-byte emptyDisk", class.Name, class.Driver, scratchBytes))
			g := f.bootMigrant(ctx, name, nil, func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.HypervisorClassName = class.Name
				s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, v1alpha1.Disk{Name: "scratch", DiskDevice: v1alpha1.DiskDevice{Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}})
				s.Volumes = append(s.Volumes, v1alpha1.Volume{Name: "scratch", VolumeSource: v1alpha1.VolumeSource{
					EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: *resource.NewQuantity(scratchBytes, resource.BinarySI)}}})
			})
			By("the guest writes a marker on each disk (the containerDisk's last sector, the emptyDisk's 100th)")
			Expect(f.consoleAnswer(ctx, name, "kv-marked", diskMarkers("write", name))).To(MatchRegexp(`^vd[a-z],vd[a-z]$`))
			before := f.heartbeats(ctx, g.guestRun)
			f.migrate(ctx, name+"-1", name)
			m := f.waitMigrationPhase(ctx, name+"-1", v1alpha1.MigrationSucceeded, migrationTimeout)
			Expect(m.Status.MigrationState).NotTo(BeNil())
			vmi := f.expectMovedOn(ctx, g, before)
			Expect(vmi.Status.HypervisorDriver).To(Equal(class.Driver))
			By("on the target, its page cache dropped, the guest reads both markers back from its disks")
			Expect(f.consoleAnswer(ctx, name, "kv-read", diskMarkers("read", name))).To(Equal("KVMARK-" + name + "-cd,KVMARK-" + name + "-scratch"))
			Eventually(func() string {
				vmi = f.VMI(ctx, name)
				return GuestIP(vmi)
			}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal(f.LauncherPods(ctx, vmi.UID)[0].Status.PodIP))
			Expect(f.HTTPFromPodOn(ctx, g.node, "http://"+GuestIP(vmi)+"/")).To(ContainSubstring(guest.WebAnswer))
		}
	})
})

// scratchBytes is the size of the emptyDisk the disk-copying spec gives its VMI, by which the
// guest finds it.
const scratchBytes = 16 << 20

// diskMarkers is the shell command that writes ("write") or reads back ("read") a marker on
// the guest's containerDisk (the virtio disk that is not the emptyDisk: its last sector) and
// emptyDisk (its 100th sector), printing "<marker>-42 <what>" (the devices, or what it read).
func diskMarkers(op, token string) string {
	find := fmt.Sprintf(`s=$(for b in /sys/block/vd*; do [ "$(cat $b/size)" = %[1]d ] && echo ${b##*/}; done | head -n 1); c=$(for b in /sys/block/vd*; do [ "$(cat $b/size)" != %[1]d ] && echo ${b##*/}; done | head -n 1); n=$(cat /sys/block/$c/size); `, scratchBytes/512)
	if op == "write" {
		return find + fmt.Sprintf(`printf 'KVMARK-%[1]s-cd\n' | dd of=/dev/$c bs=512 seek=$((n-1)) conv=sync,fsync 2>/dev/null; printf 'KVMARK-%[1]s-scratch\n' | dd of=/dev/$s bs=512 seek=100 conv=sync,fsync 2>/dev/null; echo kv-marked-$((6*7)) $c,$s`, token)
	}
	return find + `sync; echo 3 > /proc/sys/vm/drop_caches; echo kv-read-$((6*7)) $(dd if=/dev/$c bs=512 skip=$((n-1)) count=1 2>/dev/null | head -n 1),$(dd if=/dev/$s bs=512 skip=100 count=1 2>/dev/null | head -n 1)`
}

// consoleAnswer runs command on VMI name's serial console and returns the word it printed after
// "<marker>-42 " (the command prints marker-$((6*7)), so that the echoed command line does not
// match).
func (f *Framework) consoleAnswer(ctx context.Context, name, marker, command string) string {
	GinkgoHelper()
	re := regexp.MustCompile(regexp.QuoteMeta(marker) + `-42 (\S*)`)
	var answer string
	Eventually(func(g Gomega) {
		c := f.OpenConsole(ctx, name)
		defer c.Close()
		c.Send("\r")
		c.Send(command + "\r")
		g.Eventually(func() []string { return re.FindStringSubmatch(c.Output()) }).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(HaveLen(2))
		answer = re.FindStringSubmatch(c.Output())[1]
	}).WithContext(ctx).WithTimeout(2 * time.Minute).Should(Succeed())
	return answer
}

// driverPostCopies says whether hypervisor driver switches migrations to post-copy on every
// node (capability.kubevisor.io/<driver>.live-migration-post-copy).
func (f *Framework) driverPostCopies(ctx context.Context, driver string) bool {
	GinkgoHelper()
	var nodes corev1.NodeList
	Expect(f.Client.List(ctx, &nodes)).To(Succeed())
	all := len(nodes.Items) > 0
	for _, n := range nodes.Items {
		all = all && n.Labels[v1alpha1.DriverMigrationPostCopyLabel(driver)] == "true"
	}
	return all
}

// otherMigratingClasses are the HypervisorClasses other than the one the specs use by default
// whose driver migrates and copies disks on every node (capability.kubevisor.io/<driver>.
// live-migration and .live-migration-disks "true" on each); the spec is skipped when there is
// none.
func (f *Framework) otherMigratingClasses(ctx context.Context) []*v1alpha1.HypervisorClass {
	GinkgoHelper()
	var classes v1alpha1.HypervisorClassList
	Expect(f.Client.List(ctx, &classes)).To(Succeed())
	var nodes corev1.NodeList
	Expect(f.Client.List(ctx, &nodes)).To(Succeed())
	var out []*v1alpha1.HypervisorClass
	for i := range classes.Items {
		c := &classes.Items[i]
		if c.Name == Cfg.HypervisorClass || Cfg.HypervisorClass == "" && v1alpha1.IsDefaultClass(c) {
			continue
		}
		all := len(nodes.Items) > 1
		for _, n := range nodes.Items {
			all = all && n.Labels[v1alpha1.DriverMigrationLabel(c.Driver)] == "true" && n.Labels[v1alpha1.DriverMigrationDisksLabel(c.Driver)] == "true"
		}
		if all {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		Skip("no other HypervisorClass whose driver migrates and copies disks on every node")
	}
	return out
}

// expectStayed checks that g's guest runs where it ran, as it was: the same node, launcher pod
// and guest boot, no target pod left, the heartbeat going on.
func (f *Framework) expectStayed(ctx context.Context, g *migrant) {
	GinkgoHelper()
	By("the VMI runs on the source as before: same node, launcher pod and boot, no target pod left")
	Eventually(func(gm Gomega) {
		pods := f.LauncherPods(ctx, g.vmi.UID)
		gm.Expect(pods).To(HaveLen(1))
		gm.Expect(pods[0].UID).To(Equal(g.launcher.UID))
	}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	vmi := f.VMI(ctx, g.name)
	Expect(vmi.Status.Phase).To(Equal(v1alpha1.Running))
	Expect(vmi.Status.NodeName).To(Equal(g.node))
	Expect(vmi.Status.LauncherPodName).To(Equal(g.launcher.Name))
	Expect(f.bootID(ctx, g.name)).To(Equal(g.bootID))
	n := len(f.heartbeats(ctx, g.guestRun))
	Eventually(func() int { return len(f.heartbeats(ctx, g.guestRun)) }).WithContext(ctx).
		WithTimeout(30*time.Second).WithPolling(time.Second).Should(BeNumerically(">", n+2), "the heartbeat stopped")
}

func metaName(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name} }

func metaNamespaced(ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name}
}
