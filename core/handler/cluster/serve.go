package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/handler/migrationproxy"
	"github.com/kubevisor/kubevisor/core/handler/nodecert"
	"github.com/kubevisor/kubevisor/core/handler/streams"
	"github.com/kubevisor/kubevisor/core/liveconfig"
	"github.com/kubevisor/kubevisor/core/metricsauth"
	"github.com/kubevisor/kubevisor/core/plugin"
)

// ServeConfig is what `kubevisor-handler serve` runs with.
type ServeConfig struct {
	// Rest reaches the API server (in-cluster config in the DaemonSet).
	Rest *rest.Config
	// Handler is the node handler's configuration; its NodeName is the node served.
	Handler handler.Config
	// Manifests are drivers offered besides those in Handler.PluginDir.
	Manifests []plugin.Manifest
	// PluginBinDir, when set, offers the configured drivers' kubevisor-driver-<name> binaries in
	// that directory too, their digests computed at start (handler.DriverSet.Manifests): the
	// handler image ships its drivers beside the handler, so the image is what is trusted. A
	// configured driver that is not there is looked up in Handler.PluginDir only.
	PluginBinDir string
	// Agent configures the VMI agent; its NodeName defaults to Handler.NodeName.
	Agent AgentConfig
	// Streams configures the stream endpoint of kubevisor-api (core/nodeapi): consoles, VNC,
	// port forwards and actions of the node's VMIs over mutual TLS. Disabled when its Addr is
	// empty or "0".
	Streams streams.Config
	// Migration configures the migration proxy (core/handler/migrationproxy), which carries
	// live migrations to and from this node's VMIs over mutual TLS with node certificates.
	// Disabled when its Addr is empty or "0"; its NodeName defaults to the agent's, and its
	// metrics go to the handler's /metrics.
	Migration migrationproxy.Config
	// RequestNodeCert, with the migration proxy enabled, keeps the node certificate in the
	// proxy's CertDir through the CSR API (core/handler/nodecert, configured by NodeCert,
	// whose node, directory, client, logger, events and metrics default to the handler's).
	// Off, the files are put there by someone else.
	RequestNodeCert bool
	NodeCert        nodecert.Config
	// CPUManagerStateFile is the kubelet's CPU manager state file as the handler sees it; the
	// node is labelled kubevisor.io/cpumanager=true while it names the static policy
	// (NodeLabeler.CPUManagerStateFile). Empty: the label is left to the admin.
	CPUManagerStateFile string
	// MetricsAddr and HealthAddr are the listen addresses of /metrics and /healthz, /readyz
	// ("0" disables). /metrics is HTTPS with a self-signed certificate, served to bearer tokens
	// the API server authenticates and allows get on /metrics (core/metricsauth); the probes
	// are plain HTTP, for the kubelet.
	MetricsAddr, HealthAddr string
	Logger                  hclog.Logger
	// StopDrivers stops the driver plugins when Serve returns (tests); by default they keep
	// running, with their VMs, for the next handler to re-adopt.
	StopDrivers bool
	Log         logr.Logger
	// LiveConfig, when set, watches the live configuration (its Client is made here) and
	// hands it to its appliers (the handler's log level) while the handler runs, and to the
	// handler's hostdev driver (its permitted host devices: Handler.SetPermittedHostDevices),
	// which Serve adds.
	LiveConfig *liveconfig.Watcher
}

