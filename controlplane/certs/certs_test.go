package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// clock is a settable time for Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func testOptions(dir string, now func() time.Time) Options {
	return Options{
		Dir: dir, ServiceName: "kubevisor-api", ServiceNamespace: "kubevisor-system",
		ExtraNames: []string{"127.0.0.1"},
		Lifetime:   time.Hour, RenewBefore: 20 * time.Minute, CALifetime: 3 * time.Hour,
		Now: now,
	}
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	certs := parseCerts(data)
	if len(certs) == 0 {
		t.Fatalf("%s: no certificate", path)
	}
	return certs[0]
}

// verify checks that the serving certificate chains to the bundle for name.
func verify(t *testing.T, dir, name string, at time.Time) {
	t.Helper()
	pool := x509.NewCertPool()
	bundle, err := os.ReadFile(filepath.Join(dir, BundleFile))
	if err != nil {
		t.Fatal(err)
	}
	if !pool.AppendCertsFromPEM(bundle) {
		t.Fatal("bundle has no certificate")
	}
	cert := readCert(t, filepath.Join(dir, CertFile))
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, CurrentTime: at}); err != nil {
		t.Fatalf("serving certificate does not verify for %s: %v", name, err)
	}
	if _, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)); err != nil {
		t.Fatalf("certificate and key: %v", err)
	}
}

func TestEnsureIssuesReusesAndRenews(t *testing.T) {
	dir := t.TempDir()
	clk := &clock{t: time.Now()}
	o := testOptions(dir, clk.Now)

	st, err := Ensure(o)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Rotated || !st.CARotated {
		t.Fatalf("first Ensure: %+v, want a new CA and certificate", st)
	}
	for _, name := range []string{"kubevisor-api.kubevisor-system.svc", "kubevisor-api.kubevisor-system.svc.cluster.local", "127.0.0.1"} {
		verify(t, dir, name, clk.Now())
	}
	if fi, err := os.Stat(filepath.Join(dir, KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", fi.Mode(), err)
	}
	first := readCert(t, filepath.Join(dir, CertFile))

	// Within the lifetime minus the margin: nothing changes.
	clk.Add(30 * time.Minute)
	if st, err = Ensure(o); err != nil || st.Rotated || st.CARotated {
		t.Fatalf("second Ensure: %+v %v, want no change", st, err)
	}
	if got := readCert(t, filepath.Join(dir, CertFile)); got.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Fatal("certificate replaced too early")
	}

	// Inside the renewal margin: a new certificate from the same CA.
	clk.Add(15 * time.Minute)
	if st, err = Ensure(o); err != nil || !st.Rotated || st.CARotated {
		t.Fatalf("third Ensure: %+v %v, want a new certificate, same CA", st, err)
	}
	if got := readCert(t, filepath.Join(dir, CertFile)); got.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("certificate not renewed")
	}
	verify(t, dir, "kubevisor-api.kubevisor-system.svc", clk.Now())

	// Other names: a new certificate.
	o.ServiceName = "other"
	if st, err = Ensure(o); err != nil || !st.Rotated {
		t.Fatalf("Ensure with new names: %+v %v", st, err)
	}
	verify(t, dir, "other.kubevisor-system.svc", clk.Now())
}

func TestEnsureRotatesCAWithOverlap(t *testing.T) {
	dir := t.TempDir()
	clk := &clock{t: time.Now()}
	o := testOptions(dir, clk.Now)
	if _, err := Ensure(o); err != nil {
		t.Fatal(err)
	}
	oldCA := readCert(t, filepath.Join(dir, CAFile))

	// The CA would expire before a new certificate does: a new CA, and the bundle keeps the old
	// one while it is valid, so that a client given the new bundle trusts certificates of both.
	clk.Add(2*time.Hour + 10*time.Minute)
	st, err := Ensure(o)
	if err != nil {
		t.Fatal(err)
	}
	if !st.CARotated || !st.Rotated {
		t.Fatalf("%+v, want a new CA and certificate", st)
	}
	bundle := parseCerts(st.Bundle)
	if len(bundle) != 2 || !bundle[1].Equal(oldCA) {
		t.Fatalf("bundle has %d certificates, want the new CA and the old one", len(bundle))
	}
	verify(t, dir, "kubevisor-api.kubevisor-system.svc", clk.Now())

	// Once the old CA has expired it leaves the bundle.
	clk.Add(time.Hour)
	st, err = Ensure(o)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(parseCerts(st.Bundle)); n != 1 {
		t.Fatalf("bundle has %d certificates after the old CA expired, want 1", n)
	}
}

