// Package webhook is Kubevisor's admission: defaulting and validation of VirtualMachines,
// VirtualMachineInstances, replica sets and migrations, and the evictions of launcher pods,
// served over TLS by kubevisor-api.
package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/kubevisor/kubevisor/controlplane/certs"
	"github.com/kubevisor/kubevisor/controlplane/evacuation"
	"github.com/kubevisor/kubevisor/controlplane/nodecerts"
	subresourcesv1alpha1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/featuregate"
	"github.com/kubevisor/kubevisor/core/metricsauth"
	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// Names the manifests in manifests/webhook use.
const (
	DefaultServiceName          = "kubevisor-api"
	DefaultServiceNamespace     = "kubevisor-system"
	DefaultMutatingConfigName   = "kubevisor-mutating"
	DefaultValidatingConfigName = "kubevisor-validating"
	DefaultPort                 = 9443
)

// DefaultAPIServiceName is the APIService of the aggregated subresource API, which gets the CA
// bundle.
var DefaultAPIServiceName = subresourcesv1alpha1.GroupVersion.Version + "." + subresourcesv1alpha1.GroupName

// Config is how kubevisor-api serves admission; cmd/kubevisor-api maps its flags onto it.
type Config struct {
	// Host and Port the webhook server listens on ("" is every address).
	Host string
	Port int
	// CertDir holds tls.crt and tls.key; the server reloads them when they change.
	CertDir string
	// ManageCertificates makes the process create a CA, a serving certificate and the client
	// certificate for the handlers (nodeapi.ClientName) in CertDir, keep the handlers' serving
	// certificate in the Secret HandlerCertSecret, renew them all before they expire, and inject
	// the CA bundle into the webhook configurations and the APIService (package certs has the
	// layout). Off, CertDir and the Secret are filled by someone else (cert-manager, a mounted
	// Secret, envtest).
	ManageCertificates bool
	// CASecret is the Secret in ServiceNamespace that holds the CA (certs.CASecret), so that
	// the CA outlives this process: a restarted or upgraded kubevisor-api issues from the same
	// CA and nobody must learn a new bundle. Empty: the CA lives in CertDir and dies with the
	// process (one replica only).
	CASecret string
	// ManageCA makes the process make and rotate the CA in CASecret itself (without
	// kubevisor-operator, which owns it when it installs and turns this off).
	ManageCA bool
	// CertExtraNames are DNS names or IP addresses the serving certificate carries besides the
	// Service's.
	CertExtraNames []string
	// CertLifetime, CertRenewBefore and CALifetime tune certificate rotation (certs.Options).
	CertLifetime, CertRenewBefore, CALifetime time.Duration
	// ServiceName and ServiceNamespace are the webhook Service, whose DNS names the serving
	// certificate carries.
	ServiceName, ServiceNamespace string
	// MutatingConfigName and ValidatingConfigName are the webhook configurations that get the
	// CA bundle.
	MutatingConfigName, ValidatingConfigName string
	// APIServiceName is the APIService that gets the CA bundle (empty: none).
	APIServiceName string
	// HandlerCertSecret is the Secret in ServiceNamespace that gets the handlers' serving
	// certificate for nodeapi.ServerName (empty: none).
	HandlerCertSecret string
	// NodeCertSigner makes the process, when it manages certificates, approve and sign the
	// handlers' node certificate requests (signer nodeapi.NodeSignerName, package
	// controlplane/nodecerts) with its CA, those of the handler service account of
	// ServiceNamespace only.
	NodeCertSigner bool
	// NodeCertMaxLifetime bounds a node certificate's lifetime (nodeapi.NodeCertMaxLifetime).
	NodeCertMaxLifetime time.Duration
	// MetricsAddr and HealthAddr are where Prometheus metrics and /healthz, /readyz are served
	// ("0" disables). The metrics are HTTPS with the serving certificate of CertDir (self-signed
	// when it is not there at start), to bearer tokens the API server authenticates and allows
	// get on /metrics (core/metricsauth); the probes are plain HTTP, for the kubelet.
	MetricsAddr, HealthAddr string
	// MachineType replaces DefaultMachineType when set.
	MachineType string
	// CheckPodSecurity refuses VMIs (and VMs and replica sets by their template) whose launcher
	// pod their namespace's enforced Pod Security level refuses (podsecurity.go).
	CheckPodSecurity bool
	// DefaultEvictionStrategy is the eviction strategy of VMIs that set none ("" is None), for
	// the eviction webhook; kubevisor-controller must be given the same.
	DefaultEvictionStrategy v1alpha1.EvictionStrategy
	// FeatureGates are the enabled feature gates (--feature-gates, package core/featuregate):
	// admission's base, all gated features off when empty.
	FeatureGates featuregate.Set
	// LiveFeatureGates, when set, is what admission reads at each request in place of
	// FeatureGates: cmd/kubevisor-api gives it to the live configuration's applier
	// (liveconfig.FeatureGates), which swaps it without a restart.
	LiveFeatureGates *featuregate.Live
	// SkipNameValidation lets several managers run in one process (tests): controller names
	// (nodecerts) are otherwise unique per process.
	SkipNameValidation bool
}

