package subresources

import (
	"flag"
	"net"
	"time"

	"github.com/kubevisor/kubevisor/controlplane/webhook"
)

// Defaults of Config.
const (
	DefaultPort             = 8443
	DefaultHandlerLabel     = "app.kubernetes.io/name=kubevisor-handler"
	DefaultHandlerDialLimit = 10 * time.Second
)

// Files in Config.CertDir. The serving pair is the webhooks' (tls.crt, tls.key); the client pair
// and the CA bundle are what kubevisor-api presents to and checks of the node handlers.
const (
	ServingCertFile = "tls.crt"
	ServingKeyFile  = "tls.key"
	ClientCertFile  = "client.crt"
	ClientKeyFile   = "client.key"
	CABundleFile    = "ca-bundle.crt"
)

// Config is how kubevisor-api serves subresources.kubevisor.io; cmd/kubevisor-api maps its flags
// onto it.
type Config struct {
	// BindAddress and Port are where the aggregated API server listens ("" is every address).
	BindAddress string
	Port        int
	// CertDir holds the serving pair (tls.crt, tls.key, reloaded when they change) and the
	// handler client pair and CA bundle (client.crt, client.key, ca-bundle.crt).
	CertDir string
	// Kubeconfig reaches the API server that authenticates (TokenReview) and authorizes
	// (SubjectAccessReview) requests and holds kube-system/extension-apiserver-authentication;
	// empty is the in-cluster configuration.
	Kubeconfig string
	// HandlerNamespace and HandlerSelector find the node handler pods (a label selector).
	HandlerNamespace, HandlerSelector string
	// DialTimeout bounds the connection to a node handler.
	DialTimeout time.Duration
	// Listener, when set, is served instead of BindAddress:Port (tests listen on port 0).
	Listener net.Listener
}

// DefaultConfig is the configuration the manifests expect.
func DefaultConfig() Config {
	return Config{
		Port:             DefaultPort,
		CertDir:          webhook.DefaultConfig().CertDir,
		HandlerNamespace: webhook.DefaultServiceNamespace,
		HandlerSelector:  DefaultHandlerLabel,
		DialTimeout:      DefaultHandlerDialLimit,
	}
}

// AddFlags binds c's fields to flags of fs, with c's values as defaults. CertDir has no flag of
// its own: kubevisor-api shares the webhook's --cert-dir.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.BindAddress, "subresources-bind-address", c.BindAddress, "address the subresource API server listens on (empty: all)")
	fs.IntVar(&c.Port, "subresources-port", c.Port, "port of the subresource API server (subresources.kubevisor.io)")
	fs.StringVar(&c.Kubeconfig, "authentication-kubeconfig", c.Kubeconfig, "kubeconfig of the API server that authenticates and authorizes subresource requests (empty: in-cluster)")
	fs.StringVar(&c.HandlerNamespace, "handler-namespace", c.HandlerNamespace, "namespace of the node handler pods")
	fs.StringVar(&c.HandlerSelector, "handler-selector", c.HandlerSelector, "label selector of the node handler pods")
	fs.DurationVar(&c.DialTimeout, "handler-dial-timeout", c.DialTimeout, "timeout of a connection to a node handler")
}