func TestOptionsRefused(t *testing.T) {
	for name, o := range map[string]Options{
		"no directory":            {ServiceName: "s"},
		"no names":                {Dir: t.TempDir()},
		"CA shorter than 2 certs": {Dir: t.TempDir(), ServiceName: "s", Lifetime: time.Hour, CALifetime: 90 * time.Minute},
	} {
		if _, err := Ensure(o); err == nil {
			t.Errorf("%s: Ensure accepted %+v", name, o)
		}
	}
}

func TestEnsureReplacesGarbage(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{CertFile, KeyFile, CAFile, CAKeyFile} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	st, err := Ensure(testOptions(dir, nil))
	if err != nil || !st.Rotated || !st.CARotated {
		t.Fatalf("%+v %v", st, err)
	}
	verify(t, dir, "kubevisor-api", time.Now())
}

// TestRotatorRenewsServedCertificate runs the rotation loop in real time with a short lifetime
// and checks that a TLS server reading the directory through controller-runtime's certwatcher
// (as the webhook server does) serves each new certificate, and that Inject saw the bundle.
func TestRotatorRenewsServedCertificate(t *testing.T) {
	dir := t.TempDir()
	o := Options{Dir: dir, ServiceName: "kubevisor-api", ServiceNamespace: "ns", ExtraNames: []string{"127.0.0.1"},
		Lifetime: 3 * time.Second, RenewBefore: 2 * time.Second, CALifetime: time.Hour}
	var mu sync.Mutex
	var injected [][]byte
	rotations := make(chan State, 16)
	r := &Rotator{
		Options:       o,
		CheckInterval: 100 * time.Millisecond,
		Inject: func(_ context.Context, b []byte) error {
			mu.Lock()
			defer mu.Unlock()
			injected = append(injected, b)
			return nil
		},
		OnError:  func(err error) { t.Errorf("rotator: %v", err) },
		OnRotate: func(st State) { rotations <- st },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	first := <-rotations

	cw, err := certwatcher.New(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = cw.Start(ctx) }()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: cw.GetCertificate})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	served := func() *x509.Certificate {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(first.Bundle)
		conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatalf("TLS handshake with the served certificate: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0]
	}
	if got := served(); !got.NotAfter.Equal(first.NotAfter) {
		t.Fatalf("serves a certificate expiring %s, want %s", got.NotAfter, first.NotAfter)
	}

	var second State
	select {
	case second = <-rotations:
	case <-time.After(10 * time.Second):
		t.Fatal("no rotation within 10s of a 3s certificate with a 2s margin")
	}
	if !second.NotAfter.After(first.NotAfter) || second.CARotated {
		t.Fatalf("second rotation %+v after %+v, want a later certificate from the same CA", second, first)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !served().NotAfter.Equal(second.NotAfter) {
		if time.Now().After(deadline) {
			t.Fatal("the TLS server did not pick up the renewed certificate")
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(injected) < 2 {
		t.Fatalf("injected %d times, want once per check", len(injected))
	}
	for _, b := range injected {
		if string(b) != string(first.Bundle) {
			t.Fatal("injected another bundle, but the CA did not change")
		}
	}
}

// The certwatcher logs through controller-runtime's delegating logger, which complains (with a
// stack trace) when no logger is set.
func init() { ctrllog.SetLogger(logr.Discard()) }
