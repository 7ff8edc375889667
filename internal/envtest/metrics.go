package envtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// ServiceAccountToken creates the ServiceAccount namespace/name (and its namespace) when missing
// and returns a token of it from the TokenRequest API, valid for an hour.
func (e *Env) ServiceAccountToken(t testing.TB, namespace, name string) string {
	t.Helper()
	ctx := context.Background()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}},
	} {
		if err := e.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("service account %s/%s: %v", namespace, name, err)
		}
	}
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// MetricsReaderToken is ServiceAccountToken for a ServiceAccount bound to the generated
// ClusterRole of scrapers (manifests/rbac/metrics-reader/role.yaml, created as it is when
// missing), as an admin binds a Prometheus: a token the components' /metrics accept.
func (e *Env) MetricsReaderToken(t testing.TB, namespace, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(RepoRoot(), "manifests", "rbac", "metrics-reader", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(data, &role); err != nil || role.Kind != "ClusterRole" {
		t.Fatalf("manifests/rbac/metrics-reader/role.yaml: want one ClusterRole, got %q (%v)", role.Kind, err)
	}
	ctx := context.Background()
	if err := e.Client.Create(ctx, &role); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	token := e.ServiceAccountToken(t, namespace, name)
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader:" + namespace + ":" + name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: name}},
	}
	if err := e.Client.Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return token
}

// GetMetrics GETs https://addr/metrics with token as its bearer token (none when empty) and
// returns the status code and body. With roots nil the server's certificate is not verified
// (the components' metrics certificate is self-signed unless they have one of their own).
func GetMetrics(addr, token string, roots *x509.CertPool) (int, string, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, InsecureSkipVerify: roots == nil}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 20 * time.Second}
	defer c.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
