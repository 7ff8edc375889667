// Package cli is the kubevisor-conformance command: it runs the checks of the driver
// conformance kit (package conformance, conformance/driver) against driver plugin binaries,
// started and reached through the plugin host of core/plugin as a node's handler would:
// `driver` runs the checks of one driver's kind, `vm` boots a real guest with a hypervisor and
// a storage driver together. With --class both take the hypervisor from a HypervisorClass
// manifest (class.go): its driver, and for `vm` the capabilities every launcher keeps, as in a
// launcher pod of that class.
//
// It lives apart from the kit so that the kit, a library driver authors import into their own
// tests, does not depend on the plugin host.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/core/plugin"
)

// Exit codes of Run.
const (
	ExitOK    = 0
	ExitFail  = 1
	ExitUsage = 2
)

const usage = `usage: kubevisor-conformance driver --plugin PATH --kind KIND [flags]
       kubevisor-conformance driver --class FILE [flags]
       kubevisor-conformance vm --hypervisor PATH --storage PATH --guest-dir DIR [flags]
       kubevisor-conformance vm --class FILE --storage PATH --guest-dir DIR [flags]

driver runs the conformance checks of a driver's kind against its plugin binary; vm boots a
real guest with a hypervisor and a storage driver plugin together. Both start the plugins
through the Kubevisor plugin host, print a line per check, then "N passed, N failed,
N skipped", and exit 1 when a check fails. --class FILE takes the hypervisor from a
HypervisorClass manifest: the driver kubevisor-driver-<driver> in --plugin-dir (default: this
program's directory) and, for vm, every launcher confined to the class's launcherCapabilities
as in its launcher pods. "kubevisor-conformance driver -h" and "kubevisor-conformance vm -h"
list their flags.
`

const driverUsage = `usage: kubevisor-conformance driver --plugin PATH --kind KIND [flags]
       kubevisor-conformance driver --class FILE [flags]

Runs the driver conformance checks against a driver plugin binary, started through the
Kubevisor plugin host. Prints a line per check, then "N passed, N failed, N skipped";
exits 1 when a check fails.

--class FILE runs the hypervisor checks against the driver of a HypervisorClass manifest (YAML
or JSON, as installed: manifests/install/drivers/<driver>/hypervisorclass.yaml): the plugin
binary kubevisor-driver-<driver> in --plugin-dir, whose Info must report that name. --plugin and
--name may be given with it when they name the class's driver. A class with parameters is
refused, as the API server refuses it. The class's launcherCapabilities, deviceResources,
overhead and scheduling are not applied (the driver checks start no launcher: vm --class does);
lines say so.

Flags:
`

// DriverConfig is the configuration of `kubevisor-conformance driver`, one field per flag.
type DriverConfig struct {
	// Plugin is the driver plugin binary.
	Plugin string
	// Kind is hypervisor, network, storage or device.
	Kind string
	// Class is a HypervisorClass manifest (YAML or JSON) whose driver is the hypervisor under
	// test: found in PluginDir unless Plugin names it, and with the class's driver name.
	Class string
	// PluginDir is where Class's driver binary, kubevisor-driver-<driver>, is; empty means the
	// directory of this executable.
	PluginDir string
	// Name is the driver's name; empty means the binary's file name without a
	// "kubevisor-driver-" prefix.
	Name string
	// Args are passed to the plugin binary.
	Args []string
	// ConfigFile holds the driver's configuration (JSON), passed to Configure.
	ConfigFile string
	// JUnit, when set, is where the JUnit XML report is written.
	JUnit string
	// Run selects checks as `go test -run` does ("Lifecycle", "Setup/StableMAC").
	Run string
	// StateDir is the plugin host's state directory; empty means a temporary one.
	StateDir string
	// Timeout bounds each check.
	Timeout time.Duration
	// ShutdownTimeout is the timeout the hypervisor checks pass to Shutdown.
	ShutdownTimeout time.Duration
	// ConsoleMarker is text the serial console of a started VM must show.
	ConsoleMarker string
	// Domain is a file with the domain spec (protobuf JSON) of the VMs the hypervisor checks
	// create: something to boot, for ConsoleMarker (conformance.DomainFromFile).
	Domain string
	// GuestDir holds a test guest (conformance.GuestFromDir) the hypervisor checks boot instead
	// of conformance.DefaultDomain; ConsoleMarker then defaults to its ready marker.
	GuestDir string
	// LogLevel is the level of the host's and the plugin's log lines on stderr.
	LogLevel string

	// class is Class, loaded by applyClass.
	class *v1alpha1.HypervisorClass
}

