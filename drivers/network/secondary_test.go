package network

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"

	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

func TestSecondaryNetwork(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	n := newNode(t)
	n.addSecondary(t, "net-a")
	p := n.newPod(t)
	d := n.newDriver(t, "")
	vmi := newVMIID()
	before := links(t, p.ns)
	ifaces := []*iface_{
		{"default", BindingMasquerade, ""},
		{"blue", BindingBridge, "tenant/net-a"},
	}
	req := setupReq(vmi, p.ns, reqIfaces(ifaces)...)
	resp, err := d.Setup(ctx, req)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	blue := resp.GetInterfaces()[1]
	if blue.GetPodInterface() != "net1" || blue.GetTapName() != "tapnet1" || len(blue.GetIpAddresses()) != 1 {
		t.Fatalf("secondary interface result %v: want net1, tapnet1 and one address", blue)
	}
	addr := netip.MustParsePrefix(blue.GetIpAddresses()[0])
	if !netip.MustParsePrefix(secSubnet).Contains(addr.Addr()) {
		t.Errorf("secondary address %s is not in %s", addr, secSubnet)
	}
	if got := ipamAllocations(t, n.secondaryIPAM()); got != 1 {
		t.Errorf("%d host-local allocations of net-a, want 1", got)
	}
	net1 := link(t, p.ns, "net1")
	br := link(t, p.ns, "k6t-net1")
	if net1 == nil || br == nil || net1.Attrs().MasterIndex != br.Attrs().Index {
		t.Fatalf("net1 is not a port of k6t-net1: %v", links(t, p.ns))
	}
	if _, err := d.Check(ctx, checkReq(vmi, p.ns, req.Interfaces...)); err != nil {
		t.Fatalf("Check: %v", err)
	}

	// The guest gets net1's address on its second interface (no gateway on net-a).
	g := attachGuest(t, p.ns, "k6t-net1", blue.GetMac(), 1500)
	ack, err := g.dhcp(t)
	if err != nil {
		t.Fatalf("DHCP on the secondary network: %v", err)
	}
	ones, _ := ack.SubnetMask().Size()
	if ack.YourIPAddr.String() != addr.Addr().String() || ones != addr.Bits() || len(ack.Router()) != 0 {
		t.Errorf("secondary lease %s/%d router %v; want %s without router", ack.YourIPAddr, ones, ack.Router(), addr)
	}
	if ack.ServerIdentifier().String() != "169.254.75.11" {
		t.Errorf("server identifier %s, want 169.254.75.11 (second interface)", ack.ServerIdentifier())
	}
	if ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Errorf("answer %s", ack.MessageType())
	}

	if err := d.Teardown(ctx, teardownReq(vmi, p.ns, req.Interfaces...)); err != nil {
		t.Fatalf("Teardown: %v", err)
	}
	if got := withoutFakeGuests(links(t, p.ns)); !slices.Equal(got, before) {
		t.Errorf("links after Teardown %v, want %v", got, before)
	}
	if got := ipamAllocations(t, n.secondaryIPAM()); got != 0 {
		t.Errorf("%d host-local allocations of net-a after Teardown, want 0", got)
	}
	if files := cacheFiles(t, n.driverConfig().CNICacheDir); len(files) != 0 {
		t.Errorf("libcni cache after Teardown: %v", files)
	}
}

// iface_ is an interface of a test request.
type iface_ struct{ name, binding, network string }

func reqIfaces(ifs []*iface_) []*networkv1.Interface {
	var out []*networkv1.Interface
	for _, i := range ifs {
		out = append(out, iface(i.name, i.binding, i.network))
	}
	return out
}

func withoutFakeGuests(ls []string) []string {
	return slices.DeleteFunc(ls, func(s string) bool { return len(s) > 3 && s[:3] == "kvg" })
}

// cacheFiles lists the files of libcni's cache directory.
func cacheFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	_ = filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			out = append(out, path)
		}
		return nil
	})
	return out
}
