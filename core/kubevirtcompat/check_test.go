package kubevirtcompat

import (
	"encoding/json"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// errorStrings is the field errors as admission prints them.
func errorStrings(errs field.ErrorList) []string {
	out := make([]string, 0, len(errs))
	for _, e := range errs {
		out = append(out, e.Error())
	}
	return out
}

func specOf(t *testing.T, y string) any {
	t.Helper()
	var spec any
	if err := yaml.Unmarshal([]byte(y), &spec); err != nil {
		t.Fatal(err)
	}
	return spec
}

func TestCheckSpec(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec string
		want []string
	}{{
		name: "a spec of Kubevisor's fields only",
		spec: `
domain:
  cpu: {cores: 2}
  devices:
    rng: {}
    disks: [{name: root, disk: {bus: virtio}, bootOrder: 1}]
    interfaces: [{name: default, masquerade: {}, ports: [{port: 22}]}]
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms: [{matchExpressions: [{key: a, operator: In, values: [b]}]}]
tolerations: [{key: a, operator: Exists}]
volumes: [{name: root, containerDisk: {image: x}}]
networks: [{name: default, pod: {}}]
`,
	}, {
		name: "a KubeVirt field and an unknown one",
		spec: `
domain:
  bogus: 1
  devices:
    interfaces: [{name: default, masquerade: {}}, {name: user, slirp: {}}]
`,
		want: []string{
			"spec.domain.bogus: Forbidden: " + UnknownField,
			"spec.domain.devices.interfaces[1].slirp: Forbidden: not supported by Kubevisor: user-mode (slirp) networking is not implemented; use masquerade",
		},
	}, {
		name: "a whole KubeVirt subtree is one error at its top",
		spec: `
domain:
  firmware: {acpi: {slicNameRef: slic, msdmNameRef: msdm}}
volumes: [{name: data, dataVolume: {name: dv}}]
`,
		want: []string{
			"spec.domain.firmware.acpi: Forbidden: not supported by Kubevisor: custom ACPI tables (SLIC, MSDM) are not supported",
			"spec.volumes[0].dataVolume: Forbidden: not supported by Kubevisor: needs a data importer (CDI), which Kubevisor does not have; use persistentVolumeClaim, or containerDisk",
		},
	}, {
		name: "probes through the guest agent are Kubevisor fields",
		spec: `
livenessProbe: {exec: {command: ["true"]}, periodSeconds: 2}
readinessProbe: {guestAgentPing: {}, tcpSocket: {port: 22}}
`,
	}, {
		name: "a field with an entry of its own inside a covered one is answered with its own",
		spec: `
accessCredentials:
- userPassword: {source: {secret: {secretName: s}}}
- sshPublicKey: {source: {secret: {secretName: k}}, propagationMethod: {qemuGuestAgent: {users: [root]}}}
- sshPublicKey: {source: {secret: {secretName: k}}, propagationMethod: {noCloud: {}}}
`,
		want: []string{
			"spec.accessCredentials[0].userPassword: Forbidden: not supported by Kubevisor: needs the guest agent to change the guest's accounts, which Kubevisor's agent channel does not do yet (it reads the guest's OS information and runs probes); use a password in cloudInitNoCloud userData",
			"spec.accessCredentials[1].sshPublicKey.propagationMethod.qemuGuestAgent: Forbidden: not supported by Kubevisor: needs the guest agent to change the guest's accounts, which Kubevisor's agent channel does not do yet (it reads the guest's OS information and runs probes); use propagationMethod noCloud or configDrive (the keys go into the cloud-init user data)",
		},
	}, {
		name: "unknown inside a Kubernetes type and inside an empty Kubevisor object",
		spec: `
domain:
  devices: {rng: {rate: 5}}
tolerations: [{key: a, colour: red}]
`,
		want: []string{
			"spec.domain.devices.rng.rate: Forbidden: " + UnknownField,
			"spec.tolerations[0].colour: Forbidden: " + UnknownField,
		},
	}, {
		name: "a KubeVirt field inside a field Kubevisor has",
		spec: `
domain:
  devices:
    disks: [{name: a, disk: {bus: virtio, pciAddress: "0000:81:01.0"}, changedBlockTracking: true}]
  firmware: {bootloader: {efi: {secureBoot: false, persistent: true}}}
`, // efi.persistent is Kubevisor's: no error for it
		want: []string{
			"spec.domain.devices.disks[0].changedBlockTracking: Forbidden: not supported by Kubevisor: incremental backups are not implemented",
			"spec.domain.devices.disks[0].disk.pciAddress: Forbidden: not supported by Kubevisor: the hypervisor driver assigns disks their PCI addresses; use bootOrder or serial to find a disk in the guest",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := errorStrings(CheckSpec(specOf(t, tc.spec), field.NewPath("spec")))
			if len(got) != len(tc.want) {
				t.Fatalf("errors\n got %q\nwant %q", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("error %d\n got %q\nwant %q", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// TestCheckSpecInsideAPartlySupportedObject checks a KubeVirt object Kubevisor has only part of
// (domain.launchSecurity: sev's policy, not snp, tdx or sev's attestation): what Kubevisor has
// passes, each other field is answered with its own entry.
func TestCheckSpecInsideAPartlySupportedObject(t *testing.T) {
	spec := specOf(t, `
domain:
  launchSecurity: {sev: {policy: {encryptedState: true}, attestation: {}}, snp: {}, colour: red}
  devices: {filesystems: []}
`)
	got := errorStrings(CheckSpec(spec, field.NewPath("spec")))
	want := []string{
		"spec.domain.devices.filesystems: Forbidden: not supported by Kubevisor: QEMU 7.2's virtiofsd (Debian 12's) must sandbox itself with unshare(2) and chroot(2) or new namespaces, which the launcher pod's seccomp profile and dropped capabilities refuse; it has no unsandboxed mode; use a persistentVolumeClaim volume as a disk",
		"spec.domain.launchSecurity.colour: Forbidden: " + UnknownField,
		"spec.domain.launchSecurity.sev.attestation: Forbidden: not supported by Kubevisor: " + sevAttestationReason + "; use launchSecurity.sev without attestation",
		"spec.domain.launchSecurity.snp: Forbidden: not supported by Kubevisor: QEMU 7.2 (Debian 12's, which the qmp driver runs) has no SEV-SNP guests: sev-snp-guest came in QEMU 9.1; use launchSecurity.sev",
	}
	if len(got) != len(want) {
		t.Fatalf("errors\n got %q\nwant %q", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("error %d\n got %q\nwant %q", i, got[i], want[i])
		}
	}
	if got := errorStrings(CheckSpec(specOf(t, "domain: {launchSecurity: {sev: {}}}"), field.NewPath("spec"))); len(got) != 0 {
		t.Errorf("launchSecurity.sev alone: %q, want no error", got)
	}
}

func TestCheckObject(t *testing.T) {
	vm := map[string]any{
		"apiVersion": "kubevisor.io/v1alpha1", "kind": "VirtualMachine",
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"domain": map[string]any{"devices": map[string]any{}, "bogus": true},
		}}},
	}
	raw, err := json.Marshal(vm)
	if err != nil {
		t.Fatal(err)
	}
	errs, err := CheckObject("VirtualMachine", raw)
	if err != nil {
		t.Fatal(err)
	}
	if got := errorStrings(errs); len(got) != 1 || got[0] != "spec.template.spec.domain.bogus: Forbidden: "+UnknownField {
		t.Errorf("VirtualMachine: %q", got)
	}
	// A VM without a template, and kinds without a VMI spec, have nothing to check.
	for kind, obj := range map[string]string{
		"VirtualMachine":                  `{"spec":{"runStrategy":"Halted"}}`,
		"VirtualMachineInstanceMigration": `{"spec":{"vmiName":"a","bogus":1}}`,
	} {
		if errs, err := CheckObject(kind, []byte(obj)); err != nil || len(errs) != 0 {
			t.Errorf("%s: %v %v", kind, errs, err)
		}
	}
	if _, err := CheckObject("VirtualMachineInstance", []byte("{")); err == nil {
		t.Error("no error for bad JSON")
	}
}
