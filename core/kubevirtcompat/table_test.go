package kubevirtcompat

import (
	"strings"
	"testing"
)

// TestEveryKubeVirtFieldIsClassified fails on a KubeVirt field that Kubevisor neither supports
// nor explains: give it an entry in table.go (or implement it).
func TestEveryKubeVirtFieldIsClassified(t *testing.T) {
	for _, f := range KubeVirtFields() {
		if f.Class == Uncovered {
			t.Errorf("%s: Kubevisor does not have it and no entry in table.go says why", f.Path)
		}
	}
}

// TestEntriesAreCurrent fails on an entry that is stale: for a path KubeVirt does not have, for
// a field Kubevisor has gained (delete the entry, or narrow it to what is still missing), or
// that no field uses (a longer entry covers all its fields).
func TestEntriesAreCurrent(t *testing.T) {
	used := map[string]bool{}
	for _, f := range KubeVirtFields() {
		if f.Entry != nil {
			used[f.Entry.Path] = true
		}
	}
	seen := map[string]bool{}
	for _, e := range entries {
		switch {
		case seen[e.Path]:
			t.Errorf("%s: two entries", e.Path)
		case !kubeVirtSpec.Has(e.Path):
			t.Errorf("%s: KubeVirt %s has no such field", e.Path, KubeVirtAPIVersion)
		case KubevisorSupports(e.Path):
			t.Errorf("%s: Kubevisor supports it now: delete the entry (or narrow it to the fields still missing)", e.Path)
		case !used[e.Path]:
			t.Errorf("%s: no field uses the entry (longer entries cover all of its fields)", e.Path)
		case !e.Planned() && e.Reason == "":
			t.Errorf("%s: a field that is not planned needs a reason", e.Path)
		}
		seen[e.Path] = true
	}
}

func TestSupportedIsReadFromTheTypes(t *testing.T) {
	for path, want := range map[string]Class{
		"domain.devices.rng":                                        Supported,
		"domain.devices.interfaces[].masquerade":                    Supported,
		"volumes[].containerDisk.image":                             Supported,
		"domain.devices.interfaces[].slirp":                         NotSupported,
		"volumes[].dataVolume.name":                                 NotSupported,
		"domain.features.hyperv.relaxed.enabled":                    Supported,
		"domain.features.hypervPassthrough.enabled":                 NotSupported,
		"livenessProbe.tcpSocket":                                   Supported,
		"readinessProbe.httpGet":                                    Supported,
		"livenessProbe.exec":                                        Supported,
		"readinessProbe.guestAgentPing":                             Supported,
		"dnsConfig":                                                 Supported,
		"dnsPolicy":                                                 Supported,
		"accessCredentials[].userPassword.source.secret.secretName": NotSupported,
		"accessCredentials[].sshPublicKey.source.secret.secretName": Supported,
		"accessCredentials[].sshPublicKey.propagationMethod.qemuGuestAgent.users": NotSupported,
		"domain.cpu.numa.guestMappingPassthrough":                                 Supported,
		"domain.devices.tpm.persistent":                                           Supported,
		"domain.devices.gpus[].deviceName":                                        Supported,
		"domain.devices.gpus[].claimName":                                         NotSupported,
	} {
		if got := Classify([]string{path})[0].Class; got != want {
			t.Errorf("%s: %s, want %s", path, got, want)
		}
	}
}

func TestEntryMessage(t *testing.T) {
	for _, tc := range []struct {
		e    Entry
		want string
	}{
		{Entry{Reason: "user-mode (slirp) networking is not implemented", Alternative: "masquerade"},
			"not supported by Kubevisor: user-mode (slirp) networking is not implemented; use masquerade"},
		{Entry{Reason: "Kubevisor gives the guest no vsock device"},
			"not supported by Kubevisor: Kubevisor gives the guest no vsock device"},
		{Entry{Issue: 15}, "not supported by Kubevisor yet: planned in issue 15"},
		{Entry{Issue: 15, Reason: "needs swtpm on the node", Alternative: "x"},
			"not supported by Kubevisor yet: planned in issue 15 (needs swtpm on the node); use x"},
	} {
		if got := tc.e.Message(); got != tc.want {
			t.Errorf("Message() = %q, want %q", got, tc.want)
		}
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Reason, ".") || strings.HasSuffix(e.Alternative, ".") {
			t.Errorf("%s: reasons and alternatives are sentence fragments, without a final period", e.Path)
		}
	}
}
