package subresources

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/nodeapi"
	"github.com/kubevisor/kubevisor/core/wsstream"
)

type testCert struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte
}

func (c testCert) pemCert() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.der})
}
func (c testCert) pemKey(t *testing.T) []byte {
	b, err := x509.MarshalECPrivateKey(c.key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: b})
}

// issue makes a certificate from tmpl signed by parent (self-signed when nil).
func issue(t *testing.T, tmpl *x509.Certificate, parent *testCert) testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return testCert{cert: cert, key: key, der: der}
}

// fakeHandler is a node handler over mutual TLS: it answers only kubevisor-api's client
// certificate and records the paths it was asked.
func fakeHandler(t *testing.T, h http.Handler) (addr, certDir string) {
	t.Helper()
	ca := issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "ca"}, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, nil)
	server := issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "handler"}, DNSNames: []string{nodeapi.ServerName}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, &ca)
	cl := issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: nodeapi.ClientName}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, &ca)
	certDir = t.TempDir()
	for name, data := range map[string][]byte{ClientCertFile: cl.pemCert(), ClientKeyFile: cl.pemKey(t), CABundleFile: ca.pemCert()} {
		if err := os.WriteFile(filepath.Join(certDir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{server.der}, PrivateKey: server.key}},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		VerifyPeerCertificate: func(_ [][]byte, chains [][]*x509.Certificate) error {
			if chains[0][0].Subject.CommonName != nodeapi.ClientName {
				t.Errorf("client %q", chains[0][0].Subject.CommonName)
			}
			return nil
		},
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), certDir
}

func TestActionProxyPassesTheHandlersAnswer(t *testing.T) {
	var gotPath, gotAuth string
	addr, dir := fakeHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath, gotAuth = r.Method+" "+r.URL.Path, r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotImplemented)
		_, _ = io.WriteString(w, `{"kind":"Status","message":"driver qmp does not declare SoftRebooter"}`)
	}))
	h, err := newHandlerDialer(dir, time.Second).actionProxy(addr, nodeapi.VMIPath("ns", "vm1", "softreboot"))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPut, "/x", nil))
	if rec.Code != http.StatusNotImplemented || !strings.Contains(rec.Body.String(), "SoftRebooter") {
		t.Fatalf("%d %s, want the handler's 501", rec.Code, rec.Body)
	}
	if gotPath != "PUT /v1alpha1/namespaces/ns/virtualmachineinstances/vm1/softreboot" || gotAuth != "" {
		t.Fatalf("handler saw %q (authorization %q)", gotPath, gotAuth)
	}
}

func TestActionProxyUnreachableHandlerIs503(t *testing.T) {
	_, dir := fakeHandler(t, http.NotFoundHandler())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	h, err := newHandlerDialer(dir, time.Second).actionProxy(addr, "/v1alpha1/x")
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	start := time.Now()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPut, "/x", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), addr) || time.Since(start) > 5*time.Second {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
}

func TestStreamProxyCarriesBytesBothWays(t *testing.T) {
	addr, dir := fakeHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != nodeapi.VMIPath("ns", "vm1", "console") {
			http.NotFound(w, r)
			return
		}
		conn, err := wsstream.Upgrade(w, r)
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = io.Copy(conn, conn) // echo
	}))
	h, err := newHandlerDialer(dir, time.Second).streamProxy(addr, nodeapi.VMIPath("ns", "vm1", "console"))
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(h)
	defer front.Close()
	conn, err := wsstream.Dial(t.Context(), "ws"+strings.TrimPrefix(front.URL, "http")+"/anything", wsstream.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("read %q %v", buf, err)
	}
}

func TestHandlerPod(t *testing.T) {
	pod := func(name, node, ip string, ready bool) corev1.Pod {
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}}
	}
	pods := []corev1.Pod{pod("other-node", "n2", "10.0.0.2", true), pod("not-ready", "n1", "10.0.0.3", false), pod("no-ip", "n1", "", true), pod("good", "n1", "10.0.0.1", true)}
	if p := handlerPod(pods, "n1"); p == nil || p.Name != "good" {
		t.Fatalf("got %v, want good", p)
	}
	if p := handlerPod(pods, "n3"); p != nil {
		t.Fatalf("got %s on a node without handler", p.Name)
	}
}

func TestPortForwardOptions(t *testing.T) {
	cases := []struct {
		path, want string
		port       int32
	}{
		{path: "/80", port: 80}, {path: "/22/tcp", port: 22}, {path: "", want: "needs a port"},
		{path: "/0", want: "1 to 65535"}, {path: "/70000", want: "1 to 65535"}, {path: "/53/udp", want: "only tcp"}, {path: "/1/tcp/x", want: "want portforward"},
	}
	for _, tc := range cases {
		opts, err := portForwardOptions(map[string][]string{subpathKey: {tc.path}})
		switch {
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: err %v, want %q", tc.path, err, tc.want)
		case tc.want == "" && (err != nil || opts.Port != tc.port || opts.Protocol != "tcp"):
			t.Errorf("%q: %+v %v", tc.path, opts, err)
		}
	}
}
