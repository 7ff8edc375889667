package qmp

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	lclient "github.com/kubevisor/kubevisor/core/driver/launcher"
	"github.com/kubevisor/kubevisor/internal/testbin"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// tpmLine is the test guest's KUBEVISOR-TPM line for a TPM 2.0 on CRB whose PCR 0 and reset count
// it read.
var tpmLine = regexp.MustCompile(`^tpm0 version=2 driver=tpm_crb pcr0=[0-9A-Fa-f]{64} resets=[0-9]+$`)

func TestSWTPMProbe(t *testing.T) {
	t.Parallel()
	ok := RunnerFunc(func(_ context.Context, name string, args ...string) ([]byte, error) {
		if !slices.Equal(args, []string{"socket", "--tpm2", "--print-capabilities"}) {
			return nil, errors.New("unexpected " + strings.Join(args, " "))
		}
		return []byte(`{ "type": "swtpm", "features": [ "tpm-1.2", "tpm-2.0", "cmdarg-seccomp" ], "version": "0.7.1" }`), nil
	})
	tpm12 := RunnerFunc(func(context.Context, string, ...string) ([]byte, error) {
		return []byte(`{ "type": "swtpm", "features": [ "tpm-1.2" ], "version": "0.5.0" }`), nil
	})
	broken := RunnerFunc(func(context.Context, string, ...string) ([]byte, error) {
		return []byte("swtpm: error while loading shared libraries: libtpms.so.0"), errors.New("exit status 127")
	})
	found := func(string) (string, error) { return "/usr/bin/swtpm", nil }
	missing := func(f string) (string, error) { return "", exec.ErrNotFound }
	for _, c := range []struct {
		name    string
		p       *Prober
		path    string
		problem string
	}{
		{"tpm 2.0", &Prober{Runner: ok, LookPath: found}, "/usr/bin/swtpm", ""},
		{"not installed", &Prober{Runner: ok, LookPath: missing}, "", "swtpm not found (install swtpm)"},
		{"no tpm 2.0", &Prober{Runner: tpm12, LookPath: found}, "", "does not emulate TPM 2.0"},
		{"does not run", &Prober{Runner: broken, LookPath: found}, "", "libtpms.so.0"},
	} {
		s := c.p.SWTPM(context.Background(), "")
		if s.Path != c.path || !strings.Contains(s.Problem, c.problem) || (c.problem == "") != (s.Problem == "") {
			t.Errorf("%s: %+v, want path %q and a problem saying %q", c.name, s, c.path, c.problem)
		}
		if c.path != "" && s.Version != "0.7.1" {
			t.Errorf("%s: version %q", c.name, s.Version)
		}
	}
}

// TestTPMNotOffered: without swtpm the driver does not declare the tpm device, and refuses a
// VM with a TPM anyway (FailedPrecondition naming tpm).
func TestTPMNotOffered(t *testing.T) {
	t.Parallel()
	requireQEMU(t)
	d := New(WithLogger(testLogger()))
	if err := d.Configure(context.Background(), &basev1.ConfigureRequest{StateDir: t.TempDir(), Config: []byte(`{"swtpm": "/nonexistent/swtpm"}`)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killAll(d) })
	ctx := context.Background()
	caps, err := d.Capabilities(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(caps.GetDevices(), driver.DeviceTPM) {
		t.Errorf("devices %v offer tpm without swtpm", caps.GetDevices())
	}
	fctx, cancel := context.WithCancel(ctx)
	var fp *basev1.FingerprintResponse
	_ = d.Fingerprint(fctx, func(r *basev1.FingerprintResponse) error { fp = r; cancel(); return nil })
	if got, ok := fp.GetAttributes()["tpm"]; ok {
		t.Errorf("fingerprint attribute tpm = %q without swtpm", got)
	}
	spec := echoSpec(t, "no-swtpm", false, 0)
	spec.Tpm = &domainv1.TPM{}
	if _, err := d.Create(ctx, spec); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "tpm: swtpm is not usable on this node") {
		t.Errorf("Create = %v, want FailedPrecondition naming tpm", err)
	}
}

