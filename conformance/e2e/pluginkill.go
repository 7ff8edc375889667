package e2e

import (
	"bufio"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// The handler pod as the driver-kill spec reaches into it (manifests/install/handler.yaml).
const (
	handlerNamespace = "kubevisor-system"
	handlerContainer = "handler"
	handlerProgram   = "kubevisor-handler"
	// pluginProgramPrefix + a driver's name is its plugin's program (core/plugin).
	pluginProgramPrefix = "kubevisor-driver-"
)

// bootIDCommand prints the guest kernel's boot id, which a new boot (a new VM process, a reset)
// changes, between markers its echo does not match.
const bootIDCommand = "echo BOOTID-$(cat /proc/sys/kernel/random/boot_id)-END\r"

var bootIDLine = regexp.MustCompile(`BOOTID-([0-9a-f-]{36})-END`)

// pluginKill is what e2e-signal (conformance/e2e/signal) printed: the handler's children before
// and after, the process it killed, and the one the plugin host started in its place.
type pluginKill struct {
	handlerPID            int
	killed, restarted     int
	before, after         map[string]int // program -> pid
	raw                   string
	container, handlerPod string
}

// parsePluginKill reads e2e-signal's output.
func parsePluginKill(out string) (pluginKill, error) {
	k := pluginKill{before: map[string]int{}, after: map[string]int{}, raw: out}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		pid, err := strconv.Atoi(f[2])
		if err != nil {
			return k, fmt.Errorf("line %q: pid: %w", sc.Text(), err)
		}
		switch f[0] {
		case "before":
			k.before[f[1]] = pid
		case "after":
			k.after[f[1]] = pid
		case "parent":
			k.handlerPID = pid
		case "signalled":
			k.killed = pid
		case "restarted":
			k.restarted = pid
		}
	}
	if k.handlerPID == 0 || k.killed == 0 || k.restarted == 0 {
		return k, fmt.Errorf("e2e-signal said no parent, signalled or restarted pid:\n%s", out)
	}
	return k, nil
}

// killPlugin SIGKILLs the hypervisor driver plugin of driver in handler pod pod, from an
// ephemeral container running e2e-signal in the handler container's process namespace, and
// returns what it saw once the plugin host has started the plugin again.
//
// The ephemeral container is the least that does it on any cluster: it needs no node access,
// leaves the handler pod and its other containers as they are (an ephemeral container is never
// restarted and cannot be removed, so the pod lists it, terminated, until the pod is replaced),
// and asks for only what the signal needs. It runs as root, the plugins' user, so kill(2) needs
// no capability; CAP_KILL is the one it keeps, should a plugin run as another user. AppArmor is
// what would refuse it otherwise: the container runtimes' default profile lets a container send
// signals only to processes of that same profile, and the privileged handler's plugins run
// unconfined, so on an AppArmor node the signal is denied unless the ephemeral container is
// unconfined too (read from the profile's rules; the local cluster's node has no LSM). The
// handler's namespace enforces the privileged Pod Security level, which allows that. The
// handler runs with hostPID, so the container sees the node's processes, and e2e-signal
// takes the plugin among the kubevisor-handler process's children only.
func (f *Framework) killPlugin(ctx context.Context, pod corev1.Pod, driver string) pluginKill {
	GinkgoHelper()
	name := "e2e-kill-" + driver + "-" + utilrand.String(5)
	ec := corev1.EphemeralContainer{
		TargetContainerName: handlerContainer,
		EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name:            name,
			Image:           Cfg.SignalImage,
			ImagePullPolicy: corev1.PullIfNotPresent,
			Command: []string{"/usr/local/bin/e2e-signal", "-parent", handlerProgram, "-signal", "KILL", "-wait", "2m",
				pluginProgramPrefix + driver},
			SecurityContext: &corev1.SecurityContext{
				RunAsUser:                ptr.To[int64](0),
				AllowPrivilegeEscalation: ptr.To(false),
				Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"KILL"}},
				AppArmorProfile:          &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined},
			},
		},
	}
	Eventually(func() error {
		var cur corev1.Pod
		if err := f.Client.Get(ctx, client.ObjectKeyFromObject(&pod), &cur); err != nil {
			return err
		}
		cur.Spec.EphemeralContainers = append(cur.Spec.EphemeralContainers, ec)
		return f.Client.SubResource("ephemeralcontainers").Update(ctx, &cur)
	}).WithContext(ctx).WithTimeout(30*time.Second).WithPolling(time.Second).Should(Succeed(),
		"add ephemeral container %s to %s/%s", name, handlerNamespace, pod.Name)
	var st *corev1.ContainerStatus
	Eventually(func(g Gomega) {
		var cur corev1.Pod
		g.Expect(f.Client.Get(ctx, client.ObjectKeyFromObject(&pod), &cur)).To(Succeed())
		st = nil
		for i := range cur.Status.EphemeralContainerStatuses {
			if cur.Status.EphemeralContainerStatuses[i].Name == name {
				st = &cur.Status.EphemeralContainerStatuses[i]
			}
		}
		g.Expect(st).NotTo(BeNil(), "no status of ephemeral container %s yet", name)
		g.Expect(st.State.Terminated).NotTo(BeNil(), "ephemeral container %s: %+v", name, st.State)
	}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
	out, err := f.Kubectl(ctx, "", "-n", handlerNamespace, "logs", pod.Name, "-c", name)
	Expect(err).NotTo(HaveOccurred(), out)
	Expect(st.State.Terminated.ExitCode).To(BeZero(), "e2e-signal in %s/%s: %s\n%s", pod.Name, name, st.State.Terminated.Reason, out)
	k, err := parsePluginKill(out)
	Expect(err).NotTo(HaveOccurred())
	k.container, k.handlerPod = name, pod.Name
	return k
}

