package cluster

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

var (
	qmpHealth = v1alpha1.DriverHealthLabel("hypervisor", "qmp")
	qmpAccel  = v1alpha1.DriverAttributeLabel("qmp", "accel")
	cniHealth = v1alpha1.DriverHealthLabel("network", "cni")
)

func TestDesiredLabels(t *testing.T) {
	for _, tt := range []struct {
		name        string
		caps        map[string]string
		schedulable bool
	}{
		{"healthy hypervisor", map[string]string{qmpHealth: "healthy", cniHealth: "healthy"}, true},
		{"degraded hypervisor (TCG only)", map[string]string{qmpHealth: "degraded"}, true},
		{"unhealthy hypervisor", map[string]string{qmpHealth: "unhealthy", cniHealth: "healthy"}, false},
		{"no hypervisor driver", map[string]string{cniHealth: "healthy"}, false},
		{"nothing", nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := DesiredLabels(tt.caps)
			if _, ok := got[v1alpha1.SchedulableNodeLabel]; ok != tt.schedulable {
				t.Errorf("schedulable label present = %v, want %v (%v)", ok, tt.schedulable, got)
			}
			for k, v := range tt.caps {
				if got[k] != v {
					t.Errorf("label %s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestNodeLabelPatch(t *testing.T) {
	for _, tt := range []struct {
		name             string
		current, desired map[string]string
		want             map[string]any // the patch's metadata.labels; nil: no patch
	}{
		{
			name:    "new labels are set, others left alone",
			current: map[string]string{"kubernetes.io/hostname": "n1"},
			desired: map[string]string{qmpHealth: "healthy", qmpAccel: "kvm"},
			want:    map[string]any{qmpHealth: "healthy", qmpAccel: "kvm"},
		},
		{
			name:    "nothing differs: no patch",
			current: map[string]string{qmpHealth: "healthy", "team": "a"},
			desired: map[string]string{qmpHealth: "healthy"},
		},
		{
			name:    "changed value, stale capability and schedulable labels removed",
			current: map[string]string{qmpHealth: "healthy", qmpAccel: "kvm", v1alpha1.SchedulableNodeLabel: "true", "kubevisor.io/other": "x"},
			desired: map[string]string{qmpHealth: "unhealthy"},
			want:    map[string]any{qmpHealth: "unhealthy", qmpAccel: nil, v1alpha1.SchedulableNodeLabel: nil},
		},
		{
			name:    "the node's SELinux mode is the handler's label",
			current: map[string]string{v1alpha1.SELinuxNodeLabel: "permissive", qmpHealth: "healthy"},
			desired: map[string]string{v1alpha1.SELinuxNodeLabel: "disabled", qmpHealth: "healthy"},
			want:    map[string]any{v1alpha1.SELinuxNodeLabel: "disabled"},
		},
		{
			name:    "and removed when the handler no longer says it",
			current: map[string]string{v1alpha1.SELinuxNodeLabel: "enforcing", qmpHealth: "healthy"},
			desired: map[string]string{qmpHealth: "healthy"},
			want:    map[string]any{v1alpha1.SELinuxNodeLabel: nil},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			patch, changed, err := NodeLabelPatch(tt.current, tt.desired)
			if err != nil {
				t.Fatal(err)
			}
			if changed != (tt.want != nil) {
				t.Fatalf("changed = %v, patch %s", changed, patch)
			}
			if !changed {
				return
			}
			var got struct {
				Metadata struct {
					Labels map[string]any `json:"labels"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(patch, &got); err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got.Metadata.Labels, tt.want) {
				t.Errorf("patch labels = %v, want %v", got.Metadata.Labels, tt.want)
			}
		})
	}
	if _, _, err := NodeLabelPatch(nil, map[string]string{"team": "a"}); err == nil {
		t.Error("a label outside the handler's prefixes was accepted")
	}
}

// fakeSource is a LabelSource the test changes.
type fakeSource struct {
	mu     sync.Mutex
	labels map[string]string
}

func (s *fakeSource) NodeLabels() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.labels)
}

func (s *fakeSource) set(l map[string]string) {
	s.mu.Lock()
	s.labels = l
	s.mu.Unlock()
}

// TestNodeLabelerOnAPIServer runs the labeler against a real API server and Node: labels
// appear, follow the drivers, come back when removed by hand, and other labels stay.
func TestNodeLabelerOnAPIServer(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	cs := kubernetes.NewForConfigOrDie(env.Config)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{"kubernetes.io/hostname": "node-1"}}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{labels: map[string]string{qmpHealth: "degraded", qmpAccel: "tcg", cniHealth: "healthy"}}
	// The kubelet runs the static CPU manager policy, then, restarted, none.
	state := filepath.Join(t.TempDir(), "cpu_manager_state")
	if err := os.WriteFile(state, []byte(`{"policyName":"static","defaultCpuSet":"0-1","checksum":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	l := &NodeLabeler{Client: cs, Node: "node-1", Source: src, Interval: 100 * time.Millisecond, CPUManagerStateFile: state}
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()

	waitLabels := func(what string, want map[string]string, absent ...string) {
		t.Helper()
		var got map[string]string
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			n, err := cs.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got = n.Labels
			ok := true
			for k, v := range want {
				ok = ok && got[k] == v
			}
			for _, k := range absent {
				_, there := got[k]
				ok = ok && !there
			}
			if ok {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s: node labels %v, want %v without %v", what, got, want, absent)
	}
	waitLabels("published", map[string]string{
		qmpHealth: "degraded", qmpAccel: "tcg", cniHealth: "healthy",
		v1alpha1.SchedulableNodeLabel: "true", "kubernetes.io/hostname": "node-1",
		v1alpha1.CPUManagerNodeLabel: "true",
	})
	if err := os.WriteFile(state+".tmp", []byte(`{"policyName":"none","defaultCpuSet":"","checksum":2}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(state+".tmp", state); err != nil { // as the kubelet writes it
		t.Fatal(err)
	}
	waitLabels("the none CPU manager policy", map[string]string{qmpHealth: "degraded"}, v1alpha1.CPUManagerNodeLabel)

	// The hypervisor driver becomes unhealthy and loses its attribute.
	src.set(map[string]string{qmpHealth: "unhealthy", cniHealth: "healthy"})
	waitLabels("driver unhealthy", map[string]string{qmpHealth: "unhealthy", "kubernetes.io/hostname": "node-1"},
		qmpAccel, v1alpha1.SchedulableNodeLabel)

	// Someone removes a label by hand: the watch sees it and the labeler puts it back.
	rm := []byte(`{"metadata":{"labels":{"` + cniHealth + `":null}}}`)
	if _, err := cs.CoreV1().Nodes().Patch(ctx, "node-1", types.MergePatchType, rm, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLabels("restored", map[string]string{cniHealth: "healthy"})

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("Run did not return after its context ended")
	}
}
