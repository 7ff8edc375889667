package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/syncbuf"
)

// The guest's serial root shell: a line ends with a carriage return, as a terminal's Enter
// sends it.
const (
	// answerCommand prints answerText only when the shell runs it (its echo has "$((6*7))").
	answerCommand = "echo $((6*7))-marker\r"
	answerText    = "42-marker"
	// heartbeatCommand prints HB-<uptime> every second in the background.
	heartbeatCommand = "while :; do read -r up idle </proc/uptime; echo HB-$up; sleep 1; done &\r"
)

// bootGuest applies a VM of the test guest with runStrategy Always and waits until its VMI
// is Running and its console log shows the ready marker.
func (f *Framework) bootGuest(ctx context.Context, name string) *v1alpha1.VirtualMachineInstance {
	GinkgoHelper()
	f.Apply(ctx, vmManifest(name, "Always", "vmctl-"+name))
	vmi := f.WaitRunning(ctx, name)
	f.WaitReady(ctx, vmi)
	return vmi
}

// WaitReady waits until the VMI's console log shows the ready marker.
func (f *Framework) WaitReady(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) {
	GinkgoHelper()
	Eventually(func() string { return f.Console(ctx, vmi) }).WithContext(ctx).
		WithTimeout(Cfg.BootTimeout).WithPolling(2*time.Second).Should(ContainSubstring(ReadyMarker),
		"VMI %s (%s): no %s on its console", vmi.Name, vmi.UID, ReadyMarker)
}

// paused reports whether the VMI's Paused condition is True.
func (f *Framework) paused(ctx context.Context, name string) bool {
	vmi := f.VMI(ctx, name)
	if vmi == nil {
		return false
	}
	c := v1alpha1.InstanceCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstancePaused)
	return c != nil && c.Status == corev1.ConditionTrue
}

