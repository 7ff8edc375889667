package nodecerts

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	authenticationv1 "k8s.io/api/authentication/v1"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kubevisor/kubevisor/controlplane/certs"
	"github.com/kubevisor/kubevisor/core/handler/nodecert"
	"github.com/kubevisor/kubevisor/core/nodeapi"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

const installNS = "kubevisor-system"

// TestNodeCertificatesThroughTheAPIServer runs the signer in a manager that has only
// kubevisor-api's generated RBAC (its markers), and handlers that have only the handler's
// generated ClusterRole and a real service account token bound to a pod on their node
// (TokenRequest with a Pod boundObjectRef: the API server writes the pod's spec.nodeName into
// the token, and from it into the request's spec.extra). The handler of node-x obtains a
// certificate for node-x and renews it with a new key; a handler with a token of a pod on
// node-x asking for node-y is denied (NodeMismatch); a token bound to no pod is denied
// (TokenNotBoundToNode); the handler cannot approve its own request; a request someone else
// approved that the signer would deny is marked Failed, not signed.
func TestNodeCertificatesThroughTheAPIServer(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	admin, ctx := env.Client, context.Background()

	// The handler's service account, bound to its generated ClusterRole.
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: installNS}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: nodeapi.HandlerServiceAccount, Namespace: installNS}},
		handlerRole(t),
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kubevisor-handler"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kubevisor-handler"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: nodeapi.HandlerServiceAccount, Namespace: installNS}},
		},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-x"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-y"}},
	} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	// kubevisor-api's CA, and the signer with kubevisor-api's markers' rights only.
	certDir := t.TempDir()
	st, err := certs.Ensure(certs.Options{Dir: certDir, ServiceName: "kubevisor-api", ServiceNamespace: installNS})
	if err != nil {
		t.Fatal(err)
	}
	bundleFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(bundleFile, st.Bundle, 0o644); err != nil {
		t.Fatal(err)
	}
	apiCfg := env.ImpersonateWithMarkers(t, "kubevisor-api", "signer.go")
	mgr, err := ctrl.NewManager(apiCfg, ctrl.Options{
		Scheme: envtest.Scheme(), Cache: cache.Options{ByObject: CacheByObject()},
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	signer := &Signer{Client: mgr.GetClient(), CertDir: certDir, Requester: Requester(installNS)}
	if err := signer.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(env.Config)

	// Before the signer runs, an administrator files a request and approves it: not the
	// handler's, so the signer does not sign it but marks it Failed.
	preApproved, err := cs.CertificatesV1().CertificateSigningRequests().Create(ctx, requestFor(t, "node-x", "pre-approved"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	preApproved.Status.Conditions = []certv1.CertificateSigningRequestCondition{condition(certv1.CertificateApproved, "ByHand", "approved by an administrator", time.Now())}
	if _, err := cs.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, preApproved.Name, preApproved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	envtest.RunManager(t, mgr)

	podOnX := handlerPod(t, cs, "handler-x", "node-x")
	handlerX := tokenConfig(t, env.Config, cs, podOnX)

	// The handler of node-x, with a clock the test moves to make it renew.
	clk := &clock{}
	dirX := filepath.Join(t.TempDir(), "node-certs")
	mx, err := nodecert.New(nodecert.Config{
		NodeName: "node-x", Dir: dirX, CABundleFile: bundleFile, Client: kubernetes.NewForConfigOrDie(handlerX),
		Lifetime: 10 * time.Minute, CheckInterval: 200 * time.Millisecond, MinBackoff: 100 * time.Millisecond,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "node-x", Output: testWriter{t}}), Now: clk.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Add(1)
	go func() { defer wg.Done(); _ = mx.Run(runCtx) }()

	first := waitForCert(t, dirX, st.Bundle, "node-x", nil)
	if s := mx.Status(); !s.Ready || !s.NotAfter.Equal(first.NotAfter) {
		t.Errorf("status %+v, want ready until %s", s, first.NotAfter)
	}
	if got := first.NotAfter.Sub(first.NotBefore); got > 16*time.Minute {
		t.Errorf("lifetime %s: the request asked for 10m (plus the 5m backdating)", got)
	}
	if fi, err := os.Stat(dirX); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("certificate directory: %v, mode %v, want 0700", err, fi.Mode().Perm())
	}
	if fi, err := os.Stat(filepath.Join(dirX, "tls.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v, want mode 0600", err)
	}
	if ca, err := os.ReadFile(filepath.Join(dirX, "ca.crt")); err != nil || !bytes.Equal(ca, st.Bundle) {
		t.Errorf("ca.crt is not the bundle: %v", err)
	}
	csrX := onlyCSR(t, admin, "node-x")
	if !hasCondition(csrX, certv1.CertificateApproved) || len(csrX.Status.Certificate) == 0 {
		t.Errorf("request %s: conditions %+v, certificate %d bytes; want Approved and issued", csrX.Name, csrX.Status.Conditions, len(csrX.Status.Certificate))
	}
	if got := csrX.Spec.Extra[serviceaccount.NodeNameKey]; len(got) != 1 || got[0] != "node-x" {
		t.Errorf("the API server put %s = %q in the request, want node-x", serviceaccount.NodeNameKey, got)
	}

	// The handler may not approve its own request (approve on the signer is kubevisor-api's).
	handlerClient := kubernetes.NewForConfigOrDie(handlerX)
	own := csrX.DeepCopy()
	own.Status.Conditions = append(own.Status.Conditions, condition(certv1.CertificateApproved, "Self", "self", time.Now()))
	if _, err := handlerClient.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, own.Name, own, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the handler approving a request: %v, want forbidden", err)
	}

	// Two thirds into the lifetime: a new key, a new certificate.
	clk.Add(first.NotAfter.Sub(first.NotBefore)*2/3 - time.Since(first.NotBefore) + time.Second)
	second := waitForCert(t, dirX, st.Bundle, "node-x", first)
	clk.Reset() // the new certificate is due at the moved clock's time: back to now.
	// Once the clock is back, no more requests: a good certificate is kept.
	time.Sleep(time.Second)
	n := countCSRs(t, admin, "node-x")
	time.Sleep(time.Second)
	if again := countCSRs(t, admin, "node-x"); again != n {
		t.Errorf("requests for node-x went from %d to %d with a good certificate in place", n, again)
	}
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 || second.PublicKey.(*ecdsa.PublicKey).Equal(first.PublicKey) {
		t.Error("renewal kept the certificate or its key")
	}

	// A handler on node-x asking for node-y: denied, and says so.
	my, err := nodecert.New(nodecert.Config{
		NodeName: "node-y", Dir: t.TempDir(), CABundleFile: bundleFile, Client: kubernetes.NewForConfigOrDie(handlerX),
		CheckInterval: 200 * time.Millisecond, MinBackoff: time.Hour,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "node-y", Output: testWriter{t}}),
	})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = my.Run(runCtx) }()
	waitFor(t, "the request for node-y denied", func() bool {
		return strings.Contains(my.Status().Reason, "denied")
	})
	if s := my.Status(); s.Ready || !strings.Contains(s.Reason, ReasonNodeMismatch) {
		t.Errorf("node-y status %+v, want not ready, the reason naming %s", s, ReasonNodeMismatch)
	}
	csrY := onlyCSR(t, admin, "node-y")
	if c := conditionOf(csrY, certv1.CertificateDenied); c == nil || c.Reason != ReasonNodeMismatch || !strings.Contains(c.Message, `"node-x"`) {
		t.Errorf("request for node-y: conditions %+v, want Denied %s naming node-x", csrY.Status.Conditions, ReasonNodeMismatch)
	}
	if len(csrY.Status.Certificate) != 0 {
		t.Error("the denied request got a certificate")
	}

	// The request approved by hand: Failed, not signed.
	waitFor(t, "the approved request of an administrator failed", func() bool {
		var got certv1.CertificateSigningRequest
		return admin.Get(ctx, client.ObjectKey{Name: "pre-approved"}, &got) == nil && conditionOf(&got, certv1.CertificateFailed) != nil
	})
	var pre certv1.CertificateSigningRequest
	if err := admin.Get(ctx, client.ObjectKey{Name: "pre-approved"}, &pre); err != nil {
		t.Fatal(err)
	}
	if c := conditionOf(&pre, certv1.CertificateFailed); c.Reason != ReasonNotHandler || len(pre.Status.Certificate) != 0 {
		t.Errorf("request approved by hand: Failed %s %q, certificate %d bytes; want %s and none", c.Reason, c.Message, len(pre.Status.Certificate), ReasonNotHandler)
	}

	// A token of the handler's service account bound to no pod: no node, denied.
	unbound := tokenConfig(t, env.Config, cs, nil)
	csr := requestFor(t, "node-x", "unbound")
	if _, err := kubernetes.NewForConfigOrDie(unbound).CertificatesV1().CertificateSigningRequests().Create(ctx, csr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the request of an unbound token decided", func() bool {
		var got certv1.CertificateSigningRequest
		return admin.Get(ctx, client.ObjectKey{Name: "unbound"}, &got) == nil && conditionOf(&got, certv1.CertificateDenied) != nil
	})
	var got certv1.CertificateSigningRequest
	if err := admin.Get(ctx, client.ObjectKey{Name: "unbound"}, &got); err != nil {
		t.Fatal(err)
	}
	if c := conditionOf(&got, certv1.CertificateDenied); c.Reason != ReasonNotNodeBound {
		t.Errorf("unbound token: %s %q, want %s", c.Reason, c.Message, ReasonNotNodeBound)
	}
}

