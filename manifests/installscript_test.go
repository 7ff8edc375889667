package manifests_test

import (
	"bytes"
	"os/exec"
	"testing"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// installRender is `hack/install.sh render --drivers drivers`: what install applies.
func installRender(t *testing.T, drivers string) rendered {
	t.Helper()
	testenv.Command(t, "kubectl", "kubectl (its built-in kustomize renders the install)")
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("../hack/install.sh", "render", "--drivers", drivers, "--kubeconfig", "/dev/null")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/install.sh render --drivers %s: %v\n%s", drivers, err, stderr.String())
	}
	return rendered{objs: decodeAll(t, stdout.Bytes())}
}

// TestInstallScriptClasses: the classes install applies carry the label by which a later
// install finds those it must prune, and exactly one is the default: qmp's beside others, the
// only class of a driver set without qmp.
func TestInstallScriptClasses(t *testing.T) {
	for _, tc := range []struct {
		drivers, wantDefault string
		classes              int
	}{
		{"qmp,libvirt,cni,local,hostdev", "qmp", 2},
		{"libvirt,qmp,cni,local", "qmp", 2},
		{"libvirt,cni,local,hostdev", "libvirt", 1},
		{"qmp,cni,local", "qmp", 1},
	} {
		t.Run(tc.drivers, func(t *testing.T) {
			r := installRender(t, tc.drivers)
			classes := r.ofKind("HypervisorClass")
			if len(classes) != tc.classes {
				t.Fatalf("%d HypervisorClasses, want %d", len(classes), tc.classes)
			}
			var defaults []string
			for _, c := range classes {
				if got := c.GetLabels()["app.kubernetes.io/part-of"]; got != "kubevisor" {
					t.Errorf("class %s: label app.kubernetes.io/part-of=%q, want kubevisor (install prunes by it)", c.GetName(), got)
				}
				var class v1alpha1.HypervisorClass
				r.get(t, "HypervisorClass", c.GetName(), &class)
				if v1alpha1.IsDefaultClass(&class) {
					defaults = append(defaults, class.Name)
				}
			}
			if len(defaults) != 1 || defaults[0] != tc.wantDefault {
				t.Errorf("default classes %v, want [%s]", defaults, tc.wantDefault)
			}
		})
	}
}
