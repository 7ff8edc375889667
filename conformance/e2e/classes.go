package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// pickTwoClasses chooses the two HypervisorClasses of the TwoClasses spec among classes: the
// two named by told ("a,b", Config.TwoClasses), an error naming what is missing when they are
// not both there; with told empty, the first two by name whose drivers differ, else the first
// two, and skip says why when there are fewer than two.
func pickTwoClasses(classes []v1alpha1.HypervisorClass, told string) (a, b *v1alpha1.HypervisorClass, skip string, err error) {
	byName := map[string]*v1alpha1.HypervisorClass{}
	var names []string
	for i := range classes {
		if classes[i].DeletionTimestamp == nil {
			byName[classes[i].Name] = &classes[i]
			names = append(names, classes[i].Name)
		}
	}
	slices.Sort(names)
	if told != "" {
		want := strings.Split(told, ",")
		if len(want) != 2 || want[0] == "" || want[1] == "" || want[0] == want[1] {
			return nil, nil, "", fmt.Errorf("two classes %q: want two different names, a,b", told)
		}
		var missing []string
		for _, n := range want {
			if byName[n] == nil {
				missing = append(missing, n)
			}
		}
		if len(missing) > 0 {
			return nil, nil, "", fmt.Errorf("the suite was told to run HypervisorClasses %s, and %s not exist (the cluster has %v)",
				told, strings.Join(missing, " and ")+map[bool]string{true: " does", false: " do"}[len(missing) == 1], names)
		}
		return byName[want[0]], byName[want[1]], "", nil
	}
	if len(names) < 2 {
		return nil, nil, fmt.Sprintf("fewer than two HypervisorClasses exist (%v): install two hypervisor drivers, e.g. make up DRIVERS=qmp,libvirt,cni,local", names), nil
	}
	for i, x := range names {
		for _, y := range names[i+1:] {
			if byName[x].Driver != byName[y].Driver {
				return byName[x], byName[y], "", nil
			}
		}
	}
	return byName[names[0]], byName[names[1]], "", nil
}

// vmiColumns are the values of the named columns of VMI name's row in `kubectl get vmi -o wide`.
func (f *Framework) vmiColumns(ctx context.Context, name string, columns ...string) []string {
	GinkgoHelper()
	out, err := f.Kubectl(ctx, "", "get", "vmi", name, "-o", "wide")
	Expect(err).NotTo(HaveOccurred())
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	Expect(lines).To(HaveLen(2), "kubectl get vmi %s -o wide:\n%s", name, out)
	got, err := tableColumns(lines[0], lines[1], columns...)
	Expect(err).NotTo(HaveOccurred(), "kubectl get vmi %s -o wide:\n%s", name, out)
	return got
}

// tableColumns are the values of the named columns of a row of kubectl's table output, cut at
// the header's column starts (a column may be empty: PAUSED of a VMI never paused).
func tableColumns(header, row string, columns ...string) ([]string, error) {
	var starts []int
	for i := range header {
		if header[i] != ' ' && (i == 0 || header[i-1] == ' ') {
			starts = append(starts, i)
		}
	}
	var got []string
	for _, c := range columns {
		k := slices.IndexFunc(starts, func(st int) bool { return strings.Fields(header[st:])[0] == c })
		if k < 0 {
			return nil, fmt.Errorf("no column %s", c)
		}
		from, to := starts[k], len(row)
		if k+1 < len(starts) {
			to = min(starts[k+1], len(row))
		}
		if from > len(row) {
			from = len(row)
		}
		got = append(got, strings.TrimSpace(row[from:to]))
	}
	return got, nil
}