// handlerRole is the ClusterRole of manifests/rbac/handler/role.yaml (generated).
func handlerRole(t *testing.T) *rbacv1.ClusterRole {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "manifests", "rbac", "handler", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			t.Fatalf("manifests/rbac/handler/role.yaml: no ClusterRole kubevisor-handler (%v)", err)
		}
		if obj["kind"] != "ClusterRole" {
			continue
		}
		role := &rbacv1.ClusterRole{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, role); err != nil {
			t.Fatal(err)
		}
		if role.Name == "kubevisor-handler" {
			return role
		}
	}
}

// handlerPod creates a pod of the handler's service account bound to node.
func handlerPod(t *testing.T, cs kubernetes.Interface, name, node string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: installNS},
		Spec: corev1.PodSpec{
			NodeName: node, ServiceAccountName: nodeapi.HandlerServiceAccount,
			Containers: []corev1.Container{{Name: "handler", Image: "kubevisor/kubevisor-handler"}},
		},
	}
	pod, err := cs.CoreV1().Pods(installNS).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// tokenConfig reaches the API server with a token of the handler's service account, bound to
// pod (to nothing when nil), as the kubelet gives the handler's pod.
func tokenConfig(t *testing.T, admin *rest.Config, cs kubernetes.Interface, pod *corev1.Pod) *rest.Config {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tok, err := cs.CoreV1().ServiceAccounts(installNS).CreateToken(context.Background(), nodeapi.HandlerServiceAccount, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &rest.Config{Host: admin.Host, TLSClientConfig: rest.TLSClientConfig{CAData: admin.CAData}, BearerToken: tok.Status.Token}
}

// requestFor is a request as the handler files it, for node, named name.
func requestFor(t *testing.T, node, name string) *certv1.CertificateSigningRequest {
	t.Helper()
	key := p256(t)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: nodeapi.NodeCommonName(node)}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: nodeapi.NodeSignerName,
			Usages:     Usages,
		},
	}
}