// Run runs the kubevisor-conformance command with args (without the program name), writing
// the progress and summary to stdout and diagnostics to stderr, and returns the exit code.
func Run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "vm" {
		return runVMCommand(args[1:], stdout, stderr)
	}
	if len(args) == 0 || args[0] != "driver" {
		fmt.Fprint(stderr, usage)
		return ExitUsage
	}
	cfg := DriverConfig{}
	fs := newDriverFlags(&cfg, stderr)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if err := cfg.validate(fs.Args()); err != nil {
		fmt.Fprintf(stderr, "kubevisor-conformance driver: %v\n", err)
		return ExitUsage
	}
	return RunDriver(cfg, stdout, stderr)
}

// stringsFlag is a flag that may be given more than once.
type stringsFlag []string

func (s *stringsFlag) String() string     { return strings.Join(*s, " ") }
func (s *stringsFlag) Set(v string) error { *s = append(*s, v); return nil }

func newDriverFlags(cfg *DriverConfig, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kubevisor-conformance driver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, driverUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.Plugin, "plugin", "", "driver plugin `binary` (required unless --class)")
	fs.StringVar(&cfg.Kind, "kind", "", "driver `kind`: hypervisor, network, storage or device (required unless --class, which is hypervisor)")
	fs.StringVar(&cfg.Class, "class", "", "HypervisorClass manifest `file` (YAML or JSON) whose driver is the hypervisor under test")
	fs.StringVar(&cfg.PluginDir, "plugin-dir", "", "`directory` holding kubevisor-driver-<driver> of --class (default: this program's)")
	fs.StringVar(&cfg.Name, "name", "", "driver `name` (default: the binary's name without \"kubevisor-driver-\")")
	fs.Var((*stringsFlag)(&cfg.Args), "arg", "`argument` for the plugin binary (repeatable)")
	fs.StringVar(&cfg.ConfigFile, "config", "", "`file` with the driver's configuration (JSON)")
	fs.StringVar(&cfg.JUnit, "junit", "", "write a JUnit XML report to `file`")
	fs.StringVar(&cfg.Run, "run", "", "run only the checks matching `regexp`, as go test -run")
	fs.StringVar(&cfg.StateDir, "state-dir", "", "plugin host state `directory` (default: a temporary one)")
	fs.DurationVar(&cfg.Timeout, "timeout", conformance.DefaultTimeout, "how long each check may take")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", conformance.DefaultShutdownTimeout, "the timeout hypervisor checks give Shutdown")
	fs.StringVar(&cfg.ConsoleMarker, "console-marker", "", "`text` the serial console of a started VM must show (Console/Output); needs a VM with something to boot: --domain or --guest-dir")
	fs.StringVar(&cfg.Domain, "domain", "", "`file` with the domain spec (protobuf JSON) of the hypervisor checks' VMs, instead of the default with nothing to boot; the kit sets id and runDir")
	fs.StringVar(&cfg.GuestDir, "guest-dir", "", "boot the test guest in `directory` (as make guest builds it) in the hypervisor checks' VMs; --console-marker defaults to its ready marker")
	fs.StringVar(&cfg.LogLevel, "log-level", "warn", "`level` of the host's and the plugin's logs on stderr (trace, debug, info, warn, error, off)")
	return fs
}

