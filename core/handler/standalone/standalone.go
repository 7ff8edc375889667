// Package standalone runs one VMI from a manifest on this machine, without a cluster
// (`kubevisor-handler run -f vmi.yaml`): it makes the VMI's sandbox (a network namespace on a
// host bridge, with a kubevisor-launcher in it), runs the VMI through a handler and the
// configured driver plugins, prints its phase changes and serial console, and on Ctrl-C or
// SIGTERM shuts the guest down within terminationGracePeriodSeconds and removes everything.
package standalone

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
)

// Defaults of a standalone run.
const (
	DefaultStateDir   = "/var/lib/kubevisor/standalone"
	DefaultRunDir     = "/run/kubevisor/standalone/vmis"
	DefaultSandboxDir = "/run/kubevisor/standalone/sandboxes"
	DefaultBridge     = "kv-standalone0"
	DefaultSubnet     = "10.244.255.0/24"
)

// DefaultDrivers are the drivers of a run whose configuration names none.
var DefaultDrivers = handler.DriverSet{Hypervisor: "qmp", Network: "cni", Storage: "local"}

// Options is one standalone run.
type Options struct {
	// VMIFile is the VMI manifest (kubevisor.io/v1alpha1 VirtualMachineInstance, YAML or JSON).
	VMIFile string
	// Config is the handler's configuration (LoadConfig, or the zero value for the defaults).
	Config handler.Config
	// BinDir is where the kubevisor binaries are (kubevisor-handler's directory): without a
	// plugin directory the drivers are its kubevisor-driver-<name> binaries, and the launcher is
	// its kubevisor-launcher.
	BinDir string
	// Out receives the phase changes and the serial console. Default: os.Stdout.
	Out io.Writer
	// Logger receives the logs. Default: hclog's default logger.
	Logger hclog.Logger
}

// LoadVMI reads a VMI manifest strictly. It must be a kubevisor.io/v1alpha1
// VirtualMachineInstance; the namespace defaults to "default", and a UID is made when the
// manifest has none.
func LoadVMI(path string) (*v1alpha1.VirtualMachineInstance, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := handler.DecodeStrict(data, vmi); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if gv := v1alpha1.GroupVersion.String(); vmi.APIVersion != gv || vmi.Kind != "VirtualMachineInstance" {
		hint := ""
		if strings.HasPrefix(vmi.APIVersion, "kubevirt.io/") {
			hint = " (a KubeVirt manifest converts by changing apiVersion: vmctl convert)"
		}
		return nil, fmt.Errorf("%s: apiVersion %q kind %q: want %s VirtualMachineInstance%s", path, vmi.APIVersion, vmi.Kind, gv, hint)
	}
	if vmi.Name == "" {
		return nil, fmt.Errorf("%s: metadata.name: required", path)
	}
	if vmi.Namespace == "" {
		vmi.Namespace = "default"
	}
	if vmi.UID == "" {
		vmi.UID = newUID()
	}
	return vmi, nil
}

// newUID returns a random (version 4) UUID.
func newUID() types.UID {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return types.UID(fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]))
}

