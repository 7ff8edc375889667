package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/controlplane/launcherpod"
)

// The node's own pod start, the floor under a VMI's: as many pods as VMIs, created at once,
// each with as many containers as a launcher pod of the bench's VMIs, all running the pause
// image with the launcher pod's helper resources. Nothing of Kubevisor is in their path.
const (
	// DefaultE2EBaselineImage is the pause image `make up` loads (the cluster's sandbox image).
	DefaultE2EBaselineImage = "docker.io/kubevisor/pause:dev"
	// DefaultE2EBaselineContainers is the containers of the bench VMIs' launcher pods: compute,
	// guest-console-log and volume-containerdisk.
	DefaultE2EBaselineContainers = 3
	baselinePodLabel             = "kubevisor.io/bench-baseline"
)

// podBaseline is what the bench saw of the baseline pods.
type podBaseline struct {
	pods       int
	containers int
	running    []time.Duration // create request → first seen Running, sorted
}

// baselineSettle is how long the node is left after the VMIs' deletion before the baseline.
const baselineSettle = 10 * time.Second

// runBaseline measures the node's pod start, after the VMIs are gone, in a namespace of its own,
// twice: idle pods, then busy ones whose first container spends the VMIs' median boot CPU from
// its start (pause -burn), as the VMIs' QEMUs do; and prints the VMIs' creation → Running
// against both.
func (b *e2eBench) runBaseline(ctx context.Context) error {
	vms := b.sortedVMs()
	vmiRunning := e2eLatencies(vms, func(vm *e2eVM) time.Time { return vm.sent }, func(vm *e2eVM) time.Time { return vm.running })
	burn := b.medianBootCPU()
	idle, err := b.baseline(ctx, 0)
	if err != nil {
		return err
	}
	var busy *podBaseline
	if burn > 0 {
		if busy, err = b.baseline(ctx, burn); err != nil {
			return err
		}
	}
	fmt.Fprintf(b.out, "\nthe node's own pod start, %s after the VMIs were gone: %d pods of %d %s containers (a launcher pod's count, its helper resources) created at once; busy: the first container spends %s of CPU from its start (the VMIs' median QEMU CPU up to the marker):\n",
		baselineSettle, idle.pods, idle.containers, b.cfg.BaselineImage, burn)
	tab := table{w: b.out, widths: []int{46, 9, 9, 9, 5}}
	tab.row("", "P50", "P95", "max", "pods")
	row := func(name string, d []time.Duration) {
		tab.row(name, secs(percentile(d, 50)), secs(percentile(d, 95)), secs(percentile(d, 100)), fmt.Sprint(len(d)))
	}
	row("idle baseline pod: create request → Running", idle.running)
	if busy != nil {
		row("busy baseline pod: create request → Running", busy.running)
	}
	row("VMI: create request → Running", vmiRunning)
	for _, vm := range vms {
		if vm.launcher != nil && len(vm.launcher.Spec.Containers) != idle.containers {
			fmt.Fprintf(b.out, "warning: launcher pod %s has %d containers, the baseline's pods %d (--baseline-containers)\n", vm.launcher.Name, len(vm.launcher.Spec.Containers), idle.containers)
			break
		}
	}
	fmt.Fprintf(b.out, "VMI/idle baseline pod at P50: %s, at P95: %s (what Kubevisor and the VMs' own start add to the node's pod start, with the first VMs' QEMU booting meanwhile)\n",
		ratio(percentile(vmiRunning, 50), percentile(idle.running, 50)), ratio(percentile(vmiRunning, 95), percentile(idle.running, 95)))
	if busy != nil {
		fmt.Fprintf(b.out, "VMI/busy baseline pod at P50: %s, at P95: %s (what Kubevisor adds to a pod start under the same CPU contention)\n",
			ratio(percentile(vmiRunning, 50), percentile(busy.running, 50)), ratio(percentile(vmiRunning, 95), percentile(busy.running, 95)))
	}
	return nil
}

