package certs

import (
	"bytes"
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
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

// apiService reads the APIService of manifests/install/api.yaml.
func apiService(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "manifests", "install", "api.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			t.Fatalf("no APIService in manifests/install/api.yaml: %v", err)
		}
		if u.GroupVersionKind() == APIServiceGVK {
			return u
		}
	}
}

// TestInjectAPIServiceCABundle creates the install's APIService in a real API server and
// checks that the bundle lands in spec.caBundle (as the API server decodes it), that the same
// bundle writes nothing, that a new bundle replaces it, and that a missing APIService is an
// error that says so.
func TestInjectAPIServiceCABundle(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	c, ctx := env.Client, context.Background()
	svc := apiService(t)
	if b, _, _ := unstructured.NestedString(svc.Object, "spec", "caBundle"); b != "" {
		t.Fatal("the installed APIService carries a CA bundle; kubevisor-api injects it")
	}
	if err := c.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	name := svc.GetName()
	check := func(want []byte) string {
		t.Helper()
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(APIServiceGVK)
		if err := c.Get(ctx, client.ObjectKey{Name: name}, got); err != nil {
			t.Fatal(err)
		}
		enc, _, _ := unstructured.NestedString(got.Object, "spec", "caBundle")
		dec, err := base64.StdEncoding.DecodeString(enc)
		if err != nil || !bytes.Equal(dec, want) {
			t.Fatalf("spec.caBundle is not the bundle (%v)", err)
		}
		if skip, _, _ := unstructured.NestedBool(got.Object, "spec", "insecureSkipTLSVerify"); skip {
			t.Fatal("insecureSkipTLSVerify is set")
		}
		return got.GetResourceVersion()
	}

	first, err := Ensure(Options{Dir: t.TempDir(), ServiceName: "kubevisor-api", ServiceNamespace: "kubevisor-system"})
	if err != nil {
		t.Fatal(err)
	}
	if err := InjectAPIServiceCABundle(ctx, c, name, first.Bundle); err != nil {
		t.Fatal(err)
	}
	rv := check(first.Bundle)
	if err := InjectAPIServiceCABundle(ctx, c, name, first.Bundle); err != nil {
		t.Fatal(err)
	}
	if check(first.Bundle) != rv {
		t.Error("injecting the same bundle again wrote the APIService")
	}
	second, err := Ensure(Options{Dir: t.TempDir(), ServiceName: "kubevisor-api", ServiceNamespace: "kubevisor-system"})
	if err != nil {
		t.Fatal(err)
	}
	if err := InjectAPIServiceCABundle(ctx, c, name, second.Bundle); err != nil {
		t.Fatal(err)
	}
	check(second.Bundle)

	err = InjectAPIServiceCABundle(ctx, c, "v1.no-such.example.com", first.Bundle)
	if err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("want a not-found error, got %v", err)
	}
}
