package webhook

import (
	"context"
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/kubevirtcompat"
)

// The messages admission answers for the fields the manifests below set.
const (
	slirpRefusal = "Forbidden: not supported by Kubevisor: user-mode (slirp) networking is not implemented; use masquerade"
	bogusRefusal = "Forbidden: " + kubevirtcompat.UnknownField
)

// vmiSpecYAML is a VMI spec as a KubeVirt user writes it, with a KubeVirt field Kubevisor does
// not have (slirp) and a field neither API has (domain.bogus).
const vmiSpecYAML = `
domain:
  bogus: true
  resources: {requests: {memory: 128Mi}}
  devices:
    disks: [{name: root, disk: {bus: virtio}}]
    interfaces: [{name: default, slirp: {}}]
networks: [{name: default, pod: {}}]
volumes: [{name: root, containerDisk: {image: example.org/cirros:latest}}]
`

// object builds an unstructured object of kind named name in namespace vms, with spec (YAML) at
// the fields specAt.
func object(t *testing.T, kind, name, spec string, specAt ...string) *unstructured.Unstructured {
	t.Helper()
	var s map[string]any
	if err := yaml.Unmarshal([]byte(spec), &s); err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind(kind))
	u.SetNamespace("vms")
	u.SetName(name)
	if err := unstructured.SetNestedField(u.Object, s, specAt...); err != nil {
		t.Fatal(err)
	}
	return u
}

// causes returns the causes of an Invalid API error, field path to message.
func causes(t *testing.T, err error) map[string]string {
	t.Helper()
	var status apierrors.APIStatus
	if !errors.As(err, &status) || !apierrors.IsInvalid(err) || status.Status().Details == nil {
		t.Fatalf("want an Invalid error with causes, got %v", err)
	}
	out := map[string]string{}
	for _, c := range status.Status().Details.Causes {
		out[c.Field] = c.Message
	}
	return out
}

// wantRefusal checks that err refuses exactly the slirp interface and domain.bogus under prefix,
// in admission's words, and that the message names both with their paths.
func wantRefusal(t *testing.T, err error, prefix string) {
	t.Helper()
	want := map[string]string{
		prefix + ".domain.devices.interfaces[0].slirp": slirpRefusal,
		prefix + ".domain.bogus":                       bogusRefusal,
	}
	got := causes(t, err)
	if len(got) != len(want) {
		t.Fatalf("causes %v, want %v", got, want)
	}
	for path, msg := range want {
		if got[path] != msg {
			t.Errorf("%s: %q, want %q", path, got[path], msg)
		}
		if !strings.Contains(err.Error(), path+": "+msg) {
			t.Errorf("the message does not say %q: %v", path+": "+msg, err)
		}
	}
	if strings.Contains(err.Error(), "strict decoding") {
		t.Errorf("the API server refused it, not admission: %v", err)
	}
}

// TestKubeVirtFieldsRefusedThroughAPIServer checks, through a real API server with the
// generated CRDs and webhook configurations, that a field Kubevisor does not have reaches
// admission and is refused there in Kubevisor's words, under the strict field validation that
// kubectl asks for, with server-side apply, and on update; and that nothing of it is stored.
func TestKubeVirtFieldsRefusedThroughAPIServer(t *testing.T) {
	c, _ := startAPI(t)
	ctx := context.Background()
	strict := client.FieldValidation(metav1.FieldValidationStrict)

	t.Run("VirtualMachineInstance spec", func(t *testing.T) {
		err := c.Create(ctx, object(t, vmiKind, "slirp", vmiSpecYAML, "spec"), strict)
		wantRefusal(t, err, "spec")
		var got v1alpha1.VirtualMachineInstance
		if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: "slirp"}, &got); !apierrors.IsNotFound(err) {
			t.Fatalf("the refused VMI was stored: %v", err)
		}
	})

	t.Run("VirtualMachine template", func(t *testing.T) {
		vm := object(t, vmKind, "slirp", vmiSpecYAML, "spec", "template", "spec")
		if err := unstructured.SetNestedField(vm.Object, string(v1alpha1.RunStrategyHalted), "spec", "runStrategy"); err != nil {
			t.Fatal(err)
		}
		wantRefusal(t, c.Create(ctx, vm, strict), "spec.template.spec")
	})

	t.Run("VirtualMachineInstanceReplicaSet template", func(t *testing.T) {
		rs := object(t, vmirsKind, "slirp", vmiSpecYAML, "spec", "template", "spec")
		if err := unstructured.SetNestedField(rs.Object, map[string]any{"matchLabels": map[string]any{"app": "web"}}, "spec", "selector"); err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedField(rs.Object, map[string]any{"app": "web"}, "spec", "template", "metadata", "labels"); err != nil {
			t.Fatal(err)
		}
		wantRefusal(t, c.Create(ctx, rs, strict), "spec.template.spec")
	})

	valid := strings.ReplaceAll(strings.ReplaceAll(vmiSpecYAML, "  bogus: true\n", ""), "slirp: {}", "masquerade: {}")

	t.Run("server-side apply", func(t *testing.T) {
		apply := func(u *unstructured.Unstructured) error {
			return c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("test"), client.ForceOwnership)
		}
		wantRefusal(t, apply(object(t, vmiKind, "applied-slirp", vmiSpecYAML, "spec")), "spec")
		if err := apply(object(t, vmiKind, "applied", valid, "spec")); err != nil {
			t.Fatalf("server-side apply of a valid VMI: %v", err)
		}
	})

	t.Run("an update cannot add an unknown field", func(t *testing.T) {
		// A VMI's update goes through the validating webhook only, and its typed spec is
		// unchanged: the raw object is what shows the field.
		vmi := object(t, vmiKind, "updated", valid, "spec")
		if err := c.Create(ctx, vmi, strict); err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedField(vmi.Object, true, "spec", "domain", "bogus"); err != nil {
			t.Fatal(err)
		}
		err := c.Update(ctx, vmi, strict)
		if got := causes(t, err); len(got) != 1 || got["spec.domain.bogus"] != bogusRefusal {
			t.Fatalf("causes %v", got)
		}
		var stored unstructured.Unstructured
		stored.SetGroupVersionKind(vmi.GroupVersionKind())
		if err := c.Get(ctx, client.ObjectKeyFromObject(vmi), &stored); err != nil {
			t.Fatal(err)
		}
		if _, found, _ := unstructured.NestedFieldNoCopy(stored.Object, "spec", "domain", "bogus"); found {
			t.Fatal("the unknown field was stored")
		}
	})
}

