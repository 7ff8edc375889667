package libvirt

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	lclient "github.com/kubevisor/kubevisor/core/driver/launcher"
	"github.com/kubevisor/kubevisor/drivers/qmp"
	"github.com/kubevisor/kubevisor/internal/testbin"
)

// testLauncher is a kubevisor-launcher process of a test.
type testLauncher struct {
	pid    int // in the test's pid namespace
	sock   string
	client *lclient.Client
	exited chan struct{}
}

// startLauncher builds cmd/kubevisor-launcher and starts it under the command wrap (none: as
// the conformance kit and standalone mode run it, a process of the node's pid namespace); it
// is killed when the test ends.
func startLauncher(ctx context.Context, t *testing.T, vmi string, wrap ...string) *testLauncher {
	t.Helper()
	bin := t.TempDir()
	if err := testbin.Build(bin, false, "github.com/kubevisor/kubevisor/cmd/kubevisor-launcher"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "l")
	stderr := filepath.Join(t.TempDir(), "stderr")
	f, err := os.Create(stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	argv := append(wrap, filepath.Join(bin, "kubevisor-launcher"), "--dir", dir, "--vmi", vmi)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = f // a file: Wait would wait for a pipe's other holders, the launcher's children
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	l := &testLauncher{sock: filepath.Join(dir, lclient.SocketName), exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(l.exited) }()
	t.Cleanup(func() {
		if l.pid > 0 {
			_ = unix.Kill(l.pid, unix.SIGKILL)
		}
		_ = cmd.Process.Kill()
		<-l.exited
		if t.Failed() {
			raw, _ := os.ReadFile(stderr)
			t.Logf("launcher stderr:\n%s", raw)
		}
	})
	if l.client, err = lclient.Dial(ctx, l.sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.client.Close() })
	if l.pid = l.client.LauncherPid(); l.pid == 0 {
		t.Fatal("the launcher's pid is not visible here")
	}
	return l
}

// processesOf lists the live processes whose command line or environment names dir: a VM's
// libvirtd (its XDG directories), its QEMU (monitor socket, pid file) and anything else they
// started there.
func processesOf(dir string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || !processAlive(pid) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if bytes.Contains(cmdline, []byte(dir+"/")) || bytes.Contains(env, []byte("="+dir+"/")) {
			argv := strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " ")
			if len(argv) > 60 {
				argv = argv[:60] + "..."
			}
			out = append(out, fmt.Sprintf("%d %s", pid, argv))
		}
	}
	return out
}

