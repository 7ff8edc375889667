package subresources

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/controlplane/certs"
	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
	"github.com/kubevisor/kubevisor/internal/testenv"
	"github.com/kubevisor/kubevisor/internal/tlstest"
)

// kubeconfigFile writes cfg (certificate credentials) as a kubeconfig file.
func kubeconfigFile(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "x"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

type apiFixture struct {
	env  *envtest.Env
	base string // https://127.0.0.1:PORT
	ca   *x509.CertPool
	// front is a client certificate of the request-header CA the API server announces in
	// kube-system/extension-apiserver-authentication, as the aggregator's proxy has.
	front *rest.Config
}

// frontProxy makes a request-header CA and a client certificate of it; Host holds the CA file.
func frontProxy(t *testing.T) *rest.Config {
	t.Helper()
	ca := issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "front-proxy-ca"}, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, nil)
	cl := issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "front-proxy-client"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, &ca)
	path := filepath.Join(t.TempDir(), "front-proxy-ca.crt")
	if err := os.WriteFile(path, ca.pemCert(), 0o600); err != nil {
		t.Fatal(err)
	}
	return &rest.Config{Host: path, TLSClientConfig: rest.TLSClientConfig{CertData: cl.pemCert(), KeyData: cl.pemKey(t)}}
}

// startEnv is internal/envtest.Start with the API server configured for request-header
// authentication by front's CA.
func startEnv(t *testing.T, front *rest.Config) *envtest.Env {
	t.Helper()
	testenv.Heavy(t, "a real kube-apiserver and etcd")
	assets, err := envtest.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	e := &crenvtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(envtest.RepoRoot(), "manifests", "crd")},
		ErrorIfCRDPathMissing: true,
		Scheme:                envtest.Scheme(),
	}
	e.ControlPlane.GetAPIServer().Configure().
		Set("requestheader-client-ca-file", front.Host).
		Set("requestheader-username-headers", "X-Remote-User").
		Set("requestheader-group-headers", "X-Remote-Group").
		Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
	cfg, err := e.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: envtest.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return &envtest.Env{Config: cfg, Client: c, Environment: e}
}