// Serve runs the node handler against the API server until ctx ends: the agent syncs the
// node's VMIs, the labeler publishes the drivers' capabilities on the Node, the stream
// endpoint (Streams) serves kubevisor-api, and the migration proxy (Migration) serves its
// port. The running VMs
// are left to run when it returns (a restarted handler re-adopts them).
func Serve(ctx context.Context, c ServeConfig) (err error) {
	if c.Agent.NodeName == "" {
		c.Agent.NodeName = c.Handler.NodeName
	}
	if c.Handler.NodeName == "" {
		c.Handler.NodeName = c.Agent.NodeName
	}
	if c.PluginBinDir != "" {
		// A configured driver missing here may be installed in Handler.PluginDir (a driver
		// image's init container copies it there, manifests/install/drivers); the handler
		// reports each configured driver it finds in neither, and runs the others.
		ms, err := c.Handler.Drivers.Manifests(c.PluginBinDir)
		if err != nil && c.Logger != nil {
			c.Logger.Info("configured drivers not in the handler image: looked up in the plugin directory only", "dir", c.PluginBinDir, "pluginDir", c.Handler.PluginDir, "missing", err)
		}
		c.Manifests = append(ms, c.Manifests...)
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	mgr, err := ctrl.NewManager(c.Rest, ctrl.Options{
		Scheme: scheme, Cache: CacheOptions(c.Agent.NodeName), Logger: c.Log,
		Metrics:                metricsauth.Options(c.MetricsAddr, ""),
		HealthProbeBindAddress: c.HealthAddr,
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	if c.Agent.Log.GetSink() == nil {
		c.Agent.Log = c.Log.WithName("agent")
	}
	var proxy *migrationproxy.Proxy
	if c.Migration.Enabled() {
		if c.Migration.NodeName == "" {
			c.Migration.NodeName = c.Agent.NodeName
		}
		if c.Migration.Logger == nil && c.Logger != nil {
			c.Migration.Logger = c.Logger.Named("migration-proxy")
		}
		if c.Migration.Registerer == nil {
			c.Migration.Registerer = ctrlmetrics.Registry
		}
		if proxy, err = migrationproxy.New(c.Migration); err != nil {
			return fmt.Errorf("migration proxy: %w", err)
		}
		c.Agent.Migration.Proxy = proxy
		if c.Agent.Migration.Address == "" && c.Logger != nil {
			// The VMIs run; migrations to this node fail with this reason.
			c.Logger.Warn("the migration proxy has no address to advertise to other nodes (--migration-advertise-address, or POD_IP): migrations to this node fail")
		}
	}
	agent, err := NewAgent(ctx, mgr, c.Agent, c.Handler, handler.Options{Logger: c.Logger, Manifests: c.Manifests})
	if err != nil {
		return err
	}
	h := agent.Handler()
	defer func() {
		if c.StopDrivers {
			err = errors.Join(err, h.Close())
			return
		}
		// Detach, not Close: the VMs keep running through a handler restart.
		err = errors.Join(err, h.Detach())
	}()
	cs, err := kubernetes.NewForConfig(c.Rest)
	if err != nil {
		return err
	}
	if c.Streams.Enabled() {
		if c.Streams.Logger == nil && c.Logger != nil {
			c.Streams.Logger = c.Logger.Named("streams")
		}
		if err := mgr.Add(runnable(streams.New(c.Streams, h).Run)); err != nil {
			return err
		}
	}
	if proxy != nil {
		if err := mgr.Add(runnable(proxy.Run)); err != nil {
			return err
		}
		if err := addNodeCert(mgr, c, cs); err != nil {
			return err
		}
	}
	labeler := &NodeLabeler{Client: cs, Node: c.Agent.NodeName, Source: h, Log: c.Logger.Named("labels"),
		CPUManagerStateFile: c.CPUManagerStateFile, Events: mgr.GetEventRecorder(EventSource)}
	if err := mgr.Add(runnable(labeler.Run)); err != nil {
		return err
	}
	if c.LiveConfig != nil {
		c.LiveConfig.Client = cs
		c.LiveConfig.Appliers = append(c.LiveConfig.Appliers, liveconfig.HostDevices(ctx, h.SetPermittedHostDevices, c.LiveConfig.Log))
		if err := mgr.Add(c.LiveConfig); err != nil {
			return err
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("cache", func(r *http.Request) error {
		wctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(wctx) {
			return errors.New("cache not synced")
		}
		return nil
	}); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// addNodeCert runs the node certificate's manager (c.RequestNodeCert) in mgr, with the
// migration proxy's node and directory and the handler's client, logger, events and metrics.
// It is not a readiness check: VMs run without a node certificate; its absence is in the logs,
// the Node's events and kubevisor_node_certificate_ready.
func addNodeCert(mgr ctrl.Manager, c ServeConfig, cs kubernetes.Interface) error {
	if !c.RequestNodeCert {
		return nil
	}
	nc := c.NodeCert
	if nc.NodeName == "" {
		nc.NodeName = c.Migration.NodeName
	}
	if nc.NodeName == "" {
		nc.NodeName = c.Agent.NodeName
	}
	if nc.Dir == "" {
		nc.Dir = c.Migration.CertDir
	}
	if nc.Client == nil {
		nc.Client = cs
	}
	if nc.Logger == nil && c.Logger != nil {
		nc.Logger = c.Logger.Named("node-cert")
	}
	if nc.Events == nil {
		nc.Events = mgr.GetEventRecorder(EventSource)
	}
	if nc.Registerer == nil {
		nc.Registerer = ctrlmetrics.Registry
	}
	certs, err := nodecert.New(nc)
	if err != nil {
		return err
	}
	return mgr.Add(runnable(certs.Run))
}
