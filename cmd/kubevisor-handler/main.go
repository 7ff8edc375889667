// Command kubevisor-handler is Kubevisor's node agent (package core/handler). In a cluster
// (the handler DaemonSet) it runs the node's VMIs (package core/handler/cluster); without one
// it runs one VMI from a manifest (package core/handler/standalone):
//
//	kubevisor-handler serve [--config handler.yaml|DIR] [--plugin-bin-dir DIR] [--node-name NODE] [--kubeconfig FILE]
//	                        [--stream-addr :8186] [--stream-cert-dir DIR] [--stream-client-name NAME]
//	                        [--migration-addr :8187] [--migration-cert-dir DIR] [--node-cert-request=false]
//	kubevisor-handler run -f vmi.yaml [--config handler.yaml]
//	kubevisor-handler install-seccomp --dir /var/lib/kubelet/seccomp/kubevisor
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/handler/cluster"
	"github.com/kubevisor/kubevisor/core/handler/migrationproxy"
	"github.com/kubevisor/kubevisor/core/handler/nodecert"
	"github.com/kubevisor/kubevisor/core/handler/standalone"
	"github.com/kubevisor/kubevisor/core/handler/streams"
	"github.com/kubevisor/kubevisor/core/liveconfig"
	"github.com/kubevisor/kubevisor/core/nodeapi"
	"github.com/kubevisor/kubevisor/core/seccomp"
)

const usage = `usage: kubevisor-handler serve [--config HANDLER.yaml|DIR] [--plugin-bin-dir DIR] [--node-name NODE] [--kubeconfig FILE]
                         [--stream-addr :8186] [--stream-cert-dir DIR] [--stream-client-name NAME]
                         [--migration-addr :8187] [--migration-cert-dir DIR] [--node-cert-request=false]
                         [--node-cert-ca-bundle FILE] [--node-cert-lifetime 24h]
       kubevisor-handler run -f VMI.yaml [--config HANDLER.yaml] [--log-level LEVEL]
       kubevisor-handler install-seccomp --dir DIR

serve: runs the VMIs scheduled to this node (their launcher pods' sandboxes) through the
configured driver plugins, writes their status, and publishes the drivers' capabilities as
labels on the Node. The node name defaults to $NODE_NAME; without --kubeconfig the in-cluster
configuration (or $KUBECONFIG) is used. --config may name a directory: its .yaml/.json files
are merged in name order (the install manifests' base and one file per driver; the
hypervisor drivers of the files add up, the first the default).
--plugin-bin-dir offers the configured drivers' kubevisor-driver-<name> binaries in DIR (the
handler image's /usr/local/bin), besides the plugin directory's manifests.
--stream-addr serves kubevisor-api the VMIs' consoles, VNC displays, port forwards and
actions over HTTPS with mutual TLS (0 disables), with the certificates in --stream-cert-dir
(tls.crt, tls.key, ca.crt); until they exist the port is not served, and the VMIs run anyway.
--migration-addr serves the migration proxy, which carries live migrations between the
nodes' handlers over mutual TLS (core/handler/migrationproxy), with this node's certificate
(common name kubevisor-node:<node>, serverAuth and clientAuth) and the CA bundle in
--migration-cert-dir (tls.crt, tls.key, ca.crt). Off by default (0); the install manifests
turn it on. With --node-cert-request (default) the handler obtains that certificate itself
through the CSR API from kubevisor-api's signer kubevisor.io/node-migration, with a key made
on the node, copies the CA bundle --node-cert-ca-bundle beside it, and renews it at two
thirds of --node-cert-lifetime (package core/handler/nodecert). The port waits for the files
as the stream endpoint does, and migrations to and from the node fail meanwhile; the VMIs
run anyway.

--live-config-name names the ConfigMap (in --live-config-namespace; default
kubevisor-system/kubevisor-config, core/liveconfig) whose logVerbosity.handler replaces
--log-level while it exists, without a restart ("" turns it off).

run: runs one VirtualMachineInstance
on this machine without a cluster: a network namespace on the
host bridge kv-standalone0 with a kubevisor-launcher in it, the VMI booted through the
configured driver plugins (default qmp, cni, local: the kubevisor-driver-* binaries next to
this one), its phase changes and serial console on stdout. Ctrl-C or SIGTERM shuts the guest
down within terminationGracePeriodSeconds and removes everything; a second Ctrl-C cuts the
shutdown short. Needs root.

install-seccomp: writes the launcher pods' seccomp profile (launcher.json: the runtime's
default plus userfaultfd, package core/seccomp) into DIR, which must exist, by renaming a full
copy into place, and exits. The handler DaemonSet's init container runs it with DIR the
kubelet's /var/lib/kubelet/seccomp/kubevisor, whose launcher pods' compute containers name
kubevisor/launcher.json as their Localhost profile.
`

