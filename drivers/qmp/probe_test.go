package qmp

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
)

// fakeQEMU answers the probe's commands the way a QEMU with the given behaviours would.
type fakeQEMU struct {
	kvm, tcg string // "ok", "slow" (boots, never finishes), "silent" (hangs), "abort"
	version  string

	mu    sync.Mutex
	calls [][]string
}

func (f *fakeQEMU) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	f.mu.Lock()
	f.calls = append(f.calls, args)
	f.mu.Unlock()
	switch {
	case slices.Equal(args, []string{"-version"}):
		if f.version == "" {
			return []byte("qemu: error while loading shared libraries"), errors.New("exit status 127")
		}
		return []byte("QEMU emulator version " + f.version + " (Debian 1:7.2+dfsg-7+deb12u18+b3)\nCopyright (c) 2003-2022 Fabrice Bellard\n"), nil
	case slices.Equal(args, []string{"-machine", "help"}):
		return []byte("Supported machines are:\nmicrovm              microvm (i386)\npc                   Standard PC (alias of pc-i440fx-7.2)\nq35                  Standard PC (Q35 + ICH9, 2009) (alias of pc-q35-7.2)\npc-q35-7.2           Standard PC (Q35 + ICH9, 2009)\n"), nil
	case slices.Equal(args, []string{"-cpu", "help"}):
		return []byte("Available CPUs:\nx86 486                   (alias configured by machine type)\nx86 max                   Enables all features\n\nRecognized CPUID flags:\n  3dnow 3dnowext\n"), nil
	}
	i := slices.Index(args, "-accel")
	if i < 0 {
		return nil, errors.New("unexpected command " + strings.Join(args, " "))
	}
	f.mu.Lock()
	behaviour := map[string]string{"kvm": f.kvm, "tcg": f.tcg}[args[i+1]]
	f.mu.Unlock()
	switch behaviour {
	case "ok":
		return []byte(ProbeBootedMarker + "\r\n" + ProbeMarker + "\r\n"), errors.New("exit status 1")
	case "slow":
		<-ctx.Done()
		return []byte(ProbeBootedMarker + "\r\n"), errors.New("signal: killed")
	case "silent":
		<-ctx.Done()
		return nil, errors.New("signal: killed")
	case "abort":
		return []byte("qemu-system-x86_64: ../../target/i386/kvm/kvm.c:3183: kvm_buf_set_msrs: Assertion `ret == cpu->kvm_msr_buf->nmsrs' failed.\n"), errors.New("signal: aborted")
	}
	return nil, errors.New("no behaviour for " + args[i+1])
}

func (f *fakeQEMU) booted(accel string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.calls {
		if hasArgs(c, "-accel", accel) {
			return true
		}
	}
	return false
}

