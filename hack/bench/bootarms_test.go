package bench

import (
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseDriverArg(t *testing.T) {
	for _, tt := range []struct {
		in, name, path string
		bad            bool
	}{
		{in: "bin/kubevisor-driver-qmp", name: "qmp", path: "bin/kubevisor-driver-qmp"},
		{in: "qmp=bin/q", name: "qmp", path: "bin/q"},
		{in: " libvirt=/abs/kubevisor-driver-libvirt ", name: "libvirt", path: "/abs/kubevisor-driver-libvirt"},
		{in: "./odd=name", name: "qmp", path: "./odd=name"}, // a slash before "=": a bare path
		{in: "libvirt=", bad: true},
		{in: "", bad: true},
		{in: "xen=bin/x", bad: true},
	} {
		name, path, err := ParseDriverArg(tt.in)
		if tt.bad {
			if err == nil {
				t.Errorf("ParseDriverArg(%q) = %q, %q, want an error", tt.in, name, path)
			}
			continue
		}
		if err != nil || name != tt.name || path != tt.path {
			t.Errorf("ParseDriverArg(%q) = %q, %q, %v, want %q, %q", tt.in, name, path, err, tt.name, tt.path)
		}
	}
}

func TestBootFlagsDrivers(t *testing.T) {
	parse := func(args ...string) (BootConfig, error) {
		cfg := BootConfig{}
		fs := newBootFlags(&cfg, io.Discard)
		if err := fs.Parse(args); err != nil {
			return cfg, err
		}
		return cfg, cfg.validate(fs.Args())
	}
	cfg, err := parse()
	if err != nil || cfg.Driver != "bin/kubevisor-driver-qmp" || cfg.Libvirt != "" {
		t.Errorf("defaults: driver %q libvirt %q (%v), want bin/kubevisor-driver-qmp and no libvirt arm", cfg.Driver, cfg.Libvirt, err)
	}
	// The flag's meaning before the libvirt arm still holds.
	if cfg, err = parse("--driver", "/x/qmp"); err != nil || cfg.Driver != "/x/qmp" || cfg.Libvirt != "" {
		t.Errorf("a bare path: driver %q libvirt %q (%v)", cfg.Driver, cfg.Libvirt, err)
	}
	cfg, err = parse("--driver", "qmp=/b/q", "--driver", "libvirt=/b/l", "--launcher", "/b/launcher")
	if err != nil || cfg.Driver != "/b/q" || cfg.Libvirt != "/b/l" || cfg.Launcher != "/b/launcher" {
		t.Errorf("both drivers: %+v (%v)", cfg, err)
	}
	if cfg, err = parse("--driver", "libvirt=/b/l"); err != nil || cfg.Driver != "bin/kubevisor-driver-qmp" || cfg.Libvirt != "/b/l" {
		t.Errorf("libvirt alone keeps the qmp default: %+v (%v)", cfg, err)
	}
	for _, args := range [][]string{
		{"--driver", "qmp=/a", "--driver", "/b"},
		{"--driver", "libvirt=/a", "--driver", "libvirt=/b"},
		{"--driver", "kvmtool=/a"},
	} {
		if _, err := parse(args...); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

func TestArmOrder(t *testing.T) {
	arms := []string{"raw", "qmp", "libvirt"}
	firsts := map[string]int{}
	for i := range 6 {
		o := armOrder(arms, i)
		if got := slices.Sorted(slices.Values(o)); !slices.Equal(got, []string{"libvirt", "qmp", "raw"}) {
			t.Fatalf("order %d = %v, not every arm once", i, o)
		}
		firsts[o[0]]++
	}
	for _, a := range arms {
		if firsts[a] != 2 {
			t.Errorf("%s first in %d of 6 runs, want 2", a, firsts[a])
		}
	}
	// Two arms alternate as the bench always did: raw first in even runs.
	if o := armOrder([]string{"raw", "qmp"}, 0); o[0] != "raw" {
		t.Errorf("pair 0 = %v", o)
	}
	if o := armOrder([]string{"raw", "qmp"}, 1); o[0] != "qmp" {
		t.Errorf("pair 1 = %v", o)
	}
	if !slices.Equal(arms, []string{"raw", "qmp", "libvirt"}) {
		t.Errorf("armOrder changed its argument: %v", arms)
	}
}

func TestBootMediansRatios(t *testing.T) {
	s := time.Second
	raw := []time.Duration{5 * s, 6 * s, 4 * s}
	qmpRuns := []pluginTimes{{fromCreate: 6 * s}, {fromCreate: 5 * s}, {fromCreate: 7 * s}}
	lvRuns := []pluginTimes{{fromCreate: 9 * s}, {fromCreate: 8 * s}, {fromCreate: 10 * s}}
	m := bootMedians(raw, qmpRuns, lvRuns)
	if m.Raw != 5*s || m.QMP != 6*s || m.Libvirt != 9*s {
		t.Fatalf("medians = %+v", m)
	}
	got := map[string]string{}
	for _, r := range m.Ratios() {
		got[r.Name] = fmtRatio(r.Value)
	}
	want := map[string]string{"qmp/raw": "1.200", "libvirt/raw": "1.800", "libvirt/qmp": "1.500"}
	if len(got) != len(want) {
		t.Errorf("ratios = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %s, want %s", k, got[k], v)
		}
	}
	// Without the libvirt arm: qmp/raw only.
	if r := bootMedians(raw, qmpRuns, nil).Ratios(); len(r) != 1 || r[0].Name != "qmp/raw" {
		t.Errorf("ratios without libvirt = %v", r)
	}
	if !math.IsNaN(Ratio(s, 0)) || fmtRatio(Ratio(s, 0)) != "-" {
		t.Errorf("a ratio over nothing = %v, want NaN shown as -", Ratio(s, 0))
	}
}

func TestSplitLauncherTree(t *testing.T) {
	procs := []procSnapshot{
		{pid: 1, ppid: 0, comm: "init"},
		{pid: 10, ppid: 1, comm: "kubevisor-launc"},
		{pid: 11, ppid: 10, comm: "libvirtd"},
		{pid: 12, ppid: 10, comm: "qemu-system-x86"}, // adopted by the launcher, a subreaper
		{pid: 13, ppid: 11, comm: "virtlogd"},
		{pid: 20, ppid: 1, comm: "kubevisor-launc"},
		{pid: 21, ppid: 20, comm: "libvirtd"},
	}
	d, q, others, err := splitLauncherTree(procs, 10)
	if err != nil || d != 11 || q != 12 || len(others) != 1 || others[0].comm != "virtlogd" {
		t.Errorf("launcher 10: daemon %d qemu %d others %v (%v), want 11, 12, virtlogd", d, q, others, err)
	}
	if _, _, _, err := splitLauncherTree(procs, 20); err == nil {
		t.Error("launcher 20 runs no QEMU: no error")
	}
}

func TestMemoryComparison(t *testing.T) {
	const mi = 1 << 20
	mem := func(rss, pss uint64) MemUsage { return MemUsage{RSS: rss * mi, PSS: pss * mi} }
	qmpRows := []rssRow{
		{vms: 0, driverMem: mem(20, 18)},
		{vms: 2, driverMem: mem(24, 20), qemuMem: mem(260, 240)},
	}
	lv := lvRow{vms: 2, driver: mem(40, 26), perVM: []lvVMMem{
		{launcher: mem(13, 11), daemon: mem(28, 12), qemu: mem(270, 250)},
		{launcher: mem(13, 9), daemon: mem(28, 8), others: mem(4, 2), qemu: mem(262, 242), otherNames: []string{"virtlogd"}},
	}}
	p := lv.per(byPSS)
	if p.driverShare != 13*mi || p.daemon != 10*mi || p.others != 1*mi || p.beyond != 24*mi || p.launcher != 10*mi || p.qemu != 246*mi {
		t.Errorf("per VM by PSS = %+v", p)
	}
	for _, tt := range []struct {
		acc  accounting
		want []string
	}{
		{byRSS, []string{"2", "12.0 MiB", "20.0 MiB", "28.0 MiB", "2.0 MiB", "50.0 MiB", "+38.0 MiB", "13.0 MiB", "260.0 MiB", "266.0 MiB"}},
		{byPSS, []string{"2", "10.0 MiB", "13.0 MiB", "10.0 MiB", "1.0 MiB", "24.0 MiB", "+14.0 MiB", "10.0 MiB", "240.0 MiB", "246.0 MiB"}},
	} {
		rows, err := memoryComparison(tt.acc, qmpRows, []lvRow{lv})
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 2 || rows[0][0] != "VMs" || len(rows[0]) != len(tt.want) {
			t.Fatalf("by %s: rows = %q", tt.acc.name, rows)
		}
		if !slices.Equal(rows[1], tt.want) {
			t.Errorf("by %s:\n got %s\nwant %s", tt.acc.name, strings.Join(rows[1], " | "), strings.Join(tt.want, " | "))
		}
	}
	if _, err := memoryComparison(byRSS, qmpRows, []lvRow{{vms: 5}}); err == nil {
		t.Error("a libvirt count qmp did not measure: no error")
	}
}