func main() {
	if len(os.Args) >= 2 && os.Args[1] == "serve" {
		serve(os.Args[2:])
		return
	}
	if len(os.Args) >= 2 && os.Args[1] == "install-seccomp" {
		fs := flag.NewFlagSet("install-seccomp", flag.ExitOnError)
		fs.Usage = func() { fmt.Fprint(os.Stderr, usage) }
		dir := fs.String("dir", "", "directory to write launcher.json into")
		_ = fs.Parse(os.Args[2:])
		if *dir == "" || fs.NArg() > 0 {
			fs.Usage()
			os.Exit(2)
		}
		if err := seccomp.Install(*dir); err != nil {
			fmt.Fprintln(os.Stderr, "kubevisor-handler: install seccomp profile:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) < 2 || os.Args[1] != "run" {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	vmiFile := fs.String("f", "", "VMI manifest (kubevisor.io/v1alpha1 VirtualMachineInstance)")
	configFile := fs.String("config", "", "handler configuration file (YAML or JSON)")
	logLevel := fs.String("log-level", "warn", "log level: trace, debug, info, warn, error")
	_ = fs.Parse(os.Args[2:])
	if *vmiFile == "" || fs.NArg() > 0 {
		fs.Usage()
		os.Exit(2)
	}
	var cfg handler.Config
	if *configFile != "" {
		var err error
		if cfg, err = handler.LoadConfig(*configFile); err != nil {
			fmt.Fprintln(os.Stderr, "kubevisor-handler:", err)
			os.Exit(2)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubevisor-handler:", err)
		os.Exit(1)
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "kubevisor-handler", Level: hclog.LevelFromString(*logLevel), Output: os.Stderr})

	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan struct{})
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-signals
		cancel()
		<-signals
		close(stop)
	}()
	err = standalone.Run(ctx, stop, standalone.Options{
		VMIFile: *vmiFile, Config: cfg, BinDir: filepath.Dir(exe), Out: os.Stdout, Logger: logger,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubevisor-handler:", err)
		os.Exit(1)
	}
}

// serve runs `kubevisor-handler serve`.
func serve(args []string) {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	configFile := fs.String("config", "", "handler configuration file (YAML or JSON), or a directory of them merged in name order")
	pluginBinDir := fs.String("plugin-bin-dir", "", "directory whose kubevisor-driver-<name> binaries are the configured drivers (digests computed at start)")
	nodeName := fs.String("node-name", os.Getenv("NODE_NAME"), "the node this handler serves")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster, or $KUBECONFIG)")
	hostDir := fs.String("host-state-dir", cluster.DefaultHostStateDir, "directory of the launcher pods' per-VMI directories on the node")
	metricsAddr := fs.String("metrics-addr", "0", "listen address of /metrics (HTTPS with a self-signed certificate, for bearer tokens the API server allows get on /metrics; 0 disables)")
	healthAddr := fs.String("health-addr", ":8081", "listen address of /healthz and /readyz (plain HTTP; 0 disables)")
	streamAddr := fs.String("stream-addr", streams.DefaultAddr, "listen address of the stream endpoint for kubevisor-api (HTTPS, mutual TLS; 0 disables)")
	streamCertDir := fs.String("stream-cert-dir", "/etc/kubevisor/handler-certs", "directory of the stream endpoint's tls.crt, tls.key and client CA ca.crt (the Secret "+nodeapi.HandlerCertSecret+"), read again when they change; the endpoint waits for them")
	streamClient := fs.String("stream-client-name", nodeapi.ClientName, "the only client certificate common name the stream endpoint accepts")
	migrationAddr := fs.String("migration-addr", "0", "listen address of the migration proxy (mutual TLS with node certificates; 0 disables), e.g. "+migrationproxy.DefaultAddr)
	migrationCertDir := fs.String("migration-cert-dir", "/etc/kubevisor/node-certs", "directory of this node's certificate tls.crt, tls.key (common name "+nodeapi.NodeCommonNamePrefix+"<node>) and the CA bundle ca.crt, read again when they change; the proxy waits for them")
	nodeCertRequest := fs.Bool("node-cert-request", true, "with the migration proxy on, obtain and renew this node's certificate in --migration-cert-dir through the CSR API (signer "+nodeapi.NodeSignerName+"); false: the files are put there by someone else")
	nodeCertCABundle := fs.String("node-cert-ca-bundle", "", "CA bundle copied into --migration-cert-dir as ca.crt (default: ca.crt of --stream-cert-dir, the Secret "+nodeapi.HandlerCertSecret+")")
	nodeCertLifetime := fs.Duration("node-cert-lifetime", nodeapi.NodeCertLifetime, "lifetime asked for a node certificate (the signer may grant less); renewed at two thirds of it")
	migrationAdvertise := fs.String("migration-advertise-address", "", "host:port at which other nodes' handlers reach the migration proxy (default: $POD_IP and the port of --migration-addr)")
	logLevel := fs.String("log-level", "info", "log level: trace, debug, info, warn, error")
	cpuManagerState := fs.String("cpu-manager-state", cluster.DefaultCPUManagerStateFile, "the kubelet's CPU manager state file; the node is labelled kubevisor.io/cpumanager=true while it names the static policy (empty: the label is left to the admin)")
	workers := fs.Int("workers", cluster.DefaultWorkers, "VMIs synced at once (the handler serialises the calls for one VMI)")
	live := &liveconfig.Watcher{}
	fs.StringVar(&live.Namespace, "live-config-namespace", liveconfig.Namespace, "`namespace` of the live configuration ConfigMap")
	fs.StringVar(&live.Name, "live-config-name", liveconfig.Name, "`name` of the live configuration ConfigMap (core/liveconfig), whose handler log level replaces --log-level, and whose permittedHostDevices replace driverConfig.hostdev's, while it exists; \"\" turns it off")
	_ = fs.Parse(args)
	if *nodeCertCABundle == "" {
		*nodeCertCABundle = filepath.Join(*streamCertDir, "ca.crt")
	}
	fail := func(code int, err error) {
		fmt.Fprintln(os.Stderr, "kubevisor-handler serve:", err)
		os.Exit(code)
	}
	if *nodeName == "" || fs.NArg() > 0 {
		fs.Usage()
		os.Exit(2)
	}
	var cfg handler.Config
	if *configFile != "" {
		var err error
		if cfg, err = handler.LoadConfigPath(*configFile); err != nil {
			fail(2, err)
		}
	}
	cfg.NodeName = *nodeName
	var rc *rest.Config
	var err error
	if *kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	} else {
		rc, err = ctrl.GetConfig()
	}
	if err != nil {
		fail(2, err)
	}
	if *migrationAdvertise == "" && *migrationAddr != "0" && *migrationAddr != "" {
		if _, port, err := net.SplitHostPort(*migrationAddr); err == nil && os.Getenv("POD_IP") != "" {
			*migrationAdvertise = net.JoinHostPort(os.Getenv("POD_IP"), port)
		}
	}
	level := hclog.LevelFromString(*logLevel)
	logger := hclog.New(&hclog.LoggerOptions{Name: "kubevisor-handler", Level: level, Output: os.Stderr, JSONFormat: true})
	slogLevel := &slog.LevelVar{}
	slogLevel.Set(liveconfig.SlogLevel(level))
	log := logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slogLevel}))
	ctrl.SetLogger(log)
	if live.Name != "" {
		live.Log = log.WithName("liveconfig")
		live.Appliers = []liveconfig.Applier{liveconfig.HandlerLevel(logger, slogLevel, *logLevel, live.Log)}
	} else {
		live = nil
	}
	err = cluster.Serve(ctrl.SetupSignalHandler(), cluster.ServeConfig{
		Rest: rc, Handler: cfg, PluginBinDir: *pluginBinDir, Agent: cluster.AgentConfig{NodeName: *nodeName, HostStateDir: *hostDir,
			Controller: controller.Options{MaxConcurrentReconciles: *workers},
			Migration:  cluster.MigrationConfig{Address: *migrationAdvertise}},
		Streams:         streams.Config{Addr: *streamAddr, CertDir: *streamCertDir, ClientName: *streamClient},
		Migration:       migrationproxy.Config{Addr: *migrationAddr, CertDir: *migrationCertDir},
		RequestNodeCert: *nodeCertRequest,
		NodeCert:        nodecert.Config{CABundleFile: *nodeCertCABundle, Lifetime: *nodeCertLifetime},
		MetricsAddr:     *metricsAddr, HealthAddr: *healthAddr, Logger: logger, Log: log,
		CPUManagerStateFile: *cpuManagerState, LiveConfig: live,
	})
	if err != nil {
		fail(1, err)
	}
}
