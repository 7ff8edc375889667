package operator

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/metricsauth"
	"github.com/kubevisor/kubevisor/manifests"
)

// Config configures kubevisor-operator.
type Config struct {
	// Kubeconfig is a kubeconfig file; empty means $KUBECONFIG, the in-cluster service account
	// or ~/.kube/config.
	Kubeconfig string
	// Version is the image tag the operator installs when the spec names none: its own.
	Version string
	// LeaderElection makes replicas elect one leader through the Lease LeaderElectionID in
	// Namespace; only the leader reconciles.
	LeaderElection   bool
	LeaderElectionID string
	// MetricsAddr serves /metrics over HTTPS with a self-signed certificate, to bearer tokens the
	// API server allows get on /metrics (core/metricsauth; "0" turns it off); HealthProbeAddr
	// /healthz and /readyz, plain HTTP.
	MetricsAddr     string
	HealthProbeAddr string
	// Recheck is Reconciler.Recheck.
	Recheck time.Duration
	// PodNamespace and PodName name the operator's own pod: without Version, its image's tag
	// (the container named "operator") is the version.
	PodNamespace, PodName string
}

// OperatorContainer is the container of the operator's pod whose image tag is its version.
const OperatorContainer = "operator"

// ownVersion reads the tag of the operator's own image from its pod.
func ownVersion(ctx context.Context, c client.Reader, namespace, name string) (string, error) {
	var pod corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &pod); err != nil {
		return "", fmt.Errorf("the operator's version: read its pod %s/%s: %w", namespace, name, err)
	}
	for _, ct := range pod.Spec.Containers {
		if ct.Name == OperatorContainer {
			if tag := imageTag(ct.Image); tag != "" {
				return tag, nil
			}
			return "", fmt.Errorf("the operator's version: image %q of its pod %s/%s has no tag: give --version", ct.Image, namespace, name)
		}
	}
	return "", fmt.Errorf("the operator's version: its pod %s/%s has no container %q: give --version", namespace, name, OperatorContainer)
}

// imageTag is the tag of an image reference ("" when it has none, or only a digest).
func imageTag(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return ""
	}
	return ref[i+1:]
}

// Scheme returns the scheme the operator's clients use.
func Scheme() *kruntime.Scheme {
	s := kruntime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	return s
}

// NewManager builds the operator's manager: its cache holds the Kubevisors and the workloads
// and pods of kubevisor-system only.
func NewManager(restCfg *rest.Config, cfg Config) (manager.Manager, error) {
	if cfg.Version == "" {
		return nil, errors.New("the operator's version (the image tag it installs by default) is required: give --version, or run it in its pod ($POD_NAMESPACE, $POD_NAME)")
	}
	ns := map[string]cache.Config{Namespace: {}}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme: Scheme(),
		// The CA Secret is read when the operator looks at it, not watched: a cache of Secrets
		// would watch every Secret of the cluster.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&appsv1.Deployment{}: {Namespaces: ns},
			&appsv1.DaemonSet{}:  {Namespaces: ns},
			&corev1.Pod{}:        {Namespaces: ns},
		}},
		Metrics:                       metricsauth.Options(or(cfg.MetricsAddr, ":8080"), ""),
		HealthProbeBindAddress:        or(cfg.HealthProbeAddr, ":8081"),
		LeaderElection:                cfg.LeaderElection,
		LeaderElectionID:              or(cfg.LeaderElectionID, "kubevisor-operator"),
		LeaderElectionNamespace:       Namespace,
		LeaderElectionResourceLock:    "leases",
		LeaderElectionReleaseOnCancel: true,
		GracefulShutdownTimeout:       ptrDuration(10 * time.Second),
	})
	if err != nil {
		return nil, err
	}
	r := &Reconciler{
		Client:   mgr.GetClient(),
		Reader:   mgr.GetAPIReader(),
		Renderer: Renderer{Manifests: manifests.FS, DefaultVersion: cfg.Version},
		Recheck:  cfg.Recheck,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := mgr.Add(manager.RunnableFunc(r.CountOutdated)); err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("cache", func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return errors.New("the cache has not synced")
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return mgr, nil
}

// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=kubevisor-system,resources=leases,verbs=get;list;watch;create;update;patch;delete

// Run runs the operator until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	restCfg, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	if cfg.Version == "" && cfg.PodName != "" {
		c, err := client.New(restCfg, client.Options{Scheme: Scheme()})
		if err != nil {
			return err
		}
		if cfg.Version, err = ownVersion(ctx, c, cfg.PodNamespace, cfg.PodName); err != nil {
			return err
		}
	}
	mgr, err := NewManager(restCfg, cfg)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		return c, nil
	}
	return ctrl.GetConfig()
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func ptrDuration(d time.Duration) *time.Duration { return &d }