// applyClass loads Class, once, and takes the hypervisor's binary, name and kind from it.
func (cfg *DriverConfig) applyClass() error {
	if cfg.Class == "" || cfg.class != nil {
		return nil
	}
	if cfg.Kind != "" && cfg.Kind != driver.KindHypervisor {
		return fmt.Errorf("--kind %s: --class names a hypervisor driver", cfg.Kind)
	}
	c, err := loadClass(cfg.Class)
	if err != nil {
		return err
	}
	if cfg.Plugin, cfg.Name, err = classDriver(c, cfg.Class, cfg.Plugin, cfg.Name, cfg.PluginDir, "--plugin", "--name"); err != nil {
		return err
	}
	cfg.Kind = driver.KindHypervisor
	cfg.class = c
	return nil
}

func (cfg *DriverConfig) validate(rest []string) error {
	switch {
	case len(rest) > 0:
		return fmt.Errorf("unexpected arguments %q (pass arguments of the plugin with --arg)", rest)
	case cfg.PluginDir != "" && cfg.Class == "":
		return errors.New("--plugin-dir is for --class")
	}
	if err := cfg.applyClass(); err != nil {
		return err
	}
	switch {
	case cfg.Plugin == "":
		return errors.New("--plugin or --class is required")
	case cfg.Kind == "":
		return errors.New("--kind is required")
	}
	if _, err := driver.ParseKind(cfg.Kind); err != nil {
		return fmt.Errorf("--kind: %w", err)
	}
	if hclog.LevelFromString(cfg.LogLevel) == hclog.NoLevel {
		return fmt.Errorf("--log-level: unknown level %q", cfg.LogLevel)
	}
	if _, err := conformance.NewRecorder(conformance.RecorderConfig{Run: cfg.Run}); err != nil {
		return fmt.Errorf("--run: %w", err)
	}
	if (cfg.Domain != "" || cfg.GuestDir != "") && cfg.Kind != driver.KindHypervisor {
		return errors.New("--domain and --guest-dir are for --kind hypervisor")
	}
	if cfg.Domain != "" && cfg.GuestDir != "" {
		return errors.New("give one of --domain and --guest-dir")
	}
	return nil
}

// domainOptions are the options of the hypervisor checks' domain spec and console marker.
func (cfg *DriverConfig) domainOptions() ([]conformance.Option, error) {
	marker := cfg.ConsoleMarker
	var domain func(id, dir string) *domainv1.DomainSpec
	var err error
	switch {
	case cfg.Domain != "":
		domain, err = conformance.DomainFromFile(cfg.Domain)
	case cfg.GuestDir != "":
		var g conformance.Guest
		if g, err = conformance.GuestFromDir(cfg.GuestDir); err == nil {
			domain, err = conformance.GuestDomain(g)
			if marker == "" {
				marker = g.ReadyMarker
			}
		}
	}
	if err != nil {
		return nil, err
	}
	opts := []conformance.Option{conformance.WithConsoleMarker(marker)}
	if domain != nil {
		opts = append(opts, conformance.WithDomain(domain))
	}
	return opts, nil
}

// RunDriver runs the checks of cfg.Kind against the plugin and returns the exit code. Setting
// up the plugin is part of the run: a plugin that does not start is a failed check named after
// the kind.
func RunDriver(cfg DriverConfig, stdout, stderr io.Writer) int {
	if err := cfg.applyClass(); err != nil {
		fmt.Fprintf(stderr, "kubevisor-conformance driver: %v\n", err)
		return ExitUsage
	}
	kind, err := driver.ParseKind(cfg.Kind)
	if err != nil {
		fmt.Fprintf(stderr, "kubevisor-conformance driver: %v\n", err)
		return ExitUsage
	}
	rec, err := conformance.NewRecorder(conformance.RecorderConfig{Progress: stdout, Run: cfg.Run})
	if err != nil {
		fmt.Fprintf(stderr, "kubevisor-conformance driver: --run: %v\n", err)
		return ExitUsage
	}
	logger := hclog.New(&hclog.LoggerOptions{
		Name:   "kubevisor-conformance",
		Level:  hclog.LevelFromString(cfg.LogLevel),
		Output: stderr,
	})

	rec.Run(cfg.Kind, func(t conformance.T) { runPlugin(t, cfg, kind, logger, stdout) })
	return finish(rec, "driver", cfg.Run, cfg.JUnit, stdout, stderr)
}