// DefaultConfig is the configuration the manifests expect.
func DefaultConfig() Config {
	return Config{
		Port:                 DefaultPort,
		CertDir:              "/var/run/kubevisor-api/certs",
		ManageCertificates:   true,
		CASecret:             certs.DefaultCASecret,
		ManageCA:             true,
		CertLifetime:         certs.DefaultLifetime,
		CertRenewBefore:      certs.DefaultRenewBefore,
		ServiceName:          DefaultServiceName,
		ServiceNamespace:     DefaultServiceNamespace,
		MutatingConfigName:   DefaultMutatingConfigName,
		ValidatingConfigName: DefaultValidatingConfigName,
		APIServiceName:       DefaultAPIServiceName,
		HandlerCertSecret:    nodeapi.HandlerCertSecret,
		NodeCertSigner:       true,
		NodeCertMaxLifetime:  nodeapi.NodeCertMaxLifetime,
		CheckPodSecurity:     true,
		MetricsAddr:          ":8080",
		HealthAddr:           ":8081",
	}
}

// AddFlags binds c's fields to flags of fs, with c's values as defaults.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Host, "webhook-host", c.Host, "address the webhook server listens on (empty: all)")
	fs.IntVar(&c.Port, "webhook-port", c.Port, "port the webhook server listens on")
	fs.StringVar(&c.CertDir, "cert-dir", c.CertDir, "directory with tls.crt and tls.key (reloaded on change)")
	fs.BoolVar(&c.ManageCertificates, "manage-certificates", c.ManageCertificates, "create, rotate and inject a self-signed CA and serving certificate")
	fs.StringVar(&c.CASecret, "ca-secret", c.CASecret, "Secret in the service namespace holding the CA, which outlives the process (empty: the CA lives in --cert-dir and dies with the process)")
	fs.BoolVar(&c.ManageCA, "manage-ca", c.ManageCA, "make and rotate the CA in --ca-secret (off: someone else, kubevisor-operator, keeps it)")
	fs.Func("cert-extra-name", "DNS name or IP address the serving certificate carries besides the Service's (repeatable)", func(v string) error {
		c.CertExtraNames = append(c.CertExtraNames, v)
		return nil
	})
	fs.DurationVar(&c.CertLifetime, "cert-lifetime", c.CertLifetime, "lifetime of a serving certificate")
	fs.DurationVar(&c.CertRenewBefore, "cert-renew-before", c.CertRenewBefore, "renew a certificate this long before it expires")
	fs.DurationVar(&c.CALifetime, "ca-lifetime", c.CALifetime, "lifetime of the CA (0: 4 times --cert-lifetime; at least twice it)")
	fs.StringVar(&c.ServiceName, "service-name", c.ServiceName, "name of the webhook Service")
	fs.StringVar(&c.ServiceNamespace, "service-namespace", c.ServiceNamespace, "namespace of the webhook Service")
	fs.StringVar(&c.MutatingConfigName, "mutating-webhook-configuration", c.MutatingConfigName, "MutatingWebhookConfiguration that gets the CA bundle")
	fs.StringVar(&c.ValidatingConfigName, "validating-webhook-configuration", c.ValidatingConfigName, "ValidatingWebhookConfiguration that gets the CA bundle")
	fs.StringVar(&c.APIServiceName, "apiservice", c.APIServiceName, "APIService that gets the CA bundle (empty: none)")
	fs.StringVar(&c.HandlerCertSecret, "handler-cert-secret", c.HandlerCertSecret, "Secret in the service namespace that gets the handlers' serving certificate (empty: none)")
	fs.BoolVar(&c.NodeCertSigner, "node-cert-signer", c.NodeCertSigner, "approve and sign the handlers' node certificate requests (signer "+nodeapi.NodeSignerName+") with the managed CA")
	fs.DurationVar(&c.NodeCertMaxLifetime, "node-cert-max-lifetime", c.NodeCertMaxLifetime, "longest lifetime of a node certificate (a request's expirationSeconds is honoured up to it)")
	fs.StringVar(&c.MetricsAddr, "metrics-bind-address", c.MetricsAddr, "address of /metrics: HTTPS with the --cert-dir certificate, for bearer tokens allowed get on /metrics (0 disables)")
	fs.StringVar(&c.HealthAddr, "health-probe-bind-address", c.HealthAddr, "address of /healthz and /readyz, plain HTTP (0 disables)")
	fs.Func("default-eviction-strategy", "eviction `strategy` of VMIs that set none: None (default), LiveMigrate, LiveMigrateIfPossible or External; give kubevisor-controller the same", func(s string) error {
		v, err := evacuation.ParseStrategy(s)
		c.DefaultEvictionStrategy = v
		return err
	})
	fs.StringVar(&c.MachineType, "default-machine-type", c.MachineType, "machine type of VMIs that name none (empty: "+DefaultMachineType+")")
	fs.Func("feature-gates", "enabled feature `gates`, comma-separated: "+strings.Join(featuregate.Names(), ", ")+
		" (empty: every gated feature off); the live configuration's featureGates replace them while it has the field", func(s string) error {
		v, err := featuregate.ParseFlag(s)
		c.FeatureGates = v
		return err
	})
	fs.BoolVar(&c.CheckPodSecurity, "check-pod-security", c.CheckPodSecurity, "refuse VMIs, VMs and replica sets whose launcher pod their namespace's enforced Pod Security level (pod-security.kubernetes.io/enforce) refuses; false where the cluster's Pod Security admission exempts kubevisor-controller")
}

