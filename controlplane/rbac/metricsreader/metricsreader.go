// Package metricsreader declares the ClusterRole kubevisor-metrics-reader: get on the
// non-resource URL /metrics, what a scraper needs to read the metrics of every Kubevisor
// component (core/metricsauth) and of kubevisor-api's aggregated API server. The install binds
// it to nobody; an admin binds the scraper's ServiceAccount to it (docs/operations.md).
package metricsreader

// +kubebuilder:rbac:urls=/metrics,verbs=get