// TestProbesThroughAPIServer checks through a real API server that a VMI's httpGet, tcpSocket,
// exec and guestAgentPing probes are admitted and stored as written, and that an exec without a
// command, a probe the kubelet could not get to the guest and a probe without a check are
// refused with their field paths.
func TestProbesThroughAPIServer(t *testing.T) {
	c, _ := startAPI(t)
	ctx := context.Background()
	strict := client.FieldValidation(metav1.FieldValidationStrict)
	base := strings.ReplaceAll(strings.ReplaceAll(vmiSpecYAML, "  bogus: true\n", ""), "slirp: {}", "masquerade: {}, ports: [{port: 80}]")

	ok := object(t, vmiKind, "probed", base+"readinessProbe: {httpGet: {path: /, port: 80}, periodSeconds: 2}\nlivenessProbe: {tcpSocket: {port: 80}, failureThreshold: 2}\n", "spec")
	if err := c.Create(ctx, ok, strict); err != nil {
		t.Fatalf("httpGet and tcpSocket probes: %v", err)
	}
	var stored v1alpha1.VirtualMachineInstance
	if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: "probed"}, &stored); err != nil {
		t.Fatal(err)
	}
	if r := stored.Spec.ReadinessProbe; r == nil || r.HTTPGet == nil || r.HTTPGet.Port.IntValue() != 80 || r.PeriodSeconds != 2 {
		t.Errorf("stored readinessProbe %+v", r)
	}
	if l := stored.Spec.LivenessProbe; l == nil || l.TCPSocket == nil || l.FailureThreshold != 2 {
		t.Errorf("stored livenessProbe %+v", l)
	}

	agent := object(t, vmiKind, "agent-probed", base+"livenessProbe: {exec: {command: [cat, /tmp/healthy]}, timeoutSeconds: 3}\nreadinessProbe: {guestAgentPing: {}, periodSeconds: 4}\n", "spec")
	if err := c.Create(ctx, agent, strict); err != nil {
		t.Fatalf("exec and guestAgentPing probes: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: "agent-probed"}, &stored); err != nil {
		t.Fatal(err)
	}
	if l := stored.Spec.LivenessProbe; l == nil || l.Exec == nil || strings.Join(l.Exec.Command, " ") != "cat /tmp/healthy" || l.TimeoutSeconds != 3 {
		t.Errorf("stored livenessProbe %+v", l)
	}
	if r := stored.Spec.ReadinessProbe; r == nil || r.GuestAgentPing == nil || r.PeriodSeconds != 4 {
		t.Errorf("stored readinessProbe %+v", r)
	}

	for _, tc := range []struct{ name, probes, path, words string }{
		{"nocommand", "livenessProbe: {exec: {command: []}}\n", "spec.livenessProbe.exec.command", "Required value"},
		{"emptyexec", "readinessProbe: {exec: {}}\n", "spec.readinessProbe.exec.command", "Required value"},
		{"notforwarded", "readinessProbe: {tcpSocket: {port: 22}}\n", "spec.readinessProbe.tcpSocket.port", "does not forward TCP port 22"},
		{"nohandler", "livenessProbe: {periodSeconds: 2}\n", "spec.livenessProbe", "exactly one of httpGet, tcpSocket, exec and guestAgentPing is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Create(ctx, object(t, vmiKind, tc.name, base+tc.probes, "spec"), strict)
			if got := causes(t, err); !strings.Contains(got[tc.path], tc.words) {
				t.Fatalf("causes %v, want %s: ...%s...", got, tc.path, tc.words)
			}
		})
	}
}