var _ = Describe("Two HypervisorClasses on one node", Label("Conformance", "TwoClasses"), func() {
	f := NewFramework()

	It("runs a VM of each of two classes on one node at once, each with its class's driver, and stopping one leaves the other running", func(ctx SpecContext) {
		var list v1alpha1.HypervisorClassList
		Expect(f.Client.List(ctx, &list)).To(Succeed())
		classA, classB, skip, err := pickTwoClasses(list.Items, Cfg.TwoClasses)
		Expect(err).NotTo(HaveOccurred())
		if skip != "" {
			Skip(skip)
		}
		By(fmt.Sprintf("classes %s (driver %s) and %s (driver %s)", classA.Name, classA.Driver, classB.Name, classB.Driver))

		apply := func(name string, class *v1alpha1.HypervisorClass, node map[string]string) {
			spec := guestSpecOf(guest.Options{UserData: name, HypervisorClass: class.Name})
			spec.NodeSelector = node
			b, err := yaml.Marshal(spec)
			Expect(err).NotTo(HaveOccurred())
			f.Apply(ctx, "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: "+name+"\nspec:\n"+indent(string(b), 2))
		}
		By("a VMI of the first class runs")
		apply("first", classA, nil)
		first := f.WaitRunning(ctx, "first")
		var node corev1.Node
		Expect(f.Client.Get(ctx, types.NamespacedName{Name: first.Status.NodeName}, &node)).To(Succeed())
		host := node.Labels[corev1.LabelHostname]
		Expect(host).NotTo(BeEmpty(), "node %s has no %s label", node.Name, corev1.LabelHostname)

		By("a VMI of the second class runs on the same node at the same time")
		apply("second", classB, map[string]string{corev1.LabelHostname: host})
		second := f.WaitRunning(ctx, "second")
		Expect(second.Status.NodeName).To(Equal(first.Status.NodeName))
		Expect(f.VMI(ctx, "first").Status.Phase).To(Equal(v1alpha1.Running))

		By("each VMI's status, launcher pod and kubectl get vmi -o wide name its own class and driver")
		for _, c := range []struct {
			vmi   *v1alpha1.VirtualMachineInstance
			class *v1alpha1.HypervisorClass
		}{{first, classA}, {second, classB}} {
			Expect(c.vmi.Status.HypervisorClassName).To(Equal(c.class.Name), "VMI %s", c.vmi.Name)
			Expect(c.vmi.Status.HypervisorDriver).To(Equal(c.class.Driver), "VMI %s", c.vmi.Name)
			pods := f.LauncherPods(ctx, c.vmi.UID)
			Expect(pods).To(HaveLen(1), "launcher pods of VMI %s", c.vmi.Name)
			Expect(pods[0].Labels).To(HaveKeyWithValue(v1alpha1.HypervisorDriverLabel, c.class.Driver))
			Expect(f.vmiColumns(ctx, c.vmi.Name, "CLASS", "DRIVER")).To(Equal([]string{c.class.Name, c.class.Driver}))
		}

		By("both guests boot to their ready marker")
		for _, vmi := range []*v1alpha1.VirtualMachineInstance{first, second} {
			Eventually(func() string { return f.Console(ctx, vmi) }).WithContext(ctx).
				WithTimeout(Cfg.BootTimeout).WithPolling(2*time.Second).
				Should(And(ContainSubstring(vmi.Name), ContainSubstring(ReadyMarker)), "console of VMI %s", vmi.Name)
		}

		By("stopping the first leaves the second running")
		_, err = f.Kubectl(ctx, "", "delete", "vmi", "first", "--wait=true", "--timeout=3m")
		Expect(err).NotTo(HaveOccurred())
		f.WaitGone(ctx, "first")
		Consistently(func(g Gomega) {
			vmi := f.VMI(ctx, "second")
			g.Expect(vmi).NotTo(BeNil())
			g.Expect(vmi.Status.Phase).To(Equal(v1alpha1.Running))
			g.Expect(vmi.Status.Conditions).To(ContainElement(And(
				HaveField("Type", v1alpha1.VirtualMachineInstanceReady), HaveField("Status", corev1.ConditionTrue))))
		}).WithContext(ctx).WithTimeout(15 * time.Second).WithPolling(time.Second).Should(Succeed())
		Expect(f.Console(ctx, second)).To(ContainSubstring(ReadyMarker))
	})
})
