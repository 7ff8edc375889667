package migrationproxy

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the proxy's Prometheus metrics (the package doc lists them).
type metrics struct {
	bytes  *prometheus.CounterVec
	conns  *prometheus.CounterVec
	active *prometheus.GaugeVec
}

// newMetrics makes the metrics and registers them with reg (nil: not registered). A metric
// already registered (a second proxy in one process) is shared.
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubevisor_migration_proxy_bytes_total",
			Help: "Bytes the migration proxy carried, by side of the migration this node is (source, target) and direction (to_target, to_source).",
		}, []string{"side", "direction"}),
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubevisor_migration_proxy_connections_total",
			Help: "Migration connections, by side and result: carried, or refused (refusals are logged with their reason).",
		}, []string{"side", "result"}),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubevisor_migration_proxy_active_connections",
			Help: "Migration connections being carried now, by side.",
		}, []string{"side"}),
	}
	if reg != nil {
		m.bytes = register(reg, m.bytes)
		m.conns = register(reg, m.conns)
		m.active = register(reg, m.active)
	}
	return m
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}

func (m *metrics) carried(s side) {
	m.conns.WithLabelValues(string(s), "carried").Inc()
	m.active.WithLabelValues(string(s)).Inc()
}

func (m *metrics) done(s side) { m.active.WithLabelValues(string(s)).Dec() }

func (m *metrics) refused(s side) { m.conns.WithLabelValues(string(s), "refused").Inc() }

// counter returns the function that counts bytes of side s for splice.
func (m *metrics) counter(s side) func(toTarget bool, n int) {
	to, from := m.bytes.WithLabelValues(string(s), "to_target"), m.bytes.WithLabelValues(string(s), "to_source")
	return func(toTarget bool, n int) {
		if toTarget {
			to.Add(float64(n))
		} else {
			from.Add(float64(n))
		}
	}
}
