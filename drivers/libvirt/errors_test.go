package libvirt

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

// leftovers lists what of a VM with run dir runDir is left on the node: processes whose
// command line or environment names the run dir (its libvirtd, its QEMU, a stand-in), and
// sockets below it.
func leftovers(t *testing.T, runDir string) []string {
	t.Helper()
	var left []string
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid := p.Name()
		if pid[0] < '0' || pid[0] > '9' || pid == itoa(os.Getpid()) {
			continue
		}
		for _, f := range []string{"cmdline", "environ"} {
			raw, err := os.ReadFile(filepath.Join("/proc", pid, f))
			n, _ := strconv.Atoi(pid)
			if err == nil && strings.Contains(string(raw), runDir+"/") && processAlive(n) {
				cmd, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
				left = append(left, "process "+pid+": "+strings.ReplaceAll(string(cmd), "\x00", " "))
				break
			}
		}
	}
	_ = filepath.WalkDir(runDir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type()&fs.ModeSocket != 0 {
			left = append(left, "socket "+p)
		}
		return nil
	})
	return left
}

// TestStartRefusedNamesField: specs that pass domain.Validate and BuildDomain but that libvirt
// or QEMU refuse at Start fail it with the domain spec's field path, libvirt's message and the
// contract's code; the failed Start leaves nothing running (the daemon it started is stopped),
// no domain defined, no socket, and the VM as it was (startable again, deletable). Another VM of
// the driver runs on throughout.
func TestStartRefusedNamesField(t *testing.T) {
	requireLibvirt(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	d := newTestDriver(t)
	if _, err := d.Create(ctx, bootSpec(t, "lv-ok", reachableDir(t))); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx, "lv-ok"); err != nil {
		t.Fatal(err)
	}
	ok, _ := d.Status(ctx, "lv-ok")

	for _, tc := range []struct {
		id       string
		edit     func(s *domainv1.DomainSpec, dir string)
		wantCode codes.Code
		want     []string
	}{
		{
			id:       "lv-cpu",
			edit:     func(s *domainv1.DomainSpec, _ string) { s.Cpu = &domainv1.CPU{Model: "NoSuchCPU"} },
			wantCode: codes.InvalidArgument,
			want:     []string{"cpu.model: libvirt: ", "Unknown CPU model NoSuchCPU"},
		},
		{
			id:       "lv-machine",
			edit:     func(s *domainv1.DomainSpec, _ string) { s.Machine = &domainv1.Machine{Type: "pc-q35-99.0"} },
			wantCode: codes.InvalidArgument,
			want:     []string{"machine.type: libvirt: ", "does not support machine type 'pc-q35-99.0'"},
		},
		{
			// QEMU's refusal, at its start: a raw image given as qcow2.
			id: "lv-format",
			edit: func(s *domainv1.DomainSpec, dir string) {
				img := filepath.Join(dir, "data.img")
				if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
					t.Fatal(err)
				}
				s.Disks = append(s.Disks, &domainv1.Disk{Name: "data", Path: img, Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2})
			},
			wantCode: codes.InvalidArgument,
			want:     []string{`disks[1].format: disk "data": libvirt: `, "Image is not in qcow2 format"},
		},
	} {
		t.Run(tc.id, func(t *testing.T) {
			dir := reachableDir(t)
			spec := bootSpec(t, tc.id, dir)
			tc.edit(spec, dir)
			if err := domain.Validate(spec); err != nil {
				t.Fatalf("the spec does not pass domain.Validate: %v", err)
			}
			if _, err := d.Create(ctx, spec); err != nil {
				t.Fatalf("Create: %v (the refusal is libvirt's, at Start)", err)
			}
			for try := 1; try <= 2; try++ {
				err := d.Start(ctx, tc.id)
				t.Logf("Start #%d: %v", try, err)
				if status.Code(err) != tc.wantCode {
					t.Fatalf("Start #%d = %v, want %s", try, err, tc.wantCode)
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("Start #%d: %q does not say %q", try, err, w)
					}
				}
				st, _ := d.Status(ctx, tc.id)
				if st.GetState() != hypervisorv1.State_STATE_CREATED || st.GetBoots() != 0 || st.GetPid() != 0 {
					t.Errorf("after the failed Start: %v, want CREATED, 0 boots", st)
				}
				d.mu.Lock()
				v := d.vms[tc.id]
				d.mu.Unlock()
				v.mu.Lock()
				conn, pid := v.conn, v.rec.DaemonPID
				v.mu.Unlock()
				if conn != nil || pid != 0 {
					t.Errorf("after the failed Start the driver still holds a daemon (pid %d)", pid)
				}
				if left := leftovers(t, spec.GetRunDir()); len(left) > 0 {
					t.Errorf("after the failed Start: %s", strings.Join(left, "; "))
				}
				// A transient domain is never defined; none was made persistent either.
				if _, err := os.Stat(filepath.Join(v.dmn.dir, "libvirt", "qemu", DomainName+".xml")); !os.IsNotExist(err) {
					t.Errorf("a domain definition is left: %v", err)
				}
			}
			if err := d.Delete(ctx, tc.id); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{filepath.Join(spec.GetRunDir(), daemonDir), filepath.Join(spec.GetRunDir(), daemonLog)} {
				if _, err := os.Stat(p); !os.IsNotExist(err) {
					t.Errorf("%s is left after Delete: %v", p, err)
				}
			}
		})
	}
	if st, _ := d.Status(ctx, "lv-ok"); st.GetState() != hypervisorv1.State_STATE_RUNNING || st.GetPid() != ok.GetPid() || !processAlive(int(ok.GetPid())) {
		t.Fatalf("the other VM after the refusals: %v (pid before %d)", st, ok.GetPid())
	}
	if err := d.Pause(ctx, "lv-ok"); err != nil {
		t.Fatalf("the other VM's daemon: %v", err)
	}
}