// handlerPodOn is the kubevisor-handler pod of node.
func (f *Framework) handlerPodOn(ctx context.Context, node string) corev1.Pod {
	GinkgoHelper()
	for _, p := range f.handlerPods(ctx) {
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil {
			return p
		}
	}
	Fail("no kubevisor-handler pod on node " + node)
	return corev1.Pod{}
}

// handlerLog is the lines of the handler container's log of pod since that hold one of want.
func (f *Framework) handlerLog(ctx context.Context, pod corev1.Pod, since time.Time, want ...string) string {
	GinkgoHelper()
	out, err := f.Kubectl(ctx, "", "-n", handlerNamespace, "logs", pod.Name, "-c", handlerContainer,
		"--since-time="+since.Add(-time.Second).UTC().Format(time.RFC3339))
	Expect(err).NotTo(HaveOccurred(), out)
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		for _, w := range want {
			if strings.Contains(l, w) {
				b.WriteString(l + "\n")
				break
			}
		}
	}
	return b.String()
}

// containerRestarts is the restart count of each container of pod by name.
func containerRestarts(pod corev1.Pod) map[string]int32 {
	out := map[string]int32{}
	for _, s := range pod.Status.ContainerStatuses {
		out[s.Name] = s.RestartCount
	}
	return out
}

// vmiWatch records, from a watch of the spec's namespace, every moment one of a set of VMIs was
// not Running and Ready, or was replaced by another of the same name.
type vmiWatch struct {
	mu     sync.Mutex
	bad    []string
	events int
	cancel context.CancelFunc
	done   chan struct{}
}

// watchSteady starts a vmiWatch of the VMIs by name (with their UIDs); Stop ends it.
func (f *Framework) watchSteady(ctx context.Context, vmis map[string]types.UID) *vmiWatch {
	GinkgoHelper()
	wc, err := newClient(Cfg.Kubeconfig)
	Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(ctx)
	w := &vmiWatch{cancel: cancel, done: make(chan struct{})}
	var list v1alpha1.VirtualMachineInstanceList
	wi, err := wc.Watch(ctx, &list, client.InNamespace(f.Namespace))
	Expect(err).NotTo(HaveOccurred())
	go func() {
		defer close(w.done)
		defer wi.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-wi.ResultChan():
				if !ok {
					if ctx.Err() == nil {
						w.note("the watch of VMIs ended early")
					}
					return
				}
				w.observe(ev, vmis)
			}
		}
	}()
	return w
}

