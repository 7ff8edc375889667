package manifests_test

import (
	"slices"
	"strconv"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// TestNodeCertificates: the handler serves the migration proxy on nodeapi.MigrationPort with
// its node certificate in a memory emptyDir that it writes itself (its readiness does not
// wait for it); the handler may file and watch certificate requests and nothing more on them;
// kubevisor-api may approve and sign for nodeapi.NodeSignerName only.
func TestNodeCertificates(t *testing.T) {
	r := render(t, drivers(t), "")
	var ds appsv1.DaemonSet
	r.get(t, "DaemonSet", "kubevisor-handler", &ds)
	spec := ds.Spec.Template.Spec
	h := container(t, spec, "handler")
	addr, _ := flagValue(h, "--migration-addr")
	if addr != ":"+strconv.Itoa(nodeapi.MigrationPort) {
		t.Errorf("--migration-addr %q, want :%d", addr, nodeapi.MigrationPort)
	}
	if !slices.ContainsFunc(h.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == "migration" && p.ContainerPort == nodeapi.MigrationPort
	}) {
		t.Errorf("no containerPort migration %d: %+v", nodeapi.MigrationPort, h.Ports)
	}
	if v, ok := flagValue(h, "--node-cert-request"); ok && v != "true" {
		t.Errorf("--node-cert-request=%s: nothing would write the node certificate", v)
	}
	dir, _ := flagValue(h, "--migration-cert-dir")
	var mount *corev1.VolumeMount
	for i, m := range h.VolumeMounts {
		if m.MountPath == dir {
			mount = &h.VolumeMounts[i]
		}
	}
	if mount == nil || mount.ReadOnly {
		t.Fatalf("--migration-cert-dir %q is not a writable mount: %+v", dir, mount)
	}
	for _, v := range spec.Volumes {
		if v.Name == mount.Name && (v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory) {
			t.Errorf("volume %s: %+v, want an emptyDir in memory (the key stays off the disk)", v.Name, v.VolumeSource)
		}
	}
	// The CA bundle the handler copies is the handler-certs Secret's (the default of
	// --node-cert-ca-bundle: ca.crt of --stream-cert-dir).
	if _, ok := flagValue(h, "--node-cert-ca-bundle"); !ok {
		streamDir, _ := flagValue(h, "--stream-cert-dir")
		if !slices.ContainsFunc(h.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == streamDir }) {
			t.Errorf("--stream-cert-dir %q, where the CA bundle is read, is not mounted", streamDir)
		}
	}
	if p := h.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe %+v", p)
	}

	roles := generatedRoles(t)
	handler, api := roles["ClusterRole/kubevisor-handler"], roles["ClusterRole/kubevisor-api"]
	const certs = "certificates.k8s.io"
	for _, verb := range []string{"create", "get", "list", "watch"} {
		if !allows(handler, certs, "certificatesigningrequests", verb, "") {
			t.Errorf("the handler may not %s certificatesigningrequests", verb)
		}
	}
	for _, no := range []struct{ resource, verb, name string }{
		{"certificatesigningrequests", "delete", ""}, {"certificatesigningrequests", "update", ""},
		{"certificatesigningrequests/approval", "update", ""}, {"certificatesigningrequests/status", "update", ""},
		{"signers", "approve", nodeapi.NodeSignerName}, {"signers", "sign", nodeapi.NodeSignerName},
	} {
		if allows(handler, certs, no.resource, no.verb, no.name) {
			t.Errorf("the handler may %s %s %s", no.verb, no.resource, no.name)
		}
	}
	for _, yes := range []struct{ resource, verb, name string }{
		{"certificatesigningrequests", "get", ""}, {"certificatesigningrequests", "list", ""}, {"certificatesigningrequests", "watch", ""},
		{"certificatesigningrequests/approval", "update", ""}, {"certificatesigningrequests/status", "update", ""},
		{"signers", "approve", nodeapi.NodeSignerName}, {"signers", "sign", nodeapi.NodeSignerName},
	} {
		if !allows(api, certs, yes.resource, yes.verb, yes.name) {
			t.Errorf("kubevisor-api may not %s %s %s", yes.verb, yes.resource, yes.name)
		}
	}
	for _, other := range []string{"kubernetes.io/kube-apiserver-client", "kubernetes.io/kubelet-serving", "kubevisor.io/*"} {
		for _, verb := range []string{"approve", "sign"} {
			if allows(api, certs, "signers", verb, other) {
				t.Errorf("kubevisor-api may %s for signer %s", verb, other)
			}
		}
	}
	if allows(api, certs, "certificatesigningrequests", "delete", "") || allows(api, certs, "certificatesigningrequests", "create", "") {
		t.Error("kubevisor-api may create or delete certificate requests")
	}
}
