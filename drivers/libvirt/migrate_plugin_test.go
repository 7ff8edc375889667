package libvirt

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/conformance/driver/cli"
	"github.com/kubevisor/kubevisor/internal/testbin"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// guestDir is the project's test guest (make guest), or KUBEVISOR_GUEST_DIR.
func guestDir() string {
	if d := os.Getenv("KUBEVISOR_GUEST_DIR"); d != "" {
		return d
	}
	abs, _ := filepath.Abs(filepath.Join("..", "..", "_output", "guest"))
	return abs
}

// runMigrateKit runs the conformance VM kit's checks matching run against the real plugin
// binaries (kubevisor-driver-libvirt, kubevisor-driver-local, kubevisor-launcher), the test
// guest booting its kernel, with relay (may be nil) between every migration's source and
// target; it returns the exit code, stdout and stderr.
func runMigrateKit(t *testing.T, run string, relay conformance.MigrationRelay) (int, string, string) {
	t.Helper()
	requireLibvirt(t)
	dir := guestDir()
	if _, err := conformance.GuestFromDir(dir); err != nil {
		testenv.Missing(t, "test guest not built: run make guest (%v)", err)
	}
	bin := t.TempDir()
	if err := testbin.Build(bin, false,
		"github.com/kubevisor/kubevisor/cmd/kubevisor-driver-libvirt",
		"github.com/kubevisor/kubevisor/cmd/kubevisor-driver-local",
		"github.com/kubevisor/kubevisor/cmd/kubevisor-launcher"); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := cli.RunVM(cli.VMConfig{
		Hypervisor: filepath.Join(bin, "kubevisor-driver-libvirt"),
		Storage:    filepath.Join(bin, "kubevisor-driver-local"),
		Launcher:   filepath.Join(bin, "kubevisor-launcher"),
		GuestDir:   dir,
		Boot:       "kernel",
		DiskBus:    "virtio", CDROMBus: "scsi",
		Run:             run,
		StateDir:        filepath.Join(t.TempDir(), "state"),
		Timeout:         conformance.DefaultVMTimeout,
		BootTimeout:     conformance.DefaultBootTimeout,
		ShutdownTimeout: conformance.DefaultGuestShutdownTimeout,
		LogLevel:        "warn",
		MigrationRelay:  relay,
	}, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// socketRelay is a MigrationRelay that carries each connection to a socket of the source's
// run dir on to the target's socket, byte for byte, as the node agents' proxies do in a
// cluster: the source's target_socket_path is then not the target's socket_path. It counts the
// connections and bytes it carried.
type socketRelay struct {
	conns, toTarget, toSource atomic.Int64
}

func (r *socketRelay) relay(t conformance.T, id, runDir string, targets map[string]string) map[string]string {
	paths := map[string]string{}
	for ch, target := range targets {
		p := filepath.Join(runDir, "relay-"+ch+".sock")
		l, err := net.Listen("unix", p)
		if err != nil {
			t.Fatalf("relay %s: %v", ch, err)
		}
		var wg sync.WaitGroup
		t.Cleanup(func() {
			_ = l.Close()
			wg.Wait()
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				src, err := l.Accept()
				if err != nil {
					return
				}
				dst, err := net.Dial("unix", target)
				if err != nil {
					_ = src.Close()
					continue
				}
				r.conns.Add(1)
				wg.Add(2)
				pipe := func(to, from net.Conn, n *atomic.Int64) {
					defer wg.Done()
					c, _ := io.Copy(to, from)
					n.Add(c)
					if uc, ok := to.(*net.UnixConn); ok {
						_ = uc.CloseWrite()
					}
				}
				go pipe(dst, src, &r.toTarget)
				go pipe(src, dst, &r.toSource)
			}
		}()
		paths[ch] = p
	}
	return paths
}

// TestMigrationConformancePlugins runs the kit's Migrate checks against the real plugin
// binaries, as `kubevisor-conformance vm --run Migrate` does: two kubevisor-driver-libvirt
// processes, each started by a plugin host of its own with its own state directory (two
// "nodes" on this host), every VM under a kubevisor-launcher of its own with a libvirtd of its
// own, the test guest booting its kernel under TCG and moving from one daemon to the other
// through a relay (socketRelay), as through the node agents' proxies: the source's daemon
// reaches the target's through the relay's socket, not the target's socket_path. The local-disk
// checks skip: the driver does not declare Capabilities.migration_disks.
func TestMigrationConformancePlugins(t *testing.T) {
	r := &socketRelay{}
	code, out, stderrOut := runMigrateKit(t, "Migrate", r.relay)
	t.Logf("kubevisor-conformance vm --run Migrate (through a relay):\n%s", out)
	if code != cli.ExitOK {
		t.Errorf("exit code %d, want %d; stderr:\n%s", code, cli.ExitOK, tailLines(stderrOut, 60))
	}
	for _, check := range []string{"Migrate/KeepsGuestState", "Migrate/Progress", "Migrate/Cancel"} {
		if !regexp.MustCompile(`--- PASS: vm/` + check + ` `).MatchString(out) {
			t.Errorf("check %s did not pass", check)
		}
	}
	for _, check := range []string{"Migrate/LocalDisks", "Migrate/LocalDisksCancel"} {
		if !regexp.MustCompile(`--- SKIP: vm/` + check + ` `).MatchString(out) {
			t.Errorf("check %s did not skip (the driver does not declare migration_disks)", check)
		}
	}
	if !strings.Contains(out, "3 passed, 0 failed, 2 skipped") {
		t.Errorf("the summary is not 3 passed, 0 failed, 2 skipped")
	}
	t.Logf("the relay carried %d connections, %d bytes to the targets, %d back", r.conns.Load(), r.toTarget.Load(), r.toSource.Load())
	if r.conns.Load() == 0 || r.toTarget.Load() == 0 {
		t.Errorf("nothing went through the relay: the migrations did not use target_socket_path")
	}
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