func (c Config) certOptions() certs.Options {
	return certs.Options{
		Dir:              c.CertDir,
		ServiceName:      c.ServiceName,
		ServiceNamespace: c.ServiceNamespace,
		ExtraNames:       c.CertExtraNames,
		ClientName:       nodeapi.ClientName,
		Lifetime:         c.CertLifetime,
		RenewBefore:      c.CertRenewBefore,
		CALifetime:       c.CALifetime,
		ExternalCA:       c.CASecret != "",
	}
}

// caSecret is the CA Secret of c, read and written with direct; nil when the CA lives in CertDir.
func (c Config) caSecret(direct client.Client) *certs.CASecret {
	if c.CASecret == "" {
		return nil
	}
	return &certs.CASecret{Client: direct, Namespace: c.ServiceNamespace, Name: c.CASecret}
}

// rotator is the certificate rotation of c, writing and injecting with direct.
func (c Config) rotator(direct client.Client) *certs.Rotator {
	log := ctrl.Log.WithName("certs")
	r := &certs.Rotator{
		Options:  c.certOptions(),
		CA:       c.caSecret(direct),
		ManageCA: c.ManageCA,
		Inject: func(ctx context.Context, bundle []byte) error {
			err := certs.InjectCABundle(ctx, direct, c.MutatingConfigName, c.ValidatingConfigName, bundle)
			if c.APIServiceName != "" {
				err = errors.Join(err, certs.InjectAPIServiceCABundle(ctx, direct, c.APIServiceName, bundle))
			}
			return err
		},
		OnError: func(err error) { log.Error(err, "certificate rotation") },
		OnRotate: func(st certs.State) {
			log.Info("rotated certificates", "notAfter", st.NotAfter, "newCA", st.CARotated,
				"client", st.ClientRotated, "handlerSecret", st.SecretRotated)
		},
	}
	if c.HandlerCertSecret != "" {
		r.Secret = &certs.SecretCert{Client: direct, Namespace: c.ServiceNamespace, Name: c.HandlerCertSecret, ServerName: nodeapi.ServerName}
	}
	return r
}

