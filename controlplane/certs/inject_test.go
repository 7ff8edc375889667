package certs

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kubevisor/kubevisor/internal/envtest"
)

// TestInjectCABundle installs manifests/webhook into a real API server and checks that every
// webhook of both configurations gets the bundle, that injecting the same bundle writes
// nothing, and that a missing configuration is an error that says so.
func TestInjectCABundle(t *testing.T) {
	env := envtest.Start(t, envtest.Options{Webhooks: &crenvtest.WebhookInstallOptions{
		Paths: []string{filepath.Join(envtest.RepoRoot(), "manifests", "webhook")},
	}})
	c, ctx := env.Client, context.Background()
	st, err := Ensure(Options{Dir: t.TempDir(), ServiceName: "kubevisor-api", ServiceNamespace: "kubevisor-system"})
	if err != nil {
		t.Fatal(err)
	}

	if err := InjectCABundle(ctx, c, "kubevisor-mutating", "kubevisor-validating", st.Bundle); err != nil {
		t.Fatal(err)
	}
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	get := func() {
		t.Helper()
		if err := c.Get(ctx, client.ObjectKey{Name: "kubevisor-mutating"}, &mwc); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, client.ObjectKey{Name: "kubevisor-validating"}, &vwc); err != nil {
			t.Fatal(err)
		}
	}
	get()
	if len(mwc.Webhooks) == 0 || len(vwc.Webhooks) == 0 {
		t.Fatalf("%d mutating and %d validating webhooks installed", len(mwc.Webhooks), len(vwc.Webhooks))
	}
	for _, w := range mwc.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, st.Bundle) {
			t.Errorf("mutating webhook %s has another CA bundle", w.Name)
		}
	}
	for _, w := range vwc.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, st.Bundle) {
			t.Errorf("validating webhook %s has another CA bundle", w.Name)
		}
	}

	rvM, rvV := mwc.ResourceVersion, vwc.ResourceVersion
	if err := InjectCABundle(ctx, c, "kubevisor-mutating", "kubevisor-validating", st.Bundle); err != nil {
		t.Fatal(err)
	}
	get()
	if mwc.ResourceVersion != rvM || vwc.ResourceVersion != rvV {
		t.Error("injecting the same bundle again wrote the configurations")
	}

	err = InjectCABundle(ctx, c, "", "no-such-configuration", st.Bundle)
	if err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("want a not-found error, got %v", err)
	}
}
