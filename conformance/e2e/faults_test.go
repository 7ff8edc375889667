package e2e

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

func TestLiveLaunchers(t *testing.T) {
	now := metav1.Now()
	pod := func(uid string, phase corev1.PodPhase, deleting bool) corev1.Pod {
		p := corev1.Pod{Status: corev1.PodStatus{Phase: phase}}
		if uid != "" {
			p.Labels = map[string]string{v1alpha1.CreatedByLabel: uid}
		}
		if deleting {
			p.DeletionTimestamp = &now
		}
		return p
	}
	got := liveLaunchers([]corev1.Pod{
		pod("a", corev1.PodRunning, false),
		pod("a", corev1.PodPending, false), // a second live one: a duplicate
		pod("b", corev1.PodRunning, false),
		pod("b", corev1.PodRunning, true),    // being deleted
		pod("b", corev1.PodSucceeded, false), // ended
		pod("c", corev1.PodFailed, false),
		pod("", corev1.PodRunning, false), // not a launcher pod
	})
	if len(got) != 2 || got["a"] != 2 || got["b"] != 1 {
		t.Errorf("liveLaunchers = %v, want a:2 b:1", got)
	}
}

func TestFaultTable(t *testing.T) {
	out := faultTable([]faultRow{
		{name: "kubelet restarted", converge: 12340 * time.Millisecond, inFlight: 2},
		{name: "containerd restarted", lost: 1, duplicates: 1, inFlight: 2, inFlightNotRunning: 1, converge: time.Minute,
			problems: []string{"VM x lost its VMI", "1 of the 2 VMIs created in flight not Running"}},
		{name: "node cut", notRun: "needs the local cluster"},
	})
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want a header and 3 rows:\n%s", len(lines), out)
	}
	for i, want := range [][]string{
		{"case", "lost", "restarted", "duplicate pods", "converged in"},
		{"kubelet restarted", " 0 ", "0/2", "12.3s", "none"},
		{"containerd restarted", " 1 ", "1/2", "1m0s", "VM x lost its VMI; 1 of the 2"},
		{"node cut", "not run: needs the local cluster"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("line %d %q lacks %q", i, lines[i], w)
			}
		}
	}
}
