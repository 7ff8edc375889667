package certs

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/core/nodeapi"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// TestGeneratedRoleSufficesForRotation runs EnsureSecret and InjectAPIServiceCABundle as a user
// granted only kubevisor-api's generated roles (manifests/webhook/role.yaml: the ClusterRole,
// and the Role in kubevisor-system), so that the +kubebuilder:rbac markers are proved enough:
// creating the Secret, renewing it, replacing one of the wrong type, injecting the APIService,
// and keeping and reading the CA Secret.
func TestGeneratedRoleSufficesForRotation(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	admin, ctx := env.Client, context.Background()
	data, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "manifests", "webhook", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var clusterRole *rbacv1.ClusterRole
	var role *rbacv1.Role
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			break
		}
		switch obj["kind"] {
		case "ClusterRole":
			clusterRole = &rbacv1.ClusterRole{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, clusterRole); err != nil {
				t.Fatal(err)
			}
		case "Role":
			role = &rbacv1.Role{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, role); err != nil {
				t.Fatal(err)
			}
		}
	}
	if clusterRole == nil || role == nil || role.Namespace != "kubevisor-system" {
		t.Fatal("manifests/webhook/role.yaml: want the ClusterRole kubevisor-api and a Role in kubevisor-system")
	}
	const user = "kubevisor-api"
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kubevisor-system"}}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: role.Namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	svc := apiService(t)
	for _, o := range []client.Object{ns, role, binding, svc} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(env.Impersonate(t, user, clusterRole), client.Options{Scheme: admin.Scheme()})
	if err != nil {
		t.Fatal(err)
	}

	clk := &clock{t: time.Now()}
	o := clientOptions(t.TempDir(), clk.Now)
	sc := SecretCert{Client: c, Namespace: "kubevisor-system", Name: nodeapi.HandlerCertSecret, ServerName: nodeapi.ServerName}
	for _, step := range []string{"create", "unchanged", "renew"} {
		if step == "renew" {
			clk.Add(45 * time.Minute)
		}
		st := mustEnsure(t, o)
		if _, rotated, err := EnsureSecret(ctx, o, st, sc); err != nil || rotated != (step != "unchanged") {
			t.Fatalf("%s: rotated %v, err %v", step, rotated, err)
		}
		if err := InjectAPIServiceCABundle(ctx, c, svc.GetName(), st.Bundle); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	var got corev1.Secret
	if err := admin.Get(ctx, client.ObjectKey{Namespace: "kubevisor-system", Name: nodeapi.HandlerCertSecret}, &got); err != nil {
		t.Fatal(err)
	}
	verifyHandler(t, o.Dir, &got, clk.Now())

	// A Secret of another type is deleted and recreated (the API server refuses a type change).
	if err := admin.Delete(ctx, &got); err != nil {
		t.Fatal(err)
	}
	opaque := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kubevisor-system", Name: nodeapi.HandlerCertSecret},
		Data: map[string][]byte{"x": []byte("y")}}
	if err := admin.Create(ctx, opaque); err != nil {
		t.Fatal(err)
	}
	if _, rotated, err := EnsureSecret(ctx, o, mustEnsure(t, o), sc); err != nil || !rotated {
		t.Fatalf("over an Opaque Secret: rotated %v, err %v", rotated, err)
	}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: "kubevisor-system", Name: nodeapi.HandlerCertSecret}, &got); err != nil {
		t.Fatal(err)
	}
	verifyHandler(t, o.Dir, &got, clk.Now())

	// The CA Secret: made, kept, copied into two directories (two pods) that get the same CA,
	// and renewed when due.
	cs := CASecret{Client: c, Namespace: "kubevisor-system", Name: DefaultCASecret}
	eo := externalOptions(t.TempDir(), clk.Now)
	for _, step := range []string{"create", "unchanged", "renew"} {
		if step == "renew" {
			clk.Add(2*time.Hour + 10*time.Minute)
		}
		if _, rotated, err := EnsureCA(ctx, eo, cs); err != nil || rotated != (step != "unchanged") {
			t.Fatalf("CA secret, %s: rotated %v, err %v", step, rotated, err)
		}
	}
	var cas [][]byte
	for _, dir := range []string{eo.Dir, t.TempDir()} {
		if _, err := SyncCA(ctx, dir, cs); err != nil {
			t.Fatal(err)
		}
		ca, err := os.ReadFile(filepath.Join(dir, CAFile))
		if err != nil {
			t.Fatal(err)
		}
		cas = append(cas, ca)
	}
	if !bytes.Equal(cas[0], cas[1]) {
		t.Fatal("two directories synced from the CA Secret hold different CAs")
	}

	// Another Secret is out of reach.
	other := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "kubevisor-system", Name: "someone-elses"}, other); !apierrors.IsForbidden(err) {
		t.Fatalf("reading another Secret: %v, want forbidden", err)
	}
}