// freePort returns a TCP port of 127.0.0.1 that nothing listens on just now.
func freePort() int {
	GinkgoHelper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// httpGet GETs url on a connection of its own and returns the body.
func httpGet(ctx context.Context, url string) (string, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(body), nil
}

// refused says whether vmctl's failure tells the user it was not allowed: the API server's
// "forbidden", or the hint naming the role that would allow it.
func refused(err error) bool {
	s := strings.ToLower(err.Error())
	return strings.Contains(s, "forbidden") || strings.Contains(s, "kubevisor.io:edit")
}

var _ = Describe("vmctl", Label("Conformance"), func() {
	f := NewFramework()

	BeforeEach(func() {
		_, err := exec.LookPath(Cfg.Vmctl)
		Expect(err).NotTo(HaveOccurred(), "vmctl binary %q (make e2e builds bin/vmctl; pass -vmctl)", Cfg.Vmctl)
	})

	It("console with a pipe as stdin shows the guest's ready marker and runs a command in its serial shell", func(ctx SpecContext) {
		const name = "console"
		f.bootGuest(ctx, name)
		c := f.OpenConsole(ctx, name)
		By("the console's backlog holds the ready marker")
		c.WaitFor(ctx, ReadyMarker, time.Minute)
		By("a command typed into the serial root shell answers")
		c.Send("\r")
		c.Send(answerCommand)
		c.WaitFor(ctx, answerText, 30*time.Second)
	})

	It("console in a terminal (tmux) answers typed keys and exits on Ctrl-]", func(ctx SpecContext) {
		const name = "tty"
		f.bootGuest(ctx, name)
		argv := append([]string{Cfg.Vmctl}, vmctlArgs(Cfg.Kubeconfig, f.Namespace, "console", name)...)
		tm, err := NewTmux(ctx, "kv-"+f.Namespace, 160, 48, argv...)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx context.Context) { _ = tm.Kill(ctx) })
		pane := func() string {
			out, err := tm.Capture(ctx)
			Expect(err).NotTo(HaveOccurred())
			return out
		}
		By("Enter gives the guest shell's prompt; a typed command answers")
		Expect(tm.SendKeys(ctx, "Enter")).To(Succeed())
		Expect(tm.SendText(ctx, "echo $((7*6))-tty")).To(Succeed())
		Expect(tm.SendKeys(ctx, "Enter")).To(Succeed())
		Eventually(pane).WithContext(ctx).WithTimeout(time.Minute).WithPolling(500 * time.Millisecond).
			Should(ContainSubstring("42-tty"))
		_, exited := Exited(pane())
		Expect(exited).To(BeFalse(), "vmctl exited before Ctrl-]:\n%s", pane())

		By("Ctrl-] ends vmctl console, and it exits 0")
		Expect(tm.SendKeys(ctx, "C-]")).To(Succeed())
		var status string
		Eventually(func(g Gomega) {
			s, ok := Exited(pane())
			g.Expect(ok).To(BeTrue(), "vmctl still running after Ctrl-]:\n%s", pane())
			status = s
		}).WithContext(ctx).WithTimeout(15 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
		Expect(status).To(Equal("0"), "vmctl console's exit status:\n%s", pane())
	})

	It("vnc screenshot writes a PNG of the guest's display that is not blank", func(ctx SpecContext) {
		const name = "vnc"
		f.bootGuest(ctx, name)
		file := filepath.Join(GinkgoT().TempDir(), "screen.png")
		Eventually(func(g Gomega) {
			out, err := f.Vmctl(ctx, "vnc", "screenshot", name, "-o", file)
			g.Expect(err).NotTo(HaveOccurred(), out)
			data, err := os.ReadFile(file)
			g.Expect(err).NotTo(HaveOccurred())
			shot, err := ReadScreenshot(data)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(shot.Plausible()).To(Succeed())
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(5 * time.Second).Should(Succeed())
	})

	It("port-forward reaches the guest's web server on port 80 from 127.0.0.1, a WebSocket per connection", func(ctx SpecContext) {
		const name = "pf"
		f.bootGuest(ctx, name)
		port := freePort()
		errb := &syncbuf.Buffer{}
		pf := exec.Command(Cfg.Vmctl, vmctlArgs(Cfg.Kubeconfig, f.Namespace, "port-forward", "vm/"+name, fmt.Sprintf("%d:80", port))...)
		pf.Stdout, pf.Stderr = GinkgoWriter, errb
		Expect(pf.Start()).To(Succeed())
		DeferCleanup(func() { _ = pf.Process.Kill(); _ = pf.Wait() })
		url := fmt.Sprintf("http://127.0.0.1:%d/", port)
		By("the first GET, once vmctl listens")
		Eventually(func() (string, error) { return httpGet(ctx, url) }).WithContext(ctx).
			WithTimeout(time.Minute).WithPolling(time.Second).Should(ContainSubstring(guest.WebAnswer), "vmctl stderr: %s", errb)
		By("more GETs, each on a connection of its own")
		for range 3 {
			Expect(httpGet(ctx, url)).To(ContainSubstring(guest.WebAnswer), "vmctl stderr: %s", errb)
		}

		By("--stdio: one connection on vmctl's stdin and stdout")
		stdio := exec.Command(Cfg.Vmctl, vmctlArgs(Cfg.Kubeconfig, f.Namespace, "port-forward", "--stdio", "vm/"+name, "80")...)
		out, serr := &syncbuf.Buffer{}, &syncbuf.Buffer{}
		stdio.Stdout, stdio.Stderr = out, serr
		in, err := stdio.StdinPipe()
		Expect(err).NotTo(HaveOccurred())
		Expect(stdio.Start()).To(Succeed())
		DeferCleanup(func() { _ = stdio.Process.Kill(); _ = stdio.Wait() })
		_, err = io.WriteString(in, "GET / HTTP/1.0\r\nHost: guest\r\n\r\n")
		Expect(err).NotTo(HaveOccurred())
		Eventually(out.String).WithContext(ctx).WithTimeout(30*time.Second).
			Should(And(HavePrefix("HTTP/1."), ContainSubstring(guest.WebAnswer)), "vmctl --stdio stderr: %s", serr)
	})

	It("ssh runs a command in the guest with the system ssh client, through port-forward, with a key from cloud-init", func(ctx SpecContext) {
		const name = "ssh"
		key := filepath.Join(GinkgoT().TempDir(), "id_ed25519")
		out, err := exec.CommandContext(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "e2e-"+f.Namespace, "-f", key).CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "ssh-keygen: %s", out)
		pub, err := os.ReadFile(key + ".pub")
		Expect(err).NotTo(HaveOccurred())
		f.Apply(ctx, vmManifest(name, "Always", "#cloud-config\nssh_authorized_keys:\n  - "+strings.TrimSpace(string(pub))+"\n"))
		f.WaitReady(ctx, f.WaitRunning(ctx, name))
		By("vmctl ssh root@vm/NAME -- -i KEY COMMAND")
		var got string
		Eventually(func() (string, error) {
			got, err = f.Vmctl(ctx, "ssh", "root@vm/"+name, "--", "-i", key, "-o", "BatchMode=yes",
				"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
				"echo ssh-$((6*7)) on $(hostname)")
			return got, err
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(2*time.Second).Should(ContainSubstring("ssh-42 on "), "vmctl ssh: %s", got)
	})

	It("startStrategy Paused starts the VMI Running and Paused with a guest that never ran; unpause boots it", func(ctx SpecContext) {
		const name = "startpaused"
		spec := guestSpecOf(guest.Options{UserData: name})
		paused := v1alpha1.StartStrategyPaused
		spec.StartStrategy = &paused
		b, err := yaml.Marshal(spec)
		Expect(err).NotTo(HaveOccurred())
		f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: "+name+"\nspec:\n"+indent(string(b), 2))
		vmi := f.WaitRunning(ctx, name)
		Eventually(func() bool { return f.paused(ctx, name) }).WithContext(ctx).WithTimeout(30 * time.Second).Should(BeTrue())
		Consistently(func() string { return f.Console(ctx, vmi) }).WithContext(ctx).
			WithTimeout(5*time.Second).WithPolling(time.Second).ShouldNot(ContainSubstring(ReadyMarker), "the guest ran while started paused")
		f.VmctlOK(ctx, "unpause", "vmi", name)
		f.WaitReady(ctx, vmi)
		Expect(f.paused(ctx, name)).To(BeFalse())
	})

	It("ssh logs in with a key of accessCredentials, into user data from a Secret, and the guest's hostname is spec.hostname", func(ctx SpecContext) {
		const name = "access"
		key := filepath.Join(GinkgoT().TempDir(), "id_ed25519")
		out, err := exec.CommandContext(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "e2e-"+f.Namespace, "-f", key).CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "ssh-keygen: %s", out)
		pub, err := os.ReadFile(key + ".pub")
		Expect(err).NotTo(HaveOccurred())
		By("a Secret of keys and a Secret of user data, which the launcher pod mounts and the handler reads there")
		f.Apply(ctx, "apiVersion: v1\nkind: Secret\nmetadata:\n  name: access-keys\nstringData:\n  key: "+strings.TrimSpace(string(pub))+"\n"+
			"---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: access-userdata\nstringData:\n  userdata: |\n    #cloud-config\n    # access\n")
		spec := guestSpecOf(guest.Options{UserData: name})
		spec.Hostname = "db-0"
		for i := range spec.Volumes {
			if ci := spec.Volumes[i].CloudInitNoCloud; ci != nil {
				ci.UserData, ci.UserDataSecretRef = "", &corev1.LocalObjectReference{Name: "access-userdata"}
			}
		}
		spec.AccessCredentials = []v1alpha1.AccessCredential{{SSHPublicKey: &v1alpha1.SSHPublicKeyAccessCredential{
			Source:            v1alpha1.SSHPublicKeyAccessCredentialSource{Secret: &v1alpha1.AccessCredentialSecretSource{SecretName: "access-keys"}},
			PropagationMethod: v1alpha1.SSHPublicKeyAccessCredentialPropagationMethod{NoCloud: &v1alpha1.NoCloudSSHPublicKeyAccessCredentialPropagation{}},
		}}}
		b, err := yaml.Marshal(spec)
		Expect(err).NotTo(HaveOccurred())
		f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: "+name+"\nspec:\n"+indent(string(b), 2))
		vmi := f.WaitRunning(ctx, name)
		Eventually(func() string { return f.Console(ctx, vmi) }).WithContext(ctx).WithTimeout(Cfg.BootTimeout).WithPolling(2 * time.Second).
			Should(ContainSubstring("KUBEVISOR-SSH: 1 authorized keys"))
		f.WaitReady(ctx, vmi)
		By("vmctl ssh root@vmi/NAME -- -i KEY COMMAND")
		var got string
		Eventually(func() (string, error) {
			got, err = f.Vmctl(ctx, "ssh", "root@vmi/"+name, "--", "-i", key, "-o", "BatchMode=yes",
				"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
				"echo ssh-$((6*7)) on $(hostname)")
			return got, err
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(2*time.Second).Should(ContainSubstring("ssh-42 on db-0"), "vmctl ssh: %s", got)
	})

	It("pause stops the guest and unpause resumes it where it was, without a reboot", func(ctx SpecContext) {
		const name = "pause"
		vmi := f.bootGuest(ctx, name)
		c := f.OpenConsole(ctx, name)
		c.WaitFor(ctx, ReadyMarker, time.Minute)
		By("a heartbeat loop in the guest prints its uptime every second")
		c.Send("\r")
		c.Send(heartbeatCommand)
		Eventually(func() int { return len(Heartbeats(c.Output())) }).WithContext(ctx).
			WithTimeout(30*time.Second).Should(BeNumerically(">=", 3), "console: %s", c.out)

		By("vmctl pause vmi: the VMI is Paused and no heartbeat comes")
		f.VmctlOK(ctx, "pause", "vmi", name)
		Eventually(func() bool { return f.paused(ctx, name) }).WithContext(ctx).
			WithTimeout(30 * time.Second).Should(BeTrue())
		time.Sleep(time.Second) // a line the guest printed just before it stopped may be on its way
		before := Heartbeats(c.Output())
		Consistently(func() int { return len(Heartbeats(c.Output())) }).WithContext(ctx).
			WithTimeout(5 * time.Second).WithPolling(250 * time.Millisecond).Should(Equal(len(before)))

		By("vmctl unpause vmi: heartbeats come again, the uptime goes on, the guest did not reboot")
		f.VmctlOK(ctx, "unpause", "vmi", name)
		Eventually(func() bool { return f.paused(ctx, name) }).WithContext(ctx).
			WithTimeout(30 * time.Second).Should(BeFalse())
		Eventually(func() int { return len(Heartbeats(c.Output())) }).WithContext(ctx).
			WithTimeout(30 * time.Second).Should(BeNumerically(">=", len(before)+3))
		ups := Heartbeats(c.Output())
		for i := 1; i < len(ups); i++ {
			Expect(ups[i]).To(BeNumerically(">", ups[i-1]), "uptimes %v: the guest's clock went back (a reboot?)", ups)
		}
		Expect(strings.Count(c.Output(), ReadyMarker)).To(Equal(1), "a second ready marker: the guest rebooted")
		Expect(f.VMI(ctx, name).UID).To(Equal(vmi.UID))
	})

	It("soft-reboot has the guest reboot itself (ACPI) and reset resets it, both in the same VMI and VM process", func(ctx SpecContext) {
		const name = "reboot"
		vmi := f.bootGuest(ctx, name)
		// One console session throughout: it would end if the VM process did.
		c := f.OpenConsole(ctx, name)
		c.WaitFor(ctx, ReadyMarker, time.Minute)
		for i, action := range []string{"soft-reboot", "reset"} {
			By("vmctl " + action + ": the guest boots again on the same console, the VMI stays Running")
			f.VmctlOK(ctx, action, name)
			Eventually(func() int { return strings.Count(c.Output(), ReadyMarker) }).WithContext(ctx).
				WithTimeout(Cfg.BootTimeout).WithPolling(time.Second).Should(Equal(i+2), "console: %s", c.out)
			got := f.VMI(ctx, name)
			Expect(got.UID).To(Equal(vmi.UID), "vmctl %s made a new VMI", action)
			Expect(got.Status.Phase).To(Equal(v1alpha1.Running))
			Expect(got.Status.LauncherPodName).To(Equal(vmi.Status.LauncherPodName), "vmctl %s made a new launcher pod", action)
			Expect(c.Exited()).To(BeFalse(), "the console ended at vmctl %s: %s", action, c.Stderr())
		}
	})

	It("stop halts the VM, start runs it again, restart boots a new VMI that console --follow reconnects to", func(ctx SpecContext) {
		const name = "power"
		vmi := f.bootGuest(ctx, name)

		By("vmctl stop: runStrategy Halted, the VMI goes")
		f.VmctlOK(ctx, "stop", name)
		Eventually(func() v1alpha1.VirtualMachineRunStrategy {
			rs := f.VM(ctx, name).Spec.RunStrategy
			if rs == nil {
				return ""
			}
			return *rs
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Equal(v1alpha1.RunStrategyHalted))
		f.WaitGone(ctx, name)

		By("vmctl start: a new VMI runs and boots")
		f.VmctlOK(ctx, "start", name)
		started := f.WaitRunning(ctx, name)
		Expect(started.UID).NotTo(Equal(vmi.UID))
		f.WaitReady(ctx, started)

		By("vmctl restart: another VMI (a new UID) runs and boots, and console --follow shows it")
		follow := f.OpenConsole(ctx, name, "--follow")
		follow.Send("\r")
		follow.Send("echo follow-$((2+3))\r")
		follow.WaitFor(ctx, "follow-5", time.Minute) // attached to the shell
		markers := strings.Count(follow.Output(), ReadyMarker)
		f.VmctlOK(ctx, "restart", name)
		var restarted *v1alpha1.VirtualMachineInstance
		Eventually(func(g Gomega) {
			restarted = f.VMI(ctx, name)
			g.Expect(restarted).NotTo(BeNil())
			g.Expect(restarted.UID).NotTo(Equal(started.UID))
			g.Expect(restarted.Status.Phase).To(Equal(v1alpha1.Running))
		}).WithContext(ctx).WithTimeout(Cfg.BootTimeout).WithPolling(time.Second).Should(Succeed())
		f.WaitReady(ctx, restarted)
		Eventually(func() int { return strings.Count(follow.Output(), ReadyMarker) }).WithContext(ctx).
			WithTimeout(Cfg.BootTimeout).WithPolling(time.Second).Should(BeNumerically(">", markers),
			"vmctl console --follow did not show the new VMI's boot: stderr %s", follow.Stderr())
		Expect(follow.Exited()).To(BeFalse(), "vmctl console --follow exited at the restart: %s", follow.Stderr())
	})

	It("a user bound to kubevisor.io:view may neither pause nor open the console; with kubevisor.io:edit both work", func(ctx SpecContext) {
		const name = "rbac"
		f.bootGuest(ctx, name)
		sa := f.ServiceAccount(ctx, "e2e-user")
		f.BindClusterRole(ctx, sa, "kubevisor.io:view")
		kubeconfig := f.KubeconfigFor(ctx, sa)

		By("view: vmctl pause is refused")
		// RBAC caches are quick but not instant: the first answers may still be a plain 403
		// before the binding exists, which is the same refusal.
		out, err := f.VmctlAs(ctx, kubeconfig, "pause", "vmi", name)
		Expect(err).To(HaveOccurred(), "vmctl pause as kubevisor.io:view succeeded: %s", out)
		Expect(refused(err)).To(BeTrue(), "vmctl pause's error says neither forbidden nor the role: %v", err)
		Expect(f.paused(ctx, name)).To(BeFalse())

		By("view: vmctl console is refused")
		out, err = f.VmctlAs(ctx, kubeconfig, "console", name)
		Expect(err).To(HaveOccurred(), "vmctl console as kubevisor.io:view succeeded: %s", out)
		Expect(refused(err)).To(BeTrue(), "vmctl console's error says neither forbidden nor the role: %v", err)

		By("edit: vmctl pause and unpause work")
		f.BindClusterRole(ctx, sa, "kubevisor.io:edit")
		Eventually(func() error {
			_, err := f.VmctlAs(ctx, kubeconfig, "pause", "vmi", name)
			return err
		}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(2 * time.Second).Should(Succeed())
		Eventually(func() bool { return f.paused(ctx, name) }).WithContext(ctx).
			WithTimeout(30 * time.Second).Should(BeTrue())
		_, err = f.VmctlAs(ctx, kubeconfig, "unpause", "vmi", name)
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() bool { return f.paused(ctx, name) }).WithContext(ctx).
			WithTimeout(30 * time.Second).Should(BeFalse())

		By("edit: vmctl console attaches and the guest's shell answers")
		c := f.OpenConsoleAs(ctx, kubeconfig, name)
		c.Send("\r")
		c.Send("echo edit-$((6*7))\r")
		c.WaitFor(ctx, "edit-42", time.Minute)
	})
})

var _ = Describe("Subresource API", Label("Conformance"), func() {
	f := NewFramework()

	It("is available and lists its subresources in discovery; vmctl version shows the server's", func(ctx SpecContext) {
		gv := subv1.GroupVersion.String()
		By("the APIService is Available")
		Eventually(func() (string, error) {
			return f.Kubectl(ctx, "", "get", "apiservice", subv1.GroupVersion.Version+"."+subv1.GroupName,
				"-o", `jsonpath={.status.conditions[?(@.type=="Available")].status}`)
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(Equal("True"))

		By("kubectl get --raw /apis/" + gv)
		raw, err := f.Kubectl(ctx, "", "get", "--raw", "/apis/"+gv)
		Expect(err).NotTo(HaveOccurred())
		var list metav1.APIResourceList
		Expect(json.Unmarshal([]byte(raw), &list)).To(Succeed(), raw)
		Expect(list.GroupVersion).To(Equal(gv))
		var names []string
		for _, r := range list.APIResources {
			names = append(names, r.Name)
		}
		vmi := func(s string) string { return subv1.VirtualMachineInstances + "/" + s }
		vm := func(s string) string { return subv1.VirtualMachines + "/" + s }
		Expect(names).To(ContainElements(
			vmi(subv1.SubresourceConsole), vmi(subv1.SubresourceVNC), vmi(subv1.SubresourcePortForward),
			vmi(subv1.SubresourcePause), vmi(subv1.SubresourceUnpause), vmi(subv1.SubresourceSoftReboot),
			vmi(subv1.SubresourceReset), vmi(subv1.SubresourceGuestOSInfo),
			vm(subv1.SubresourceStart), vm(subv1.SubresourceStop), vm(subv1.SubresourceRestart),
			vm(subv1.SubresourceMigrate), vm(subv1.SubresourceCancelMigration),
		), raw)

		By("the server's version, and vmctl version printing it")
		raw, err = f.Kubectl(ctx, "", "get", "--raw", "/apis/"+gv+"/version")
		Expect(err).NotTo(HaveOccurred())
		var sv subv1.ServerVersion
		Expect(json.Unmarshal([]byte(raw), &sv)).To(Succeed(), raw)
		Expect(sv.GitVersion).NotTo(BeEmpty(), raw)
		_, err = exec.LookPath(Cfg.Vmctl)
		Expect(err).NotTo(HaveOccurred(), "vmctl binary %q (make e2e builds bin/vmctl; pass -vmctl)", Cfg.Vmctl)
		Expect(f.VmctlOK(ctx, "version")).To(ContainSubstring(sv.GitVersion))
	})
})
