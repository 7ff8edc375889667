// Package e2e is Kubevisor's cluster conformance suite (Ginkgo): VMs driven through a real
// cluster with kubectl and the API, against any cluster given a kubeconfig where Kubevisor is
// installed. The specs live in this package; the test entry point (e2e_test.go) is behind the
// `e2e` build tag so that `go test ./...` never runs them. `make e2e` runs them on the local
// cluster and writes a JUnit report.
//
// Labels select lanes: Conformance (what every installation must pass), RequiresKVM,
// RequiresTwoNodes.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// Config is what the suite runs against; the test entry point fills it from flags.
type Config struct {
	// Kubeconfig reaches the cluster ("" : $KUBECONFIG or ~/.kube/config).
	Kubeconfig string
	// Kubectl is the kubectl binary the specs drive the cluster with, as a user would.
	Kubectl string
	// Vmctl is the vmctl binary the subresource specs drive (make e2e builds bin/vmctl).
	Vmctl string
	// GuestImage is the test guest's containerDisk image (make guest; hack/guest).
	GuestImage string
	// ClientImage holds the e2e-httpget program (conformance/e2e/httpget) in /usr/local/bin,
	// for requests from a pod.
	ClientImage string
	// SignalImage holds the e2e-signal program (conformance/e2e/signal) in /usr/local/bin, run
	// in an ephemeral container of a handler pod to kill a driver plugin.
	SignalImage string
	// BootTimeout bounds creation to Running (TCG guests boot in tens of seconds).
	BootTimeout time.Duration
	// HypervisorClass is the HypervisorClass of the VMIs the specs make ("": the cluster's
	// default class), so that one suite runs against each hypervisor driver.
	HypervisorClass string
	// TwoClasses names the two HypervisorClasses of the TwoClasses spec ("a,b"). Set, the spec
	// fails when they do not both exist; unset, it takes the first two classes of the cluster
	// (by name) and is skipped when there are fewer.
	TwoClasses string
	// UpgradeTag is the image tag the upgrade spec moves the install to (an image set of the
	// same tree under another tag, make e2e-upgrade), and back from.
	UpgradeTag string
	// UpgradePairs is how many VMs of each of two classes the upgrade spec runs (default 1).
	UpgradePairs int
	// LocalCluster is the local cluster's scripts directory (hack/cluster) when the cluster
	// under test is the local one on this machine: the fault matrix's cases that restart the
	// node's processes run them. "": another cluster.
	LocalCluster string
	// SoakDuration is how long the soak (label Soak) creates and deletes VMIs.
	SoakDuration time.Duration
}

// Cfg is the suite's configuration.
var Cfg = Config{
	Kubectl:      "kubectl",
	Vmctl:        "vmctl",
	GuestImage:   guest.DefaultImage,
	ClientImage:  "kubevisor/e2e-httpget:dev",
	SignalImage:  "kubevisor/e2e-signal:dev",
	BootTimeout:  5 * time.Minute,
	SoakDuration: 10 * time.Minute,
}

// ReadyMarker is what the test guest prints on its serial console when it is up
// (hack/guest); UserDataMarker brackets the cloud-init user-data it prints.
const (
	ReadyMarker    = "KUBEVISOR-GUEST-READY"
	UserDataMarker = "KUBEVISOR-USERDATA-BEGIN"
)

// Framework is one spec's view of the cluster: a client and a namespace of its own, deleted
// after the spec.
type Framework struct {
	Client    client.Client
	Namespace string
}

// FrameworkOption shapes the namespace NewFramework makes.
type FrameworkOption func(labels map[string]string)

// EnforcePodSecurity has the namespace enforce Pod Security's level (restricted, baseline) at
// the cluster's latest version, as pod-security.kubernetes.io/enforce does.
func EnforcePodSecurity(level string) FrameworkOption {
	return func(labels map[string]string) {
		labels["pod-security.kubernetes.io/enforce"] = level
		labels["pod-security.kubernetes.io/enforce-version"] = "latest"
	}
}

