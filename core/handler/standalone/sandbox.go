package standalone

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/launcher"
	"github.com/kubevisor/kubevisor/internal/procfs"
)

// Timeouts of the sandbox's processes.
const (
	launcherReady = 15 * time.Second
	launcherExit  = 10 * time.Second
)

// Sandbox is a VMI's sandbox without a cluster, as Run makes it: a named network namespace
// kv-<uid prefix> whose eth0 is on the host bridge (CNI bridge + host-local, as a cluster's pod
// network), and a kubevisor-launcher in it serving <SandboxDir>/<uid>. It is the handler's
// Sandbox of the VMI: the VM process is the launcher's child and ends with it, unless the
// configuration bypasses the launcher.
type Sandbox struct {
	log    hclog.Logger
	name   string // the network namespace's name
	nsPath string
	dir    string // the launcher's directory
	// bypass: the VM process is not the launcher's (StandaloneConfig.BypassLauncher).
	bypass bool

	cni  *libcni.CNIConfig
	list *libcni.NetworkConfigList
	rt   *libcni.RuntimeConf
	// podIP is eth0's address.
	podIP netip.Prefix

	launcher *exec.Cmd
	exited   chan struct{} // closed when the launcher process is gone
	exitErr  error
	// closing is set once Close began: the launcher's exit is then asked for.
	closing  atomic.Bool
	teardown sync.Once

	spec handler.SandboxSpec
}

var _ handler.Sandbox = (*Sandbox)(nil)

// netnsName is the network namespace of a VMI: kv- and the first 12 hex digits of its UID.
func netnsName(uid string) string {
	hex := strings.ReplaceAll(uid, "-", "")
	if len(hex) > 12 {
		hex = hex[:12]
	}
	return "kv-" + hex
}

// podNetwork is the CNI network list of the standalone "pod network".
func podNetwork(c *handler.StandaloneConfig, ipamDir string) (*libcni.NetworkConfigList, error) {
	b, err := json.Marshal(map[string]any{
		"cniVersion": "1.0.0",
		"name":       "kubevisor-standalone",
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": c.Bridge, "isGateway": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": c.Subnet}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": ipamDir,
			},
		}},
	})
	if err != nil {
		return nil, err
	}
	return libcni.NetworkConfFromBytes(b)
}

