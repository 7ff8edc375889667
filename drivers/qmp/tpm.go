package qmp

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/driver/launcher"
)

// The TPM: DomainSpec.tpm is a TPM 2.0 emulated by swtpm, which runs beside QEMU as a companion
// of the VM process (started by the launcher, or by LocalStarter, just before QEMU and stopped
// once it exits), so it lives in the VM's sandbox. The two are joined by a socketpair made
// before either starts: swtpm's control channel is one end (--ctrl clientfd=3), QEMU's chardev
// the other (fd=N), so neither waits for a socket path to appear and no other process of the
// sandbox can reach the TPM. QEMU hands swtpm the data channel over the control channel itself
// (CMD_SET_DATAFD). The state is in the run directory (Paths.TPMState): a restart of QEMU (a
// guest power-off and Start, a reboot) keeps it, the VM's deletion drops it. A persistent TPM's
// is in the persistent state directory (PersistentTPMDir) instead, which the VM's deletion
// leaves: swtpm (with no swtpm_setup before it) manufactures a TPM in an empty state directory
// at its first TPM2_Startup and loads the one it finds on every later start, so a new VM given
// the directory has the same TPM (its seeds, NV indices and counters).

// SWTPMInfo is what the driver found of swtpm on this node.
type SWTPMInfo struct {
	// Path is the binary (as the launcher sees it too: the launcher image installs it at the
	// same path as the node) and Version its version ("0.7.1"); Path is empty when swtpm is not
	// usable, and Problem says why.
	Path    string
	Version string
	Problem string
}

// swtpmCapabilities is what `swtpm socket --print-capabilities` prints.
type swtpmCapabilities struct {
	Type     string   `json:"type"`
	Features []string `json:"features"`
	Version  string   `json:"version"`
}

// SWTPM finds swtpm (bin, or "swtpm" in PATH when empty) and checks that it emulates TPM 2.0.
// The result is remembered per bin.
func (p *Prober) SWTPM(ctx context.Context, bin string) *SWTPMInfo {
	p.mu.Lock()
	if s, ok := p.swtpmMemo[bin]; ok {
		p.mu.Unlock()
		return s
	}
	p.mu.Unlock()
	s := p.findSWTPM(ctx, bin)
	if ctx.Err() != nil {
		return s
	}
	p.mu.Lock()
	if p.swtpmMemo == nil {
		p.swtpmMemo = map[string]*SWTPMInfo{}
	}
	p.swtpmMemo[bin] = s
	p.mu.Unlock()
	return s
}

func (p *Prober) findSWTPM(ctx context.Context, bin string) *SWTPMInfo {
	lookPath := p.LookPath
	if lookPath == nil {
		lookPath = exec.LookPath
	}
	if bin == "" {
		bin = "swtpm"
	}
	path, err := lookPath(bin)
	if err != nil {
		return &SWTPMInfo{Problem: fmt.Sprintf("%s not found (install swtpm): %v", bin, err)}
	}
	out, err := p.Runner.Run(ctx, path, "socket", "--tpm2", "--print-capabilities")
	var caps swtpmCapabilities
	if err != nil || json.Unmarshal(out, &caps) != nil {
		return &SWTPMInfo{Problem: fmt.Sprintf("%s socket --tpm2 --print-capabilities: %s", path, describeFailure(out, err))}
	}
	if !slices.Contains(caps.Features, "tpm-2.0") {
		return &SWTPMInfo{Version: caps.Version, Problem: fmt.Sprintf("%s %s does not emulate TPM 2.0 (features: %s)", path, caps.Version, strings.Join(caps.Features, ", "))}
	}
	return &SWTPMInfo{Path: path, Version: caps.Version}
}

// TPMCmd is the swtpm companion of a QEMU command line.
type TPMCmd struct {
	// Args are swtpm's arguments, without the binary; its control channel is its fd 3.
	Args []string
	// FD is the QEMU fd its chardev takes: the caller passes QEMU's end of the socketpair
	// there, right after Cmdline.ExtraFiles.
	FD int
}

// tpm adds the TPM's chardev, backend and device, once every other passed file is known: QEMU's
// end of the socketpair comes after them.
func (b *argBuilder) tpm() {
	if b.spec.GetTpm() == nil {
		return
	}
	if b.env.SWTPM == "" {
		if b.missing == "" {
			b.missing = fmt.Sprintf("tpm: swtpm is not usable on this node: %s", b.env.SWTPMReason)
		}
		return
	}
	fd := 3 + len(b.files)
	// CRB is the TPM 2.0 interface of q35's era (what libvirt picks for TPM 2.0); TIS for pc.
	dev := "tpm-crb"
	if !b.q35 {
		dev = "tpm-tis"
	}
	b.add("-chardev", fmt.Sprintf("socket,id=chrtpm,fd=%d", fd),
		"-tpmdev", "emulator,id=tpm0,chardev=chrtpm",
		"-device", dev+",tpmdev=tpm0,id=tpm")
	b.tpmCmd = &TPMCmd{FD: fd, Args: []string{
		"socket", "--tpm2",
		"--tpmstate", "dir=" + esc(b.paths.TPMState) + ",mode=0600",
		"--ctrl", "type=unixio,clientfd=3",
		"--log", "fd=1,level=1",
		// Exit once QEMU closes the control channel, should nothing else stop it.
		"--terminate",
	}}
}

// tpmSocketpair returns the two ends of the control channel between QEMU and swtpm.
func tpmSocketpair() (qemu, swtpm *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "tpm-qemu"), os.NewFile(uintptr(fds[1]), "tpm-swtpm"), nil
}

// tpmCompanion prepares the swtpm companion of v's QEMU: its state directory (0700, kept across
// QEMU restarts) and the socketpair, whose swtpm end is the companion's only passed file and
// whose QEMU end is returned.
func (d *Driver) tpmCompanion(ctx context.Context, v *vm, t *TPMCmd) (*launcher.Companion, *os.File, error) {
	sw := d.swtpm(ctx)
	if sw.Path == "" {
		return nil, nil, status.Errorf(codes.FailedPrecondition, "tpm: swtpm is not usable on this node: %s", sw.Problem)
	}
	if err := os.MkdirAll(v.paths.TPMState, 0o700); err != nil {
		return nil, nil, status.Errorf(codes.FailedPrecondition, "tpm state directory: %v", err)
	}
	if err := ownLikeParent(v.paths.TPMState); err != nil {
		return nil, nil, status.Errorf(codes.FailedPrecondition, "tpm state directory: %v", err)
	}
	qemuEnd, swtpmEnd, err := tpmSocketpair()
	if err != nil {
		return nil, nil, status.Errorf(codes.Internal, "tpm: %v", err)
	}
	return &launcher.Companion{
		Name: "swtpm", Path: sw.Path, Args: t.Args, LogPath: v.paths.SWTPMLog, ExtraFiles: []*os.File{swtpmEnd},
	}, qemuEnd, nil
}