// startServer runs the subresource server in-process against a real API server: delegated
// authentication and authorization go to it, and the server's own reads and writes are made
// with only the rights of this package's +kubebuilder:rbac markers.
func startServer(t *testing.T) *apiFixture {
	t.Helper()
	front := frontProxy(t)
	env := startEnv(t, front)
	dir := t.TempDir()
	if _, err := certs.Ensure(certs.Options{Dir: dir, ServiceName: "kubevisor-api", ServiceNamespace: "kubevisor-system", ExtraNames: []string{"127.0.0.1"}}); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.CertDir, c.Listener, c.Kubeconfig = dir, l, kubeconfigFile(t, env.Config)
	own := env.ImpersonateWithMarkers(t, "kubevisor-api", "vm.go", "vmi.go")
	cl, err := client.New(own, client.Options{Scheme: envtest.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(c, Clients{Reader: cl, Writer: cl})
	if err != nil {
		t.Fatal(err)
	}
	envtest.Run(t, "server", srv.Start)
	bundle, err := os.ReadFile(filepath.Join(dir, certs.BundleFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	f := &apiFixture{env: env, base: "https://" + l.Addr().String(), ca: pool, front: front}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _ := f.do(t, nil, http.MethodGet, "/healthz", "")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not healthy: %d", code)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return f
}

// user creates a user of the API server with a ClusterRole of rules and returns its config.
func (f *apiFixture) user(t *testing.T, name string, rules ...rbacv1.PolicyRule) *rest.Config {
	t.Helper()
	u, err := f.env.Environment.AddUser(crenvtest.User{Name: name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := f.env.Client.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	return u.Config()
}

// do sends a request to the server, with the client certificate of as (nil: none), and returns
// the status code and body.
func (f *apiFixture) do(t *testing.T, as *rest.Config, method, path, body string) (int, string) {
	t.Helper()
	return f.doWith(t, as, nil, method, path, body)
}

// doWith is do with extra headers.
func (f *apiFixture) doWith(t *testing.T, as *rest.Config, header http.Header, method, path, body string) (int, string) {
	t.Helper()
	tc := &tls.Config{RootCAs: f.ca, MinVersion: tls.VersionTLS12}
	if as != nil {
		pair, err := tls.X509KeyPair(as.CertData, as.KeyData)
		if err != nil {
			t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 20 * time.Second}
	req, err := http.NewRequest(method, f.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const vmiPath = "/apis/subresources.kubevisor.io/v1alpha1/namespaces/vms/virtualmachineinstances/"

func TestServerAgainstAPIServer(t *testing.T) {
	f := startServer(t)
	ctx := context.Background()
	if err := f.env.Client.Create(ctx, nsObj("vms")); err != nil {
		t.Fatal(err)
	}
	pending := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "pending", Namespace: "vms"}}
	if err := f.env.Client.Create(ctx, pending); err != nil {
		t.Fatal(err)
	}
	viewer := f.user(t, "viewer", rbacv1.PolicyRule{APIGroups: []string{"kubevisor.io"}, Resources: []string{"virtualmachineinstances"}, Verbs: []string{"get", "list", "watch"}})
	operator := f.user(t, "operator",
		rbacv1.PolicyRule{APIGroups: []string{subv1.GroupName}, Resources: []string{"virtualmachineinstances/pause", "virtualmachines/start"}, Verbs: []string{"update"}},
		rbacv1.PolicyRule{APIGroups: []string{subv1.GroupName}, Resources: []string{"virtualmachineinstances/console"}, Verbs: []string{"get"}})

	t.Run("no credentials is 401", func(t *testing.T) {
		if code, body := f.do(t, nil, http.MethodPut, vmiPath+"pending/pause", ""); code != http.StatusUnauthorized {
			t.Fatalf("%d %s, want 401", code, body)
		}
	})
	t.Run("the aggregator's request headers carry the user", func(t *testing.T) {
		as := func(u string) http.Header {
			return http.Header{"X-Remote-User": {u}, "X-Remote-Group": {"system:authenticated"}}
		}
		if code, body := f.doWith(t, f.front, as("operator"), http.MethodPut, vmiPath+"pending/pause", ""); code != http.StatusConflict {
			t.Errorf("operator through the front proxy: %d %s, want 409", code, body)
		}
		if code, body := f.doWith(t, f.front, as("viewer"), http.MethodPut, vmiPath+"pending/pause", ""); code != http.StatusForbidden {
			t.Errorf("viewer through the front proxy: %d %s, want 403", code, body)
		}
		// Headers from a client without the front-proxy certificate are not believed.
		if code, body := f.doWith(t, nil, as("operator"), http.MethodPut, vmiPath+"pending/pause", ""); code != http.StatusUnauthorized {
			t.Errorf("headers without the front-proxy certificate: %d %s, want 401", code, body)
		}
	})
	t.Run("a viewer of VMIs is refused the subresources", func(t *testing.T) {
		for _, r := range []struct{ method, sub string }{{http.MethodPut, "pause"}, {http.MethodGet, "console"}} {
			code, body := f.do(t, viewer, r.method, vmiPath+"pending/"+r.sub, "")
			if code != http.StatusForbidden || !strings.Contains(body, "virtualmachineinstances/"+r.sub) {
				t.Errorf("%s %s: %d %s, want 403 naming the subresource", r.method, r.sub, code, body)
			}
		}
	})
	t.Run("an operator gets past authorization to the VMI's state", func(t *testing.T) {
		code, body := f.do(t, operator, http.MethodPut, vmiPath+"absent/pause", "")
		if code != http.StatusNotFound {
			t.Errorf("pause absent: %d %s, want 404", code, body)
		}
		code, body = f.do(t, operator, http.MethodPut, vmiPath+"pending/pause", "")
		if code != http.StatusConflict || !strings.Contains(body, "VMI pending is not running") {
			t.Errorf("pause pending: %d %s, want 409 not running", code, body)
		}
		code, body = f.do(t, operator, http.MethodGet, vmiPath+"pending/console", "")
		if code != http.StatusConflict {
			t.Errorf("console pending: %d %s, want 409", code, body)
		}
		// Not granted: the other subresources stay refused.
		if code, body := f.do(t, operator, http.MethodPut, vmiPath+"pending/reset", ""); code != http.StatusForbidden {
			t.Errorf("reset: %d %s, want 403", code, body)
		}
	})
	t.Run("a running VMI without a handler on its node is 503", func(t *testing.T) {
		vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "running", Namespace: "vms"}}
		if err := f.env.Client.Create(ctx, vmi); err != nil {
			t.Fatal(err)
		}
		envtest.Update(t, f.env.Client, vmi, func(v *v1alpha1.VirtualMachineInstance) {})
		cur := &v1alpha1.VirtualMachineInstance{}
		if err := f.env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), cur); err != nil {
			t.Fatal(err)
		}
		cur.Status.Phase, cur.Status.NodeName = v1alpha1.Running, "node-1"
		if err := f.env.Client.Status().Update(ctx, cur); err != nil {
			t.Fatal(err)
		}
		code, body := f.do(t, operator, http.MethodPut, vmiPath+"running/pause", "")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "node-1") {
			t.Errorf("pause: %d %s, want 503 naming the node", code, body)
		}
	})
	t.Run("start of a halted VM sets runStrategy Always as kubevisor-api", func(t *testing.T) {
		m := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "vms"},
			Spec: v1alpha1.VirtualMachineSpec{RunStrategy: ptr.To(v1alpha1.RunStrategyHalted), Template: &v1alpha1.VirtualMachineInstanceTemplateSpec{}}}
		if err := f.env.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		code, body := f.do(t, operator, http.MethodPut, "/apis/subresources.kubevisor.io/v1alpha1/namespaces/vms/virtualmachines/vm1/start", "{}")
		if code != http.StatusAccepted {
			t.Fatalf("start: %d %s, want 202", code, body)
		}
		if err := f.env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			t.Fatal(err)
		}
		if m.Spec.RunStrategy == nil || *m.Spec.RunStrategy != v1alpha1.RunStrategyAlways {
			t.Fatalf("runStrategy %v, want Always", m.Spec.RunStrategy)
		}
		if code, body := f.do(t, viewer, http.MethodPut, "/apis/subresources.kubevisor.io/v1alpha1/namespaces/vms/virtualmachines/vm1/stop", "{}"); code != http.StatusForbidden {
			t.Fatalf("viewer stop: %d %s, want 403", code, body)
		}
	})
	t.Run("discovery lists the subresources with KubeVirt's verbs", func(t *testing.T) {
		code, body := f.do(t, viewer, http.MethodGet, "/apis/subresources.kubevisor.io/v1alpha1", "")
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, body)
		}
		var list metav1.APIResourceList
		if err := json.Unmarshal([]byte(body), &list); err != nil {
			t.Fatal(err)
		}
		verbs := map[string]string{}
		for _, r := range list.APIResources {
			verbs[r.Name] = strings.Join(r.Verbs, ",")
		}
		want := map[string]string{
			"virtualmachineinstances/console": "get", "virtualmachineinstances/vnc": "get", "virtualmachineinstances/portforward": "get",
			"virtualmachineinstances/pause": "update", "virtualmachineinstances/unpause": "update", "virtualmachineinstances/softreboot": "update",
			"virtualmachineinstances/reset": "update", "virtualmachineinstances/guestosinfo": "get",
			"virtualmachines/start": "update", "virtualmachines/stop": "update", "virtualmachines/restart": "update",
			"virtualmachines/migrate": "update", "virtualmachines/cancelmigration": "update",
			"virtualmachineinstances": "", "virtualmachines": "",
		}
		for name, v := range want {
			if got, ok := verbs[name]; !ok || got != v {
				t.Errorf("%s: verbs %q (listed %v), want %q", name, got, ok, v)
			}
		}
	})
	t.Run("version answers every authenticated user", func(t *testing.T) {
		code, body := f.do(t, viewer, http.MethodGet, VersionPath, "")
		if code != http.StatusOK || !strings.Contains(body, `"gitVersion"`) {
			t.Fatalf("%d %s", code, body)
		}
		if code, _ := f.do(t, nil, http.MethodGet, VersionPath, ""); code != http.StatusUnauthorized {
			t.Fatalf("anonymous version: %d, want 401", code)
		}
	})
	// The generic server's own /metrics sits behind the same delegated authentication and
	// authorization: the scrapers' generated role is what opens it.
	t.Run("metrics need a user allowed get on /metrics", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "manifests", "rbac", "metrics-reader", "role.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var reader rbacv1.ClusterRole
		if err := yaml.Unmarshal(data, &reader); err != nil {
			t.Fatal(err)
		}
		scraper := f.user(t, "scraper", reader.Rules...)
		for _, tc := range []struct {
			who  string
			as   *rest.Config
			want int
		}{{"anonymous", nil, http.StatusUnauthorized}, {"viewer", viewer, http.StatusForbidden}, {"scraper", scraper, http.StatusOK}} {
			code, body := f.do(t, tc.as, http.MethodGet, "/metrics", "")
			if code != tc.want || strings.Contains(body, "# HELP") != (tc.want == http.StatusOK) {
				t.Errorf("/metrics as %s: %d %.200s, want %d", tc.who, code, body, tc.want)
			}
		}
	})
	t.Run("TLS 1.1 is refused", func(t *testing.T) {
		tlstest.RefusesTLS11(t, strings.TrimPrefix(f.base, "https://"), &tls.Config{RootCAs: f.ca})
	})
}