// baseline runs one baseline, its pods' first container spending burn of CPU (none when 0), in
// a namespace of its own, after baselineSettle.
func (b *e2eBench) baseline(ctx context.Context, burn time.Duration) (*podBaseline, error) {
	if err := sleep(ctx, baselineSettle); err != nil {
		return nil, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "kv-bench-baseline-", Labels: map[string]string{"kubevisor.io/bench": "e2e"}}}
	if err := b.c.Create(ctx, ns); err != nil {
		return nil, fmt.Errorf("create the baseline's namespace: %w", err)
	}
	bl, err := b.baselinePods(ctx, ns.Name, burn)
	if derr := b.c.Delete(context.WithoutCancel(ctx), ns); client.IgnoreNotFound(derr) != nil {
		err = errors.Join(err, fmt.Errorf("delete namespace %s: %w", ns.Name, derr))
	}
	return bl, err
}

// baselinePods creates the baseline pods in namespace ns (their first containers spending burn
// of CPU), waits until all are Running, deletes them and waits until they are gone.
func (b *e2eBench) baselinePods(ctx context.Context, ns string, burn time.Duration) (*podBaseline, error) {
	n, per := b.cfg.VMIs, b.cfg.BaselineContainers
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	w, err := b.c.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns), client.HasLabels{baselinePodLabel})
	if err != nil {
		return nil, fmt.Errorf("watch baseline pods: %w", err)
	}
	defer w.Stop()

	sent := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			if err := b.c.Create(ctx, baselinePod(ns, b.cfg.BaselineImage, i, per, burn)); err != nil {
				errs[i] = fmt.Errorf("create baseline pod %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(err, b.deleteBaseline(context.WithoutCancel(ctx), ns))
	}
	seen := map[string]time.Duration{}
	for len(seen) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, errors.Join(fmt.Errorf("baseline pods: the watch ended with %d/%d Running", len(seen), n), b.deleteBaseline(context.WithoutCancel(ctx), ns))
			}
			pod, isPod := ev.Object.(*corev1.Pod)
			if !isPod || ev.Type == watch.Deleted {
				continue
			}
			if _, done := seen[pod.Name]; !done && pod.Status.Phase == corev1.PodRunning {
				seen[pod.Name] = time.Since(sent)
			}
		case <-ctx.Done():
			return nil, errors.Join(fmt.Errorf("baseline pods: %d/%d Running after %s: %w", len(seen), n, b.cfg.Timeout, ctx.Err()), b.deleteBaseline(context.WithoutCancel(ctx), ns))
		}
	}
	bl := &podBaseline{pods: n, containers: per}
	for _, d := range seen {
		bl.running = append(bl.running, d)
	}
	slices.Sort(bl.running)
	return bl, b.deleteBaseline(ctx, ns)
}

// baselinePod is baseline pod i: per pause containers, each with the launcher pod's helper
// resources (launcherpod.HelperCPU request, launcherpod.HelperMemory request and limit), the
// first running `pause -burn burn` when burn is not 0.
func baselinePod(ns, image string, i, per int, burn time.Duration) *corev1.Pod {
	zero := int64(0)
	no := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("baseline-%03d", i), Namespace: ns, Labels: map[string]string{baselinePodLabel: "true"}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &zero,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
		},
	}
	res := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: launcherpod.HelperCPU, corev1.ResourceMemory: launcherpod.HelperMemory},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: launcherpod.HelperMemory},
	}
	for c := range per {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
			Name: fmt.Sprintf("c%d", c), Image: image, ImagePullPolicy: corev1.PullIfNotPresent, Resources: res,
		})
	}
	if burn > 0 && per > 0 {
		pod.Spec.Containers[0].Args = []string{"-burn", burn.String()}
	}
	return pod
}

// deleteBaseline deletes the baseline pods and waits until they are gone.
func (b *e2eBench) deleteBaseline(ctx context.Context, ns string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := b.c.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns), client.HasLabels{baselinePodLabel}, client.GracePeriodSeconds(0)); err != nil {
		return fmt.Errorf("delete baseline pods: %w", err)
	}
	for {
		var pods corev1.PodList
		if err := b.c.List(ctx, &pods, client.InNamespace(ns), client.HasLabels{baselinePodLabel}); err == nil && len(pods.Items) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("baseline pods not gone: %w", ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