// killProcessesOf kills what processesOf finds, so that a failed test leaves nothing running.
func killProcessesOf(dir string) {
	for _, p := range processesOf(dir) {
		if pid, err := strconv.Atoi(strings.Fields(p)[0]); err == nil {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}

// TestLauncherKilled: a launcher SIGKILLed under a running VM takes the VM's libvirtd and the
// daemon's QEMU with it, though no driver process manages the VM then (the driver let go of it
// first, as one that is down or restarting has). As the conformance kit and standalone mode run
// it, a process of the node's pid namespace, no pod's end would kill them: the daemon dies by
// the parent-death signal setpriv sets again, QEMU, which the launcher adopted, by the one the
// daemon's emulator script has setpriv set. As a launcher pod runs it, the init of a pid
// namespace of its own, the kernel kills them, and QEMU runs without the script.
func TestLauncherKilled(t *testing.T) {
	requireLibvirt(t)
	for _, c := range []struct {
		name   string
		wrap   []string
		script bool
	}{
		{name: "NodeProcess", script: true},
		{name: "PidNamespaceInit", wrap: []string{"unshare", "--pid", "--fork", "--mount-proc", "--"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			l := startLauncher(ctx, t, "lv-lkill", c.wrap...)
			d := newTestDriver(t)
			spec := bootSpec(t, "lv-lkill", reachableDir(t))
			spec.Serial = &domainv1.Serial{SocketPath: filepath.Join(spec.GetRunDir(), "serial.sock")}
			spec.Sandbox = &domainv1.Sandbox{LauncherSocket: l.sock}
			t.Cleanup(func() { killProcessesOf(spec.GetRunDir()) })
			if _, err := d.Create(ctx, spec); err != nil {
				t.Fatal(err)
			}
			if err := d.Start(ctx, spec.GetId()); err != nil {
				t.Fatal(err)
			}
			out := &consoleBuf{}
			go func() { _ = d.Console(ctx, spec.GetId(), nil, out) }()
			waitFor(t, "the boot sector's marker", time.Minute, func() bool { return out.count(qmp.BootSectorMarker) >= 1 })
			daemonPID := daemonPIDOf(d, spec.GetId())
			qemuPID := 0 // in this pid namespace (the daemon's pid file has the launcher's)
			for _, p := range processesOf(spec.GetRunDir()) {
				if f := strings.Fields(p); len(f) > 1 && strings.HasSuffix(f[1], "qemu-system-x86_64") {
					qemuPID, _ = strconv.Atoi(f[0])
				}
			}
			if qemuPID == 0 || daemonPID == 0 {
				t.Fatalf("daemon pid %d, QEMU pid %d; processes: %s", daemonPID, qemuPID, strings.Join(processesOf(spec.GetRunDir()), "; "))
			}
			// The daemon is the launcher's child; QEMU, which libvirt daemonizes, is adopted by
			// the launcher, a child subreaper.
			for what, pid := range map[string]int{"libvirtd": daemonPID, "qemu": qemuPID} {
				if pp := parentPID(pid); pp != l.pid {
					t.Errorf("%s (pid %d) has parent %d, want the launcher %d", what, pid, pp, l.pid)
				}
			}
			if st, _ := d.Status(ctx, spec.GetId()); int(st.GetPid()) != qemuPID {
				t.Errorf("Status says QEMU is pid %d, want %d (this pid namespace's)", st.GetPid(), qemuPID)
			}
			if _, err := os.Stat(vmOf(d, spec.GetId()).dmn.emulator()); (err == nil) != c.script {
				t.Errorf("the emulator script: %v, want it written: %v", err, c.script)
			}
			t.Logf("the VM's processes: %s", strings.Join(processesOf(spec.GetRunDir()), "; "))

			if err := d.Close(); err != nil { // no driver is there to kill anything
				t.Fatal(err)
			}
			if err := unix.Kill(l.pid, unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-l.exited
			deadline := time.Now().Add(10 * time.Second)
			for len(processesOf(spec.GetRunDir())) > 0 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if left := processesOf(spec.GetRunDir()); len(left) > 0 {
				t.Errorf("10 s after the launcher was SIGKILLed, these still run: %s", strings.Join(left, "; "))
			}
		})
	}
}

// vmOf is the driver's VM id.
func vmOf(d *Driver, id string) *vm {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.vms[id]
}

// daemonPIDOf is the pid of VM id's daemon as the driver records it, read under the VM's lock
// (the driver's event loop writes it when the daemon goes away).
func daemonPIDOf(d *Driver, id string) int {
	v := vmOf(d, id)
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.rec.DaemonPID
}

// parentPID is pid's parent (0 if it cannot be read).
func parentPID(pid int) int {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 2 {
		return 0
	}
	pp, _ := strconv.Atoi(f[1])
	return pp
}

// TestLeftoverDaemon: a driver process SIGKILLed after the launcher started the VM's libvirtd,
// before it recorded the daemon, leaves a daemon no later driver process knows in the
// launcher, which runs one process at a time: the next driver process's Start kills it and
// starts the VM on a daemon of its own, where it failed for good before.
func TestLeftoverDaemon(t *testing.T) {
	requireLibvirt(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := startLauncher(ctx, t, "lv-left")
	stateDir := t.TempDir()
	first := New(WithLogger(testLogger()))
	if err := first.Configure(ctx, &basev1.ConfigureRequest{StateDir: stateDir}); err != nil {
		t.Fatal(err)
	}
	spec := bootSpec(t, "lv-left", reachableDir(t))
	spec.Serial = &domainv1.Serial{SocketPath: filepath.Join(spec.GetRunDir(), "serial.sock")}
	spec.Sandbox = &domainv1.Sandbox{LauncherSocket: l.sock}
	t.Cleanup(func() { killProcessesOf(spec.GetRunDir()) })
	h, err := first.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	// What the first driver's Start does up to the launcher's start of the daemon, and no
	// further: the driver process dies there.
	dm := vmOf(first, spec.GetId()).dmn
	if err := first.prepareFiles(vmOf(first, spec.GetId())); err != nil {
		t.Fatal(err)
	}
	if err := dm.prepare(); err != nil {
		t.Fatal(err)
	}
	leftover, err := lclient.NewStarter(l.sock).Start(ctx, dm.command(first.config().Setpriv, true))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the leftover daemon's socket", 30*time.Second, func() bool {
		_, err := os.Stat(dm.socket())
		return err == nil
	})
	_ = first.Close()

	d := newTestDriver(t)
	d.mu.Lock()
	d.stateDir = stateDir
	d.mu.Unlock()
	st, err := d.Recover(ctx, h)
	if err != nil || st.GetState() != hypervisorv1.State_STATE_CREATED {
		t.Fatalf("Recover = %v, %v; want CREATED", st, err)
	}
	if err := d.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start beside the leftover daemon: %v", err)
	}
	out := &consoleBuf{}
	go func() { _ = d.Console(ctx, spec.GetId(), nil, out) }()
	waitFor(t, "the boot sector's marker", time.Minute, func() bool { return out.count(qmp.BootSectorMarker) >= 1 })
	waitFor(t, "the leftover daemon gone", 10*time.Second, func() bool { return !processAlive(leftover) })
	daemonPID := daemonPIDOf(d, spec.GetId())
	info, err := l.client.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := info.GetProcess(); daemonPID == leftover || !p.GetRunning() || l.client.LocalPid(p.GetProcess()) != daemonPID {
		t.Errorf("the launcher runs %v; the VM's daemon is pid %d, the leftover was %d", p, daemonPID, leftover)
	}
}

// TestDaemonCredentials reads what the VM's libvirtd and its QEMU run with, under a launcher
// confined as a launcher pod's compute container is (root with SETUID and SETGID only, the
// class's launcherCapabilities: no CAP_SETPCAP, so setpriv cannot empty the bounding set and
// leaves it without failing) and under one with root's capabilities (the conformance kit's
// and standalone mode's without a class): the user's uid and gid, no supplementary group, empty
// inheritable, permitted, effective and ambient sets and no_new_privs either way; the bounding
// set the launcher's, SETUID and SETGID, in the first, and empty in the second.
func TestDaemonCredentials(t *testing.T) {
	requireLibvirt(t)
	for _, c := range []struct {
		name string
		wrap []string
		bnd  uint64
	}{
		{name: "PodCapabilities", wrap: []string{"setpriv", "--bounding-set=-all,+setuid,+setgid", "--inh-caps=-all", "--"}, bnd: 1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID},
		{name: "RootCapabilities", bnd: 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			l := startLauncher(ctx, t, "lv-creds", c.wrap...)
			if c.wrap != nil {
				if st := procStatus(t, l.pid); st["CapBnd"] != "00000000000000c0" || st["CapEff"] != "00000000000000c0" || st["Uid"] != "0\t0\t0\t0" {
					t.Fatalf("the confined launcher: %v", st)
				}
			}
			d := newTestDriver(t)
			spec := bootSpec(t, "lv-creds", reachableDir(t))
			spec.Sandbox = &domainv1.Sandbox{LauncherSocket: l.sock}
			t.Cleanup(func() { killProcessesOf(spec.GetRunDir()) })
			if _, err := d.Create(ctx, spec); err != nil {
				t.Fatal(err)
			}
			if err := d.Start(ctx, spec.GetId()); err != nil {
				t.Fatal(err)
			}
			pids := map[string]int{"libvirtd": daemonPIDOf(d, spec.GetId())}
			for _, p := range processesOf(spec.GetRunDir()) {
				if f := strings.Fields(p); len(f) > 1 && strings.HasSuffix(f[1], "qemu-system-x86_64") {
					pids["qemu"], _ = strconv.Atoi(f[0])
				}
			}
			want := map[string]string{
				"Uid": "65534\t65534\t65534\t65534", "Gid": "65534\t65534\t65534\t65534", "Groups": "",
				"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
				"CapAmb": "0000000000000000", "CapBnd": fmt.Sprintf("%016x", c.bnd), "NoNewPrivs": "1",
			}
			for _, what := range []string{"libvirtd", "qemu"} {
				if pids[what] == 0 {
					t.Fatalf("no %s found: %s", what, strings.Join(processesOf(spec.GetRunDir()), "; "))
				}
				st := procStatus(t, pids[what])
				for k, w := range want {
					if st[k] != w {
						t.Errorf("%s (pid %d): %s %q, want %q", what, pids[what], k, st[k], w)
					}
				}
			}
		})
	}
}

