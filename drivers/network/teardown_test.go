package network

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// failPlugin is a CNI plugin that fails ADD with a message of its own and succeeds otherwise.
const failPlugin = `#!/bin/sh
case "$CNI_COMMAND" in
ADD) echo '{"cniVersion":"1.0.0","code":999,"msg":"kvfail: refusing on purpose","details":"injected failure"}'; exit 1 ;;
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}' ;;
esac
exit 0
`

// withFailPlugin adds a directory holding the plugin kvfail to the driver's plugin path.
func withFailPlugin(t *testing.T, n *node) {
	t.Helper()
	dir := tempDir(t)
	if err := os.WriteFile(filepath.Join(dir, "kvfail"), []byte(failPlugin), 0o755); err != nil {
		t.Fatalf("%v", err)
	}
	n.extraBin = append(n.extraBin, dir)
}

// snapshot is what a pod namespace holds, for before/after comparisons.
type snapshot struct {
	links, eth0, routes, tables []string
	forward                     string
}

func snap(t *testing.T, ns string) snapshot {
	t.Helper()
	tables, _ := nftRuleset(t, ns)
	return snapshot{
		links: withoutFakeGuests(links(t, ns)), eth0: addrs(t, ns, "eth0"), routes: routes(t, ns), tables: tables,
		forward: sysctl(t, ns, sysctlForward4),
	}
}

func (s snapshot) diff(o snapshot) string {
	var d []string
	for _, c := range []struct {
		what string
		a, b []string
	}{{"links", s.links, o.links}, {"eth0 addresses", s.eth0, o.eth0}, {"routes", s.routes, o.routes}, {"nftables tables", s.tables, o.tables}} {
		if !slices.Equal(c.a, c.b) {
			d = append(d, c.what+": "+strings.Join(c.a, ", ")+" -> "+strings.Join(c.b, ", "))
		}
	}
	if s.forward != o.forward {
		d = append(d, "ip_forward: "+s.forward+" -> "+o.forward)
	}
	return strings.Join(d, "; ")
}

// expectClean fails the test when the pod differs from before, or the driver keeps a DHCP
// server or state, or net-a keeps an allocation.
func expectClean(t *testing.T, n *node, d *Driver, ns string, before snapshot, stateDir string) {
	t.Helper()
	if diff := before.diff(snap(t, ns)); diff != "" {
		t.Errorf("the pod namespace changed: %s", diff)
	}
	if c := d.dhcp.count(); c != 0 {
		t.Errorf("%d DHCP servers run", c)
	}
	if got := ipamAllocations(t, n.secondaryIPAM()); got != 0 {
		t.Errorf("%d host-local allocations left", got)
	}
	if stateDir != "" {
		if files, _ := filepath.Glob(filepath.Join(stateDir, "vmis", "*")); len(files) != 0 {
			t.Errorf("state left: %v", files)
		}
	}
}

