package liveconfig

import (
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

func TestParse(t *testing.T) {
	head := "apiVersion: " + APIVersion + "\nkind: " + Kind + "\n"
	for _, c := range []struct {
		name string
		data map[string]string
		want string // an error holds it; "" means valid
	}{
		{"empty: the flags", map[string]string{Key: head}, ""},
		{"migrations and verbosity", map[string]string{Key: head + "migrations:\n  bandwidthPerMigration: 64Mi\n  parallelMigrationsPerCluster: 3\n  allowPostCopy: true\nlogVerbosity:\n  controller: 4\n"}, ""},
		{"no document", map[string]string{"other": head}, "data[config.yaml]: Required value"},
		{"another version", map[string]string{Key: "apiVersion: liveconfig.kubevisor.io/v2\nkind: " + Kind + "\n"}, `data[config.yaml].apiVersion: Unsupported value: "liveconfig.kubevisor.io/v2"`},
		{"no version", map[string]string{Key: "migrations: {}\n"}, "data[config.yaml].apiVersion: Unsupported value"},
		{"unknown field", map[string]string{Key: head + "migration:\n  progressTimeout: 5\n"}, `unknown field "migration"`},
		{"not YAML", map[string]string{Key: "{"}, "data[config.yaml]: Invalid value"},
		{"a timeout of 0", map[string]string{Key: head + "migrations:\n  progressTimeout: 0\n"}, "data[config.yaml].migrations.progressTimeout: Invalid value: 0: at least 1 second"},
		{"a limit of 0", map[string]string{Key: head + "migrations:\n  parallelOutboundMigrationsPerNode: 0\n"}, "data[config.yaml].migrations.parallelOutboundMigrationsPerNode: Invalid value: 0: at least 1"},
		{"a negative bandwidth", map[string]string{Key: head + "migrations:\n  bandwidthPerMigration: -1Mi\n"}, "data[config.yaml].migrations.bandwidthPerMigration: Invalid value"},
		{"a handler level", map[string]string{Key: head + "logVerbosity:\n  handler: debug\n"}, ""},
		{"an unknown handler level", map[string]string{Key: head + "logVerbosity:\n  handler: loud\n"}, `data[config.yaml].logVerbosity.handler: Unsupported value: "loud"`},
		{"verbosity over 10", map[string]string{Key: head + "logVerbosity:\n  api: 11\n"}, "data[config.yaml].logVerbosity.api: Invalid value: 11: from 0 to 10"},
		{"permitted host devices", map[string]string{Key: head + "permittedHostDevices:\n  pciHostDevices:\n  - pciVendorSelector: 10DE:1EB8\n    resourceName: devices.kubevisor.io/gpu-t4\n  - {pciVendorSelector: '8086:1572', resourceName: nic}\n"}, ""},
		{"no permitted host devices", map[string]string{Key: head + "permittedHostDevices: {}\n"}, ""},
		{"a bad selector", map[string]string{Key: head + "permittedHostDevices:\n  pciHostDevices:\n  - {pciVendorSelector: 10de, resourceName: gpu}\n"}, `data[config.yaml].permittedHostDevices.pciHostDevices[0].pciVendorSelector: Invalid value: "10de": want vendor:device`},
		{"a selector twice", map[string]string{Key: head + "permittedHostDevices:\n  pciHostDevices:\n  - {pciVendorSelector: '10de:1eb8', resourceName: a}\n  - {pciVendorSelector: '10DE:1EB8', resourceName: b}\n"}, `data[config.yaml].permittedHostDevices.pciHostDevices[1].pciVendorSelector: Invalid value: "10DE:1EB8": already selected by data[config.yaml].permittedHostDevices.pciHostDevices[0]`},
		{"no resource name", map[string]string{Key: head + "permittedHostDevices:\n  pciHostDevices:\n  - {pciVendorSelector: '10de:1eb8'}\n"}, "data[config.yaml].permittedHostDevices.pciHostDevices[0].resourceName: Required value"},
		{"another domain", map[string]string{Key: head + "permittedHostDevices:\n  pciHostDevices:\n  - {pciVendorSelector: '10de:1eb8', resourceName: nvidia.com/T4}\n"}, `data[config.yaml].permittedHostDevices.pciHostDevices[0].resourceName: Invalid value: "nvidia.com/T4": the device plugins serve devices.kubevisor.io/<name> only`},
		{"KubeVirt's mediated devices", map[string]string{Key: head + "permittedHostDevices:\n  mediatedDevices: []\n"}, `unknown field "permittedHostDevices.mediatedDevices"`},
		{"feature gates", map[string]string{Key: head + "featureGates: [HostDisk, HostDevices, LiveMigration]\n"}, ""},
		{"no feature gates: none enabled", map[string]string{Key: head + "featureGates: []\n"}, ""},
		{"an unknown feature gate (a hand edit)", map[string]string{Key: head + "featureGates: [HostDisk, Snapshot]\n"}, `data[config.yaml].featureGates[1]: Unsupported value: "Snapshot": supported values: "GPU", "HostDevices", "HostDisk", "LiveMigration", "NUMA"`},
		{"a feature gate twice", map[string]string{Key: head + "featureGates: [HostDisk, HostDisk]\n"}, `data[config.yaml].featureGates[1]: Duplicate value: "HostDisk"`},
		{"KubeVirt's external provider", map[string]string{Key: head + "permittedHostDevices:\n  pciHostDevices:\n  - {pciVendorSelector: '10de:1eb8', resourceName: gpu, externalResourceProvider: true}\n"}, `unknown field "permittedHostDevices.pciHostDevices[0].externalResourceProvider"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.data)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Parse: %v", err)
			case c.want != "" && err == nil:
				t.Fatalf("Parse: no error, want one holding %q", c.want)
			case c.want != "" && !strings.Contains(err.Error(), c.want):
				t.Fatalf("Parse: %v, want it to hold %q", err, c.want)
			}
		})
	}
}

func TestMarshalParses(t *testing.T) {
	c := New()
	c.Migrations = &v1alpha1.KubevisorMigrations{MigrationConfiguration: v1alpha1.MigrationConfiguration{
		BandwidthPerMigration: ptr.To(resource.MustParse("64Mi")), ProgressTimeout: ptr.To[int64](90)},
		ParallelMigrationsPerCluster: ptr.To[int32](2)}
	c.LogVerbosity = &LogVerbosity{API: ptr.To[int32](3)}
	c.PermittedHostDevices = &v1alpha1.PermittedHostDevices{PCIHostDevices: []v1alpha1.PCIHostDevice{{PCIVendorSelector: "10DE:1EB8", ResourceName: "gpu"}}}
	data, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(data)
	if err != nil {
		t.Fatalf("Parse(Marshal()): %v\n%s", err, data[Key])
	}
	if got.Migrations.BandwidthPerMigration.String() != "64Mi" || *got.Migrations.ProgressTimeout != 90 ||
		*got.Migrations.ParallelMigrationsPerCluster != 2 || *APIVerbosity(got) != 3 || ControllerVerbosity(got) != nil ||
		got.PermittedHostDevices.PCIHostDevices[0] != c.PermittedHostDevices.PCIHostDevices[0] {
		t.Errorf("round trip: %+v", got)
	}
	if _, err := Parse(map[string]string{Key: mustMarshal(t, New())}); err != nil {
		t.Errorf("New() does not parse: %v", err)
	}
}

func mustMarshal(t *testing.T, c Config) string {
	t.Helper()
	data, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return data[Key]
}

// TestVerbosity: the applier sets the flag to the configuration's value, and back to the
// flag's value at its making when the configuration has none.
func TestVerbosity(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	v := fs.Int("v", 2, "")
	val := fs.Lookup("v").Value
	apply := Verbosity(val, ControllerVerbosity, logr.Discard())
	c := New()
	c.LogVerbosity = &LogVerbosity{Controller: ptr.To[int32](5), API: ptr.To[int32](1)}
	apply(c)
	if *v != 5 {
		t.Errorf("after a configuration of 5: -v=%d", *v)
	}
	apply(New())
	if *v != 2 {
		t.Errorf("after a configuration without it: -v=%d, want the flag's 2", *v)
	}
}

// TestHandlerLevel: the applier sets the hclog root's level (its sub-loggers follow) and the
// slog level, and returns them to the flag's when the configuration has none.
func TestHandlerLevel(t *testing.T) {
	root := hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: io.Discard})
	sub := root.Named("driver")
	sl := &slog.LevelVar{}
	apply := HandlerLevel(root, sl, "info", logr.Discard())
	c := New()
	c.LogVerbosity = &LogVerbosity{Handler: "trace"}
	apply(c)
	if !sub.IsTrace() || sl.Level() != slog.LevelDebug-4 {
		t.Errorf("after trace: sub-logger level %v, slog %v", sub.GetLevel(), sl.Level())
	}
	apply(New())
	if sub.GetLevel() != hclog.Info || sl.Level() != slog.LevelInfo {
		t.Errorf("after none: sub-logger level %v, slog %v, want the flag's info", sub.GetLevel(), sl.Level())
	}
}