// swtpmOf returns the pid of the swtpm whose state directory is stateDir, 0 when none runs.
func swtpmOf(stateDir string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(raw) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if filepath.Base(args[0]) == "swtpm" && slices.Contains(args, "dir="+stateDir+",mode=0600") {
			return pid
		}
	}
	return 0
}

func waitNoSWTPM(t *testing.T, stateDir string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for swtpmOf(stateDir) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("swtpm of %s still runs %s after QEMU exited", stateDir, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// bootTPMGuest starts spec (the test guest with a TPM) and returns its KUBEVISOR-TPM line and
// the pid of its swtpm.
func bootTPMGuest(t *testing.T, h *hostClient, spec *domainv1.DomainSpec) (string, int) {
	t.Helper()
	ctx := context.Background()
	if err := h.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	out, _, _ := attachConsole(t, h, spec.GetId())
	out.waitCount(t, GuestReadyMarker, 1, 180*time.Second)
	line := consoleLine(out.String(), "KUBEVISOR-TPM:")
	t.Logf("KUBEVISOR-TPM: %s", line)
	return line, swtpmOf(RunPaths(spec, spec.GetRunDir()).TPMState)
}

// TestTPMRealGuest boots the test guest with a TPM, QEMU started by the driver itself: the
// guest finds a TPM 2.0 on CRB and reads PCR 0 from it (so swtpm answers); swtpm keeps its
// state in the run directory and is gone once QEMU is. A second boot finds the same state.
func TestTPMRealGuest(t *testing.T) {
	t.Parallel()
	testenv.Command(t, "swtpm", "swtpm")
	d := newTestDriver(t, t.TempDir())
	h := inProcess(t, d)
	ctx := context.Background()
	caps, err := h.Capabilities(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(caps.GetDevices(), driver.DeviceTPM) {
		t.Fatalf("devices %v lack tpm with swtpm installed", caps.GetDevices())
	}
	fctx, cancel := context.WithCancel(ctx)
	var fp *basev1.FingerprintResponse
	_ = d.Fingerprint(fctx, func(r *basev1.FingerprintResponse) error { fp = r; cancel(); return nil })
	if got := fp.GetAttributes()["tpm"]; !strings.HasPrefix(got, "swtpm-") {
		t.Errorf("fingerprint attribute tpm = %q, want swtpm-<version> (attributes %v)", got, fp.GetAttributes())
	}
	spec := realGuestSpec(t, "tpm")
	spec.Tpm = &domainv1.TPM{}
	if _, err := h.Create(ctx, spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	stateDir := RunPaths(spec, spec.GetRunDir()).TPMState
	t.Cleanup(func() {
		if pid := swtpmOf(stateDir); pid != 0 {
			_ = procfsKill(pid)
		}
	})
	line, pid := bootTPMGuest(t, h, spec)
	if !tpmLine.MatchString(line) {
		t.Errorf("KUBEVISOR-TPM: %q, want tpm0 version=2 driver=tpm_crb with PCR 0", line)
	}
	if pid == 0 {
		t.Fatal("no swtpm runs with the VM's state directory")
	}
	fi, err := os.Stat(stateDir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state directory %s: %v, %v; want 0700", stateDir, fi, err)
	}
	state, _ := filepath.Glob(filepath.Join(stateDir, "tpm2-*.permall"))
	if len(state) == 0 {
		t.Errorf("swtpm wrote no TPM 2.0 state in %s", stateDir)
	}
	if err := h.Kill(ctx, spec.GetId()); err != nil {
		t.Fatal(err)
	}
	waitNoSWTPM(t, stateDir, 10*time.Second)

	// Start again: a new swtpm on the same state.
	before, _ := os.ReadFile(state[0])
	line, pid2 := bootTPMGuest(t, h, spec)
	if !tpmLine.MatchString(line) || pid2 == 0 || pid2 == pid {
		t.Errorf("second boot: KUBEVISOR-TPM: %q, swtpm pid %d (first %d)", line, pid2, pid)
	}
	if len(before) == 0 {
		t.Errorf("state %s empty after the first boot", state[0])
	}
	if err := h.Kill(ctx, spec.GetId()); err != nil {
		t.Fatal(err)
	}
	waitNoSWTPM(t, stateDir, 10*time.Second)
}

func procfsKill(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}

// TestTPMThroughLauncher: with a launcher in its own pid and network namespaces, swtpm is the
// launcher's child in its namespaces beside QEMU, and the guest sees the TPM; when QEMU exits
// (the guest powers off) the launcher stops swtpm.
func TestTPMThroughLauncher(t *testing.T) {
	t.Parallel()
	testenv.Root(t, "runs the launcher in network and PID namespaces")
	testenv.Command(t, "swtpm", "swtpm")
	requireQEMU(t)
	binDir := t.TempDir()
	if err := testbin.Build(binDir, false, "github.com/kubevisor/kubevisor/cmd/kubevisor-launcher"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "vmi")
	cmd := exec.Command("unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--",
		filepath.Join(binDir, "kubevisor-launcher"), "--dir", dir, "--grace-period", "20s")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	sock := filepath.Join(dir, lclient.SocketName)
	lc, err := lclient.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	lpid := lc.LauncherPid()

	d := newTestDriver(t, t.TempDir())
	h := inProcess(t, d)
	spec := realGuestSpec(t, "tpm-launcher")
	spec.Tpm = &domainv1.TPM{}
	spec.Sandbox = &domainv1.Sandbox{LauncherSocket: sock, NetnsPath: "/proc/" + strconv.Itoa(lpid) + "/ns/net"}
	if _, err := h.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	line, pid := bootTPMGuest(t, h, spec)
	if !tpmLine.MatchString(line) {
		t.Errorf("KUBEVISOR-TPM: %q, want tpm0 version=2 driver=tpm_crb with PCR 0", line)
	}
	if pid == 0 {
		t.Fatal("no swtpm runs with the VM's state directory")
	}
	if pp, _ := parentOf(pid); pp != lpid {
		t.Errorf("swtpm's parent %d, want the launcher %d", pp, lpid)
	}
	for _, ns := range []string{"net", "pid"} {
		sns, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/" + ns)
		lns, _ := os.Readlink("/proc/" + strconv.Itoa(lpid) + "/ns/" + ns)
		if sns != lns || sns == "" {
			t.Errorf("swtpm in %s, launcher in %s", sns, lns)
		}
	}
	cgroupOf := func(pid int) string {
		raw, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
		return string(raw)
	}
	if cg, lcg := cgroupOf(pid), cgroupOf(lpid); cg != lcg || cg == "" {
		t.Errorf("swtpm in cgroup %q, launcher in %q", cg, lcg)
	}
	// The guest powers off: QEMU exits, and the launcher stops swtpm.
	if _, err := h.Shutdown(ctx, spec.GetId(), 60*time.Second); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	waitState(t, h, spec.GetId(), hypervisorv1.State_STATE_STOPPED, 60*time.Second)
	waitNoSWTPM(t, RunPaths(spec, spec.GetRunDir()).TPMState, 10*time.Second)
}

// TestTPMEmulatorFails: when swtpm dies at start, Start fails and says what QEMU and swtpm
// logged.
func TestTPMEmulatorFails(t *testing.T) {
	t.Parallel()
	requireQEMU(t)
	fakeSWTPM := filepath.Join(t.TempDir(), "swtpm")
	script := "#!/bin/sh\ncase \"$*\" in *--print-capabilities*) echo '{\"type\":\"swtpm\",\"features\":[\"tpm-2.0\"],\"version\":\"0.7.1\"}'; exit 0;; esac\n" +
		"echo 'swtpm: the state directory is on fire' >&2\nexit 1\n"
	if err := os.WriteFile(fakeSWTPM, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	d := New(WithLogger(testLogger()), WithProber(NewProber()))
	if err := d.Configure(context.Background(), &basev1.ConfigureRequest{StateDir: t.TempDir(), Config: []byte(`{"swtpm": "` + fakeSWTPM + `"}`)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killAll(d) })
	ctx := context.Background()
	spec := echoSpec(t, "swtpm-fails", false, 0)
	spec.Tpm = &domainv1.TPM{}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	err := d.Start(ctx, spec.GetId())
	if err == nil || !strings.Contains(err.Error(), "swtpm: the state directory is on fire") {
		t.Fatalf("Start = %v, want an error with swtpm's log", err)
	}
	t.Logf("Start: %v", err)
}
