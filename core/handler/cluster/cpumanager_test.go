package cluster

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// TestCPUManagerLabel: the node is labelled kubevisor.io/cpumanager=true while the kubelet's
// CPU manager state file names the static policy; the label is absent with the none policy, no
// file or a file that does not parse, and the handler removes it then. With no file configured
// the handler leaves the label as the admin set it.
func TestCPUManagerLabel(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name    string
		content string // "": no file
		noPath  bool
		want    bool
	}{
		{name: "static", content: `{"policyName":"static","defaultCpuSet":"0,3","entries":{"6a1f":{"compute":"1-2"}},"checksum":1}`, want: true},
		{name: "none", content: `{"policyName":"none","defaultCpuSet":"","checksum":2}`},
		{name: "no state file (the none policy)"},
		{name: "not JSON", content: "static"},
		{name: "no file configured: the admin's label kept", noPath: true, want: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, filepath.Base(t.Name()))
			if tt.content != "" {
				if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			l := &NodeLabeler{CPUManagerStateFile: path}
			if tt.noPath {
				l.CPUManagerStateFile = ""
			}
			current := map[string]string{v1alpha1.CPUManagerNodeLabel: "true"}
			desired := DesiredLabels(nil)
			l.cpuManagerLabels(desired, current, hclog.NewNullLogger())
			if got := desired[v1alpha1.CPUManagerNodeLabel] == "true"; got != tt.want {
				t.Fatalf("desired labels %v: %s set = %v, want %v", desired, v1alpha1.CPUManagerNodeLabel, got, tt.want)
			}
			// The handler owns the label: one it no longer wants is removed from the node, one
			// it wants stays.
			patch, changed, err := NodeLabelPatch(current, desired)
			if err != nil {
				t.Fatal(err)
			}
			if changed == tt.want {
				t.Errorf("patch of a node labelled %s=true: %s (changed %v)", v1alpha1.CPUManagerNodeLabel, patch, changed)
			}
		})
	}
}