// newSandbox makes the sandbox of vmi; on failure it removes what it made.
func newSandbox(ctx context.Context, log hclog.Logger, cfg handler.Config, vmi *v1alpha1.VirtualMachineInstance, grace time.Duration) (s *Sandbox, err error) {
	c := cfg.Standalone
	uid := string(vmi.UID)
	s = &Sandbox{
		log:    log,
		name:   netnsName(uid),
		dir:    filepath.Join(c.SandboxDir, uid),
		bypass: c.BypassLauncher,
		exited: make(chan struct{}),
	}
	s.nsPath = "/run/netns/" + s.name
	defer func() {
		if err != nil {
			_ = s.Close(context.WithoutCancel(ctx))
		}
	}()

	// The network namespace, its loopback, and eth0 on the pod network.
	if _, err := os.Stat(s.nsPath); err == nil {
		return s, fmt.Errorf("network namespace %s exists: another run of VMI %s, or what one left (ip netns del %s)", s.name, uid, s.name)
	}
	if err := run(ctx, "ip", "netns", "add", s.name); err != nil {
		return s, fmt.Errorf("make network namespace: %w", err)
	}
	if err := run(ctx, "ip", "-n", s.name, "link", "set", "lo", "up"); err != nil {
		return s, fmt.Errorf("network namespace %s: %w", s.name, err)
	}
	if s.list, err = podNetwork(c, filepath.Join(cfg.StateDir, "standalone", "ipam")); err != nil {
		return s, fmt.Errorf("pod network: %w", err)
	}
	s.cni = libcni.NewCNIConfigWithCacheDir(c.CNIBinDir, filepath.Join(cfg.StateDir, "standalone", "cni-cache"), nil)
	rt := &libcni.RuntimeConf{ContainerID: uid, NetNS: s.nsPath, IfName: "eth0"}
	res, err := s.cni.AddNetworkList(ctx, s.list, rt)
	if err != nil {
		return s, fmt.Errorf("pod network (CNI bridge and host-local from %v): %w", c.CNIBinDir, err)
	}
	s.rt = rt
	if r, err := types100.NewResultFromResult(res); err == nil {
		for _, ip := range r.IPs {
			if p, err := netip.ParsePrefix(ip.Address.String()); err == nil && p.Addr().Is4() {
				s.podIP = p
				break
			}
		}
	}

	// The launcher, in the namespace.
	if err := os.MkdirAll(c.SandboxDir, 0o700); err != nil {
		return s, err
	}
	if err := os.Mkdir(s.dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return s, err
	}
	logFile, err := os.OpenFile(filepath.Join(s.dir, "launcher.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return s, err
	}
	defer logFile.Close()
	s.launcher = exec.Command("nsenter", "--net="+s.nsPath, "--", c.Launcher,
		"--dir", s.dir, "--grace-period", grace.String(), "--vmi", vmiName(vmi))
	s.launcher.Stdout, s.launcher.Stderr = logFile, logFile
	// Its own process group: Ctrl-C on the terminal reaches the handler only, which stops the
	// VM and then the launcher.
	s.launcher.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := startOnCPUs(s.launcher, c.CPUs); err != nil {
		s.launcher = nil
		close(s.exited)
		return s, fmt.Errorf("start %s: %w", c.Launcher, err)
	}
	go func() {
		s.exitErr = s.launcher.Wait()
		close(s.exited)
		if s.bypass && !s.closing.Load() {
			s.log.Warn("the launcher exited; the VM runs on (it is not the launcher's child)", "why", s.ExitReason())
		}
	}()
	dctx, cancel := context.WithTimeout(ctx, launcherReady)
	defer cancel()
	cl, err := launcher.Dial(dctx, filepath.Join(s.dir, launcher.SocketName))
	if err != nil {
		return s, fmt.Errorf("launcher (log: %s): %w", filepath.Join(s.dir, "launcher.log"), err)
	}
	_ = cl.Close()

	// The VM process runs on the launcher's CPUs (or, bypassing the launcher, the driver's,
	// which are the handler's as the launcher's are): a VMI with dedicatedCpuPlacement is
	// pinned onto the first of them. Nothing makes them exclusive here.
	cpus, err := procfs.Affinity(s.launcher.Process.Pid)
	if err != nil {
		return s, fmt.Errorf("launcher: %w", err)
	}
	s.spec = handler.SandboxSpec{NetNSPath: s.nsPath, CPUs: cpus}
	if !c.BypassLauncher {
		s.spec.LauncherSocket = filepath.Join(s.dir, launcher.SocketName)
	}
	log.Info("sandbox ready", "netns", s.nsPath, "pod_ip", s.podIP.String(), "launcher_pid", s.launcher.Process.Pid, "dir", s.dir)
	return s, nil
}

// Open implements handler.Sandbox: the sandbox is ready from newSandbox on, until its launcher
// exits (when the VM process would be the launcher's).
func (s *Sandbox) Open(context.Context) (handler.SandboxSpec, error) {
	if !s.bypass {
		select {
		case <-s.exited:
			return handler.SandboxSpec{}, errors.New(s.ExitReason())
		default:
		}
	}
	return s.spec, nil
}

// Exited implements handler.Sandbox: closed when the launcher process is gone, and with it the
// VM process, its child; nil when the launcher is bypassed (the VM does not end with it).
func (s *Sandbox) Exited() <-chan struct{} {
	if s.bypass {
		return nil
	}
	return s.exited
}

// ExitReason implements handler.Sandbox: why the launcher exited, from its status file.
func (s *Sandbox) ExitReason() string {
	if st, err := launcher.ReadStatus(s.dir); err == nil {
		return fmt.Sprintf("the launcher exited: %s: %s", st.Reason, st.Message)
	}
	return fmt.Sprintf("the launcher exited without a status (%v)", s.exitErr)
}

// Close implements handler.Sandbox: it ends the launcher (and with it a VM still running in
// it), runs the pod network's CNI DEL and removes the network namespace and the launcher's
// directory, once. It logs what it cannot undo.
func (s *Sandbox) Close(ctx context.Context) error {
	s.closing.Store(true)
	s.teardown.Do(func() { s.tearDown(ctx) })
	return nil
}

// tearDown is Close's work.
func (s *Sandbox) tearDown(ctx context.Context) {
	if s.launcher != nil {
		s.stopLauncher(ctx)
	}
	if s.rt != nil {
		if err := s.cni.DelNetworkList(ctx, s.list, s.rt); err != nil {
			s.log.Warn("pod network: CNI DEL failed", "netns", s.name, "error", err)
		}
	}
	if _, err := os.Stat(s.nsPath); err == nil {
		if err := run(ctx, "ip", "netns", "del", s.name); err != nil {
			s.log.Warn("remove network namespace", "netns", s.name, "error", err)
		}
	}
	if s.dir != "" {
		if err := os.RemoveAll(s.dir); err != nil {
			s.log.Warn("remove launcher directory", "dir", s.dir, "error", err)
		}
	}
}

// stopLauncher asks the launcher to exit, then signals it.
func (s *Sandbox) stopLauncher(ctx context.Context) {
	select {
	case <-s.exited:
		return
	default:
	}
	ectx, cancel := context.WithTimeout(ctx, launcherExit)
	defer cancel()
	if cl, err := launcher.Dial(ectx, filepath.Join(s.dir, launcher.SocketName)); err == nil {
		if err := cl.Exit(ectx); err != nil {
			s.log.Debug("launcher Exit", "error", err)
		}
		_ = cl.Close()
	}
	pgid := s.launcher.Process.Pid
	for _, sig := range []syscall.Signal{0, syscall.SIGTERM, syscall.SIGKILL} {
		if sig != 0 {
			_ = syscall.Kill(-pgid, sig)
		}
		select {
		case <-s.exited:
			if st, err := launcher.ReadStatus(s.dir); err == nil {
				s.log.Info("launcher exited", "reason", st.Reason, "message", st.Message, "exit_code", st.ExitCode)
			}
			return
		case <-time.After(launcherExit / 2):
		}
	}
	s.log.Warn("the launcher did not exit", "pid", pgid)
}

// run runs a command, returning its output in the error.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func vmiName(vmi *v1alpha1.VirtualMachineInstance) string {
	if vmi.Namespace == "" {
		return vmi.Name
	}
	return vmi.Namespace + "/" + vmi.Name
}

// startOnCPUs starts cmd with its affinity set to cpus (all of the caller's when empty): from a
// thread of its own whose affinity it narrows first, since a child inherits the affinity of the
// thread that forks it. The thread is not given back to the runtime (it exits with the
// goroutine), so no other goroutine runs on the narrowed CPUs.
func startOnCPUs(cmd *exec.Cmd, cpus []uint32) error {
	if len(cpus) == 0 {
		return cmd.Start()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		var set unix.CPUSet
		for _, c := range cpus {
			set.Set(int(c))
		}
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			done <- fmt.Errorf("run the launcher on CPUs %v: %w", cpus, err)
			return
		}
		done <- cmd.Start()
	}()
	return <-done
}
