package qmp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
)

// Runner runs a short-lived command to completion and returns its combined output. It kills
// the command when ctx is done.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// RunnerFunc adapts a function to Runner.
type RunnerFunc func(ctx context.Context, name string, args ...string) ([]byte, error)

// Run implements Runner.
func (f RunnerFunc) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return f(ctx, name, args...)
}

// ExecRunner runs commands with os/exec.
type ExecRunner struct{}

// Run implements Runner. The command gets SIGKILL if the driver process dies first, so a probe
// QEMU (which can spin for its whole timeout where KVM is broken) never outlives the driver.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = time.Second
	return cmd.CombinedOutput()
}

// ProbeOptions is what a probe looks for.
type ProbeOptions struct {
	// QEMU is the binary; empty searches PATH for qemu-system-x86_64.
	QEMU string
	// KVMDevice is the KVM device node (/dev/kvm when empty).
	KVMDevice string
	// VhostNetDevice is the vhost-net device node (/dev/vhost-net when empty).
	VhostNetDevice string
	// DisableKVM skips KVM: the node is emulation only.
	DisableKVM bool
	// Timeout bounds each test boot (DefaultProbeTimeout when zero).
	Timeout time.Duration
}

// DefaultProbeTimeout bounds a test boot when ProbeOptions.Timeout is zero.
const DefaultProbeTimeout = 5 * time.Second

// HostInfo is what a probe found out about QEMU on this node.
type HostInfo struct {
	// QEMU is the binary's path and Version its version ("7.2.22").
	QEMU    string
	Version string
	// Problem, when set, says why QEMU cannot run VMs at all.
	Problem string
	// Transient says Problem rests on a timeout: a test guest ran out of time under an
	// accelerator, which a busy node causes as surely as a broken one, so a later probe may
	// find it working (HostProbe probes again). Such a result is not remembered by
	// Prober.Probe.
	Transient bool
	// KVM and TCG say whether a test guest ran under each accelerator; the reasons say why not.
	KVM       bool
	KVMReason string
	TCG       bool
	TCGReason string
	// TCGBoot is how long the test guest took under TCG, start to marker.
	TCGBoot time.Duration
	// VhostNet says /dev/vhost-net can be opened.
	VhostNet bool
	// CPUModels and MachineTypes are what `-cpu help` and `-machine help` list.
	CPUModels    []string
	MachineTypes []string
	// CPUFlags are the CPUID flags `-cpu help` lists.
	CPUFlags []string
	// SEV is what the host offers AMD SEV guests (only looked for where KVM runs), nil when
	// nothing; SEVReason says why not.
	SEV       *SEVHost
	SEVReason string
}

// Best is the accelerator VMs get when they do not ask: KVM when it works, else TCG, else "".
func (h *HostInfo) Best() Accel {
	switch {
	case h.KVM:
		return AccelKVM
	case h.TCG:
		return AccelTCG
	}
	return ""
}

// Fingerprint is the driver's health and node attributes for this host: HEALTHY with
// accel=kvm, DEGRADED with accel=tcg when only emulation works, UNHEALTHY when QEMU does not run.
func (h *HostInfo) Fingerprint() *basev1.FingerprintResponse {
	attrs := map[string]string{}
	if v := labelValue(h.Version); v != "" {
		attrs["qemu-version"] = v
	}
	switch {
	case h.Problem != "":
		return &basev1.FingerprintResponse{Health: basev1.Health_HEALTH_UNHEALTHY, HealthDescription: h.Problem, Attributes: attrs}
	case h.KVM:
		attrs["accel"] = string(AccelKVM)
		if h.SEV != nil {
			attrs["sev"] = "sev"
			if h.SEV.ES {
				attrs["sev"] = "sev-es"
			}
		}
		return &basev1.FingerprintResponse{Health: basev1.Health_HEALTH_HEALTHY, HealthDescription: "QEMU " + h.Version + " with KVM", Attributes: attrs}
	default:
		attrs["accel"] = string(AccelTCG)
		return &basev1.FingerprintResponse{
			Health:            basev1.Health_HEALTH_DEGRADED,
			HealthDescription: fmt.Sprintf("KVM not usable (%s); emulation only", h.KVMReason),
			Attributes:        attrs,
		}
	}
}

