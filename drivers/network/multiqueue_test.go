package network

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// openTapQueue opens the tap name as one queue, as QEMU opens a tap by ifname: IFF_MULTI_QUEUE
// when it wants more than one (the kernel refuses a tap whose queue mode differs).
func openTapQueue(name string, multiQueue bool) (*os.File, error) {
	f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		f.Close()
		return nil, err
	}
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if multiQueue {
		flags |= unix.IFF_MULTI_QUEUE
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(int(f.Fd()), unix.TUNSETIFF, ifr); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// TestMultiQueueTap: an interface with queues above 1 gets a multi-queue tap that a hypervisor
// opens once per queue (and not as a single queue); Check sees a tap whose queue mode is not
// the interface's; the same VMI asked again with another queue count is refused until it is
// torn down; a tap left with the other mode is refused, not reused.
func TestMultiQueueTap(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	n := newNode(t)
	p := n.newPod(t)
	d := n.newDriver(t, "")
	vmi := newVMIID()
	mq := iface("default", BindingMasquerade, "")
	mq.Queues = 4
	req := setupReq(vmi, p.ns, mq)
	if _, err := d.Setup(ctx, req); err != nil {
		t.Fatalf("Setup: %v", err)
	}
	tap := link(t, p.ns, "tapeth0")
	if tt, ok := tap.(*netlink.Tuntap); !ok || tt.Flags&netlink.TUNTAP_MULTI_QUEUE == 0 || tt.Flags&netlink.TUNTAP_VNET_HDR == 0 {
		t.Fatalf("tap tapeth0 is not a multi-queue tap with vnet headers: %+v", tap)
	}
	if err := nsDo(t, p.ns, func() error {
		var queues []*os.File
		defer func() {
			for _, f := range queues {
				f.Close()
			}
		}()
		for range 4 {
			f, err := openTapQueue("tapeth0", true)
			if err != nil {
				return err
			}
			queues = append(queues, f)
		}
		if f, err := openTapQueue("tapeth0", false); err == nil {
			f.Close()
			t.Errorf("the multi-queue tap opened as a single queue")
		}
		return nil
	}); err != nil {
		t.Fatalf("open the tap 4 times as QEMU does with queues=4: %v", err)
	}
	if _, err := d.Check(ctx, checkReq(vmi, p.ns, mq)); err != nil {
		t.Fatalf("Check: %v", err)
	}
	single := iface("default", BindingMasquerade, "")
	if _, err := d.Setup(ctx, setupReq(vmi, p.ns, single)); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Setup of the VMI with one queue after four = %v, want FailedPrecondition", err)
	}
	if _, err := d.Check(ctx, checkReq(vmi, p.ns, single)); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Check with one queue of a VMI set up with four = %v, want FailedPrecondition", err)
	}
	if err := d.Teardown(ctx, teardownReq(vmi, p.ns, mq)); err != nil {
		t.Fatalf("Teardown: %v", err)
	}

	// A single-queue tap: the default, which QEMU opens once without IFF_MULTI_QUEUE.
	vmi = newVMIID()
	if _, err := d.Setup(ctx, setupReq(vmi, p.ns, single)); err != nil {
		t.Fatalf("Setup with one queue: %v", err)
	}
	if tt := link(t, p.ns, "tapeth0").(*netlink.Tuntap); tt.Flags&netlink.TUNTAP_MULTI_QUEUE != 0 {
		t.Errorf("tap of a one-queue interface is multi-queue (flags %#x)", tt.Flags)
	}
	if err := nsDo(t, p.ns, func() error {
		f, err := openTapQueue("tapeth0", false)
		if err == nil {
			f.Close()
		}
		return err
	}); err != nil {
		t.Errorf("open the single-queue tap: %v", err)
	}
	// The tap ensureTap finds with the other mode is refused with what is wrong.
	if err := nsDo(t, p.ns, func() error {
		br, err := netlink.LinkByName("k6t-eth0")
		if err != nil {
			return err
		}
		_, err = ensureTap("tapeth0", owner(vmi), br, clusterMTU, 0, 0, true)
		return err
	}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "single-queue") {
		t.Errorf("ensureTap multi-queue over a single-queue tap = %v, want FailedPrecondition naming its mode", err)
	}
	if err := d.Teardown(ctx, teardownReq(vmi, p.ns, single)); err != nil {
		t.Fatalf("Teardown: %v", err)
	}

	// More queues than a tap has.
	mq.Queues = 257
	if _, err := d.Setup(ctx, setupReq(newVMIID(), p.ns, mq)); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `interface "default"`) {
		t.Errorf("Setup with 257 queues = %v, want InvalidArgument naming the interface", err)
	}
}
