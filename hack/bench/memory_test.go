package bench

import (
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler/standalone"
)

func TestParseProcStat(t *testing.T) {
	for _, tt := range []struct {
		name, in string
		comm     string
		ppid     int
		bad      bool
	}{
		{"plain", "2071 (kubevisor-driv) S 2053 2071 2053 0 -1 4194560", "kubevisor-driv", 2053, false},
		{"spaces and parentheses in the name", "42 (a (b) c) R 7 42 42 0", "a (b) c", 7, false},
		{"qemu", "3050 (qemu-system-x86) S 3010 3050 3050 0 -1", "qemu-system-x86", 3010, false},
		{"no name", "42 S 7", "", 0, true},
		{"too short", "42 (x) S", "", 0, true},
		{"bad parent", "42 (x) S y 1", "", 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			comm, ppid, err := ParseProcStat([]byte(tt.in))
			if tt.bad {
				if err == nil {
					t.Fatalf("ParseProcStat(%q) = %q, %d, want an error", tt.in, comm, ppid)
				}
				return
			}
			if err != nil || comm != tt.comm || ppid != tt.ppid {
				t.Fatalf("ParseProcStat(%q) = %q, %d, %v, want %q, %d", tt.in, comm, ppid, err, tt.comm, tt.ppid)
			}
		})
	}
}

func TestDescendants(t *testing.T) {
	procs := []procSnapshot{
		{pid: 1, ppid: 0, comm: "init"},
		{pid: 10, ppid: 1, comm: "kubevisor-launc"},
		{pid: 11, ppid: 10, comm: "qemu-system-x86"},
		{pid: 12, ppid: 11, comm: "helper"},
		{pid: 20, ppid: 1, comm: "kubevisor-launc"},
		{pid: 21, ppid: 20, comm: "qemu-system-x86"},
		{pid: 5, ppid: 10, comm: "late"}, // a lower pid than its parent: reused pids
	}
	if got, want := descendants(procs, 10), []int{5, 11, 12}; !slices.Equal(got, want) {
		t.Errorf("descendants of 10 = %v, want %v", got, want)
	}
	if got := descendants(procs, 21); len(got) != 0 {
		t.Errorf("descendants of a leaf = %v, want none", got)
	}
	if got := descendants(procs, 99); len(got) != 0 {
		t.Errorf("descendants of an unknown pid = %v, want none", got)
	}
	// A cycle (a pid reused while reading /proc) must not loop.
	cyc := []procSnapshot{{pid: 2, ppid: 3}, {pid: 3, ppid: 2}}
	if got, want := descendants(cyc, 2), []int{3}; !slices.Equal(got, want) {
		t.Errorf("descendants in a cycle = %v, want %v", got, want)
	}
	if !isQEMU("qemu-system-x86") || isQEMU("kubevisor-launc") {
		t.Error("isQEMU tells QEMU wrong")
	}
}

func TestMemoryFigures(t *testing.T) {
	const mi = 1 << 20
	// rss builds a reading whose PSS is half its RSS, so that the accountings differ.
	rss := func(n uint64) MemUsage { return MemUsage{RSS: n * mi, PSS: n * mi / 2, Anon: mi} }
	rssAll := func(ns ...uint64) []MemUsage {
		var out []MemUsage
		for _, n := range ns {
			out = append(out, rss(n))
		}
		return out
	}
	r := memoryRound{
		vms:       4,
		qemu:      rssAll(200, 220, 210, 210),
		launchers: rssAll(12, 12, 13, 11),
		handler:   rss(38),
		drivers:   map[string]MemUsage{"qmp": rss(20), "cni": rss(18), "local": rss(14)},
	}
	f := r.figures(byRSS, rss(18))
	want := memoryFigures{qemu: 210 * mi, launcher: 12 * mi, handler: 5 * mi, drivers: 13 * mi}
	if f != want {
		t.Fatalf("figures by RSS = %+v, want %+v", f, want)
	}
	if got := f.overhead(); got != 30*mi {
		t.Errorf("overhead = %v MiB, want 30", got/mi)
	}
	if got, want := r.figures(byPSS, rss(18)).overhead(), 15.0*mi; got != want {
		t.Errorf("overhead by PSS = %v MiB, want %v", got/mi, want/mi)
	}
	// Every reading holds 1 MiB of anonymous memory: launcher 1 + handler 0 + 3 drivers / 4 VMs.
	if got, want := r.figures(byAnon, rss(18)).overhead(), 1.75*mi; got != want {
		t.Errorf("overhead by anonymous memory = %v MiB, want %v", got/mi, want/mi)
	}
	// A handler below its baseline (the GC returned memory) counts as nothing, not negative.
	r.handler = rss(10)
	if got := r.figures(byRSS, rss(18)).handler; got != 0 {
		t.Errorf("handler share below the baseline = %v, want 0", got)
	}
	r.handler = rss(38)
	more := memoryRound{
		vms:       6,
		qemu:      make([]MemUsage, 6),
		launchers: rssAll(12, 12, 12, 12, 12, 12),
		handler:   rss(40),
		drivers:   map[string]MemUsage{"qmp": rss(21), "cni": rss(19), "local": rss(14)},
	}
	// Kubevisor beyond QEMU: 4 VMs 120 MiB, 6 VMs 72+22+54 = 148 MiB: 14 MiB per VM more.
	if got := marginal(byRSS, r, more, rss(18)); got != 14*mi {
		t.Errorf("marginal = %v MiB, want 14", got/mi)
	}
	if verdict(MemoryAim) != "met" || verdict(math.Nextafter(MemoryAim, math.Inf(1))) != "NOT met" {
		t.Error("the aim is at most 25 MiB, inclusive")
	}
}