func TestTeardown(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	n := newNode(t)
	n.addSecondary(t, "net-a")
	both := func(binding string) []*networkv1.Interface {
		return []*networkv1.Interface{iface("default", binding, ""), iface("blue", BindingBridge, "net-a")}
	}

	t.Run("Twice", func(t *testing.T) {
		p := n.newPod(t)
		stateDir := tempDir(t)
		d := n.newDriver(t, stateDir)
		before := snap(t, p.ns)
		vmi := newVMIID()
		if _, err := d.Setup(ctx, setupReq(vmi, p.ns, both(BindingMasquerade)...)); err != nil {
			t.Fatalf("Setup: %v", err)
		}
		for i := range 2 {
			if err := d.Teardown(ctx, teardownReq(vmi, p.ns, both(BindingMasquerade)...)); err != nil {
				t.Fatalf("Teardown %d: %v", i+1, err)
			}
		}
		expectClean(t, n, d, p.ns, before, stateDir)
		_, err := d.Check(ctx, checkReq(vmi, p.ns, both(BindingMasquerade)...))
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("Check after Teardown: %v, want FailedPrecondition", err)
		}
	})

	t.Run("WithoutSetup", func(t *testing.T) {
		p := n.newPod(t)
		d := n.newDriver(t, "")
		before := snap(t, p.ns)
		for _, ns := range []string{p.ns, "", "/run/netns/kvtest-no-such-namespace"} {
			if err := d.Teardown(ctx, teardownReq(newVMIID(), ns, both(BindingBridge)...)); err != nil {
				t.Errorf("Teardown of a VMI never set up (netns %q): %v", ns, err)
			}
		}
		expectClean(t, n, d, p.ns, before, "")
	})

	t.Run("NamespaceGone", func(t *testing.T) {
		for _, binding := range Bindings {
			t.Run(binding, func(t *testing.T) {
				p := n.newPod(t)
				stateDir := tempDir(t)
				d := n.newDriver(t, stateDir)
				vmi := newVMIID()
				if _, err := d.Setup(ctx, setupReq(vmi, p.ns, both(binding)...)); err != nil {
					t.Fatalf("Setup: %v", err)
				}
				if err := netns.DeleteNamed(filepath.Base(p.ns)); err != nil {
					t.Fatalf("delete the pod namespace: %v", err)
				}
				if err := d.Teardown(ctx, teardownReq(vmi, p.ns, both(binding)...)); err != nil {
					t.Fatalf("Teardown with the namespace gone: %v", err)
				}
				if c := d.dhcp.count(); c != 0 {
					t.Errorf("%d DHCP servers run", c)
				}
				if got := ipamAllocations(t, n.secondaryIPAM()); got != 0 {
					t.Errorf("%d host-local allocations left (CNI DEL without a namespace must release them)", got)
				}
				if files, _ := filepath.Glob(filepath.Join(stateDir, "vmis", "*")); len(files) != 0 {
					t.Errorf("state left: %v", files)
				}
				if err := d.Teardown(ctx, teardownReq(vmi, p.ns, both(binding)...)); err != nil {
					t.Errorf("second Teardown: %v", err)
				}
			})
		}
	})

	t.Run("HalfMade/PluginFails", func(t *testing.T) {
		withFailPlugin(t, n)
		n.addSecondary(t, "net-bad", map[string]any{"type": "kvfail"})
		p := n.newPod(t)
		stateDir := tempDir(t)
		d := n.newDriver(t, stateDir)
		before := snap(t, p.ns)
		vmi := newVMIID()
		ifaces := []*networkv1.Interface{iface("default", BindingMasquerade, ""), iface("blue", BindingBridge, "net-a"), iface("bad", BindingBridge, "net-bad")}
		_, err := d.Setup(ctx, setupReq(vmi, p.ns, ifaces...))
		if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), `interface "bad"`) || !strings.Contains(err.Error(), "kvfail: refusing on purpose") {
			t.Fatalf("Setup with a failing plugin: %v; want Internal naming the interface and the plugin's message", err)
		}
		t.Logf("Setup: %v", err)
		expectClean(t, n, d, p.ns, before, stateDir)
		if _, err := d.Check(ctx, checkReq(vmi, p.ns, ifaces...)); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("Check after a failed Setup: %v, want FailedPrecondition", err)
		}
		if err := d.Teardown(ctx, teardownReq(vmi, p.ns, ifaces...)); err != nil {
			t.Errorf("Teardown after a failed Setup: %v", err)
		}
	})

	t.Run("HalfMade/ForeignLink", func(t *testing.T) {
		// A tap of the same name that someone else made stops Setup half-way: after the
		// bridge, before the pod interface moves. Setup undoes the bridge and leaves the
		// foreign tap alone.
		p := n.newPod(t)
		stateDir := tempDir(t)
		d := n.newDriver(t, stateDir)
		if err := nsDo(t, p.ns, func() error {
			return netlink.LinkAdd(&netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "tapeth0"}, Mode: netlink.TUNTAP_MODE_TAP})
		}); err != nil {
			t.Fatalf("make a foreign tap: %v", err)
		}
		before := snap(t, p.ns)
		vmi := newVMIID()
		_, err := d.Setup(ctx, setupReq(vmi, p.ns, both(BindingBridge)...))
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `interface "default"`) || !strings.Contains(err.Error(), "tapeth0") {
			t.Fatalf("Setup: %v; want FailedPrecondition naming the interface and tapeth0", err)
		}
		t.Logf("Setup: %v", err)
		expectClean(t, n, d, p.ns, before, stateDir)
		if link(t, p.ns, "tapeth0") == nil {
			t.Errorf("Setup removed the foreign tapeth0")
		}
	})

	t.Run("DriverRestart", func(t *testing.T) {
		// A new driver process (same state directory) finds the VMI: Check starts its DHCP
		// servers again, Setup answers the same, Teardown removes it all.
		p := n.newPod(t)
		stateDir := tempDir(t)
		before := snap(t, p.ns)
		vmi := newVMIID()
		req := setupReq(vmi, p.ns, both(BindingBridge)...)
		first := n.newDriver(t, stateDir)
		resp, err := first.Setup(ctx, req)
		if err != nil {
			t.Fatalf("Setup: %v", err)
		}
		_ = first.Close() // its DHCP servers die with the process
		second := n.newDriver(t, stateDir)
		if _, err := second.Check(ctx, checkReq(vmi, p.ns, req.Interfaces...)); err != nil {
			t.Fatalf("Check in a new driver: %v", err)
		}
		if c := second.dhcp.count(); c != 2 {
			t.Errorf("Check in a new driver runs %d DHCP servers, want 2", c)
		}
		g := attachGuest(t, p.ns, "k6t-eth0", resp.GetInterfaces()[0].GetMac(), clusterMTU)
		if ack, err := g.dhcp(t); err != nil || ack.YourIPAddr.String() != p.ip.Addr().String() {
			t.Errorf("DHCP after the restart: %v, %v", ack, err)
		}
		if again, err := second.Setup(ctx, req); err != nil || len(again.GetInterfaces()) != 2 || again.GetInterfaces()[0].GetMac() != resp.GetInterfaces()[0].GetMac() {
			t.Errorf("Setup in a new driver: %v, %v; want %v", again, err, resp)
		}
		if err := second.Teardown(ctx, teardownReq(vmi, p.ns, req.Interfaces...)); err != nil {
			t.Fatalf("Teardown in a new driver: %v", err)
		}
		expectClean(t, n, second, p.ns, before, stateDir)
	})

	t.Run("CheckFindsDamage", func(t *testing.T) {
		p := n.newPod(t)
		d := n.newDriver(t, "")
		vmi := newVMIID()
		req := setupReq(vmi, p.ns, iface("default", BindingMasquerade, ""))
		if _, err := d.Setup(ctx, req); err != nil {
			t.Fatalf("Setup: %v", err)
		}
		_ = nsDo(t, p.ns, func() error { return deleteNAT(nftables.TableFamilyIPv4, "eth0") })
		_, err := d.Check(ctx, checkReq(vmi, p.ns, req.Interfaces...))
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "kubevisor_eth0") {
			t.Errorf("Check without the NAT table: %v, want FailedPrecondition naming it", err)
		}
		// Setup repairs it.
		if _, err := d.Setup(ctx, req); err != nil {
			t.Fatalf("Setup again: %v", err)
		}
		if _, err := d.Check(ctx, checkReq(vmi, p.ns, req.Interfaces...)); err != nil {
			t.Errorf("Check after Setup repaired: %v", err)
		}
		_ = nsDo(t, p.ns, func() error { return deleteOwned("tapeth0", owner(vmi)) })
		if _, err := d.Check(ctx, checkReq(vmi, p.ns, req.Interfaces...)); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "tapeth0") {
			t.Errorf("Check without the tap: %v, want FailedPrecondition naming it", err)
		}
		if err := d.Teardown(ctx, teardownReq(vmi, p.ns, req.Interfaces...)); err != nil {
			t.Fatalf("Teardown: %v", err)
		}
	})
}
