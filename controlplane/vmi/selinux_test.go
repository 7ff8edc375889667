package vmi

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kubevisor/kubevisor/controlplane/launcherpod"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/mcs"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// launcherPodAt is a launcher pod of VMI uid at level ("" for none).
func launcherPodAt(ns, name string, uid types.UID, level string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.CreatedByLabel: string(uid)}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "compute", Image: "x"}}},
	}
	if level != "" {
		pod.Spec.SecurityContext = &corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Level: level}}
	}
	return pod
}

// TestLevelsRebuild is a controller restart over 1,000 running VMIs: the levels are rebuilt from
// their launcher pods (the migration target of one at the same level), each VMI keeps its
// level, and 1,000 new VMIs get levels none of them has. Pods that are not launcher pods, pods
// without a level and a pod with an unreadable one take nothing.
func TestLevelsRebuild(t *testing.T) {
	ctx := context.Background()
	first, err := mcs.NewAllocator(0)
	if err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	had := map[types.UID]mcs.Level{}
	for i := range 1000 {
		uid := types.UID(fmt.Sprintf("vmi-%04d", i))
		l, err := first.Allocate(string(uid))
		if err != nil {
			t.Fatal(err)
		}
		had[uid] = l
		objs = append(objs, launcherPodAt(fmt.Sprintf("ns-%d", i%7), fmt.Sprintf("launcher-%d", i), uid, l.String()))
	}
	// The target pod of a migration of vmi-0000, at its level.
	objs = append(objs, launcherPodAt("ns-0", "launcher-0-mig", "vmi-0000", had["vmi-0000"].String()))
	objs = append(objs,
		launcherPodAt("ns-1", "old", "vmi-old", ""),         // made before levels
		launcherPodAt("ns-1", "bad", "vmi-bad", "s0:c9,c3"), // not a level Build writes
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns-1", Name: "other"}, Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Level: "s0:c500,c501"}},
		}}, // not a launcher pod
	)
	c := fake.NewClientBuilder().WithObjects(objs...).Build()
	l := &levels{reader: c}
	if l.holds("vmi-0000") {
		t.Fatal("holds a level before the rebuild")
	}
	a, err := l.allocator(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The 1,000 VMIs' levels, and nothing of the pods without a readable level or of the pod
	// that is no launcher pod.
	if a.Len() != 1000 {
		t.Errorf("%d levels held after the rebuild, want 1000", a.Len())
	}
	for _, uid := range []string{"vmi-old", "vmi-bad"} {
		if l, ok := a.Level(uid); ok {
			t.Errorf("%s holds %s", uid, l)
		}
	}
	taken := map[mcs.Level]bool{}
	for uid, want := range had {
		got, err := l.allocate(ctx, uid)
		if err != nil || got != want {
			t.Fatalf("VMI %s after the restart: %s, %v; want its pods' %s", uid, got, err, want)
		}
		taken[want] = true
	}
	for i := range 1000 {
		uid := types.UID(fmt.Sprintf("new-%d", i))
		got, err := l.allocate(ctx, uid)
		if err != nil {
			t.Fatal(err)
		}
		if taken[got] {
			t.Fatalf("new VMI %s got %s, which another VMI holds", uid, got)
		}
		taken[got] = true
	}
	l.release("vmi-0000")
	if l.holds("vmi-0000") {
		t.Error("vmi-0000 holds its level after the release")
	}
}

// TestLevelsRebuildError: a rebuild that cannot list the pods gives no allocator (a controller
// that allocated from an empty one would give levels that running VMIs have), and the next use
// tries again.
func TestLevelsRebuildError(t *testing.T) {
	l := &levels{reader: failingReader{}}
	if _, err := l.allocate(context.Background(), "u"); err == nil || !strings.Contains(err.Error(), "list launcher pods") {
		t.Fatalf("allocate without a pod list: %v", err)
	}
	if l.alloc != nil {
		t.Fatal("an allocator was kept from a failed rebuild")
	}
	l.reader = fake.NewClientBuilder().Build()
	if _, err := l.allocate(context.Background(), "u"); err != nil {
		t.Fatal(err)
	}
}

