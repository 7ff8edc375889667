package driver

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
)

// ServeOption changes how Serve runs a driver.
type ServeOption func(*serveConfig)

type serveConfig struct {
	logger hclog.Logger
}

// WithLogger sets the logger go-plugin itself logs to. Use the logger from NewLogger, or any
// hclog logger writing JSON to stderr, so the host shows the lines under the driver's name.
func WithLogger(l hclog.Logger) ServeOption {
	return func(c *serveConfig) { c.logger = l }
}

// NewLogger returns the logger a driver should log with: JSON lines on stderr, which the host
// parses and re-logs, with their level, under the driver's name.
func NewLogger(name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       name,
		Level:      hclog.Trace,
		Output:     os.Stderr,
		JSONFormat: true,
	})
}

// ServeHypervisor runs impl as a hypervisor plugin process. It returns when the host closes the
// plugin. Call it from main.
func ServeHypervisor(impl Hypervisor, opts ...ServeOption) {
	serve(basev1.Kind_KIND_HYPERVISOR, impl, opts)
}

// ServeNetwork runs impl as a network plugin process.
func ServeNetwork(impl Network, opts ...ServeOption) {
	serve(basev1.Kind_KIND_NETWORK, impl, opts)
}

// ServeStorage runs impl as a storage plugin process.
func ServeStorage(impl Storage, opts ...ServeOption) {
	serve(basev1.Kind_KIND_STORAGE, impl, opts)
}

// ServeDevice runs impl as a device plugin process.
func ServeDevice(impl Device, opts ...ServeOption) {
	serve(basev1.Kind_KIND_DEVICE, impl, opts)
}

func serve(kind basev1.Kind, impl Driver, opts []ServeOption) {
	cfg := serveConfig{}
	for _, o := range opts {
		o(&cfg)
	}
	if err := Servable(kind, impl); err != nil {
		// Stderr reaches the host's log: the host reports the plugin exited, with this line.
		fmt.Fprintf(os.Stderr, "kubevisor driver: %v\n", err)
		os.Exit(1)
	}
	// A driver outlives a restart of its host (which reattaches to it). Once the host is gone
	// its end of the stderr pipe is closed; without this, the driver's next log line would kill
	// it with SIGPIPE. With it, the write fails and the driver goes on.
	signal.Ignore(syscall.SIGPIPE)
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{ProtocolVersion: {KindName(kind): &Plugin{Kind: kind, Impl: impl}}},
		GRPCServer:       plugin.DefaultGRPCServer,
		Logger:           cfg.logger,
	})
}

// Servable reports whether impl can be served as a driver of the given kind: it implements the
// kind's interface and every optional interface its Capabilities declare.
func Servable(kind basev1.Kind, impl Driver) error {
	if err := Register(nopRegistrar{}, kind, impl); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	caps, err := impl.Capabilities(ctx)
	if err != nil {
		return fmt.Errorf("capabilities: %w", err)
	}
	return CheckCapabilities(kind, impl, caps)
}