func TestProbe(t *testing.T) {
	found := func(string) (string, error) { return "/usr/bin/qemu-system-x86_64", nil }
	cases := []struct {
		name       string
		fake       *fakeQEMU
		lookPath   func(string) (string, error)
		noKVMDev   bool
		disableKVM bool

		health     basev1.Health
		accel      string
		descHas    string
		kvmBooted  bool
		wantModels bool
		transient  bool
	}{
		{
			name: "kvm works", fake: &fakeQEMU{kvm: "ok", tcg: "ok", version: "7.2.22"},
			health: basev1.Health_HEALTH_HEALTHY, accel: "kvm", kvmBooted: true, wantModels: true,
		},
		{
			name: "kvm runs guest code too slowly", fake: &fakeQEMU{kvm: "slow", tcg: "ok", version: "7.2.22"},
			health: basev1.Health_HEALTH_DEGRADED, accel: "tcg", kvmBooted: true,
			descHas: "KVM not usable (a test guest booted but did not finish a short computation within 200ms",
		},
		{
			name: "kvm hangs", fake: &fakeQEMU{kvm: "silent", tcg: "ok", version: "7.2.22"},
			health: basev1.Health_HEALTH_DEGRADED, accel: "tcg", kvmBooted: true,
			descHas: "KVM not usable (a test guest printed nothing within 200ms); emulation only",
		},
		{
			name: "kvm aborts", fake: &fakeQEMU{kvm: "abort", tcg: "ok", version: "7.2.22"},
			health: basev1.Health_HEALTH_DEGRADED, accel: "tcg", kvmBooted: true,
			descHas: "KVM not usable (qemu: qemu-system-x86_64: ../../target/i386/kvm/kvm.c:3183: kvm_buf_set_msrs: Assertion",
		},
		{
			name: "no kvm device", fake: &fakeQEMU{tcg: "ok", version: "7.2.22"}, noKVMDev: true,
			health: basev1.Health_HEALTH_DEGRADED, accel: "tcg", descHas: "KVM not usable (open /dev/kvm: no such file or directory)",
		},
		{
			name: "kvm disabled", fake: &fakeQEMU{kvm: "ok", tcg: "ok", version: "7.2.22"}, disableKVM: true,
			health: basev1.Health_HEALTH_DEGRADED, accel: "tcg", descHas: "disabled by the driver's configuration",
		},
		{
			name: "qemu missing", fake: &fakeQEMU{},
			lookPath: func(string) (string, error) { return "", exec.ErrNotFound },
			health:   basev1.Health_HEALTH_UNHEALTHY, descHas: "qemu-system-x86_64 not found (install qemu-system-x86)",
		},
		{
			name: "qemu broken", fake: &fakeQEMU{},
			health: basev1.Health_HEALTH_UNHEALTHY, descHas: "-version: qemu: error while loading shared libraries (exit status 127)",
		},
		{
			name: "nothing boots", fake: &fakeQEMU{kvm: "abort", tcg: "silent", version: "7.2.22"},
			health: basev1.Health_HEALTH_UNHEALTHY, kvmBooted: true, descHas: "no accelerator runs a test guest: tcg: a test guest printed nothing",
			transient: true,
		},
		{
			name: "nothing finishes in time (a busy node)", fake: &fakeQEMU{kvm: "silent", tcg: "slow", version: "7.2.22"},
			health: basev1.Health_HEALTH_UNHEALTHY, kvmBooted: true, transient: true,
			descHas: "no accelerator runs a test guest: tcg: a test guest booted but did not finish a short computation within 200ms",
		},
		{
			name: "nothing boots, neither in time", fake: &fakeQEMU{kvm: "abort", tcg: "abort", version: "7.2.22"},
			health: basev1.Health_HEALTH_UNHEALTHY, kvmBooted: true, descHas: "no accelerator runs a test guest: tcg: qemu:",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := &Prober{
				Runner:   c.fake,
				LookPath: c.lookPath,
				OpenDevice: func(path string) error {
					if path == "/dev/kvm" && !c.noKVMDev {
						return nil
					}
					return errors.New("open " + path + ": no such file or directory")
				},
				TempDir: t.TempDir(),
			}
			if p.LookPath == nil {
				p.LookPath = found
			}
			h := p.Probe(context.Background(), ProbeOptions{DisableKVM: c.disableKVM, Timeout: 200 * time.Millisecond})
			fp := h.Fingerprint()
			if fp.GetHealth() != c.health {
				t.Errorf("health = %s (%s), want %s", fp.GetHealth(), fp.GetHealthDescription(), c.health)
			}
			if got := fp.GetAttributes()["accel"]; got != c.accel {
				t.Errorf("accel attribute = %q, want %q", got, c.accel)
			}
			if c.fake.version != "" && fp.GetAttributes()["qemu-version"] != c.fake.version {
				t.Errorf("qemu-version attribute = %q", fp.GetAttributes()["qemu-version"])
			}
			if !strings.Contains(fp.GetHealthDescription(), c.descHas) {
				t.Errorf("description %q lacks %q", fp.GetHealthDescription(), c.descHas)
			}
			if h.Transient != c.transient {
				t.Errorf("Transient = %v, want %v", h.Transient, c.transient)
			}
			if got := c.fake.booted("kvm"); got != c.kvmBooted {
				t.Errorf("booted under kvm = %v, want %v", got, c.kvmBooted)
			}
			if c.wantModels {
				if !slices.Equal(h.MachineTypes, []string{"microvm", "pc", "q35", "pc-q35-7.2"}) {
					t.Errorf("MachineTypes = %q", h.MachineTypes)
				}
				if !slices.Equal(h.CPUModels, []string{"486", "max"}) {
					t.Errorf("CPUModels = %q", h.CPUModels)
				}
			}
		})
	}
}