var labelUnsafe = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// TPMAttributeValue is the fingerprint's tpm attribute on a node whose swtpm (of version
// swtpmVersion) gives VMs a TPM: the control plane places VMIs with a TPM on nodes that have it.
func TPMAttributeValue(swtpmVersion string) string { return labelValue("swtpm-" + swtpmVersion) }

// labelValue makes s a valid Kubernetes label value (or "").
func labelValue(s string) string {
	s = labelUnsafe.ReplaceAllString(s, "-")
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Trim(s, "._-")
}

// Prober finds QEMU and proves which accelerators work by booting a test guest under each: a
// device node that opens (/dev/kvm answering ioctls) does not mean QEMU can run guests with it.
type Prober struct {
	Runner Runner
	// LookPath finds a binary (exec.LookPath when nil).
	LookPath func(file string) (string, error)
	// OpenDevice checks that a device node opens read-write (os.OpenFile when nil).
	OpenDevice func(path string) error
	// TempDir is where the test disk images go (os.TempDir() when empty).
	TempDir string
	// Sysfs is where sysfs is mounted ("/sys" when empty) and CPUID reads a CPUID leaf (the
	// CPU's when nil): for AMD SEV.
	Sysfs string
	CPUID func(leaf uint32) (eax, ebx, ecx, edx uint32)

	mu        sync.Mutex
	memo      map[ProbeOptions]*HostInfo
	swtpmMemo map[string]*SWTPMInfo
}

// NewProber returns a Prober that runs real commands and remembers its results per options:
// what QEMU can do does not change while the driver runs.
func NewProber() *Prober { return &Prober{Runner: ExecRunner{}} }

// defaultProber is shared by every driver of the process, so tests starting many drivers probe
// once.
var defaultProber = NewProber()

// Probe finds QEMU and tests its accelerators. It never fails: what does not work is described
// in the result. Results are remembered per options.
func (p *Prober) Probe(ctx context.Context, opts ProbeOptions) *HostInfo {
	p.mu.Lock()
	if h, ok := p.memo[opts]; ok {
		p.mu.Unlock()
		return h
	}
	p.mu.Unlock()
	h := p.probe(ctx, opts)
	if ctx.Err() != nil || h.Transient {
		return h // cut short, or may differ next time: do not remember
	}
	p.mu.Lock()
	if p.memo == nil {
		p.memo = map[ProbeOptions]*HostInfo{}
	}
	p.memo[opts] = h
	p.mu.Unlock()
	return h
}

var versionRE = regexp.MustCompile(`QEMU emulator version (\d+\.\d+\.\d+)`)

func (p *Prober) probe(ctx context.Context, opts ProbeOptions) *HostInfo {
	lookPath, openDevice := p.LookPath, p.OpenDevice
	if lookPath == nil {
		lookPath = exec.LookPath
	}
	if openDevice == nil {
		openDevice = func(path string) error {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				return err
			}
			return f.Close()
		}
	}
	if opts.KVMDevice == "" {
		opts.KVMDevice = "/dev/kvm"
	}
	if opts.VhostNetDevice == "" {
		opts.VhostNetDevice = "/dev/vhost-net"
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultProbeTimeout
	}
	h := &HostInfo{}
	bin := opts.QEMU
	if bin == "" {
		bin = "qemu-system-x86_64"
	}
	path, err := lookPath(bin)
	if err != nil {
		h.Problem = fmt.Sprintf("%s not found (install qemu-system-x86): %v", bin, err)
		return h
	}
	h.QEMU = path
	out, err := p.Runner.Run(ctx, path, "-version")
	if m := versionRE.FindSubmatch(out); err != nil || m == nil {
		h.Problem = fmt.Sprintf("%s -version: %s", path, describeFailure(out, err))
		return h
	} else {
		h.Version = string(m[1])
	}
	if out, err := p.Runner.Run(ctx, path, "-machine", "help"); err == nil {
		h.MachineTypes = parseHelp(out, "")
	}
	if out, err := p.Runner.Run(ctx, path, "-cpu", "help"); err == nil {
		h.CPUModels = parseHelp(out, "x86 ")
		h.CPUFlags = parseCPUFlags(out)
	}
	h.VhostNet = openDevice(opts.VhostNetDevice) == nil

	dir, err := os.MkdirTemp(p.TempDir, "kubevisor-qmp-probe-")
	if err != nil {
		h.Problem = fmt.Sprintf("probe: %v", err)
		return h
	}
	defer os.RemoveAll(dir)

	var wg sync.WaitGroup
	var tcgTimedOut, kvmTimedOut bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		h.TCG, h.TCGReason, tcgTimedOut = p.boot(ctx, path, AccelTCG, dir, opts.Timeout)
		h.TCGBoot = time.Since(start)
	}()
	switch {
	case opts.DisableKVM:
		h.KVMReason = "disabled by the driver's configuration"
	default:
		if err := openDevice(opts.KVMDevice); err != nil {
			h.KVMReason = err.Error()
			break
		}
		h.KVM, h.KVMReason, kvmTimedOut = p.boot(ctx, path, AccelKVM, dir, opts.Timeout)
	}
	h.SEVReason = "KVM is not usable"
	if h.KVM {
		sysfs, id := p.Sysfs, p.CPUID
		if sysfs == "" {
			sysfs = "/sys"
		}
		if id == nil {
			id = cpuid
		}
		h.SEV, h.SEVReason = DetectSEV(sysfs, openDevice("/dev/sev") == nil, id)
	}
	wg.Wait()
	if !h.TCG && !h.KVM {
		h.Problem = fmt.Sprintf("no accelerator runs a test guest: tcg: %s; kvm: %s", h.TCGReason, h.KVMReason)
		h.Transient = tcgTimedOut || kvmTimedOut
	}
	return h
}

