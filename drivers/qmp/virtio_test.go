package qmp

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// Virtio PCI IDs (vendor:device) as the test guest's KUBEVISOR-PCI line lists them: a
// transitional device's ID is below 1af4:1040, a modern-only one's is 1af4:1040 plus its virtio
// device type.
var (
	virtioModern       = map[string]string{"net": "1af4:1041", "block": "1af4:1042", "entropy": "1af4:1044", "balloon": "1af4:1045"}
	virtioTransitional = map[string]string{"net": "1af4:1000", "block": "1af4:1001", "balloon": "1af4:1002", "entropy": "1af4:1005"}
)

// consoleLine is the rest of the last console line that starts with marker.
func consoleLine(console, marker string) string {
	line := ""
	for _, l := range strings.Split(console, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), marker); ok {
			line = strings.TrimSpace(rest)
		}
	}
	return line
}

// TestGuestVirtioAndNICQueues boots the test guest from its disk through SeaBIOS, with two
// vCPUs, a virtio disk, NIC, entropy device and balloon, the NIC with two queue pairs on a
// multi-queue tap (needs CAP_NET_ADMIN). Without virtio_transitional the guest finds every
// virtio device modern only (SeaBIOS boots from the modern-only virtio-blk disk); with it, every
// one transitional. Both times the guest's eth0 uses two queues.
func TestGuestVirtioAndNICQueues(t *testing.T) {
	t.Parallel()
	testenv.Root(t, "makes a multi-queue tap")
	testenv.Command(t, "ip", "iproute2")
	testenv.Command(t, "qemu-img", "qemu-utils")
	base := filepath.Join(guestDir(), "disk.qcow2")
	testenv.File(t, base, "guest")
	tap := "kvmq" + strconv.Itoa(os.Getpid()%100000)
	if out, err := exec.Command("ip", "tuntap", "add", "dev", tap, "mode", "tap", "multi_queue").CombinedOutput(); err != nil {
		t.Fatalf("ip tuntap add multi_queue: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", tap).Run() })
	if out, err := exec.Command("ip", "link", "set", tap, "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set up: %v: %s", err, out)
	}

	d := newTestDriver(t, t.TempDir())
	ctx := context.Background()
	for _, transitional := range []bool{false, true} {
		id := "virtio-modern"
		want, notWant := virtioModern, virtioTransitional
		if transitional {
			id, want, notWant = "virtio-transitional", virtioTransitional, virtioModern
		}
		overlay := filepath.Join(t.TempDir(), "disk.qcow2")
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, overlay).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img create: %v: %s", err, out)
		}
		spec := echoSpec(t, id, false, domainv1.DiskBus_DISK_BUS_VIRTIO)
		spec.Memory.GuestBytes = 256 << 20
		spec.Cpu = &domainv1.CPU{Sockets: 2, Cores: 1, Threads: 1}
		spec.Disks = []*domainv1.Disk{{Name: "root", Path: overlay, Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, Bus: domainv1.DiskBus_DISK_BUS_VIRTIO, BootOrder: 1}}
		spec.Nics = []*domainv1.NIC{{Name: "default", TapName: tap, Mac: "52:54:00:00:00:0c", Queues: 2}}
		spec.Rng, spec.Balloon = &domainv1.RNG{}, &domainv1.Balloon{}
		spec.VirtioTransitional = transitional
		if _, err := d.Create(ctx, spec); err != nil {
			t.Fatalf("%s: Create: %v", id, err)
		}
		if err := d.Start(ctx, spec.GetId()); err != nil {
			t.Fatalf("%s: Start: %v", id, err)
		}
		out, _, _ := attachConsole(t, d, spec.GetId())
		out.waitCount(t, GuestReadyMarker, 1, 180*time.Second)
		console := out.String()
		pci := " " + consoleLine(console, "KUBEVISOR-PCI:") + " "
		t.Logf("%s: KUBEVISOR-PCI:%s", id, pci)
		for what, w := range want {
			if !strings.Contains(pci, " "+w+" ") {
				t.Errorf("%s: the guest's PCI devices%s have no virtio %s %s", id, pci, what, w)
			}
		}
		for what, n := range notWant {
			if strings.Contains(pci, " "+n+" ") {
				t.Errorf("%s: the guest's PCI devices%s have the virtio %s %s", id, pci, what, n)
			}
		}
		nic := consoleLine(console, "KUBEVISOR-NIC:")
		if !strings.HasPrefix(nic, "eth0 ") || !strings.HasSuffix(nic, " queues=2") {
			t.Errorf("%s: the guest's NIC line is %q: want eth0 with 2 queues (2 vCPUs, queues 2)", id, nic)
		}
		if err := d.Kill(ctx, spec.GetId()); err != nil {
			t.Fatalf("%s: Kill: %v", id, err)
		}
	}
}
