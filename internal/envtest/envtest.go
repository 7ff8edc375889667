// Package envtest starts a real kube-apiserver and etcd for tests (controller-runtime's envtest)
// with Kubevisor's CRDs installed. The binaries are the ones the project builds with
// `make k8s-bins` into _output/k8s/bin; KUBEBUILDER_ASSETS overrides that directory.
//
// There is no fallback: a test that needs an API server and finds no binaries fails and says
// how to build them, rather than skipping and counting as passed.
package envtest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	kruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// RepoRoot is the repository's top directory (found from this file's location).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// AssetsDir returns the directory holding kube-apiserver and etcd: $KUBEBUILDER_ASSETS when set,
// else <repo>/_output/k8s/bin. The error says what is missing and how to build it.
func AssetsDir() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		dir = filepath.Join(RepoRoot(), "_output", "k8s", "bin")
	}
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("KUBEBUILDER_ASSETS=%q must be an absolute path", dir)
	}
	var missing []error
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if fi, err := os.Stat(filepath.Join(dir, bin)); err != nil || fi.Mode()&0o111 == 0 {
			missing = append(missing, fmt.Errorf("%s not found in %s", bin, dir))
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("%w: build them with `make k8s-bins`", errors.Join(missing...))
	}
	return dir, nil
}

// Options adjust the environment Start brings up.
type Options struct {
	// Webhooks, when set, installs these webhook configurations into the API server and gives
	// the local webhook server's host, port and certificate directory in them.
	Webhooks *crenvtest.WebhookInstallOptions
}

// Env is a running API server with the Kubevisor CRDs installed.
type Env struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is a controller-runtime client for Config with Scheme's types.
	Client client.Client
	// Environment is the underlying envtest environment.
	Environment *crenvtest.Environment
}

// Scheme returns a new scheme with the Kubernetes built-in types and the Kubevisor API.
func Scheme() *kruntime.Scheme {
	s := kruntime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	return s
}

// Start brings up etcd and kube-apiserver, installs manifests/crd, and stops them when the test
// ends. It fails the test when the binaries are missing; under go test -short it skips it.
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	testenv.Heavy(t, "a real kube-apiserver and etcd")
	env, err := StartEnv(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop API server: %v", err)
		}
	})
	return env
}

// StartEnv is Start for callers without a testing.TB (benchmarks, commands); the caller stops it.
func StartEnv(opts Options) (*Env, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	scheme := Scheme()
	e := &crenvtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "manifests", "crd")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	if opts.Webhooks != nil {
		e.WebhookInstallOptions = *opts.Webhooks
	}
	cfg, err := e.Start()
	if err != nil {
		return nil, fmt.Errorf("start kube-apiserver and etcd from %s: %w", assets, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = e.Stop()
		return nil, fmt.Errorf("client for the test API server: %w", err)
	}
	return &Env{Config: cfg, Client: c, Environment: e}, nil
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error { return e.Environment.Stop() }