func TestParseSmapsRollup(t *testing.T) {
	const rollup = `00400000-7ffe5a522000 ---p 00000000 00:00 0                              [rollup]
Rss:               12024 kB
Pss:               10735 kB
Pss_Anon:           1532 kB
Anonymous:          1532 kB
Swap:                  0 kB
`
	m, err := ParseSmapsRollup([]byte(rollup))
	if err != nil {
		t.Fatal(err)
	}
	if want := (MemUsage{RSS: 12024 << 10, PSS: 10735 << 10, Anon: 1532 << 10}); m != want {
		t.Errorf("ParseSmapsRollup = %+v, want %+v", m, want)
	}
	for name, bad := range map[string]string{
		"empty (an exited process)": "",
		"no Pss":                    "Rss: 1 kB\nAnonymous: 1 kB\n",
		"not kB":                    "Rss: 1 MB\nPss: 1 kB\nAnonymous: 1 kB\n",
		"not a number":              "Rss: x kB\nPss: 1 kB\nAnonymous: 1 kB\n",
	} {
		if _, err := ParseSmapsRollup([]byte(bad)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// Our own rollup parses, with PSS at most RSS.
	own, err := readMem(os.Getpid())
	if err != nil || own.RSS == 0 || own.PSS > own.RSS {
		t.Errorf("readMem(self) = %+v, %v", own, err)
	}
}

func TestBenchVMI(t *testing.T) {
	tmpl, err := standalone.LoadVMI("../../core/handler/testdata/demo-vmi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	before := tmpl.DeepCopy()
	vmi, err := BenchVMI(tmpl, 3, "uid-3", "/g/disk.qcow2", 128<<20, 7*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if vmi.Name != "bench-3" || vmi.UID != "uid-3" || vmi.Namespace != tmpl.Namespace {
		t.Errorf("name %s/%s uid %s", vmi.Namespace, vmi.Name, vmi.UID)
	}
	if m := vmi.Spec.Domain.Memory; m == nil || m.Guest == nil || m.Guest.Value() != 128<<20 {
		t.Errorf("memory = %v, want 128Mi", m)
	}
	if g := vmi.Spec.TerminationGracePeriodSeconds; g == nil || *g != 7 {
		t.Errorf("grace = %v, want 7", g)
	}
	var images []string
	for _, v := range vmi.Spec.Volumes {
		if v.ContainerDisk != nil {
			images = append(images, v.ContainerDisk.Image)
		}
	}
	if !slices.Equal(images, []string{"/g/disk.qcow2"}) {
		t.Errorf("containerDisk images = %q", images)
	}
	if tmpl.Spec.Volumes[0].ContainerDisk.Image != before.Spec.Volumes[0].ContainerDisk.Image || tmpl.Name != before.Name {
		t.Error("BenchVMI changed its template")
	}

	none := tmpl.DeepCopy()
	none.Spec.Volumes = []v1alpha1.Volume{}
	if _, err := BenchVMI(none, 0, "u", "/g/disk.qcow2", 128<<20, time.Second); err == nil {
		t.Error("a template without a containerDisk: no error")
	}
}

func TestBytesFlag(t *testing.T) {
	for in, want := range map[string]uint64{"128Mi": 128 << 20, "1Gi": 1 << 30, "134217728": 128 << 20, " 64Mi ": 64 << 20} {
		var f bytesFlag
		if err := f.Set(in); err != nil || uint64(f) != want {
			t.Errorf("Set(%q) = %d, %v, want %d", in, f, err, want)
		}
	}
	for _, in := range []string{"", "abc", "-1Mi", "0", "0.5"} {
		var f bytesFlag
		if err := f.Set(in); err == nil {
			t.Errorf("Set(%q): no error", in)
		}
	}
	f := bytesFlag(128 << 20)
	q := resource.MustParse("128Mi")
	if got := f.String(); got != q.String() {
		t.Errorf("String() = %q, want 128Mi", got)
	}
}

func TestMemoryFlags(t *testing.T) {
	cfg := MemoryConfig{}
	fs := newMemoryFlags(&cfg, io.Discard)
	if err := fs.Parse([]string{"--vms", "2,4", "--memory", "96Mi"}); err != nil {
		t.Fatal(err)
	}
	if err := cfg.validate(fs.Args()); err != nil {
		t.Fatalf("validate: %v", err)
	}
	if !slices.Equal(cfg.VMs, []int{2, 4}) || cfg.MemoryBytes != 96<<20 || cfg.Bridge != DefaultMemoryBridge || cfg.GracePeriod != DefaultMemoryGrace {
		t.Errorf("config = %+v", cfg)
	}

	def := MemoryConfig{}
	fs = newMemoryFlags(&def, io.Discard)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(def.VMs, []int{1, 5, 10}) || def.MemoryBytes != 128<<20 {
		t.Errorf("defaults: vms %v memory %d, want 1,5,10 and 128Mi", def.VMs, def.MemoryBytes)
	}

	for _, args := range [][]string{{"--memory", "32Mi"}, {"--vms", ""}, {"--grace-period", "0s"}, {"--log-level", "loud"}, {"extra"}} {
		c := MemoryConfig{}
		fs := newMemoryFlags(&c, io.Discard)
		if err := fs.Parse(args); err != nil {
			continue
		}
		if err := c.validate(fs.Args()); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	var out strings.Builder
	if code := Run([]string{"memory", "--vms", "x"}, io.Discard, &out); code != ExitUsage {
		t.Errorf("a bad flag: exit %d, want %d", code, ExitUsage)
	}
}