func (w *vmiWatch) note(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.bad = append(w.bad, time.Now().Format("15:04:05.000")+" "+s)
}

func (w *vmiWatch) observe(ev watch.Event, vmis map[string]types.UID) {
	vmi, ok := ev.Object.(*v1alpha1.VirtualMachineInstance)
	if !ok {
		w.note(fmt.Sprintf("watch event %s of %T", ev.Type, ev.Object))
		return
	}
	uid, mine := vmis[vmi.Name]
	if !mine {
		return
	}
	w.mu.Lock()
	w.events++
	w.mu.Unlock()
	ready := v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
	switch {
	case ev.Type == watch.Deleted:
		w.note(fmt.Sprintf("VMI %s deleted", vmi.Name))
	case vmi.UID != uid:
		w.note(fmt.Sprintf("VMI %s is another one (UID %s, was %s)", vmi.Name, vmi.UID, uid))
	case vmi.Status.Phase != v1alpha1.Running:
		w.note(fmt.Sprintf("VMI %s %s: %s", vmi.Name, vmi.Status.Phase, vmi.Status.Reason))
	case ready == nil || ready.Status != corev1.ConditionTrue:
		w.note(fmt.Sprintf("VMI %s not Ready: %+v", vmi.Name, ready))
	}
}

// Stop ends the watch and returns what it saw amiss and how many events of the VMIs it had.
func (w *vmiWatch) Stop() ([]string, int) {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.bad, w.events
}

