package liveconfig_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/core/liveconfig"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// TestGeneratedRolesWatch: the Role in kubevisor-system of each component's generated roles
// (kubevisor-controller, kubevisor-api, kubevisor-handler), alone, lets the watcher read the
// live configuration: the marker reached each role that make generate writes.
func TestGeneratedRolesWatch(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	ctx := context.Background()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: liveconfig.Namespace}}); err != nil {
		t.Fatal(err)
	}
	c := liveconfig.New()
	c.LogVerbosity = &liveconfig.LogVerbosity{API: ptr.To[int32](3)}
	data, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: liveconfig.Namespace, Name: liveconfig.Name}, Data: data}); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{"manifests/rbac/controller/role.yaml", "manifests/webhook/role.yaml", "manifests/rbac/handler/role.yaml"} {
		t.Run(filepath.Base(filepath.Dir(file)), func(t *testing.T) {
			role := namespacedRole(t, filepath.Join(envtest.RepoRoot(), file))
			user := "test-" + role.Name
			role.Name = user
			binding := &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: liveconfig.Namespace},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
			}
			for _, o := range []client.Object{role, binding} {
				if err := env.Client.Create(ctx, o); err != nil {
					t.Fatal(err)
				}
			}
			cfg := rest.CopyConfig(env.Config)
			cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan liveconfig.Config, 4)
			w := &liveconfig.Watcher{Client: cs, Log: logr.Discard(), Appliers: []liveconfig.Applier{func(c liveconfig.Config) { got <- c }}}
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- w.Start(wctx) }()
			select {
			case c := <-got:
				if v := liveconfig.APIVerbosity(c); v == nil || *v != 3 {
					t.Errorf("applied %+v, want the ConfigMap's api verbosity 3", c)
				}
			case <-wctx.Done():
				t.Errorf("the watcher got nothing in 30s under %s's Role", file)
			}
			cancel()
			<-done
		})
	}
}

// namespacedRole is the Role in kubevisor-system of a generated role file.
func namespacedRole(t *testing.T, path string) *rbacv1.Role {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			break
		}
		if obj["kind"] != "Role" {
			continue
		}
		role := &rbacv1.Role{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, role); err != nil {
			t.Fatal(err)
		}
		if role.Namespace == liveconfig.Namespace {
			return role
		}
	}
	t.Fatalf("%s: no Role in %s", path, liveconfig.Namespace)
	return nil
}