// finish prints the summary of a run of the command cmd, writes its JUnit report when asked,
// and returns the exit code.
func finish(rec *conformance.Recorder, cmd, run, junit string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stdout, rec.Summary())
	passed, failed, skipped := rec.Counts()
	code := ExitOK
	if failed > 0 {
		code = ExitFail
	}
	if passed+failed+skipped == 0 {
		fmt.Fprintf(stderr, "kubevisor-conformance %s: warning: no check matches --run %q\n", cmd, run)
	}
	if junit != "" {
		if err := writeJUnit(junit, rec.Results()); err != nil {
			fmt.Fprintf(stderr, "kubevisor-conformance %s: %v\n", cmd, err)
			code = ExitFail
		}
	}
	return code
}

func writeJUnit(path string, results []conformance.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write JUnit report: %w", err)
	}
	if err := conformance.WriteJUnit(f, results); err != nil {
		_ = f.Close()
		return fmt.Errorf("write JUnit report %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write JUnit report: %w", err)
	}
	return nil
}

// runPlugin starts the plugin and runs the kit of its kind against it, as the suite t.
func runPlugin(t conformance.T, cfg DriverConfig, kind basev1.Kind, logger hclog.Logger, stdout io.Writer) {
	m := manifest(t, cfg.Plugin, cfg.Kind, cfg.Name, cfg.Args, cfg.ConfigFile)
	host, stateDir := newHost(t, cfg.StateDir, logger)
	startPlugin(t, host, m, cfg.Timeout, cfg.Class)
	fmt.Fprintf(stdout, "=== driver %s (%s): %s %s\n", m.Name, cfg.Kind, m.Binary, strings.Join(m.Args, " "))
	if cfg.class != nil {
		printClass(stdout, cfg.Class, cfg.class, false)
	}

	domainOpts, err := cfg.domainOptions()
	if err != nil {
		t.Fatalf("%v", err)
	}
	opts := append([]conformance.Option{
		conformance.WithName(m.Name),
		conformance.WithConfig(m.Config),
		// The directory the host gives the driver (HostConfig.StateDir): the kit's Configure
		// must not move it.
		conformance.WithStateDir(driverStateDir(stateDir, m)),
		conformance.WithTimeout(cfg.Timeout),
		conformance.WithShutdownTimeout(cfg.ShutdownTimeout),
	}, domainOpts...)
	switch kind {
	case basev1.Kind_KIND_HYPERVISOR:
		get := hypervisorOf(host, m.Name)
		// The Recover checks need a new driver process, as the handler sees after a crash:
		// the plugin is killed with SIGKILL, and the host's supervision starts it again.
		restart := func(t conformance.T) driver.Hypervisor {
			crash(t, host, m.Name, cfg.Timeout)
			return get(t)
		}
		conformance.Hypervisor(t, get, append(opts, conformance.WithRestart(restart))...)
	case basev1.Kind_KIND_NETWORK:
		conformance.Network(t, func(t conformance.T) driver.Network {
			d, err := host.Network(m.Name)
			if err != nil {
				t.Fatalf("%v", err)
			}
			return d
		}, opts...)
	case basev1.Kind_KIND_STORAGE:
		conformance.Storage(t, storageOf(host, m.Name), opts...)
	case basev1.Kind_KIND_DEVICE:
		conformance.Device(t, func(t conformance.T) driver.Device {
			d, err := host.Device(m.Name)
			if err != nil {
				t.Fatalf("%v", err)
			}
			return d
		}, opts...)
	}
}