// NewManager builds a controller-runtime manager that serves the admission webhooks (and, when
// c.ManageCertificates, rotates the certificates and, with c.NodeCertSigner, signs the node
// certificates) with /healthz and /readyz. When it manages
// certificates it writes them before returning, since the webhook server reads them at start.
func NewManager(cfg *rest.Config, c Config) (manager.Manager, error) {
	if c.CertDir == "" {
		return nil, errors.New("a certificate directory is required")
	}
	var direct client.Client
	if c.ManageCertificates {
		var err error
		if direct, err = client.New(cfg, client.Options{Scheme: Scheme()}); err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
		if s := c.caSecret(direct); s != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if c.ManageCA {
				// A failure here (another replica made the Secret first) leaves it to SyncCA to
				// find a CA or fail.
				if _, _, err := certs.EnsureCA(ctx, c.certOptions(), *s); err != nil {
					ctrl.Log.WithName("certs").Error(err, "keep the CA secret")
				}
			}
			if _, err := certs.SyncCA(ctx, c.CertDir, *s); err != nil {
				return nil, err
			}
		}
		if _, err := certs.Ensure(c.certOptions()); err != nil {
			return nil, fmt.Errorf("webhook certificates: %w", err)
		}
	}
	signNodeCerts := c.ManageCertificates && c.NodeCertSigner
	var cacheOpts cache.Options
	if signNodeCerts {
		cacheOpts.ByObject = nodecerts.CacheByObject()
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 Scheme(),
		Cache:                  cacheOpts,
		Controller:             config.Controller{SkipNameValidation: &c.SkipNameValidation},
		Metrics:                metricsauth.Options(c.MetricsAddr, c.CertDir),
		HealthProbeBindAddress: c.HealthAddr,
		WebhookServer: crwebhook.NewServer(crwebhook.Options{
			Host:     c.Host,
			Port:     c.Port,
			CertDir:  c.CertDir,
			CertName: certs.CertFile,
			KeyName:  certs.KeyFile,
			TLSOpts:  []func(*tls.Config){metricsauth.MinTLS12},
		}),
	})
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	// Reads of HypervisorClasses go straight to the API server: a cache would make the
	// process watch every class for a lookup done once per create.
	gates := c.LiveFeatureGates
	if gates == nil {
		gates = featuregate.NewLive(c.FeatureGates)
	}
	a := &Admission{Reader: mgr.GetAPIReader(), MachineType: c.MachineType, CheckPodSecurity: c.CheckPodSecurity, FeatureGates: gates}
	if err := a.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if _, err := evacuation.ParseStrategy(string(c.DefaultEvictionStrategy)); err != nil {
		return nil, err
	}
	mgr.GetWebhookServer().Register(EvictionPath, &crwebhook.Admission{Handler: &Eviction{
		Reader: mgr.GetAPIReader(), Writer: mgr.GetClient(), DefaultStrategy: c.DefaultEvictionStrategy,
	}})
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return nil, err
	}
	if c.ManageCertificates {
		r := c.rotator(direct)
		if err := mgr.Add(manager.RunnableFunc(r.Run)); err != nil {
			return nil, err
		}
	}
	if signNodeCerts {
		s := &nodecerts.Signer{Client: mgr.GetClient(), CertDir: c.CertDir,
			Requester: nodecerts.Requester(c.ServiceNamespace), MaxLifetime: c.NodeCertMaxLifetime}
		if err := s.SetupWithManager(mgr); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// Scheme returns a scheme with the Kubernetes built-in types and the Kubevisor API.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	return s
}

// Run serves admission until ctx ends.
func Run(ctx context.Context, cfg *rest.Config, c Config) error {
	mgr, err := NewManager(cfg, c)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}