// ProbeArgs is the command line of a test boot of the disk image under accel.
func ProbeArgs(accel Accel, image string) []string {
	return []string{
		"-machine", "q35", "-accel", string(accel), "-m", "32", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-drive", "file=" + esc(image) + ",format=raw,if=ide",
		"-serial", "stdio", "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
	}
}

// boot runs the probe guest under accel and reports whether it finished, and if not, why and
// whether it ran out of time (rather than failed).
func (p *Prober) boot(ctx context.Context, qemu string, accel Accel, dir string, timeout time.Duration) (ok bool, reason string, timedOut bool) {
	image := filepath.Join(dir, string(accel)+".img")
	if err := WriteBootDisk(image, ProbeBootSector()); err != nil {
		return false, err.Error(), false
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := p.Runner.Run(ctx, qemu, ProbeArgs(accel, image)...)
	switch {
	case bytes.Contains(out, []byte(ProbeMarker)):
		return true, "", false
	case ctx.Err() != nil && bytes.Contains(out, []byte(ProbeBootedMarker)):
		return false, fmt.Sprintf("a test guest booted but did not finish a short computation within %s: guest code runs far too slowly", timeout), true
	case ctx.Err() != nil:
		return false, fmt.Sprintf("a test guest printed nothing within %s", timeout), true
	default:
		return false, "qemu: " + describeFailure(out, err), false
	}
}

// describeFailure is the last line of a command's output, or its error.
func describeFailure(out []byte, err error) string {
	last := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			last = l
		}
	}
	switch {
	case last != "" && err != nil:
		return fmt.Sprintf("%s (%v)", last, err)
	case last != "":
		return last
	case err != nil:
		return err.Error()
	}
	return "no output"
}

// parseHelp returns the first word of every line of a `-machine help` / `-cpu help` listing
// (after prefix, when set), skipping the header and anything after the first blank line.
// parseCPUFlags returns the names listed after "Recognized CPUID flags:" in `-cpu help`.
func parseCPUFlags(out []byte) []string {
	_, rest, ok := bytes.Cut(out, []byte("Recognized CPUID flags:"))
	if !ok {
		return nil
	}
	var flags []string
	for _, line := range strings.Split(string(rest), "\n") {
		if strings.TrimSpace(line) == "" {
			if len(flags) > 0 {
				break
			}
			continue
		}
		if !strings.HasPrefix(line, " ") {
			break
		}
		flags = append(flags, strings.Fields(line)...)
	}
	return flags
}

func parseHelp(out []byte, prefix string) []string {
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for first := true; sc.Scan(); first = false {
		line := sc.Text()
		if first && strings.HasSuffix(strings.TrimSpace(line), ":") {
			continue
		}
		if strings.TrimSpace(line) == "" {
			break
		}
		if prefix != "" {
			if !strings.HasPrefix(line, prefix) {
				continue
			}
			line = line[len(prefix):]
		}
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

// errNoQEMU is what VM operations return while QEMU is not usable.
var errNoQEMU = errors.New("qemu is not usable on this node")
