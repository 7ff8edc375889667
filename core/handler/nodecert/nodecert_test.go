package nodecert

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubevisor/kubevisor/core/handler/internal/certdir"
	"github.com/kubevisor/kubevisor/core/handler/internal/testpki"
	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// signer stands in for kubevisor-api: it signs every pending request of the fake clientset
// with ca, or denies it while deny is set.
type signer struct {
	t  *testing.T
	cs *fake.Clientset

	mu   sync.Mutex
	ca   *x509.Certificate
	key  *ecdsa.PrivateKey
	deny bool
}

func newCA(t *testing.T, name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func (s *signer) run(ctx context.Context) {
	for ctx.Err() == nil {
		list, err := s.cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return
		}
		for i := range list.Items {
			csr := &list.Items[i]
			if len(csr.Status.Certificate) > 0 || len(csr.Status.Conditions) > 0 {
				continue
			}
			s.mu.Lock()
			if s.deny {
				csr.Status.Conditions = []certv1.CertificateSigningRequestCondition{{Type: certv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "NodeMismatch", Message: "not your node"}}
			} else {
				b, _ := pem.Decode(csr.Spec.Request)
				req, err := x509.ParseCertificateRequest(b.Bytes)
				if err != nil {
					s.t.Error(err)
				}
				if csr.Spec.SignerName != nodeapi.NodeSignerName || *csr.Spec.ExpirationSeconds != 3600 || len(csr.Spec.Usages) != 3 {
					s.t.Errorf("request %+v", csr.Spec)
				}
				tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: req.Subject,
					NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
					KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
				der, err := x509.CreateCertificate(rand.Reader, tmpl, s.ca, req.PublicKey, s.key)
				if err != nil {
					s.t.Error(err)
				}
				csr.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
			}
			s.mu.Unlock()
			if _, err := s.cs.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err != nil {
				s.t.Error(err)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type harness struct {
	t          *testing.T
	cs         *fake.Clientset
	dir        string
	bundleFile string
	m          *Manager
	reg        *prometheus.Registry
}

func start(t *testing.T, cs *fake.Clientset, dir, bundleFile string) *harness {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := New(Config{NodeName: "node-a", Dir: dir, CABundleFile: bundleFile, Client: cs, Lifetime: time.Hour,
		CheckInterval: 20 * time.Millisecond, MinBackoff: 20 * time.Millisecond, BundleWait: 100 * time.Millisecond,
		Logger: hclog.NewNullLogger(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return &harness{t: t, cs: cs, dir: dir, bundleFile: bundleFile, m: m, reg: reg}
}

func (h *harness) requests() int {
	list, err := h.cs.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return len(list.Items)
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func leafIn(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, certdir.CertFile), filepath.Join(dir, certdir.KeyFile))
	if err != nil {
		return nil
	}
	return pair.Leaf
}

// TestKeepsAGoodCertificateAndFollowsTheBundle: a good certificate already in the directory
// (a restarted handler) is kept, no request filed; the bundle is copied into ca.crt, and again
// when it changes (a CA rotation: new and old CA).
func TestKeepsAGoodCertificateAndFollowsTheBundle(t *testing.T) {
	ca := testpki.NewCA(t, "ca-1")
	dir := t.TempDir()
	// Valid from two hours ago to ten hours from now: due at eight hours in, six from now.
	testpki.WriteCertDir(t, dir, ca, testpki.Leaf{CommonName: nodeapi.NodeCommonName("node-a"),
		Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, NotAfter: time.Now().Add(10 * time.Hour)}, ca)
	before := leafIn(t, dir)
	bundleFile := filepath.Join(t.TempDir(), "ca.crt")
	_, _, other := newCA(t, "ca-2")
	bundle := append(append([]byte{}, other...), ca.PEM...)
	if err := os.WriteFile(bundleFile, bundle, 0o644); err != nil {
		t.Fatal(err)
	}
	h := start(t, fake.NewClientset(), dir, bundleFile)
	eventually(t, "ready", func() bool { return h.m.Status().Ready })
	eventually(t, "the bundle copied", func() bool {
		got, _ := os.ReadFile(filepath.Join(dir, certdir.CAFile))
		return bytes.Equal(got, bundle)
	})
	if s := h.m.Status(); !s.NotAfter.Equal(before.NotAfter) || s.RenewAt.Before(time.Now().Add(5*time.Hour)) || s.Reason != "" {
		t.Errorf("status %+v, want the certificate's NotAfter %s, renewal in about six hours", s, before.NotAfter)
	}
	// The bundle changes: copied again.
	_, _, third := newCA(t, "ca-3")
	bundle = append(append([]byte{}, third...), ca.PEM...)
	if err := os.WriteFile(bundleFile, bundle, 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new bundle copied", func() bool {
		got, _ := os.ReadFile(filepath.Join(dir, certdir.CAFile))
		return bytes.Equal(got, bundle)
	})
	time.Sleep(100 * time.Millisecond)
	if n := h.requests(); n != 0 {
		t.Errorf("%d requests filed with a good certificate in place", n)
	}
	if after := leafIn(t, dir); !after.Equal(before) {
		t.Error("the certificate was replaced")
	}
	if got := testutil.ToFloat64(h.m.metrics.ready); got != 1 {
		t.Errorf("kubevisor_node_certificate_ready = %v, want 1", got)
	}
}

// TestRequestsDeniedThenIssued: with no certificate the handler files a request; denied, it
// says why (status, metric) and retries with a new key and a new request; signed, the key and
// the certificate are installed. When the bundle stops trusting the certificate's CA, a new
// one is requested.
func TestRequestsDeniedThenIssued(t *testing.T) {
	caCert, caKey, caPEM := newCA(t, "ca-1")
	bundleFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(bundleFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset()
	s := &signer{t: t, cs: cs, ca: caCert, key: caKey, deny: true}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	dir := filepath.Join(t.TempDir(), "certs")
	h := start(t, cs, dir, bundleFile)
	eventually(t, "a denial reported", func() bool { return strings.Contains(h.m.Status().Reason, "denied: NodeMismatch: not your node") })
	eventually(t, "a second request after the denial", func() bool { return h.requests() >= 2 })
	if h.m.Status().Ready || leafIn(t, dir) != nil {
		t.Error("ready, or a certificate in the directory, after denials only")
	}
	if got := testutil.ToFloat64(h.m.metrics.requests.WithLabelValues("denied")); got < 1 {
		t.Errorf("denied requests counted %v", got)
	}

	s.mu.Lock()
	s.deny = false
	s.mu.Unlock()
	eventually(t, "a certificate installed", func() bool { return h.m.Status().Ready })
	leaf := leafIn(t, dir)
	if leaf == nil || leaf.Subject.CommonName != nodeapi.NodeCommonName("node-a") {
		t.Fatalf("installed %v", leaf)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("directory mode: %v %v, want 0700", fi.Mode().Perm(), err)
	}
	// The proxy's reader takes the directory as it is.
	if cert, _, err := (&certdir.Store{Dir: dir}).Load(); err != nil || !cert.Leaf.Equal(leaf) {
		t.Errorf("certdir reads %v", err)
	}
	// Every request has a name of its own, from its key.
	list, _ := cs.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	for _, r := range list.Items {
		if !strings.HasPrefix(r.Name, "kubevisor-node-node-a-") {
			t.Errorf("request named %q", r.Name)
		}
	}

	// The CA is rotated out of the bundle: the certificate no longer chains, a new one is
	// requested and signed by the new CA.
	newCert, newKey, newPEM := newCA(t, "ca-2")
	s.mu.Lock()
	s.ca, s.key = newCert, newKey
	s.mu.Unlock()
	if err := os.WriteFile(bundleFile, newPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a certificate of the new CA", func() bool {
		l := leafIn(t, dir)
		return l != nil && l.CheckSignatureFrom(newCert) == nil
	})
}

func TestRequestName(t *testing.T) {
	a, b := RequestName("node-a", []byte("key 1")), RequestName("node-a", []byte("key 2"))
	if a == b || !strings.HasPrefix(a, "kubevisor-node-node-a-") || a != RequestName("node-a", []byte("key 1")) {
		t.Errorf("names %q %q: want one per key, stable, starting kubevisor-node-node-a-", a, b)
	}
	if long := RequestName(strings.Repeat("n", 253), []byte("k")); len(long) != 253 {
		t.Errorf("a name for a 253-character node is %d long", len(long))
	}
}
