package libvirt

import (
	"io"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/internal/kittest"
)

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
		// A socket per migration: a check may migrate one VM twice (a cancelled migration,
		// then another).
		p := filepath.Join(runDir, "relay-"+ch+"-"+id[:min(len(id), 8)]+".sock")
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
// reaches the target's through the relay's socket, not the target's socket_path, and the
// source's QEMU copies the emptyDisk into the target's storage daemon through the relay's
// disks socket.
func TestMigrationConformancePlugins(t *testing.T) {
	requireLibvirt(t)
	relay := &socketRelay{}
	r := kittest.RunVM(t, kittest.Options{Hypervisor: "libvirt", Run: "Migrate", Relay: relay.relay})
	t.Logf("kubevisor-conformance vm --run Migrate (through a relay):\n%s", r.Stdout)
	kittest.ExpectPassed(t, r, "Migrate/KeepsGuestState", "Migrate/Progress", "Migrate/Cancel", "Migrate/LocalDisks", "Migrate/LocalDisksCancel")
	t.Logf("the relay carried %d connections, %d bytes to the targets, %d back", relay.conns.Load(), relay.toTarget.Load(), relay.toSource.Load())
	if relay.conns.Load() == 0 || relay.toTarget.Load() == 0 {
		t.Errorf("nothing went through the relay: the migrations did not use target_socket_path")
	}
}

// TestMigrationLocalDisksDiskBoot runs the kit's Migrate/LocalDisks check as
// TestMigrationConformancePlugins does, with the guest booting from its containerDisk under the
// BIOS: the VM then has the containerDisk's overlay as well as the emptyDisk, and the check
// copies the overlay's top image only (libvirt's shallow block copy: the target's fresh overlay
// is over the same base) and the emptyDisk whole, and reads a marker from each back on the
// target.
func TestMigrationLocalDisksDiskBoot(t *testing.T) {
	requireLibvirt(t)
	relay := &socketRelay{}
	r := kittest.RunVM(t, kittest.Options{Hypervisor: "libvirt", Boot: "disk", Run: "Migrate/LocalDisks$", Relay: relay.relay})
	t.Logf("kubevisor-conformance vm --boot disk --run Migrate/LocalDisks:\n%s", r.Stdout)
	kittest.ExpectPassed(t, r, "Migrate/LocalDisks")
	kittest.ExpectTopImageCopied(t, r)
}