// withDefaults fills in a standalone run's defaults.
func withDefaults(c handler.Config, binDir string) handler.Config {
	if d := c.Drivers; len(d.HypervisorNames()) == 0 && d.Network == "" && d.Storage == "" && d.Device == "" {
		c.Drivers = DefaultDrivers
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.RunDir == "" {
		c.RunDir = DefaultRunDir
	}
	s := handler.StandaloneConfig{}
	if c.Standalone != nil {
		s = *c.Standalone
	}
	if s.SandboxDir == "" {
		s.SandboxDir = DefaultSandboxDir
	}
	if s.Launcher == "" {
		s.Launcher = filepath.Join(binDir, "kubevisor-launcher")
		if _, err := os.Stat(s.Launcher); err != nil {
			if p, err := exec.LookPath("kubevisor-launcher"); err == nil {
				s.Launcher = p
			}
		}
	}
	if len(s.CNIBinDir) == 0 {
		s.CNIBinDir = []string{filepath.Join(filepath.Dir(binDir), "_output", "cni", "bin"), "/opt/cni/bin", "/usr/lib/cni"}
	}
	if s.Bridge == "" {
		s.Bridge = DefaultBridge
	}
	if s.Subnet == "" {
		s.Subnet = DefaultSubnet
	}
	c.Standalone = &s
	return c
}

// Run runs the VMI until it stops by itself or ctx is done (Ctrl-C, SIGTERM), then stops it
// and removes everything it made. It returns nil when the VMI ended Succeeded.
//
// ctx ending starts a graceful shutdown; stop, when it is closed during the shutdown, cuts it
// short (a second Ctrl-C).
func Run(ctx context.Context, stop <-chan struct{}, o Options) error {
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Logger == nil {
		o.Logger = hclog.Default()
	}
	out := &lockedWriter{w: o.Out}
	vmi, err := LoadVMI(o.VMIFile)
	if err != nil {
		return err
	}
	cfg, ms, err := Prepare(o.Config, o.BinDir)
	if err != nil {
		return err
	}
	grace := vmi.Spec.GracePeriod()
	name := vmiName(vmi)
	out.printf("==> VMI %s (uid %s)\n", name, vmi.UID)

	sb, err := newSandbox(ctx, o.Logger.Named("sandbox"), cfg, vmi, grace)
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	defer func() { _ = sb.Close(context.Background()) }() // Stop closes it; this is for the way out before
	if sb.podIP.IsValid() {
		out.printf("==> sandbox: network namespace %s, pod IP %s on bridge %s\n", sb.name, sb.podIP.Addr(), cfg.Standalone.Bridge)
	}

	final := make(chan v1alpha1.VirtualMachineInstanceStatus, 1)
	var last v1alpha1.VirtualMachineInstanceStatus
	onStatus := func(_ types.UID, st v1alpha1.VirtualMachineInstanceStatus) {
		if st.Reason == handler.ReasonSandboxExited && last.Reason != st.Reason {
			out.printf("\n==> %s: %s\n", name, sb.ExitReason())
		}
		printStatus(out, name, last, st)
		last = st
		if st.Phase == v1alpha1.Succeeded || st.Phase == v1alpha1.Failed {
			select {
			case final <- st:
			default:
			}
		}
	}
	h, err := handler.New(ctx, cfg, handler.Options{
		Logger:    o.Logger,
		Manifests: ms,
		Sandboxes: handler.SandboxesFunc(func(v *v1alpha1.VirtualMachineInstance) handler.Sandbox {
			if v.UID != vmi.UID {
				return nil
			}
			return sb
		}),
		OnStatus: onStatus,
	})
	if err != nil {
		return err
	}
	defer func() { _ = h.Close() }()

	if _, err := h.Sync(ctx, vmi); err != nil {
		return err
	}
	consoleCtx, stopConsole := context.WithCancel(context.Background())
	consoleDone := make(chan struct{})
	go func() {
		defer close(consoleDone)
		out.printf("==> serial console of %s (Ctrl-C stops the VMI):\n", name)
		if err := h.Console(consoleCtx, vmi.UID, nil, out); err != nil && consoleCtx.Err() == nil {
			o.Logger.Warn("console", "error", err)
		}
	}()

	// The handler fails the VMI when its sandbox ends under it (LauncherExited).
	var result v1alpha1.VirtualMachineInstanceStatus
	select {
	case <-ctx.Done():
		out.printf("\n==> stopping %s: graceful shutdown within %s\n", name, grace)
	case result = <-final:
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), grace+time.Minute)
	defer cancel()
	go func() {
		select {
		case <-stop:
			out.printf("\n==> stopping %s at once\n", name)
			cancel()
		case <-stopCtx.Done():
		}
	}()
	st, err := h.Stop(stopCtx, vmi, grace)
	stopConsole()
	<-consoleDone
	if err != nil {
		return err
	}
	if result.Phase == "" {
		result = st
	}
	out.printf("==> %s ended: %s%s\n", name, result.Phase, reasonSuffix(result.Reason))
	if result.Phase != v1alpha1.Succeeded {
		return fmt.Errorf("VMI %s ended %s%s", name, result.Phase, reasonSuffix(result.Reason))
	}
	return nil
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return " (" + r + ")"
}

// printStatus prints what changed between two statuses of a VMI.
func printStatus(out *lockedWriter, name string, prev, st v1alpha1.VirtualMachineInstanceStatus) {
	if st.Phase != prev.Phase {
		line := fmt.Sprintf("\n==> %s: phase %s%s", name, st.Phase, reasonSuffix(st.Reason))
		for _, i := range st.Interfaces {
			if i.IP != "" {
				line += fmt.Sprintf(", interface %s %s %s", i.Name, i.IP, i.MAC)
			}
		}
		out.printf("%s\n", line)
	}
	for _, c := range st.Conditions {
		p := handler.Condition(prev, c.Type)
		if p == nil || p.Status != c.Status || p.Reason != c.Reason || p.Message != c.Message {
			msg := ""
			if c.Message != "" {
				msg = ": " + c.Message
			}
			out.printf("==> %s: %s=%s%s%s\n", name, c.Type, c.Status, reasonSuffix(c.Reason), msg)
		}
	}
}

// lockedWriter serialises the console and the status lines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) printf(format string, args ...any) {
	_, _ = fmt.Fprintf(l, format, args...)
}
