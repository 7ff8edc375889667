package bench

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

const metricsText = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 2
apiserver_request_total{code="201",component="apiserver",dry_run="",group="kubevisor.io",resource="virtualmachineinstances",scope="namespace",subresource="",verb="POST",version="v1alpha1"} 20
apiserver_request_total{code="409",component="apiserver",dry_run="",group="kubevisor.io",resource="virtualmachineinstances",scope="resource",subresource="status",verb="PUT",version="v1alpha1"} 4
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 1.5e+01
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="DELETE",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="DELETE",version="v1"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 9
apiserver_request_total{code="0",component="apiserver",dry_run="",group="",resource="odd\"name\\",scope="resource",subresource="",verb="WATCH",version="v1"} 1
apiserver_request_total_extra{verb="GET",resource="pods"} 1000
apiserver_request_terminations_total{verb="GET",resource="pods"} 1000
apiserver_request_duration_seconds_bucket{verb="GET",resource="pods",le="0.1"} 1000
`

func TestParseRequestTotal(t *testing.T) {
	got, err := ParseRequestTotal([]byte(metricsText))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"list pods": 5,
		"create virtualmachineinstances.kubevisor.io":        20,
		"update virtualmachineinstances.kubevisor.io/status": 4,
		"patch pods/status":     15,
		"deletecollection pods": 1,
		"delete pods":           7,
		"get nonresource":       9,
		`watch odd"name\`:       1,
	}
	if len(got) != len(want) {
		t.Errorf("got %d keys %v, want %d", len(got), got, len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%q: got %v, want %v", k, got[k], v)
		}
	}
}

