package envtest

import (
	"context"
	"net"
	"testing"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// StartManager creates a manager for cfg with Scheme's types, its metrics server off and its
// health probes on a free port, lets setup add the controllers under test, and runs it as
// RunManager does. It fails the test when the manager cannot be created or set up.
func StartManager(t testing.TB, cfg *rest.Config, setup func(ctrl.Manager) error) ctrl.Manager {
	t.Helper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := setup(mgr); err != nil {
		t.Fatal(err)
	}
	RunManager(t, mgr)
	return mgr
}

// RunManager starts mgr in the background; when the test ends it stops mgr, waits for Start to
// return, and reports an error Start returned. Register it after Start (the API server) so the
// manager stops first.
func RunManager(t testing.TB, mgr ctrl.Manager) {
	t.Helper()
	Run(t, "manager", mgr.Start)
}

// Run runs start (a server's or a manager's Start) in the background until the test ends; then
// it cancels start's context, waits for it to return, and reports an error it returned as
// what's.
func Run(t testing.TB, what string, start func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", what, err)
		}
	})
}

// FreeAddr returns a loopback host:port that nobody listened on at the time of the call, for a
// server (metrics, health probes) whose address the test needs to know.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