type failingReader struct{ client.Reader }

func (failingReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return apierrors.NewServiceUnavailable("etcd is down")
}

// TestSELinuxLevels runs the VMI controller against a real API server with levels of 3
// categories (3 levels): each VMI's launcher pod runs at a level no other VMI's has, recorded
// in its status; a restarted controller keeps them and gives the third to a new VMI; a fourth
// VMI waits with a FailedCreate that says every level is in use, and gets the level of a VMI
// that was deleted, once that VMI's pod is gone.
func TestSELinuxLevels(t *testing.T) {
	ctrl.SetLogger(logr.Discard())
	env := envtest.Start(t, envtest.Options{})
	cfg := env.ImpersonateWithMarkers(t, "vmi-controller", "controller.go")
	opts := Options{
		Pod:                launcherpod.Config{LauncherImage: testImage, LauncherMemoryOverhead: resource.MustParse("100Mi")},
		SkipNameValidation: true,
		SELinuxCategories:  3,
	}
	start := func() (stop func()) {
		mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: envtest.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
		if err != nil {
			t.Fatal(err)
		}
		if err := SetupWithManager(mgr, opts); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- mgr.Start(ctx) }()
		stopped := false
		stop = func() {
			if stopped {
				return
			}
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		}
		t.Cleanup(stop)
		return stop
	}
	h := &harness{c: env.Client}
	ns := h.namespace(t, "selinux")
	class := h.plainClass(t)

	// level waits for the VMI's pod and returns its level, checking that the status says it.
	level := func(name string) mcs.Level {
		t.Helper()
		vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		got := h.waitVMI(t, vmi, "a launcher pod and a level", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.LauncherPodName != "" && v.Status.SELinuxLevel != ""
		})
		var pod corev1.Pod
		if err := h.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: got.Status.LauncherPodName}, &pod); err != nil {
			t.Fatal(err)
		}
		l, ok, err := mcs.PodLevel(&pod)
		if err != nil || !ok {
			t.Fatalf("VMI %s: pod %s has no level (%v)", name, pod.Name, err)
		}
		if got.Status.SELinuxLevel != l.String() {
			t.Errorf("VMI %s: status.selinuxLevel %q, its pod runs at %s", name, got.Status.SELinuxLevel, l)
		}
		if lo, hi := l.Categories(); hi >= 3 || lo >= hi {
			t.Errorf("VMI %s: level %s is not of the categories c0 to c2", name, l)
		}
		return l
	}

	stop := start()
	h.createVMI(t, ns, "a", class)
	h.createVMI(t, ns, "b", class)
	la, lb := level("a"), level("b")
	if la == lb {
		t.Fatalf("VMIs a and b both run at %s", la)
	}

	stop()
	start()
	h.createVMI(t, ns, "c", class)
	lc := level("c")
	if lc == la || lc == lb {
		t.Fatalf("after the restart VMI c got %s: a has %s, b %s", lc, la, lb)
	}
	if level("a") != la || level("b") != lb {
		t.Fatal("a VMI's level changed with the restart")
	}

	d := h.createVMI(t, ns, "d", class)
	h.waitVMI(t, d, "FailedCreate: no level left", func(v *v1alpha1.VirtualMachineInstance) bool {
		c := condition(v.Status, v1alpha1.VirtualMachineInstanceLauncherPodCreated)
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == v1alpha1.ReasonFailedCreate &&
			strings.Contains(c.Message, "every SELinux MCS level is in use")
	})
	h.expectEvent(t, d, corev1.EventTypeWarning, v1alpha1.ReasonFailedCreate)

	a := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a"}}
	if err := h.c.Delete(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	h.wait(t, "VMI a gone", func() bool {
		return apierrors.IsNotFound(h.c.Get(context.Background(), client.ObjectKeyFromObject(a), &v1alpha1.VirtualMachineInstance{}))
	})
	if ld := level("d"); ld != la {
		t.Errorf("VMI d got %s, want the level a released, %s", ld, la)
	}
}
