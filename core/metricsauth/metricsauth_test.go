package metricsauth_test

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kubevisor/kubevisor/core/metricsauth"
	"github.com/kubevisor/kubevisor/internal/envtest"
	"github.com/kubevisor/kubevisor/internal/tlstest"
)

// serve runs the metrics server of Options on a free loopback port, reaching the API server with
// cfg, until the test ends, and returns its address once it accepts connections.
func serve(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	addr := envtest.FreeAddr(t)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := metricsserver.NewServer(metricsauth.Options(addr, ""), cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	envtest.Run(t, "metrics server", srv.Start)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics server not listening on %s: %v (an error of its start follows)", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nowhere is an API server address that is never asked: a request refused before its token is
// reviewed never reaches it.
var nowhere = &rest.Config{Host: "https://127.0.0.1:1"}

func TestTLS11IsRefused(t *testing.T) {
	addr := serve(t, nowhere)
	tlstest.RefusesTLS11(t, addr, &tls.Config{InsecureSkipVerify: true})
}

func TestPlainHTTPIsRefused(t *testing.T) {
	addr := serve(t, nowhere)
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return // the server may close the connection
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(body), "# HELP") {
		t.Fatalf("plain HTTP: %s %q, want 400 and no metrics", resp.Status, body)
	}
}

func TestNoTokenIs401(t *testing.T) {
	addr := serve(t, nowhere)
	code, body, err := envtest.GetMetrics(addr, "", nil)
	if err != nil || code != http.StatusUnauthorized || strings.Contains(body, "# HELP") {
		t.Fatalf("no token: %d %q %v, want 401", code, body, err)
	}
}

// TestAuthorizationByTheAPIServer runs the metrics server as a user granted only this package's
// +kubebuilder:rbac markers (what each component's generated role takes from it), against a
// real API server: no token is refused 401, a token the API server does not accept is refused,
// a ServiceAccount's without the metrics reader role 403, and the token of one bound to the
// generated kubevisor-metrics-reader ClusterRole is served the metrics.
func TestAuthorizationByTheAPIServer(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	addr := serve(t, env.ImpersonateWithMarkers(t, "metrics-server", "metricsauth.go"))
	probe := prometheus.NewCounter(prometheus.CounterOpts{Name: "kubevisor_metricsauth_test_probe_total", Help: "A counter of this test."})
	if err := ctrlmetrics.Registry.Register(probe); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctrlmetrics.Registry.Unregister(probe) })
	probe.Inc()

	// Two ServiceAccounts: the server caches a refusal for 30 s, so a binding made after one
	// would not show at once.
	stranger := env.ServiceAccountToken(t, "monitoring", "stranger")
	scraper := env.MetricsReaderToken(t, "monitoring", "prometheus")
	for _, tc := range []struct {
		name, token string
		want        int
	}{
		{"no token", "", http.StatusUnauthorized},
		// controller-runtime's filter answers 500 when the TokenReview says why a token is not
		// accepted (it takes the reason for an error), 401 when it says nothing.
		{"a token the API server does not know", "not-a-token", http.StatusInternalServerError},
		{"a ServiceAccount without the reader role", stranger, http.StatusForbidden},
		{"a ServiceAccount bound to " + metricsauth.ReaderRole, scraper, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, err := envtest.GetMetrics(addr, tc.token, nil)
			if err != nil {
				t.Fatal(err)
			}
			served := strings.Contains(body, "kubevisor_metricsauth_test_probe_total 1")
			if code != tc.want || served != (tc.want == http.StatusOK) {
				t.Fatalf("%d (metrics served: %v), want %d:\n%.400s", code, served, tc.want, body)
			}
		})
	}
}
