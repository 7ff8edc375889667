package migrationproxy

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/core/handler/internal/testpki"
	"github.com/kubevisor/kubevisor/internal/kittest"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// TestQMPMigrationThroughTheProxy runs the conformance kit's Migrate checks against the real
// qmp plugin binaries (two kubevisor-driver-qmp processes, each under a plugin host of its own with its own state
// directory, every VM under a kubevisor-launcher of its own, the test guest booting under TCG),
// with every migration carried by a pair of proxies, as between two nodes: the source driver's
// QEMU connects to node-a's socket in the source VM's run directory, node-a carries it over
// mutual TLS to node-b's port, node-b to the target QEMU's incoming socket; LocalDisks's
// migration has its disks channel as well (the source QEMU's mirrors to node-a's second socket,
// over TLS named for that channel, to the target QEMU's NBD socket). The guest keeps its state,
// a limited migration reports its progress, a cancelled one leaves the guest running at the
// source, the markers the guest wrote on its emptyDisk are on the target's; both proxies count
// the same bytes each way, and no socket of theirs is left.
func TestQMPMigrationThroughTheProxy(t *testing.T) {
	testenv.Command(t, "qemu-system-x86_64", "qemu-system-x86")
	ca := testpki.NewCA(t, "kubevisor-ca")
	src := startNode(t, sourceNode, testpki.CertDir(t, ca, node(sourceNode), ca))
	tgt := startNode(t, targetNode, testpki.CertDir(t, ca, node(targetNode), ca))
	type relayed struct {
		name    string // the check's migration: its VM id
		in, out *Migration
	}
	var (
		mu      sync.Mutex
		relays  []relayed
		leftErr []string
	)
	relay := func(ct conformance.T, id, runDir string, targets map[string]string) map[string]string {
		in, err := tgt.p.Incoming(IncomingSpec{ID: id, SourceNode: sourceNode, TargetSocket: targets[conformance.ChannelMemory], DisksTargetSocket: targets[conformance.ChannelDisks]})
		if err != nil {
			ct.Fatalf("Incoming on %s: %v", targetNode, err)
		}
		spec := OutgoingSpec{ID: id, TargetNode: targetNode, TargetAddr: tgt.addr, Socket: filepath.Join(runDir, SocketName)}
		if targets[conformance.ChannelDisks] != "" {
			spec.DisksSocket = filepath.Join(runDir, DisksSocketName)
		}
		out, err := src.p.Outgoing(spec)
		if err != nil {
			in.Close()
			ct.Fatalf("Outgoing on %s: %v", sourceNode, err)
		}
		ct.Cleanup(func() {
			out.Close()
			in.Close()
			for _, p := range []string{out.SocketPath(), out.DisksSocketPath()} {
				if _, err := os.Lstat(p); p != "" && !errors.Is(err, fs.ErrNotExist) {
					mu.Lock()
					leftErr = append(leftErr, p)
					mu.Unlock()
				}
			}
		})
		mu.Lock()
		relays = append(relays, relayed{id, in, out})
		mu.Unlock()
		paths := map[string]string{conformance.ChannelMemory: out.SocketPath()}
		if p := out.DisksSocketPath(); p != "" {
			paths[conformance.ChannelDisks] = p
		}
		return paths
	}

	r := kittest.RunVM(t, kittest.Options{Hypervisor: "qmp", Run: "Migrate", Relay: relay})
	t.Logf("kubevisor-conformance vm --run Migrate, through the proxies:\n%s", r.Stdout)
	kittest.ExpectPassed(t, r, "Migrate/KeepsGuestState", "Migrate/Progress", "Migrate/Cancel", "Migrate/LocalDisks", "Migrate/LocalDisksCancel")

	mu.Lock()
	defer mu.Unlock()
	if len(relays) != 6 {
		t.Fatalf("%d migrations went through the proxies, want 6 (one per check, two of LocalDisksCancel)", len(relays))
	}
	whole := 0     // migrations that carried the guest's memory: those of the checks that complete
	withDisks := 0 // migrations that carried disks (LocalDisks: its emptyDisk, whose zeroes cross as NBD write-zeroes, and the guest's markers)
	for _, r := range relays {
		s, d := r.out.Stats(), r.in.Stats()
		t.Logf("migration %s: source side %+v, target side %+v", r.name, s, d)
		if r.out.DisksSocketPath() != "" {
			withDisks++
			sd, dd := s.Channels[ChannelDisks], d.Channels[ChannelDisks]
			if sd.Carried == 0 || sd.ToTarget == 0 || sd.ToSource == 0 || dd.ToTarget != sd.ToTarget {
				t.Errorf("migration %s: the disks channel carried %d connections, %d bytes to the target (target side %d), the memory channel %d bytes: want the NBD stream both ways on the disks channel",
					r.name, sd.Carried, sd.ToTarget, dd.ToTarget, s.Channels[ChannelMemory].ToTarget)
			}
		}
		if s.Carried == 0 || s.ToTarget == 0 || s.Refused != 0 || d.Refused != 0 {
			t.Errorf("migration %s: the source side carried %d connections, %d bytes to the target, refused %d (target side %d): want bytes carried, none refused", r.name, s.Carried, s.ToTarget, s.Refused, d.Refused)
		}
		// The test guest has about 107 MiB of memory that is not zero (docs/driver-authoring.md).
		// A completed migration also carried the target's answers back (QEMU's return path); a
		// cancelled one may end before the target's first answer reaches the source side.
		if s.ToTarget >= 64<<20 {
			whole++
			if s.ToSource == 0 {
				t.Errorf("migration %s: completed with no byte back from the target (the return path)", r.name)
			}
		}
		// What one side read reached the other unless that one's VM closed first (a cancelled
		// migration's target stops reading): never more.
		if d.ToTarget > s.ToTarget || s.ToSource > d.ToSource || s.Carried != d.Carried || s.Active != 0 || d.Active != 0 {
			t.Errorf("migration %s: the two sides disagree or still carry: source %+v, target %+v", r.name, s, d)
		}
	}
	if whole != 4 {
		t.Errorf("%d migrations carried at least 64 MiB, want 4 (KeepsGuestState, Progress, LocalDisks and LocalDisksCancel's second; Cancel's is cancelled early, LocalDisksCancel's first in its disk phase)", whole)
	}
	if withDisks != 3 {
		t.Errorf("%d migrations had a disks channel, want 3 (LocalDisks, LocalDisksCancel's two)", withDisks)
	}
	if len(leftErr) > 0 {
		t.Errorf("sockets left after the checks: %s", leftErr)
	}
	for _, n := range []*testNode{src, tgt} {
		if strings.Contains(n.log.String(), "refused") {
			t.Errorf("%s logged a refusal:\n%s", n.name, n.log.String())
		}
	}
}