func TestProbeRemembers(t *testing.T) {
	fake := &fakeQEMU{kvm: "ok", tcg: "ok", version: "7.2.22"}
	p := &Prober{Runner: fake, LookPath: func(string) (string, error) { return "/q", nil }, OpenDevice: func(string) error { return nil }, TempDir: t.TempDir()}
	a := p.Probe(context.Background(), ProbeOptions{})
	n := len(fake.calls)
	b := p.Probe(context.Background(), ProbeOptions{})
	if a != b || len(fake.calls) != n {
		t.Fatalf("second probe with the same options ran commands again")
	}
	p.Probe(context.Background(), ProbeOptions{DisableKVM: true})
	if len(fake.calls) == n {
		t.Fatalf("probe with other options was not run")
	}
}

func TestLabelValue(t *testing.T) {
	for in, want := range map[string]string{"7.2.22": "7.2.22", "7.2.0 (Debian)": "7.2.0-Debian", "": "", "-x-": "x"} {
		if got := labelValue(in); got != want {
			t.Errorf("labelValue(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseCPUFlags(t *testing.T) {
	out := []byte("Available CPUs:\nx86 486   (alias configured by machine type)\nx86 max  Enables all features\n\n" +
		"Recognized CPUID flags:\n  3dnow abm aes\n  avx2 popcnt\n\n")
	if got, want := parseCPUFlags(out), []string{"3dnow", "abm", "aes", "avx2", "popcnt"}; !slices.Equal(got, want) {
		t.Errorf("parseCPUFlags = %q, want %q", got, want)
	}
	if got := parseCPUFlags([]byte("x86 max\n")); got != nil {
		t.Errorf("parseCPUFlags without the section = %q, want nil", got)
	}
}

// TestParseCPUFlagsRealQEMU: the real QEMU's list has the flags the kit's CPU/Features check uses.
func TestParseCPUFlagsRealQEMU(t *testing.T) {
	requireQEMU(t)
	out, err := exec.Command("qemu-system-x86_64", "-cpu", "help").Output()
	if err != nil {
		t.Fatalf("qemu-system-x86_64 -cpu help: %v", err)
	}
	flags := parseCPUFlags(out)
	for _, f := range []string{"aes", "popcnt", "avx2"} {
		if !slices.Contains(flags, f) {
			t.Errorf("qemu-system-x86_64 -cpu help: %q not among the %d flags parsed", f, len(flags))
		}
	}
}

func TestProbeForgetsTransient(t *testing.T) {
	fake := &fakeQEMU{kvm: "silent", tcg: "slow", version: "7.2.22"}
	p := &Prober{Runner: fake, LookPath: func(string) (string, error) { return "/q", nil }, OpenDevice: func(string) error { return nil }, TempDir: t.TempDir()}
	opts := ProbeOptions{Timeout: 50 * time.Millisecond}
	if h := p.Probe(context.Background(), opts); !h.Transient {
		t.Fatalf("slow TCG, silent KVM: not transient: %+v", h)
	}
	fake.mu.Lock()
	fake.tcg = "ok"
	fake.mu.Unlock()
	if h := p.Probe(context.Background(), opts); h.Problem != "" || !h.TCG {
		t.Fatalf("the probe after a transient result was not run again: %+v", h)
	}
}

// TestHostProbeRetriesTransient checks that a probe whose result rests on a timeout runs again
// with backoff and a longer timeout, that the new result reaches Watch (the fingerprint), and
// that probing stops once a result is final.
func TestHostProbeRetriesTransient(t *testing.T) {
	fake := &fakeQEMU{kvm: "silent", tcg: "slow", version: "7.2.22"}
	var mu sync.Mutex
	var timeouts []time.Duration
	runner := RunnerFunc(func(ctx context.Context, name string, args ...string) ([]byte, error) {
		if slices.Contains(args, "-accel") && hasArgs(args, "-accel", "tcg") {
			d, _ := ctx.Deadline()
			mu.Lock()
			timeouts = append(timeouts, time.Until(d).Round(10*time.Millisecond))
			n := len(timeouts)
			mu.Unlock()
			if n == 3 { // the third TCG boot finishes: the node is less busy now
				fake.mu.Lock()
				fake.tcg = "ok"
				fake.mu.Unlock()
			}
		}
		return fake.Run(ctx, name, args...)
	})
	hp := &HostProbe{
		Prober:   &Prober{Runner: runner, LookPath: func(string) (string, error) { return "/q", nil }, OpenDevice: func(string) error { return nil }, TempDir: t.TempDir()},
		RetryMin: 20 * time.Millisecond, RetryMax: 40 * time.Millisecond,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var healths []basev1.Health
	err := hp.Watch(ctx, ProbeOptions{Timeout: 100 * time.Millisecond}, func(h *HostInfo) error {
		healths = append(healths, h.Fingerprint().GetHealth())
		if !h.Transient {
			cancel()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []basev1.Health{basev1.Health_HEALTH_UNHEALTHY, basev1.Health_HEALTH_UNHEALTHY, basev1.Health_HEALTH_DEGRADED}
	if !slices.Equal(healths, want) {
		t.Fatalf("healths seen %v, want %v", healths, want)
	}
	mu.Lock()
	got := slices.Clone(timeouts)
	mu.Unlock()
	// 100ms, then doubled, then capped at 4 times.
	if len(got) != 3 || got[0] > 100*time.Millisecond || got[1] <= 100*time.Millisecond || got[2] <= 200*time.Millisecond || got[2] > 400*time.Millisecond {
		t.Errorf("test boot timeouts %v: want about 100ms, 200ms, 400ms", got)
	}
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(timeouts) != 3 {
		t.Errorf("%d TCG boots: the probe ran again after a final result", len(timeouts))
	}
	info, err := hp.Info(context.Background(), ProbeOptions{})
	if err != nil || !info.TCG || info.Transient {
		t.Errorf("Info after the final result: %+v, %v", info, err)
	}
}

// TestHostProbeSettled: a VM operation on a transient problem has the probe run again at once,
// with the longer timeout, rather than at its next retry (an hour away here), and gets the
// final result; one that stays transient gets the latest result after its wait.
func TestHostProbeSettled(t *testing.T) {
	fake := &fakeQEMU{kvm: "silent", tcg: "slow", version: "7.2.22"}
	var mu sync.Mutex
	var timeouts []time.Duration
	recovers := true
	runner := RunnerFunc(func(ctx context.Context, name string, args ...string) ([]byte, error) {
		if hasArgs(args, "-accel", "tcg") {
			d, _ := ctx.Deadline()
			mu.Lock()
			timeouts = append(timeouts, time.Until(d).Round(10*time.Millisecond))
			if len(timeouts) == 2 && recovers {
				fake.mu.Lock()
				fake.tcg = "ok"
				fake.mu.Unlock()
			}
			mu.Unlock()
		}
		return fake.Run(ctx, name, args...)
	})
	newProbe := func() *HostProbe {
		return &HostProbe{
			Prober:   &Prober{Runner: runner, LookPath: func(string) (string, error) { return "/q", nil }, OpenDevice: func(string) error { return nil }, TempDir: t.TempDir()},
			RetryMin: time.Hour, RetryMax: time.Hour,
		}
	}
	opts := ProbeOptions{Timeout: 100 * time.Millisecond}

	hp := newProbe()
	if first, err := hp.Info(context.Background(), opts); err != nil || first.Problem == "" || !first.Transient {
		t.Fatalf("first result %+v, %v: want a transient problem", first, err)
	}
	start := time.Now()
	h, err := hp.Settled(context.Background(), opts, 30*time.Second)
	if err != nil || h.Transient || h.Problem != "" || !h.TCG {
		t.Fatalf("Settled = %+v, %v: want the final result, TCG usable", h, err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("Settled took %s: it waited for the retry rather than asking for one", took)
	}
	mu.Lock()
	if len(timeouts) != 2 || timeouts[1] <= timeouts[0] {
		t.Errorf("test boot timeouts %v: want two, the second longer", timeouts)
	}
	timeouts, recovers = nil, false
	fake.mu.Lock()
	fake.tcg = "slow"
	fake.mu.Unlock()
	mu.Unlock()

	hp = newProbe()
	h, err = hp.Settled(context.Background(), opts, 2*time.Second)
	if err != nil || !h.Transient || h.Problem == "" {
		t.Fatalf("Settled on a node that stays slow = %+v, %v: want its latest transient problem", h, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(timeouts) < 2 {
		t.Errorf("%d TCG boots while Settled waited: want the probe run again", len(timeouts))
	}
}
