package cmd

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/kubevirtcompat"
)

func TestCreateVMRoundTripsIntoTheTypedObject(t *testing.T) {
	userData := filepath.Join(t.TempDir(), "user-data")
	if err := os.WriteFile(userData, []byte("#cloud-config\npassword: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err := Execute(testContext(t), "vmctl", []string{"create", "vm", "vm1", "-n", "ns2", "--memory", "1Gi", "--cpus", "2",
		"--containerdisk", "quay.io/containerdisks/fedora:41", "--cloud-init-user-data", userData,
		"--run-strategy", "Manual", "--hypervisor-class", "qemu"}, IOStreams{In: bytes.NewReader(nil), Out: &out, ErrOut: &errOut})
	if err != nil {
		t.Fatal(err)
	}
	jsonData, err := yaml.YAMLToJSON(out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	vm := &v1alpha1.VirtualMachine{}
	if strict, err := kjson.UnmarshalStrict(jsonData, vm); err != nil || len(strict) > 0 {
		t.Fatalf("strict decode: %v %v\n%s", err, strict, out.String())
	}
	spec := vm.Spec.Template.Spec
	mem := spec.Domain.Resources.Requests["memory"]
	switch {
	case vm.APIVersion != "kubevisor.io/v1alpha1" || vm.Kind != "VirtualMachine" || vm.Name != "vm1" || vm.Namespace != "ns2":
		t.Fatalf("meta %+v %+v", vm.TypeMeta, vm.ObjectMeta)
	case *vm.Spec.RunStrategy != v1alpha1.RunStrategyManual || spec.HypervisorClassName != "qemu":
		t.Fatalf("run strategy %v, class %q", *vm.Spec.RunStrategy, spec.HypervisorClassName)
	case mem.Cmp(resource.MustParse("1Gi")) != 0 || spec.Domain.CPU == nil || spec.Domain.CPU.Cores != 2:
		t.Fatalf("memory %v, cpu %+v", mem, spec.Domain.CPU)
	case len(spec.Volumes) != 2 || spec.Volumes[0].ContainerDisk.Image != "quay.io/containerdisks/fedora:41" ||
		spec.Volumes[1].CloudInitNoCloud.UserData != "#cloud-config\npassword: x\n" || len(spec.Domain.Devices.Disks) != 2:
		t.Fatalf("volumes %+v", spec.Volumes)
	}
}

func TestCreateVMRefusesWhatTheWebhookWould(t *testing.T) {
	tests := map[string][]string{
		"bad run strategy": {"--run-strategy", "Sometimes"},
		"bad memory":       {"--memory", "lots"},
	}
	for name, flags := range tests {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			err := Execute(testContext(t), "vmctl", append([]string{"create", "vm", "vm1"}, flags...),
				IOStreams{In: bytes.NewReader(nil), Out: &out, ErrOut: &out})
			if err == nil {
				t.Fatalf("accepted: %s", out.String())
			}
		})
	}
}

func runConvert(t *testing.T, args ...string) (string, string, error) {
	var out, errOut bytes.Buffer
	err := Execute(testContext(t), "vmctl", append([]string{"convert"}, args...), IOStreams{In: bytes.NewReader(nil), Out: &out, ErrOut: &errOut})
	return out.String(), errOut.String(), err
}

func TestConvertListsTheDroppedPaths(t *testing.T) {
	out, stderr, err := runConvert(t, "-f", filepath.Join("testdata", "kubevirt-vm-drops.yaml"))
	if err == nil || !strings.Contains(err.Error(), "3 field(s) dropped") {
		t.Fatalf("err = %v, want 3 dropped fields", err)
	}
	// The fields of the VMI spec are listed with the words of the admission webhook, from
	// Kubevisor's table of KubeVirt's fields.
	slirp, ok := kubevirtcompat.EntryFor("domain.devices.interfaces[].slirp")
	if !ok {
		t.Fatal("no entry for slirp")
	}
	for _, want := range []string{
		"VirtualMachine/vm-drops: spec.template.spec.domain.devices.autoattachVSOCK: not supported by Kubevisor: Kubevisor gives the guest no vsock device (dropped)",
		"VirtualMachine/vm-drops: spec.template.spec.domain.devices.interfaces[0].slirp: " + slirp.Message() + " (dropped)",
		"VirtualMachine/vm-drops: spec.template.spec.domain.devices.interfaces[0].slirp: not supported by Kubevisor: user-mode (slirp) networking is not implemented; use masquerade (dropped)",
		"VirtualMachine/vm-drops: spec.dataVolumeTemplates: not supported (dropped)",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	docs := strings.Split(out, "\n---\n")
	if len(docs) != 2 || !strings.Contains(docs[1], "kind: Secret") {
		t.Fatalf("output documents:\n%s", out)
	}
	vm := &v1alpha1.VirtualMachine{}
	if err := yaml.UnmarshalStrict([]byte(docs[0]), vm); err != nil {
		t.Fatalf("converted VM does not decode strictly: %v\n%s", err, docs[0])
	}
	if vm.APIVersion != "kubevisor.io/v1alpha1" || vm.Spec.Template.Spec.Volumes[0].ContainerDisk == nil {
		t.Fatalf("converted VM %+v", vm)
	}
	if strings.Contains(stderr, "devices.rng") || vm.Spec.Template.Spec.Domain.Devices.Rng == nil {
		t.Errorf("devices.rng, which Kubevisor implements, was dropped:\n%s", stderr)
	}
	if strings.Contains(stderr, "domain.features") || vm.Spec.Template.Spec.Domain.Features == nil {
		t.Errorf("domain.features, which Kubevisor implements, was dropped:\n%s", stderr)
	}
	// --allow-drops accepts the same input.
	if _, _, err := runConvert(t, "--allow-drops", "-f", filepath.Join("testdata", "kubevirt-vm-drops.yaml")); err != nil {
		t.Fatalf("--allow-drops: %v", err)
	}
}

func TestConvertSupportedManifestsChangeOnlyTheAPIVersion(t *testing.T) {
	file := filepath.Join("testdata", "kubevirt-supported.yaml")
	out, stderr, err := runConvert(t, "-f", file)
	if err != nil || stderr != "" {
		t.Fatalf("err %v, stderr %q", err, stderr)
	}
	in, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	inDocs := strings.Split(string(in), "\n---\n")
	outDocs := strings.Split(out, "\n---\n")
	if len(outDocs) != len(inDocs) {
		t.Fatalf("%d documents out of %d", len(outDocs), len(inDocs))
	}
	for i := range inDocs {
		var a, b map[string]any
		if err := yaml.Unmarshal([]byte(strings.Replace(inDocs[i], "kubevirt.io/v1", "kubevisor.io/v1alpha1", 1)), &a); err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal([]byte(outDocs[i]), &b); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(normalizeManifest(a), normalizeManifest(b)) {
			t.Errorf("document %d changed:\n in: %v\nout: %v", i, a, b)
		}
	}
}

// normalizeManifest drops what a typed round trip adds without meaning (empty status,
// creationTimestamp: null).
func normalizeManifest(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		switch v := v.(type) {
		case nil:
			continue
		case map[string]any:
			if n := normalizeManifest(v); len(n) > 0 {
				out[k] = n
			}
			continue
		}
		out[k] = v
	}
	return out
}

