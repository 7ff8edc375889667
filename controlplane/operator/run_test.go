package operator

import "testing"

func TestImageTag(t *testing.T) {
	for ref, want := range map[string]string{
		"kubevisor/kubevisor-operator:v1.2":             "v1.2",
		"registry.example:5000/kubevisor/operator:dev":  "dev",
		"registry.example:5000/kubevisor/operator":      "",
		"kubevisor/operator:v1@sha256:0123456789abcdef": "v1",
		"kubevisor/operator@sha256:0123456789abcdef":    "",
	} {
		if got := imageTag(ref); got != want {
			t.Errorf("imageTag(%q) = %q, want %q", ref, got, want)
		}
	}
}
