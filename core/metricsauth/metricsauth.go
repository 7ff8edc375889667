// Package metricsauth serves a component's Prometheus metrics over HTTPS behind Kubernetes
// authentication and authorization, as every Kubevisor component that runs a
// controller-runtime manager does (kubevisor-controller, kubevisor-api, kubevisor-handler,
// kubevisor-operator).
//
// A request must carry a bearer token that the API server accepts (TokenReview) for a user
// allowed to get the non-resource URL /metrics (SubjectAccessReview): the ClusterRole ReaderRole
// (manifests/rbac/metrics-reader) grants exactly that, and a scraper's ServiceAccount is bound to
// it by the admin; the install binds it to nobody. A request without a token is answered 401, one
// whose user is not allowed 403, and one whose token the API server does not accept (expired,
// of a deleted ServiceAccount) 500: controller-runtime's filter takes the TokenReview's reason
// for an error. None of them is served a metric. The component's own role needs create on tokenreviews and
// subjectaccessreviews: the markers below, which hack/generate-rbac.sh and
// hack/generate-webhook.sh put into each of those components' roles.
//
// The health probes are not served here and stay plain HTTP, open to the kubelet.
package metricsauth

import (
	"crypto/tls"

	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// ReaderRole is the ClusterRole that allows get on /metrics, for scrapers.
const ReaderRole = "kubevisor-metrics-reader"

// Files of a certificate directory given to Options: the serving pair as kubevisor-api's
// certificate directory holds it.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// Options are the metrics server options of a component listening on addr ("0" turns the
// server off): HTTPS with TLS 1.2 or later, each request authenticated and authorized by the
// API server the manager reaches.
//
// The serving certificate is CertFile and KeyFile in certDir, reloaded when they change, when
// certDir is set and holds them when the server starts. Otherwise (certDir empty, or the files
// not there yet) controller-runtime makes a self-signed certificate in memory at start. That is
// enough for metrics: what protects them is the token and its authorization, and TLS keeps the
// token and the figures from being read on the way; a scraper then skips verifying the
// certificate (Prometheus: tls_config.insecure_skip_verify), as it does for
// kube-controller-manager's and kube-scheduler's self-signed metrics certificates.
func Options(addr, certDir string) metricsserver.Options {
	o := metricsserver.Options{
		BindAddress:    addr,
		SecureServing:  true,
		FilterProvider: filters.WithAuthenticationAndAuthorization,
		TLSOpts:        []func(*tls.Config){MinTLS12},
	}
	if certDir != "" {
		o.CertDir, o.CertName, o.KeyName = certDir, CertFile, KeyFile
	}
	return o
}

// MinTLS12 raises c's minimum protocol version to TLS 1.2 (a TLSOpts option of
// controller-runtime's metrics and webhook servers, which set none themselves).
func MinTLS12(c *tls.Config) {
	if c.MinVersion < tls.VersionTLS12 {
		c.MinVersion = tls.VersionTLS12
	}
}
