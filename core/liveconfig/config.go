// Package liveconfig is the configuration the components take while they run: a versioned
// document in one ConfigMap (kubevisor-system/kubevisor-config) that kubevisor-operator renders
// from the Kubevisor object's live fields, a watcher of that ConfigMap, and appliers that hand
// each valid version to what a component can change without a restart: migration defaults and
// limits, log verbosity, the permitted host devices of the nodes' hostdev driver, and the
// feature gates kubevisor-api admits by.
//
// A component's flags stay its base: a field the ConfigMap leaves out, or a ConfigMap that is
// absent or deleted, means the flag's value (installs without the operator run on flags only).
package liveconfig

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/featuregate"
)

// Where the live configuration is: the ConfigMap Name in Namespace, the document under Key.
const (
	Namespace = "kubevisor-system"
	Name      = "kubevisor-config"
	Key       = "config.yaml"
)

// APIVersion and Kind identify the document; a document of another version is refused, so a
// component never applies a format it does not know.
const (
	APIVersion = "liveconfig.kubevisor.io/v1alpha1"
	Kind       = "LiveConfiguration"
)

// Bounds of LogVerbosity (klog's -v), as the Kubevisor CRD's.
const (
	MinVerbosity = 0
	MaxVerbosity = 10
)

// Config is the live configuration. A nil field means the component's flag (its base).
type Config struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Migrations are the cluster's migration defaults and limits on migrations at once
	// (kubevisor-controller's --migration-* flags), the Kubevisor's configuration.migrations.
	Migrations *v1alpha1.KubevisorMigrations `json:"migrations,omitempty"`
	// LogVerbosity is the klog verbosity (-v) of kubevisor-controller and kubevisor-api, and
	// the node handler's log level (--log-level).
	LogVerbosity *LogVerbosity `json:"logVerbosity,omitempty"`
	// PermittedHostDevices are the host devices the nodes' hostdev driver (HostDevicesDriver)
	// offers, in place of the permittedHostDevices of its node configuration
	// (driverConfig.hostdev); nil means the node's. The node handlers and the
	// kubevisor-deviceplugins containers give them to their running hostdev driver
	// (HostDevices), which lists and advertises the new resources. An empty value permits none.
	PermittedHostDevices *v1alpha1.PermittedHostDevices `json:"permittedHostDevices,omitempty"`
	// FeatureGates are the enabled feature gates (package core/featuregate) that kubevisor-api
	// admits by, in place of its --feature-gates; absent (nil) means the flag's, and an empty
	// list enables none. The operator always writes it, [] when the Kubevisor lists none, so
	// that the Kubevisor is the truth.
	FeatureGates []string `json:"featureGates,omitzero"`
}

// LogVerbosity is Config.LogVerbosity.
type LogVerbosity struct {
	Controller *int32 `json:"controller,omitempty"`
	API        *int32 `json:"api,omitempty"`
	// Handler is a level of HandlerLevels; "" means the handler's flag.
	Handler string `json:"handler,omitempty"`
}

// HandlerLevels are the node handler's log levels (the Kubevisor CRD's logVerbosity.handler).
var HandlerLevels = []string{"trace", "debug", "info", "warn", "error"}

// New returns an empty Config of the current version: every field is the flags'.
func New() Config {
	return Config{APIVersion: APIVersion, Kind: Kind}
}

// Parse reads the ConfigMap's data: the document under Key, strictly (an unknown field is an
// error naming its path in the document, so a typo is not silently the flag's value), then
// Validate. Errors carry the field
// path from the ConfigMap: data[config.yaml].migrations.progressTimeout.
func Parse(data map[string]string) (Config, error) {
	p := field.NewPath("data").Key(Key)
	doc, ok := data[Key]
	if !ok {
		return Config{}, field.ErrorList{field.Required(p, "the live configuration document")}.ToAggregate()
	}
	var c Config
	j, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		return Config{}, field.ErrorList{field.Invalid(p, "", err.Error())}.ToAggregate()
	}
	// Strict, case-sensitive, and an unknown field named by its path in the document.
	strict, err := kjson.UnmarshalStrict(j, &c)
	if err != nil {
		return Config{}, field.ErrorList{field.Invalid(p, "", err.Error())}.ToAggregate()
	}
	if len(strict) > 0 {
		var errs field.ErrorList
		for _, e := range strict {
			errs = append(errs, field.Invalid(p, "", e.Error()))
		}
		return Config{}, errs.ToAggregate()
	}
	if errs := c.Validate(p); len(errs) > 0 {
		return Config{}, errs.ToAggregate()
	}
	return c, nil
}