// procStatus is /proc/PID/status by field.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	st := map[string]string{}
	for _, l := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			st[k] = strings.TrimSpace(v)
		}
	}
	return st
}

// TestDaemonDiesUnderLauncher: under a launcher in a pid namespace of its own, as a launcher
// pod's, the daemon's pid file numbers QEMU in that namespace: the driver still reports QEMU's
// pid in its own, and when the daemon dies it kills that QEMU, which nothing could manage.
func TestDaemonDiesUnderLauncher(t *testing.T) {
	requireLibvirt(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := startLauncher(ctx, t, "lv-ddies", "unshare", "--pid", "--fork", "--mount-proc", "--")
	d := newTestDriver(t)
	spec := bootSpec(t, "lv-ddies", reachableDir(t))
	spec.Sandbox = &domainv1.Sandbox{LauncherSocket: l.sock}
	t.Cleanup(func() { killProcessesOf(spec.GetRunDir()) })
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx, spec.GetId()); err != nil {
		t.Fatal(err)
	}
	st, _ := d.Status(ctx, spec.GetId())
	qemuPID := int(st.GetPid())
	if !isQEMUOf(qemuPID, vmOf(d, spec.GetId()).dmn) || parentPID(qemuPID) != l.pid {
		t.Fatalf("Status says QEMU is pid %d, which is not the VM's QEMU, the launcher's child; processes: %s",
			qemuPID, strings.Join(processesOf(spec.GetRunDir()), "; "))
	}
	if err := unix.Kill(daemonPIDOf(d, spec.GetId()), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the VM crashed", time.Minute, func() bool {
		st, _ := d.Status(ctx, spec.GetId())
		return st.GetState() == hypervisorv1.State_STATE_CRASHED
	})
	waitFor(t, "its QEMU gone", 10*time.Second, func() bool { return !processAlive(qemuPID) })
	if st, _ := d.Status(ctx, spec.GetId()); !strings.Contains(st.GetMessage(), "was killed") {
		t.Errorf("message %q, want it to say QEMU was killed", st.GetMessage())
	}
}