// manifest makes the manifest of a plugin binary given on the command line, failing t.
func manifest(t conformance.T, binary, kind, name string, args []string, configFile string) plugin.Manifest {
	t.Helper()
	m, err := plugin.ManifestFor(binary, kind, name)
	if err != nil {
		t.Fatalf("%v", err)
	}
	m.Args = args
	if configFile != "" {
		config, err := os.ReadFile(configFile)
		if err != nil {
			t.Fatalf("read the configuration of driver %q: %v", m.Name, err)
		}
		m.Config = config
	}
	return m
}

// newHost makes a plugin host on stateDir (a temporary directory when empty), closed when t
// ends, and returns it with its absolute state directory.
func newHost(t conformance.T, stateDir string, logger hclog.Logger) (*plugin.Host, string) {
	t.Helper()
	var err error
	if stateDir != "" {
		// The driver, whose working directory is not ours, gets a path under it.
		if stateDir, err = filepath.Abs(stateDir); err != nil {
			t.Fatalf("--state-dir: %v", err)
		}
	} else {
		stateDir, err = os.MkdirTemp("", "kubevisor-conformance-")
		if err != nil {
			t.Fatalf("make a state directory: %v", err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(stateDir) })
	}
	host, err := plugin.NewHost(plugin.HostConfig{StateDir: stateDir, Logger: logger})
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := host.Close(); err != nil {
			t.Errorf("close the plugin host: %v", err)
		}
	})
	return host, stateDir
}

// driverStateDir is the state directory the host gives driver m (HostConfig.StateDir).
func driverStateDir(hostStateDir string, m plugin.Manifest) string {
	return filepath.Join(hostStateDir, "drivers", m.Name)
}

// startPlugin starts m on host, failing t. class is the --class file m's name comes from, if
// any: the plugin's Info must report the class's driver.
func startPlugin(t conformance.T, host *plugin.Host, m plugin.Manifest, timeout time.Duration, class string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	if err := host.Start(ctx, m); err != nil {
		if class != "" {
			t.Fatalf("start the plugin of --class %s, whose driver is %q: %v", class, m.Name, err)
		}
		t.Fatalf("start the plugin: %v", err)
	}
}

// hypervisorOf is the factory of the host's client of a hypervisor driver, which follows the
// driver across restarts of its plugin process.
func hypervisorOf(host *plugin.Host, name string) conformance.HypervisorFactory {
	return func(t conformance.T) driver.Hypervisor {
		d, err := host.Hypervisor(name)
		if err != nil {
			t.Fatalf("%v", err)
		}
		return d
	}
}

// storageOf is the factory of the host's client of a storage driver.
func storageOf(host *plugin.Host, name string) conformance.StorageFactory {
	return func(t conformance.T) driver.Storage {
		d, err := host.Storage(name)
		if err != nil {
			t.Fatalf("%v", err)
		}
		return d
	}
}

// crash kills the plugin process of a driver with SIGKILL, as a crash would, and waits until
// the host's supervision has started a new one (running, with another pid).
func crash(t conformance.T, host *plugin.Host, name string, timeout time.Duration) {
	t.Helper()
	before := host.Status(name)
	if !before.Running || before.Pid <= 0 {
		t.Fatalf("driver %q has no running plugin process to kill (last error: %q)", name, before.LastError)
	}
	// os.Process.Kill is SIGKILL on Unix.
	p, err := os.FindProcess(before.Pid)
	if err == nil {
		err = p.Kill()
	}
	if err != nil {
		t.Fatalf("kill the plugin process of driver %q (pid %d): %v", name, before.Pid, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		st := host.Status(name)
		if st.Running && st.Pid > 0 && st.Pid != before.Pid {
			t.Logf("killed the plugin process of driver %q (pid %d) with SIGKILL; the host started it again (pid %d): the host's errors about its exit are expected", name, before.Pid, st.Pid)
			return
		}
		if time.Now().After(deadline) || t.Context().Err() != nil {
			t.Fatalf("the plugin host did not start driver %q again within %s of its process (pid %d) being killed: running=%v pid=%d restarts=%d last error %q",
				name, timeout, before.Pid, st.Running, st.Pid, st.Restarts, st.LastError)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
