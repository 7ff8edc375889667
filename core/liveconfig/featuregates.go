package liveconfig

import (
	"github.com/go-logr/logr"

	"github.com/kubevisor/kubevisor/core/featuregate"
)

// FeatureGates returns an Applier that stores each configuration's FeatureGates into gates,
// which kubevisor-api's admission reads at every request, or base (its --feature-gates) when
// the configuration has none (nil: the field absent, the ConfigMap absent or deleted). The swap
// is atomic and needs no restart; it decides the admission of requests from then on, and no
// running VMI is touched.
func FeatureGates(gates *featuregate.Live, base featuregate.Set, log logr.Logger) Applier {
	return func(c Config) {
		want, from := base, "flag --feature-gates"
		if c.FeatureGates != nil {
			s, err := featuregate.NewSet(c.FeatureGates...)
			if err != nil { // Parse validated it: only a configuration made in code gets here
				log.Error(err, "feature gates refused: the ones before stay", "featureGates", c.FeatureGates)
				return
			}
			want, from = s, "live configuration"
		}
		if gates.Load().Equal(want) {
			return
		}
		gates.Store(want)
		log.Info("feature gates set", "featureGates", want.String(), "from", from)
	}
}