// waitForCert waits until dir holds a key and certificate of node, other than previous,
// chaining to bundle for server and client auth, and returns the certificate.
func waitForCert(t *testing.T, dir string, bundle []byte, node string, previous *x509.Certificate) *x509.Certificate {
	t.Helper()
	var leaf *x509.Certificate
	waitFor(t, "a certificate of "+node+" in "+dir, func() bool {
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
		if err != nil || (previous != nil && pair.Leaf.Equal(previous)) {
			return false
		}
		leaf = pair.Leaf
		return true
	})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("certificate does not verify against the bundle: %v", err)
	}
	if leaf.Subject.CommonName != nodeapi.NodeCommonName(node) || len(leaf.DNSNames)+len(leaf.IPAddresses) != 0 {
		t.Errorf("certificate for %q names %v %v, want %q and no names", leaf.Subject.CommonName, leaf.DNSNames, leaf.IPAddresses, nodeapi.NodeCommonName(node))
	}
	return leaf
}

// onlyCSR is the newest request for node (the handlers' names start kubevisor-node-<node>-).
func onlyCSR(t *testing.T, c client.Client, node string) *certv1.CertificateSigningRequest {
	t.Helper()
	var list certv1.CertificateSigningRequestList
	if err := c.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	var newest *certv1.CertificateSigningRequest
	for i := range list.Items {
		r := &list.Items[i]
		if strings.HasPrefix(r.Name, "kubevisor-node-"+node+"-") && (newest == nil || !r.CreationTimestamp.Before(&newest.CreationTimestamp)) {
			newest = r
		}
	}
	if newest == nil {
		t.Fatalf("no request for %s", node)
	}
	return newest
}

// countCSRs counts the requests for node.
func countCSRs(t *testing.T, c client.Client, node string) int {
	t.Helper()
	var list certv1.CertificateSigningRequestList
	if err := c.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range list.Items {
		if strings.HasPrefix(r.Name, "kubevisor-node-"+node+"-") {
			n++
		}
	}
	return n
}

func conditionOf(csr *certv1.CertificateSigningRequest, typ certv1.RequestConditionType) *certv1.CertificateSigningRequestCondition {
	for i, c := range csr.Status.Conditions {
		if c.Type == typ {
			return &csr.Status.Conditions[i]
		}
	}
	return nil
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// clock is a time the test moves forward.
type clock struct {
	mu sync.Mutex
	d  time.Duration
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return time.Now().Add(c.d) }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.d += d
}
func (c *clock) Reset() { c.mu.Lock(); defer c.mu.Unlock(); c.d = 0 }

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func ptrTo[T any](v T) *T { return &v }