// NewFramework makes a namespace for the spec it is called in and removes it afterwards.
func NewFramework(opts ...FrameworkOption) *Framework {
	f := &Framework{}
	BeforeEach(func(ctx SpecContext) {
		c, err := newClient(Cfg.Kubeconfig)
		Expect(err).NotTo(HaveOccurred())
		f.Client = c
		labels := map[string]string{"kubevisor.io/e2e": "true"}
		for _, o := range opts {
			o(labels)
		}
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "kv-e2e-", Labels: labels}}
		Expect(c.Create(ctx, ns)).To(Succeed())
		f.Namespace = ns.Name
		DeferCleanup(func(ctx SpecContext) {
			Expect(client.IgnoreNotFound(c.Delete(ctx, ns))).To(Succeed())
		})
	})
	return f
}

// newClient is a client of the cluster of kubeconfig that can also watch.
func newClient(kubeconfig string) (client.WithWatch, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	return client.NewWithWatch(rc, client.Options{Scheme: scheme})
}

// Kubectl runs kubectl in the spec's namespace with stdin, returning its output; a failure
// carries kubectl's stderr.
func (f *Framework) Kubectl(ctx context.Context, stdin string, args ...string) (string, error) {
	full := []string{"--namespace", f.Namespace}
	if Cfg.Kubeconfig != "" {
		full = append(full, "--kubeconfig", Cfg.Kubeconfig)
	}
	cmd := exec.CommandContext(ctx, Cfg.Kubectl, append(full, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

// Apply is `kubectl apply -f -` of a manifest in the spec's namespace.
func (f *Framework) Apply(ctx context.Context, manifest string) {
	GinkgoHelper()
	out, err := f.Kubectl(ctx, manifest, "apply", "-f", "-")
	Expect(err).NotTo(HaveOccurred(), out)
}

// VMI returns the stored VMI, nil when there is none.
func (f *Framework) VMI(ctx context.Context, name string) *v1alpha1.VirtualMachineInstance {
	GinkgoHelper()
	var vmi v1alpha1.VirtualMachineInstance
	err := f.Client.Get(ctx, types.NamespacedName{Namespace: f.Namespace, Name: name}, &vmi)
	if apierrors.IsNotFound(err) {
		return nil
	}
	Expect(err).NotTo(HaveOccurred())
	return &vmi
}

// VM returns the stored VM.
func (f *Framework) VM(ctx context.Context, name string) *v1alpha1.VirtualMachine {
	GinkgoHelper()
	var vm v1alpha1.VirtualMachine
	Expect(f.Client.Get(ctx, types.NamespacedName{Namespace: f.Namespace, Name: name}, &vm)).To(Succeed())
	return &vm
}

// WaitRunning waits until the VMI is Running and returns it; a VMI that fails on the way
// fails the spec with its status.
func (f *Framework) WaitRunning(ctx context.Context, name string) *v1alpha1.VirtualMachineInstance {
	GinkgoHelper()
	var vmi *v1alpha1.VirtualMachineInstance
	Eventually(func(g Gomega) {
		vmi = f.VMI(ctx, name)
		g.Expect(vmi).NotTo(BeNil(), "VMI %s does not exist", name)
		g.Expect(vmi.Status.Phase).NotTo(Equal(v1alpha1.Failed), "VMI %s failed: %+v", name, vmi.Status)
		g.Expect(vmi.Status.Phase).To(Equal(v1alpha1.Running), "VMI %s: %+v", name, vmi.Status)
	}).WithContext(ctx).WithTimeout(Cfg.BootTimeout).WithPolling(time.Second).Should(Succeed())
	return vmi
}

// WaitGone waits until the VMI no longer exists.
func (f *Framework) WaitGone(ctx context.Context, name string) {
	GinkgoHelper()
	Eventually(func() *v1alpha1.VirtualMachineInstance { return f.VMI(ctx, name) }).
		WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(BeNil())
}

// LauncherPods lists the launcher pods of a VMI UID.
func (f *Framework) LauncherPods(ctx context.Context, uid types.UID) []corev1.Pod {
	GinkgoHelper()
	var pods corev1.PodList
	Expect(f.Client.List(ctx, &pods, client.InNamespace(f.Namespace),
		client.MatchingLabels{v1alpha1.CreatedByLabel: string(uid)})).To(Succeed())
	return pods.Items
}

// Console returns what the VMI's guest printed on its serial console so far: the launcher
// pod's guest-console-log container's log.
func (f *Framework) Console(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) string {
	GinkgoHelper()
	pods := f.LauncherPods(ctx, vmi.UID)
	Expect(pods).NotTo(BeEmpty(), "no launcher pod for VMI %s", vmi.Name)
	out, err := f.Kubectl(ctx, "", "logs", pods[0].Name, "-c", layout.ConsoleLogContainer)
	Expect(err).NotTo(HaveOccurred())
	return out
}

// GuestIP is the VMI's first interface's IP.
func GuestIP(vmi *v1alpha1.VirtualMachineInstance) string {
	if len(vmi.Status.Interfaces) == 0 {
		return ""
	}
	return vmi.Status.Interfaces[0].IP
}

// HTTPFromPod runs a pod with the client image that GETs url and returns what it printed
// (status line and body).
func (f *Framework) HTTPFromPod(ctx context.Context, url string) string {
	GinkgoHelper()
	return f.HTTPFromPodOn(ctx, "", url)
}

// HTTPFromPodOn is HTTPFromPod from a pod on the node named node ("": wherever it is scheduled).
func (f *Framework) HTTPFromPodOn(ctx context.Context, node, url string) string {
	GinkgoHelper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "httpget-", Namespace: f.Namespace},
		Spec: corev1.PodSpec{
			NodeName:      node,
			RestartPolicy: corev1.RestartPolicyNever,
			// What Pod Security's restricted level asks, so that it runs in any namespace.
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65534),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "get", Image: Cfg.ClientImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"/usr/local/bin/e2e-httpget", "--retry-for", "60s", url},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	Expect(f.Client.Create(ctx, pod)).To(Succeed())
	Eventually(func(g Gomega) {
		g.Expect(f.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		g.Expect(pod.Status.Phase).To(BeElementOf(corev1.PodSucceeded, corev1.PodFailed))
	}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	out, err := f.Kubectl(ctx, "", "logs", pod.Name)
	Expect(err).NotTo(HaveOccurred())
	Expect(pod.Status.Phase).To(Equal(corev1.PodSucceeded), "GET %s from a pod: %s", url, out)
	if node != "" {
		Expect(pod.Spec.NodeName).To(Equal(node))
	}
	return out
}

// RequireTwoNodes returns the names of two schedulable nodes (Ready, not cordoned, no NoSchedule
// or NoExecute taint), in name order, for the specs labelled RequiresTwoNodes. With fewer, the
// spec is skipped, or fails under CI=true: a lane that asked for two nodes must not pass by
// running nothing. The local cluster has two with make up NODES=2.
func (f *Framework) RequireTwoNodes(ctx context.Context) (string, string) {
	GinkgoHelper()
	var nodes corev1.NodeList
	Expect(f.Client.List(ctx, &nodes)).To(Succeed())
	var names, others []string
	for _, n := range nodes.Items {
		if why := unschedulable(n); why != "" {
			others = append(others, n.Name+" ("+why+")")
			continue
		}
		names = append(names, n.Name)
	}
	slices.Sort(names)
	if len(names) < 2 {
		msg := fmt.Sprintf("RequiresTwoNodes: the cluster has %d schedulable node(s) %v (others: %v); the local cluster gets two with make up NODES=2",
			len(names), names, others)
		if testenv.CI() {
			Fail(msg)
		}
		Skip(msg)
	}
	return names[0], names[1]
}

// unschedulable says why new pods cannot run on the node ("" when they can).
func unschedulable(n corev1.Node) string {
	if n.Spec.Unschedulable {
		return "cordoned"
	}
	for _, t := range n.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
			return "taint " + t.Key
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return ""
		}
	}
	return "not Ready"
}