// fakeLibvirtd writes a libvirtd for the driver's Config.Libvirtd that runs the real one,
// unless the VM's run dir (in XDG_CONFIG_HOME) names one of the failures: a configuration
// libvirtd cannot read, a runtime (socket) directory it cannot write, an exit at once, a daemon
// that never serves. It is in a directory the VM's user can reach.
func fakeLibvirtd(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kv-libvirtd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := `#!/bin/sh
case "$XDG_CONFIG_HOME" in
*/bad-config/*) echo 'this is = = not a config' > "$XDG_CONFIG_HOME/libvirt/libvirtd.conf" ;;
*/bad-socket/*) chmod 0500 "$XDG_RUNTIME_DIR" ;;
*/exits/*) echo "stand-in libvirtd: exiting at once" >&2; exit 3 ;;
*/hangs/*) exec sleep 600 ;;
esac
exec /usr/sbin/libvirtd "$@"
`
	p := filepath.Join(dir, "libvirtd")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDaemonStartFails: a VM's libvirtd that cannot start (its binary missing, a configuration
// it cannot read, a socket directory it cannot write, an exit at once, no answer in time) fails
// Start with an error naming libvirtd and its log's last lines, leaves no process and no socket,
// and the VM startable and deletable; another VM of the driver runs on, its daemon answering.
func TestDaemonStartFails(t *testing.T) {
	requireLibvirt(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	defer func(old time.Duration) { daemonTimeout = old }(daemonTimeout)
	daemonTimeout = 5 * time.Second
	fake := fakeLibvirtd(t)
	d := New(WithLogger(testLogger()))
	if err := d.Configure(ctx, &basev1.ConfigureRequest{StateDir: t.TempDir(), Config: []byte(`{"libvirtd": "` + fake + `"}`)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killAll(d) })
	missing := New(WithLogger(testLogger()))
	if err := missing.Configure(ctx, &basev1.ConfigureRequest{StateDir: t.TempDir(), Config: []byte(`{"libvirtd": "/nonexistent/sbin/libvirtd"}`)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killAll(missing) })

	base := reachableDir(t)
	// Each VM's files in base/<id>, which the stand-in reads from its run dir.
	spec := func(id string) *domainv1.DomainSpec {
		dir := filepath.Join(base, id)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return bootSpec(t, id, dir)
	}
	if _, err := d.Create(ctx, spec("ok")); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	ok, _ := d.Status(ctx, "ok")

	for _, tc := range []struct {
		id   string
		drv  *Driver
		want []string
	}{
		{"missing", missing, []string{"libvirtd (/nonexistent/sbin/libvirtd) exited", "its log ends: setpriv: failed to execute /nonexistent/sbin/libvirtd: No such file or directory"}},
		{"bad-config", d, []string{"libvirtd (" + fake + ") exited", "its log ends: ", "Can't load config file", "libvirtd.conf"}},
		{"bad-socket", d, []string{"libvirtd (" + fake + ") exited", "its log ends: ", "Cannot create user runtime directory", "Permission denied"}},
		{"exits", d, []string{"libvirtd (" + fake + ") exited", "its log ends: stand-in libvirtd: exiting at once"}},
		{"hangs", d, []string{"libvirtd (" + fake + ") did not serve the VM within 5s", "and was killed", "its log ends: (empty)"}},
	} {
		t.Run(tc.id, func(t *testing.T) {
			s := spec(tc.id)
			if _, err := tc.drv.Create(ctx, s); err != nil {
				t.Fatal(err)
			}
			err := tc.drv.Start(ctx, tc.id)
			t.Logf("Start: %v", err)
			if status.Code(err) != codes.Internal {
				t.Fatalf("Start = %v, want Internal (the VM's helper failed)", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
			if st, _ := tc.drv.Status(ctx, tc.id); st.GetState() != hypervisorv1.State_STATE_CREATED {
				t.Errorf("state after the failed Start: %v", st.GetState())
			}
			if left := leftovers(t, s.GetRunDir()); len(left) > 0 {
				t.Errorf("after the failed Start: %s", strings.Join(left, "; "))
			}
			if _, err := os.Stat(filepath.Join(s.GetRunDir(), daemonDir, "r")); !os.IsNotExist(err) {
				t.Errorf("the daemon's runtime directory is left: %v", err)
			}
			if err := tc.drv.Delete(ctx, tc.id); err != nil {
				t.Fatal(err)
			}
			if entries, _ := os.ReadDir(s.GetRunDir()); len(entries) > 0 {
				t.Errorf("the run dir holds %v after Delete", entries)
			}
		})
	}
	if st, _ := d.Status(ctx, "ok"); st.GetState() != hypervisorv1.State_STATE_RUNNING || st.GetPid() != ok.GetPid() || !processAlive(int(ok.GetPid())) {
		t.Fatalf("the other VM after the failures: %v (pid before %d)", st, ok.GetPid())
	}
	out := &consoleBuf{}
	go func() { _ = d.Console(ctx, "ok", nil, out) }()
	if err := d.Reboot(ctx, "ok"); err != nil {
		t.Fatalf("the other VM's daemon: %v", err)
	}
	waitFor(t, "the other VM's marker after its reset", time.Minute, func() bool { return out.count(qmp.BootSectorMarker) >= 1 })
}

// TestQEMUSaid: of QEMU's log at a failed start, the error gets what QEMU said at the last
// start, not libvirt's command line nor what libvirt's message already holds.
func TestQEMUSaid(t *testing.T) {
	log := `2026-12-06 03:35:20.100+0000: starting up libvirt version: 9.0.0, qemu version: 7.2.22
LC_ALL=C \
/usr/bin/qemu-system-x86_64 \
-name guest=vm,debug-threads=on \
-msg timestamp=on
2026-12-06T03:35:20.150768Z qemu-system-x86_64: an older start's words
2026-12-06 03:35:26.504+0000: starting up libvirt version: 9.0.0, qemu version: 7.2.22
LC_ALL=C \
/usr/bin/qemu-system-x86_64 \
-blockdev '{"node-name":"libvirt-1-format","read-only":false,"driver":"qcow2","file":"libvirt-1-storage","backing":null}' \
-msg timestamp=on
2026-12-06T03:35:26.650768Z qemu-system-x86_64: -blockdev {"node-name":"libvirt-1-format","read-only":false,"driver":"qcow2","file":"libvirt-1-storage","backing":null}: Image is not in qcow2 format
2026-12-06T03:35:26.650800Z qemu-system-x86_64: a line libvirt did not quote
2026-12-06 03:35:28.467+0000: shutting down, reason=failed
`
	p := filepath.Join(t.TempDir(), "vm.log")
	if err := os.WriteFile(p, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	msg := `internal error: qemu unexpectedly closed the monitor: 2026-12-06T03:35:26.650768Z qemu-system-x86_64: -blockdev {"node-name":"libvirt-1-format","read-only":false,"driver":"qcow2","file":"libvirt-1-storage","backing":null}: Image is not in qcow2 format`
	if got, want := qemuSaid(p, msg), "2026-12-06T03:35:26.650800Z qemu-system-x86_64: a line libvirt did not quote"; got != want {
		t.Errorf("qemuSaid = %q, want %q", got, want)
	}
	if got := qemuSaid(p+".none", msg); got != "" {
		t.Errorf("qemuSaid of no log = %q", got)
	}
}