// bootID types bootIDCommand into the guest's serial shell through `vmctl console` (the VMI's
// hypervisor driver serves it) and returns the boot id it printed. A console that the driver
// cannot serve yet (just restarted, the VM not re-adopted) is opened again; how long that took
// and how many consoles were opened is printed.
func (f *Framework) bootID(ctx context.Context, name string) string {
	GinkgoHelper()
	var id string
	start, opened := time.Now(), 0
	defer func() {
		GinkgoWriter.Printf("VM %s: boot id read through its console in %s (%d console(s) opened)\n", name, time.Since(start).Round(10*time.Millisecond), opened)
	}()
	Eventually(func(g Gomega) {
		opened++
		c := f.OpenConsole(ctx, name)
		defer c.Close()
		c.Send("\r")
		c.Send(bootIDCommand)
		g.Eventually(func(g Gomega) {
			m := bootIDLine.FindStringSubmatch(c.Output())
			if m == nil {
				g.Expect(c.Exited()).To(BeFalse(), "vmctl console exited: %s", c.Stderr())
			}
			g.Expect(m).NotTo(BeNil(), "no boot id on the console yet")
			id = m[1]
		}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
	}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(2*time.Second).Should(Succeed(), "boot id of VMI %s", name)
	return id
}

// guestRun is what the driver-kill spec knows of one of its running VMs.
type guestRun struct {
	name     string
	class    *v1alpha1.HypervisorClass
	vmi      *v1alpha1.VirtualMachineInstance
	launcher corev1.Pod
	bootID   string
}

// heartbeats are the guest's heartbeat uptimes in its console log so far.
func (f *Framework) heartbeats(ctx context.Context, g *guestRun) []float64 {
	GinkgoHelper()
	return Heartbeats(f.Console(ctx, g.vmi))
}

// expectUndisturbed checks that g's VM ran on as it was: the same VMI and launcher pod (UID,
// no container restarted), no new phase, the same guest boot (boot id, one ready marker),
// and its heartbeat going on past since (the beats before the kill) with its uptime rising and,
// from the last beat before the kill on, no gap longer than maxGap.
func (f *Framework) expectUndisturbed(ctx context.Context, g *guestRun, since int) {
	GinkgoHelper()
	ups := f.expectSameGuest(ctx, g, since)
	for i := max(since, 1); i < len(ups); i++ { // from the last beat before the kill on (a pause before is no gap of this)
		Expect(ups[i]-ups[i-1]).To(BeNumerically("<", maxGap.Seconds()), "VM %s: uptimes %v: a gap after beat %d", g.name, ups, since)
	}
}

// expectSameGuest checks that g's VM runs on as it was: its heartbeat going on past since with
// its uptime rising, the same VMI and launcher pod (UID, no container restarted), no new phase,
// the same guest boot (boot id, one ready marker). It returns the heartbeat uptimes.
func (f *Framework) expectSameGuest(ctx context.Context, g *guestRun, since int) []float64 {
	GinkgoHelper()
	By(fmt.Sprintf("VM %s (%s): the guest's heartbeat goes on", g.name, g.class.Driver))
	Eventually(func() int { return len(f.heartbeats(ctx, g)) }).WithContext(ctx).
		WithTimeout(time.Minute).WithPolling(time.Second).Should(BeNumerically(">=", since+5),
		"VM %s: the heartbeat stopped after %d beats", g.name, since)
	console := f.Console(ctx, g.vmi)
	ups := Heartbeats(console)
	for i := 1; i < len(ups); i++ {
		Expect(ups[i]).To(BeNumerically(">", ups[i-1]), "VM %s: uptimes %v went back (a reboot?)", g.name, ups)
	}
	Expect(strings.Count(console, ReadyMarker)).To(Equal(1), "VM %s: a second ready marker, the guest booted again", g.name)

	By(fmt.Sprintf("VM %s (%s): the same VMI, launcher pod and guest boot", g.name, g.class.Driver))
	vmi := f.VMI(ctx, g.name)
	Expect(vmi).NotTo(BeNil())
	Expect(vmi.UID).To(Equal(g.vmi.UID))
	Expect(vmi.Status.Phase).To(Equal(v1alpha1.Running))
	Expect(vmi.Status.LauncherPodName).To(Equal(g.vmi.Status.LauncherPodName))
	Expect(vmi.Status.PhaseTransitionTimestamps).To(Equal(g.vmi.Status.PhaseTransitionTimestamps), "VMI %s entered a phase again", g.name)
	pods := f.LauncherPods(ctx, g.vmi.UID)
	Expect(pods).To(HaveLen(1), "launcher pods of VMI %s", g.name)
	Expect(pods[0].UID).To(Equal(g.launcher.UID), "VMI %s: another launcher pod", g.name)
	Expect(containerRestarts(pods[0])).To(Equal(containerRestarts(g.launcher)), "VMI %s: a launcher container restarted", g.name)
	Expect(f.bootID(ctx, g.name)).To(Equal(g.bootID), "VM %s: another boot id, the guest booted again", g.name)
	return ups
}

// maxGap bounds the time between two heartbeats of a guest that was never stopped (they come
// every second; a TCG guest on a busy node is late by a little).
const maxGap = 5 * time.Second

// bootOneOfEach runs a guest of each of the suite's two HypervisorClasses (pickTwoClasses; the
// spec is skipped when there are not two) on one node, as VMs with runStrategy Always (asVM) or
// as bare VMIs, named prefix-<class>; each is Running and Ready, its guest booted, its boot id
// read and its heartbeat printing on its console.
func (f *Framework) bootOneOfEach(ctx context.Context, prefix string, asVM bool) []*guestRun {
	GinkgoHelper()
	return f.bootOneOfEachOn(ctx, prefix, asVM, "")
}

// bootOneOfEachOn is bootOneOfEach on the node of hostname label node ("": where the first
// guest is scheduled).
func (f *Framework) bootOneOfEachOn(ctx context.Context, prefix string, asVM bool, node string) []*guestRun {
	GinkgoHelper()
	var list v1alpha1.HypervisorClassList
	Expect(f.Client.List(ctx, &list)).To(Succeed())
	classA, classB, skip, err := pickTwoClasses(list.Items, Cfg.TwoClasses)
	Expect(err).NotTo(HaveOccurred())
	if skip != "" {
		Skip(skip)
	}
	Expect(classA.Driver).NotTo(Equal(classB.Driver), "classes %s and %s have the same driver: killing it would be one driver's test", classA.Name, classB.Name)
	By(fmt.Sprintf("classes %s (driver %s) and %s (driver %s)", classA.Name, classA.Driver, classB.Name, classB.Driver))

	By("a guest of each class runs on one node, booted, its heartbeat printing")
	var guests []*guestRun
	for _, class := range []*v1alpha1.HypervisorClass{classA, classB} {
		g := &guestRun{name: prefix + "-" + class.Name, class: class}
		spec := guestSpecOf(guest.Options{UserData: g.name, HypervisorClass: class.Name})
		if node != "" {
			spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
		}
		if asVM {
			f.Apply(ctx, vmOf(g.name, spec))
		} else {
			b, err := yaml.Marshal(spec)
			Expect(err).NotTo(HaveOccurred())
			f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: "+g.name+"\nspec:\n"+indent(string(b), 2))
		}
		g.vmi = f.WaitRunning(ctx, g.name)
		if node == "" {
			var n corev1.Node
			Expect(f.Client.Get(ctx, types.NamespacedName{Name: g.vmi.Status.NodeName}, &n)).To(Succeed())
			node = n.Labels[corev1.LabelHostname]
			Expect(node).NotTo(BeEmpty(), "node %s has no %s label", n.Name, corev1.LabelHostname)
		}
		guests = append(guests, g)
	}
	Expect(guests[1].vmi.Status.NodeName).To(Equal(guests[0].vmi.Status.NodeName))
	for _, g := range guests {
		Expect(g.vmi.Status.HypervisorDriver).To(Equal(g.class.Driver), "VMI %s", g.name)
		f.takeGuest(ctx, g)
		c := f.OpenConsole(ctx, g.name)
		c.Send("\r")
		c.Send(heartbeatCommand)
		Eventually(func() int { return len(f.heartbeats(ctx, g)) }).WithContext(ctx).
			WithTimeout(30*time.Second).WithPolling(time.Second).Should(BeNumerically(">=", 2), "VM %s: no heartbeat", g.name)
		c.Close()
	}
	return guests
}

// takeGuest waits until g's VMI (g.vmi, Running) is Ready, and takes it as it is then: the VMI,
// its one launcher pod and its guest's boot id.
func (f *Framework) takeGuest(ctx context.Context, g *guestRun) {
	GinkgoHelper()
	f.WaitReady(ctx, g.vmi)
	g.vmi = f.waitReadyCondition(ctx, g.name)
	pods := f.LauncherPods(ctx, g.vmi.UID)
	Expect(pods).To(HaveLen(1))
	g.launcher = pods[0]
	g.bootID = f.bootID(ctx, g.name)
}

// waitReadyCondition waits until VMI name's Ready condition is True and returns the VMI.
func (f *Framework) waitReadyCondition(ctx context.Context, name string) *v1alpha1.VirtualMachineInstance {
	GinkgoHelper()
	var vmi *v1alpha1.VirtualMachineInstance
	Eventually(func(g Gomega) {
		vmi = f.VMI(ctx, name)
		g.Expect(vmi).NotTo(BeNil())
		ready := v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
		g.Expect(ready).NotTo(BeNil(), "VMI %s has no Ready condition", name)
		g.Expect(ready.Status).To(Equal(corev1.ConditionTrue), "VMI %s Ready: %+v", name, ready)
	}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	return vmi
}

var _ = Describe("A hypervisor driver plugin SIGKILLed", Label("Conformance", "TwoClasses", "PluginKill"), func() {
	f := NewFramework()

	It("loses none of its VMs and disturbs none of the other driver's: the plugin is started again, both guests run on in the same launcher pods without a reboot, and each killed driver's VM pauses, unpauses and stops gracefully", func(ctx SpecContext) {
		guests := f.bootOneOfEach(ctx, "kill", true)
		uids := map[string]types.UID{}
		for _, g := range guests {
			uids[g.name] = g.vmi.UID
		}

		handlerPID := 0
		for i, victim := range guests {
			other := guests[1-i]
			driver := victim.class.Driver
			By(fmt.Sprintf("SIGKILL of the %s plugin (%s%s) in the handler pod", driver, pluginProgramPrefix, driver))
			handler := f.handlerPodOn(ctx, victim.vmi.Status.NodeName)
			beats := map[string]int{}
			for _, g := range guests {
				beats[g.name] = len(f.heartbeats(ctx, g))
			}
			w := f.watchSteady(ctx, uids)
			killedAt := time.Now()
			k := f.killPlugin(ctx, handler, driver)
			GinkgoWriter.Printf("%s in %s:\n%s", k.container, k.handlerPod, k.raw)
			if handlerPID == 0 {
				handlerPID = k.handlerPID
			}
			Expect(k.handlerPID).To(Equal(handlerPID), "the handler is another process")

			By(fmt.Sprintf("the plugin host started %s again: a new pid; the handler and the %s plugin are the same processes", driver, other.class.Driver))
			prog, otherProg := pluginProgramPrefix+driver, pluginProgramPrefix+other.class.Driver
			Expect(k.before).To(HaveKeyWithValue(prog, k.killed))
			Expect(k.restarted).NotTo(Equal(k.killed))
			Expect(k.after).To(HaveKeyWithValue(prog, k.restarted))
			Expect(k.before).To(HaveKey(otherProg), "the handler runs no %s plugin", other.class.Driver)
			Expect(k.after).To(HaveKeyWithValue(otherProg, k.before[otherProg]), "the %s plugin is another process", other.class.Driver)

			for _, g := range []*guestRun{victim, other} {
				f.expectUndisturbed(ctx, g, beats[g.name])
			}
			bad, events := w.Stop()
			Expect(bad).To(BeEmpty(), "the VMIs while the %s plugin was killed and started again (%d events)", driver, events)
			Expect(events).To(BeNumerically(">=", len(guests)), "the watch saw no VMI")
			GinkgoWriter.Printf("handler %s on the %s plugin's restart:\n%s", handler.Name, driver, f.handlerLog(ctx, handler, killedAt,
				`"plugin exited unexpectedly"`, `"plugin restarted"`, `"VM recovered"`, `"@level":"error"`))
			var after corev1.Pod
			Expect(f.Client.Get(ctx, client.ObjectKeyFromObject(&handler), &after)).To(Succeed())
			Expect(after.UID).To(Equal(handler.UID), "the handler pod was replaced")
			Expect(containerRestarts(after)).To(Equal(containerRestarts(handler)), "a handler pod container restarted")

			By(fmt.Sprintf("VM %s: the restarted %s plugin pauses and unpauses it", victim.name, driver))
			f.VmctlOK(ctx, "pause", "vmi", victim.name)
			Eventually(func() bool { return f.paused(ctx, victim.name) }).WithContext(ctx).
				WithTimeout(30 * time.Second).Should(BeTrue())
			time.Sleep(2 * time.Second) // what the guest printed just before it stopped reaches the log
			paused := len(f.heartbeats(ctx, victim))
			Consistently(func() int { return len(f.heartbeats(ctx, victim)) }).WithContext(ctx).
				WithTimeout(4*time.Second).WithPolling(time.Second).Should(Equal(paused), "heartbeats of a paused guest")
			f.VmctlOK(ctx, "unpause", "vmi", victim.name)
			Eventually(func() bool { return f.paused(ctx, victim.name) }).WithContext(ctx).
				WithTimeout(30 * time.Second).Should(BeFalse())
			Eventually(func() int { return len(f.heartbeats(ctx, victim)) }).WithContext(ctx).
				WithTimeout(30*time.Second).WithPolling(time.Second).Should(BeNumerically(">=", paused+3), "heartbeats after unpause")
			f.waitReadyCondition(ctx, victim.name)
		}

		for _, g := range guests {
			By(fmt.Sprintf("VM %s: runStrategy Halted, and the restarted %s plugin stops its guest gracefully", g.name, g.class.Driver))
			c := f.OpenConsole(ctx, g.name)
			c.Send("\r")
			c.Send(answerCommand) // answered: the console is attached, what the guest prints next comes
			c.WaitFor(ctx, answerText, 30*time.Second)
			_, err := f.Kubectl(ctx, "", "patch", "vm", g.name, "--type=merge", "-p", `{"spec":{"runStrategy":"Halted"}}`)
			Expect(err).NotTo(HaveOccurred())
			c.WaitFor(ctx, "KUBEVISOR-POWEROFF", time.Minute)
			f.WaitGone(ctx, g.name)
			Eventually(func() v1alpha1.VirtualMachinePrintableStatus {
				return f.VM(ctx, g.name).Status.PrintableStatus
			}).WithContext(ctx).WithTimeout(time.Minute).Should(Equal(v1alpha1.VirtualMachineStatusStopped))
			Eventually(func() []corev1.Pod { return f.LauncherPods(ctx, g.vmi.UID) }).
				WithContext(ctx).WithTimeout(2 * time.Minute).Should(BeEmpty())
			c.Close()
		}
	})

	It("leaves the VMs its new process re-adopted watched: a guest that powers itself off after its driver's plugin was SIGKILLed ends its VMI Succeeded, and the other class's VMI runs on", func(ctx SpecContext) {
		guests := f.bootOneOfEach(ctx, "off", false)
		handler := f.handlerPodOn(ctx, guests[0].vmi.Status.NodeName)
		for _, g := range guests {
			By(fmt.Sprintf("SIGKILL of the %s plugin (%s%s) in the handler pod", g.class.Driver, pluginProgramPrefix, g.class.Driver))
			k := f.killPlugin(ctx, handler, g.class.Driver)
			GinkgoWriter.Printf("%s in %s:\n%s", k.container, k.handlerPod, k.raw)
			Expect(k.restarted).NotTo(Equal(k.killed))
			By(fmt.Sprintf("VMI %s: the restarted %s plugin serves its console, the same boot", g.name, g.class.Driver))
			Expect(f.bootID(ctx, g.name)).To(Equal(g.bootID), "VMI %s: another boot id, the guest booted again", g.name)
		}
		for i, g := range guests {
			By(fmt.Sprintf("VMI %s: its guest powers itself off, and the VMI ends Succeeded", g.name))
			c := f.OpenConsole(ctx, g.name)
			c.Send("\r")
			c.Send(answerCommand)
			c.WaitFor(ctx, answerText, 30*time.Second)
			c.Send("poweroff -f\r")
			Eventually(func(gm Gomega) {
				vmi := f.VMI(ctx, g.name)
				gm.Expect(vmi).NotTo(BeNil())
				gm.Expect(vmi.UID).To(Equal(g.vmi.UID))
				gm.Expect(vmi.Status.Phase).To(Equal(v1alpha1.Succeeded), "VMI %s: %s %s", g.name, vmi.Status.Phase, vmi.Status.Reason)
			}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(),
				"VMI %s after its guest powered off (its %s plugin was SIGKILLed and started again before)", g.name, g.class.Driver)
			c.Close()
			if i == 0 {
				other := f.VMI(ctx, guests[1].name)
				Expect(other.Status.Phase).To(Equal(v1alpha1.Running), "VMI %s", other.Name)
				Expect(other.UID).To(Equal(guests[1].vmi.UID))
			}
		}
	})
})