// Marshal is the ConfigMap data of c (Parse's input).
func (c Config) Marshal() (map[string]string, error) {
	data, err := yaml.Marshal(c)
	if err != nil {
		return nil, err
	}
	return map[string]string{Key: string(data)}, nil
}

// Validate says what is wrong with c, each error under p.
func (c Config) Validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if c.APIVersion != APIVersion {
		errs = append(errs, field.NotSupported(p.Child("apiVersion"), c.APIVersion, []string{APIVersion}))
	}
	if c.Kind != Kind {
		errs = append(errs, field.NotSupported(p.Child("kind"), c.Kind, []string{Kind}))
	}
	errs = append(errs, ValidateMigrations(c.Migrations, p.Child("migrations"))...)
	if v := c.LogVerbosity; v != nil {
		errs = append(errs, validateVerbosity(v.Controller, p.Child("logVerbosity", "controller"))...)
		errs = append(errs, validateVerbosity(v.API, p.Child("logVerbosity", "api"))...)
		if v.Handler != "" && !slices.Contains(HandlerLevels, v.Handler) {
			errs = append(errs, field.NotSupported(p.Child("logVerbosity", "handler"), v.Handler, HandlerLevels))
		}
	}
	errs = append(errs, c.PermittedHostDevices.Validate(p.Child("permittedHostDevices"))...)
	errs = append(errs, featuregate.Validate(c.FeatureGates, p.Child("featureGates"))...)
	return errs
}

func validateVerbosity(v *int32, p *field.Path) field.ErrorList {
	if v == nil || (*v >= MinVerbosity && *v <= MaxVerbosity) {
		return nil
	}
	return field.ErrorList{field.Invalid(p, *v, fmt.Sprintf("from %d to %d", MinVerbosity, MaxVerbosity))}
}

// ValidateMigrations checks migration defaults by what kubevisor-controller accepts (the
// operator checks the Kubevisor's configuration.migrations with it, at p): a bandwidth that is
// not negative, timeouts of at least 1 second, limits of at least 1.
func ValidateMigrations(m *v1alpha1.KubevisorMigrations, p *field.Path) field.ErrorList {
	if m == nil {
		return nil
	}
	var errs field.ErrorList
	if m.BandwidthPerMigration != nil && m.BandwidthPerMigration.Sign() < 0 {
		errs = append(errs, field.Invalid(p.Child("bandwidthPerMigration"), m.BandwidthPerMigration.String(), "bytes per second, 0 for no limit"))
	}
	if m.CompletionTimeoutPerGiB != nil && *m.CompletionTimeoutPerGiB < 1 {
		errs = append(errs, field.Invalid(p.Child("completionTimeoutPerGiB"), *m.CompletionTimeoutPerGiB, "at least 1 second"))
	}
	if m.ProgressTimeout != nil && *m.ProgressTimeout < 1 {
		errs = append(errs, field.Invalid(p.Child("progressTimeout"), *m.ProgressTimeout, "at least 1 second"))
	}
	for _, l := range []struct {
		name string
		v    *int32
	}{{"parallelMigrationsPerCluster", m.ParallelMigrationsPerCluster}, {"parallelOutboundMigrationsPerNode", m.ParallelOutboundMigrationsPerNode}} {
		if l.v != nil && *l.v < 1 {
			errs = append(errs, field.Invalid(p.Child(l.name), *l.v, "at least 1"))
		}
	}
	return errs
}