func TestParseRequestTotalErrors(t *testing.T) {
	for name, text := range map[string]string{
		"none":         "# TYPE apiserver_request_total counter\nother_total 3\n",
		"unterminated": `apiserver_request_total{verb="GET} 3` + "\n",
		"no value":     `apiserver_request_total{verb="GET"}` + "\n",
		"bad value":    `apiserver_request_total{verb="GET"} x` + "\n",
	} {
		if _, err := ParseRequestTotal([]byte(text)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestRequestDiffAndBenchKeys(t *testing.T) {
	d := diffFloat(map[string]float64{"list pods": 7, "get nodes": 2}, map[string]float64{"list pods": 3, "get nodes": 2})
	if len(d) != 1 || d["list pods"] != 4 {
		t.Errorf("diffFloat: %v", d)
	}
	k := asServerKeys(map[string]int{"get discovery": 2, "create pods": 1})
	if k["get nonresource"] != 2 || k["create pods"] != 1 || len(k) != 2 {
		t.Errorf("asServerKeys: %v", k)
	}
}

func TestE2ELatenciesPercentiles(t *testing.T) {
	base := time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)
	var vms []*e2eVM
	// 20 VMs Running 1..20 s after creation; one more never Running (left out).
	for i := 20; i >= 1; i-- {
		vms = append(vms, &e2eVM{created: base, running: base.Add(time.Duration(i) * time.Second)})
	}
	vms = append(vms, &e2eVM{created: base})
	lat := e2eLatencies(vms, func(v *e2eVM) time.Time { return v.created }, func(v *e2eVM) time.Time { return v.running })
	if len(lat) != 20 {
		t.Fatalf("%d latencies, want 20", len(lat))
	}
	for i := 1; i < len(lat); i++ {
		if lat[i] < lat[i-1] {
			t.Fatalf("not sorted: %v", lat)
		}
	}
	// Nearest rank: P50 of 20 is the 10th, P95 the 19th, max the 20th.
	for p, want := range map[int]time.Duration{50: 10 * time.Second, 95: 19 * time.Second, 100: 20 * time.Second, 1: time.Second} {
		if got := percentile(lat, p); got != want {
			t.Errorf("P%d: %s, want %s", p, got, want)
		}
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("P50 of none: %s", got)
	}
}

// writeProc writes a fake /proc/PID with stat and cgroup.
func writeProc(t *testing.T, root string, pid, ppid int, comm, cgroup string) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stat := strconv.Itoa(pid) + " (" + comm + ") S " + strconv.Itoa(ppid) + " 1 1 0 -1\n"
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestPodProcsFromFakeProc(t *testing.T) {
	const (
		podUID   = "c4283031-48d3-4adf-b02f-b3267259f515"
		otherUID = "7e4e8c74-721d-4b51-876f-772fffeabd0b"
		compute  = "4b92e8cff4118ebf"
		console  = "e8585073873c630e"
		sandbox  = "23988926a5998e1a"
	)
	v1 := func(path string) string { // cgroup v1, cgroupfs driver
		return "9:name=systemd:" + path + "\n4:memory:" + path + "\n1:cpu:" + path + "\n0::/\n"
	}
	v2 := func(path string) string { return "0::" + path + "\n" } // cgroup v2
	pod := "/kubepods/burstable/pod" + podUID + "/"
	root := t.TempDir()
	writeProc(t, root, 1, 0, "init", v2("/init.scope"))
	writeProc(t, root, 2, 0, "kthreadd", v2("/"))
	writeProc(t, root, 50, 2, "kworker/0:1", v2("/"))
	writeProc(t, root, 100, 1, "containerd-shim", v1("/system.slice/containerd.service"))
	writeProc(t, root, 101, 100, "pause", v1(pod+sandbox))
	writeProc(t, root, 102, 100, "kubevisor-launc", v1(pod+compute))
	writeProc(t, root, 103, 102, "qemu-system-x86", v1(pod+compute))
	writeProc(t, root, 104, 100, "kubevisor-launc", v1(pod+console))
	writeProc(t, root, 200, 1, "containerd-shim", v1("/system.slice/containerd.service"))
	writeProc(t, root, 201, 200, "kubevisor-handl", v1("/kubepods/burstable/pod"+otherUID+"/abc"))
	// The systemd cgroup driver's names, under cgroup v2.
	writeProc(t, root, 300, 1, "containerd-shim", v2("/system.slice/containerd.service"))
	writeProc(t, root, 301, 300, "pause", v2("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+
		"0b1c2d3e_4f50_6172_8394_a5b6c7d8e9f0.slice/cri-containerd-"+sandbox+".scope"))
	if err := os.MkdirAll(filepath.Join(root, "self"), 0o755); err != nil { // not a pid
		t.Fatal(err)
	}

	procs, err := readProcTree(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 10 {
		t.Errorf("%d processes, want 10 (no kernel threads): %+v", len(procs), procs)
	}
	ps := podProcs(procs, podUID)
	if got := pids(ps); len(got) != 4 || got[0] != 101 || got[3] != 104 {
		t.Fatalf("pod processes %v, want 101..104", got)
	}
	shims := podShims(procs, ps)
	if len(shims) != 1 || shims[0].pid != 100 {
		t.Errorf("shims %+v, want pid 100", shims)
	}
	ids := map[string]string{compute: "compute", console: "guest-console-log"}
	wantPart := map[int]string{101: "pause (sandbox)", 102: "compute", 103: "compute", 104: "guest-console-log"}
	for _, p := range ps {
		if got := containerOf(p.cgroup, ids); got != wantPart[p.pid] {
			t.Errorf("pid %d: container %q, want %q", p.pid, got, wantPart[p.pid])
		}
	}
	if got := podProcs(procs, "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"); len(got) != 1 || got[0].pid != 301 {
		t.Errorf("systemd driver pod: %+v, want pid 301", got)
	}
	if got := podProcs(procs, podUID[:8]); len(got) != 0 {
		t.Errorf("a UID prefix matched %+v", got)
	}
	if got := podProcs(procs, ""); len(got) != 0 {
		t.Errorf("empty UID matched %+v", got)
	}
}

func TestIsDriverPlugin(t *testing.T) {
	if !isDriverPlugin("kubevisor-drive") || isDriverPlugin("kubevisor-handl") || isDriverPlugin("kubevisor-devic") {
		t.Error("isDriverPlugin")
	}
}

func TestE2EVMI(t *testing.T) {
	cfg := E2EConfig{Image: DefaultE2EImage, MemoryBytes: 128 << 20, CPURequest: "10m"}
	vmi, err := e2eVMI(cfg, "ns1", "bench-class", 7)
	if err != nil {
		t.Fatal(err)
	}
	if vmi.Name != "bench-007" || vmi.Namespace != "ns1" || vmi.Spec.HypervisorClassName != "bench-class" {
		t.Errorf("meta/class: %s/%s %q", vmi.Namespace, vmi.Name, vmi.Spec.HypervisorClassName)
	}
	if q := vmi.Spec.Domain.Memory.Guest; q == nil || q.Cmp(resource.MustParse("128Mi")) != 0 {
		t.Errorf("memory %v", q)
	}
	if q := vmi.Spec.Domain.Resources.Requests.Cpu(); q.Cmp(resource.MustParse("10m")) != 0 {
		t.Errorf("cpu request %v", q)
	}
	var disk, cloudInit bool
	for _, v := range vmi.Spec.Volumes {
		disk = disk || (v.ContainerDisk != nil && v.ContainerDisk.Image == DefaultE2EImage)
		cloudInit = cloudInit || (v.CloudInitNoCloud != nil && v.CloudInitNoCloud.UserData != "")
	}
	ifaces := vmi.Spec.Domain.Devices.Interfaces
	if !disk || !cloudInit || len(ifaces) != 1 || ifaces[0].Masquerade == nil {
		t.Errorf("volumes %+v, interfaces %+v", vmi.Spec.Volumes, ifaces)
	}
}

func TestE2EFlags(t *testing.T) {
	for _, args := range [][]string{{"--vmis", "0"}, {"--console", "tty"}, {"--cpu-request", "lots"}, {"extra"}} {
		if code := Run(append([]string{"e2e"}, args...), io.Discard, io.Discard); code != ExitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, ExitUsage)
		}
	}
}