func TestConvertRunsTheWebhooksValidation(t *testing.T) {
	// Disks without volumes are kept but rejected by the webhook.
	file := filepath.Join(t.TempDir(), "vmi.yaml")
	doc := "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: bad\nspec:\n  domain:\n    devices:\n      disks:\n      - name: missing\n    resources:\n      requests:\n        memory: 64Mi\n"
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr, err := runConvert(t, "--allow-drops", "-f", file)
	if err == nil || !strings.Contains(err.Error(), "rejected by validation") || !strings.Contains(stderr, "spec.domain.devices.disks[0]") {
		t.Fatalf("err %v, stderr %q", err, stderr)
	}
}

func TestSSHCommand(t *testing.T) {
	got := sshCommand("/usr/bin/vmctl", []string{"--kubeconfig=/tmp/my config", "--namespace=ns1"}, "ns1", "fedora", "vm/vm1", "vm1", 2222, []string{"-i", "key", "uptime"})
	want := []string{
		"-o", "ProxyCommand=/usr/bin/vmctl '--kubeconfig=/tmp/my config' --namespace=ns1 port-forward --stdio vm/vm1 2222",
		"-o", "HostKeyAlias=vmi.vm1.ns1", "-l", "fedora", "vmi.vm1.ns1", "-i", "key", "uptime",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("sshCommand =\n%q\nwant\n%q", got, want)
	}
}

func TestParsePortMapping(t *testing.T) {
	tests := []struct {
		in   string
		want portMapping
		ok   bool
	}{
		{"8080:80", portMapping{8080, 80}, true},
		{"22", portMapping{22, 22}, true},
		{":22", portMapping{0, 22}, true},
		{"80:0", portMapping{}, false},
		{"x:80", portMapping{}, false},
		{"80:70000", portMapping{}, false},
	}
	for _, tt := range tests {
		got, err := parsePortMapping(tt.in)
		if (err == nil) != tt.ok || (tt.ok && got != tt.want) {
			t.Errorf("parsePortMapping(%q) = %v, %v", tt.in, got, err)
		}
	}
}

func TestConvertMigrationPolicy(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.yaml")
	doc := "apiVersion: migrations.kubevirt.io/v1alpha1\nkind: MigrationPolicy\nmetadata:\n  name: db\nspec:\n" +
		"  allowAutoConverge: true\n  bandwidthPerMigration: 64Mi\n  completionTimeoutPerGiB: 300\n  allowWorkloadDisruption: true\n" +
		"  selectors:\n    namespaceSelector:\n      team: data\n    virtualMachineInstanceSelector:\n      app: db\n" +
		"---\napiVersion: kubevirt.io/v1\nkind: MigrationPolicy\nmetadata:\n  name: wrong-group\nspec:\n  selectors: {}\n"
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := runConvert(t, "-f", file)
	if err == nil || !strings.Contains(err.Error(), "2 field(s) dropped") {
		t.Fatalf("err = %v, want 2 dropped (a field, a document)", err)
	}
	for _, want := range []string{
		"MigrationPolicy/db: spec.allowWorkloadDisruption: not supported (dropped)",
		"MigrationPolicy/wrong-group: kind: kind MigrationPolicy is not supported in kubevirt.io/v1 (dropped)",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	mp := &v1alpha1.MigrationPolicy{}
	if err := yaml.UnmarshalStrict([]byte(out), mp); err != nil {
		t.Fatalf("converted policy does not decode strictly: %v\n%s", err, out)
	}
	s := mp.Spec
	if mp.APIVersion != "kubevisor.io/v1alpha1" || mp.Kind != "MigrationPolicy" || s.AllowAutoConverge == nil || !*s.AllowAutoConverge ||
		s.BandwidthPerMigration == nil || s.BandwidthPerMigration.String() != "64Mi" || s.CompletionTimeoutPerGiB == nil || *s.CompletionTimeoutPerGiB != 300 ||
		s.Selectors == nil || s.Selectors.NamespaceSelector["team"] != "data" || s.Selectors.VirtualMachineInstanceSelector["app"] != "db" {
		t.Errorf("converted policy:\n%s", out)
	}
}
