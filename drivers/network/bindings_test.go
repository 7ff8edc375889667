package network

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
	"google.golang.org/protobuf/proto"

	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// checkLease checks the options every lease carries: address, MTU, DNS and search domain
// from the pod's resolv.conf, an infinite lease time.
func checkLease(t *testing.T, ack *dhcpv4.DHCPv4, wantIP netip.Prefix, wantRouter string) {
	t.Helper()
	if ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("DHCP answer is a %s, want ACK", ack.MessageType())
	}
	ones, _ := ack.SubnetMask().Size()
	if got := fmt.Sprintf("%s/%d", ack.YourIPAddr, ones); got != wantIP.String() {
		t.Errorf("lease address %s, want %s", got, wantIP)
	}
	if r := ack.Router(); len(r) != 1 || r[0].String() != wantRouter {
		t.Errorf("lease router %v, want %s", r, wantRouter)
	}
	if mtu := ack.Options.Get(dhcpv4.OptionInterfaceMTU); len(mtu) != 2 || binary.BigEndian.Uint16(mtu) != clusterMTU {
		t.Errorf("lease MTU option (26) %v, want %d", mtu, clusterMTU)
	}
	if dns := ack.DNS(); len(dns) != 1 || dns[0].String() != clusterDNS {
		t.Errorf("lease DNS %v, want %s (the pod's resolv.conf)", dns, clusterDNS)
	}
	if s := ack.DomainSearch(); s == nil || !slices.Equal(s.Labels, []string{clusterSearch}) {
		t.Errorf("lease search domains %v, want %s", s, clusterSearch)
	}
	if lt := ack.IPAddressLeaseTime(0); lt != time.Duration(^uint32(0))*time.Second {
		t.Errorf("lease time %s, want infinite", lt)
	}
}

func TestBridgeBinding(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	n := newNode(t)
	p := n.newPod(t)
	d := n.newDriver(t, "")
	vmi := newVMIID()
	before := struct{ links, addrs, routes []string }{links(t, p.ns), addrs(t, p.ns, "eth0"), routes(t, p.ns)}
	req := setupReq(vmi, p.ns, iface("default", BindingBridge, ""))

	resp, err := d.Setup(ctx, req)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	want := &networkv1.InterfaceResult{
		Name: "default", TapName: "tapeth0", Mac: p.mac, IpAddresses: []string{p.ip.String()}, Mtu: clusterMTU, PodInterface: "eth0",
	}
	if len(resp.GetInterfaces()) != 1 || !proto.Equal(resp.GetInterfaces()[0], want) {
		t.Fatalf("Setup = %v, want %v (the guest gets the pod's address and MAC)", resp.GetInterfaces(), want)
	}
	t.Logf("links after Setup: %v", links(t, p.ns))

	// The namespace: eth0 and the tap in k6t-eth0, eth0 without its address and with a MAC
	// of its own, the bridge with the DHCP server's address.
	br := link(t, p.ns, "k6t-eth0")
	if br == nil || br.Type() != "bridge" || br.Attrs().Alias != owner(vmi) || br.Attrs().MTU != clusterMTU {
		t.Fatalf("bridge k6t-eth0: %+v", br)
	}
	tap := link(t, p.ns, "tapeth0")
	if tap == nil || tap.Type() != "tuntap" || tap.Attrs().MasterIndex != br.Attrs().Index || tap.Attrs().MTU != clusterMTU {
		t.Fatalf("tap tapeth0 is not a tap in k6t-eth0 with MTU %d: %+v", clusterMTU, tap)
	}
	if tt := tap.(*netlink.Tuntap); tt.Flags&netlink.TUNTAP_VNET_HDR == 0 || tt.Flags&netlink.TUNTAP_NO_PI == 0 {
		t.Errorf("tap flags %#x lack vnet_hdr or no_pi", tt.Flags)
	}
	eth0 := link(t, p.ns, "eth0")
	if eth0.Attrs().MasterIndex != br.Attrs().Index {
		t.Errorf("eth0 is not a port of k6t-eth0")
	}
	if got := eth0.Attrs().HardwareAddr.String(); got == p.mac || got != derivedMAC(vmi, "default", "pod").String() {
		t.Errorf("eth0 MAC %s; want the derived %s (the guest has %s)", got, derivedMAC(vmi, "default", "pod"), p.mac)
	}
	if got := addrs(t, p.ns, "eth0"); len(got) != 0 {
		t.Errorf("eth0 keeps addresses %v; the guest owns them", got)
	}
	if got := addrs(t, p.ns, "k6t-eth0"); !slices.Equal(got, []string{"169.254.75.10/32"}) {
		t.Errorf("k6t-eth0 addresses %v, want [169.254.75.10/32]", got)
	}
	if tables, _ := nftRuleset(t, p.ns); len(tables) != 0 {
		t.Errorf("the bridge binding made nftables tables %v", tables)
	}

	// Idempotent, and Check agrees.
	again, err := d.Setup(ctx, req)
	if err != nil || !proto.Equal(again, resp) {
		t.Fatalf("second Setup = %v, %v; want %v", again, err, resp)
	}
	if _, err := d.Check(ctx, checkReq(vmi, p.ns, req.Interfaces...)); err != nil {
		t.Fatalf("Check: %v", err)
	}

	// The guest's DHCP: the pod's address, gateway, MTU, DNS.
	g := attachGuest(t, p.ns, "k6t-eth0", p.mac, clusterMTU)
	ack, err := g.dhcp(t)
	if err != nil {
		t.Fatalf("DHCP from the guest: %v", err)
	}
	checkLease(t, ack, p.ip, clusterGW)
	if ack.ServerIdentifier().String() != "169.254.75.10" {
		t.Errorf("server identifier %s, want 169.254.75.10", ack.ServerIdentifier())
	}
	// Another client on the bridge (the pod network is one broadcast domain) gets nothing.
	other := attachGuest(t, p.ns, "k6t-eth0", "02:00:00:00:00:42", clusterMTU)
	if ack, err := other.dhcpWithin(t, time.Second, 1); err == nil {
		t.Errorf("a client with another MAC got a lease: %v", ack.Summary())
	}

	// The guest is the pod on the network: the node reaches it by the pod's address.
	g.configure(t, ack)
	serveHTTP(t, g.ns)
	if err := ping(n.ns, p.ip.Addr(), 5*time.Second); err != nil {
		t.Errorf("ping the guest at the pod address from the node: %v", err)
	}
	body, err := httpGet(n.ns, "http://"+p.ip.Addr().String()+"/")
	if err != nil || !strings.Contains(body, "kubevisor-guest ok") {
		t.Errorf("HTTP to the guest at the pod address from the node: %q, %v", body, err)
	}
	// and the guest reaches the node through the pod's gateway.
	l := listen(t, n.ns, clusterGW+":0")
	c, err := dialFrom(ctx, g.ns, l.Addr().String())
	if err != nil {
		t.Fatalf("guest to node: %v", err)
	}
	c.Close()

	// Teardown gives eth0 back as it was.
	if err := d.Teardown(ctx, teardownReq(vmi, p.ns, req.Interfaces...)); err != nil {
		t.Fatalf("Teardown: %v", err)
	}
	guestSide := func(ls []string) []string {
		return slices.DeleteFunc(ls, func(s string) bool { return strings.HasPrefix(s, "kvg") })
	}
	if got := guestSide(links(t, p.ns)); !slices.Equal(got, before.links) {
		t.Errorf("links after Teardown %v, want %v", got, before.links)
	}
	if got := addrs(t, p.ns, "eth0"); !slices.Equal(got, before.addrs) {
		t.Errorf("eth0 addresses after Teardown %v, want %v", got, before.addrs)
	}
	if got := routes(t, p.ns); !slices.Equal(got, before.routes) {
		t.Errorf("routes after Teardown %v, want %v", got, before.routes)
	}
	if got := link(t, p.ns, "eth0").Attrs().HardwareAddr.String(); got != p.mac {
		t.Errorf("eth0 MAC after Teardown %s, want %s", got, p.mac)
	}
	if n := d.dhcp.count(); n != 0 {
		t.Errorf("%d DHCP servers run after Teardown", n)
	}
}

func TestMasqueradeBinding(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	n := newNode(t)
	for _, tc := range []struct {
		name  string
		ports []*networkv1.Port
		// reachable and unreachable are pod ports the node tries.
		reachable, unreachable []int
	}{
		{name: "DeclaredPorts", ports: []*networkv1.Port{{Name: "http", Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 53}}, reachable: []int{80}, unreachable: []int{8080}},
		{name: "AllPorts", reachable: []int{80, 8080}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := n.newPod(t)
			d := n.newDriver(t, "")
			vmi := newVMIID()
			beforeLinks, beforeAddrs := links(t, p.ns), addrs(t, p.ns, "eth0")
			// A new namespace takes ip_forward from the host's (net.core.devconf_inherit_init_net
			// = 0, the default): 1 on a host that forwards.
			beforeForward := sysctl(t, p.ns, sysctlForward4)
			req := setupReq(vmi, p.ns, iface("default", BindingMasquerade, "", tc.ports...))
			resp, err := d.Setup(ctx, req)
			if err != nil {
				t.Fatalf("Setup: %v", err)
			}
			want := &networkv1.InterfaceResult{
				Name: "default", TapName: "tapeth0", Mac: derivedMAC(vmi, "default", "guest").String(),
				IpAddresses: []string{"10.0.2.2/24"}, Mtu: clusterMTU, PodInterface: "eth0",
				ReachableAddresses: []string{p.ip.String()},
			}
			if !proto.Equal(resp.GetInterfaces()[0], want) {
				t.Fatalf("Setup = %v, want %v", resp.GetInterfaces()[0], want)
			}
			if got := addrs(t, p.ns, "eth0"); !slices.Equal(got, beforeAddrs) {
				t.Errorf("eth0 addresses %v, want them kept: %v", got, beforeAddrs)
			}
			if got := addrs(t, p.ns, "k6t-eth0"); !slices.Equal(got, []string{"10.0.2.1/24"}) {
				t.Errorf("k6t-eth0 addresses %v, want [10.0.2.1/24]", got)
			}
			if v := sysctl(t, p.ns, sysctlForward4); v != "1" {
				t.Errorf("ip_forward in the pod is %q, want 1", v)
			}
			tables, rules := nftRuleset(t, p.ns)
			wantRules := 2*max(1, len(tc.ports)) + 1
			if !slices.Equal(tables, []string{"ip kubevisor_eth0"}) || rules != wantRules {
				t.Errorf("nftables tables %v with %d rules, want [ip kubevisor_eth0] with %d", tables, rules, wantRules)
			}
			if _, err := d.Check(ctx, checkReq(vmi, p.ns, req.Interfaces...)); err != nil {
				t.Fatalf("Check: %v", err)
			}
			if again, err := d.Setup(ctx, req); err != nil || !proto.Equal(again, resp) {
				t.Fatalf("second Setup = %v, %v; want %v", again, err, resp)
			}

			g := attachGuest(t, p.ns, "k6t-eth0", want.Mac, clusterMTU)
			ack, err := g.dhcp(t)
			if err != nil {
				t.Fatalf("DHCP from the guest: %v", err)
			}
			checkLease(t, ack, netip.MustParsePrefix("10.0.2.2/24"), "10.0.2.1")
			g.configure(t, ack)

			// Inbound: the declared ports (every port when none) reach the guest.
			for _, port := range []int{80, 8080} {
				if slices.Contains(tc.reachable, port) || slices.Contains(tc.unreachable, port) {
					if port != 80 {
						l := listen(t, g.ns, fmt.Sprintf(":%d", port))
						go func() {
							if c, err := l.Accept(); err == nil {
								fmt.Fprintf(c, "guest %d\n", port)
								c.Close()
							}
						}()
					} else {
						serveHTTP(t, g.ns)
					}
				}
			}
			for _, port := range tc.reachable {
				c, err := dialFrom(ctx, n.ns, fmt.Sprintf("%s:%d", p.ip.Addr(), port))
				if err != nil {
					t.Errorf("node to pod port %d: %v; want the guest to answer", port, err)
					continue
				}
				fmt.Fprintf(c, "GET / HTTP/1.0\r\n\r\n")
				line, err := readLine(c)
				c.Close()
				if err != nil || (!strings.Contains(line, "200 OK") && !strings.Contains(line, "guest")) {
					t.Errorf("node to pod port %d: read %q, %v", port, line, err)
				}
			}
			for _, port := range tc.unreachable {
				if c, err := dialFrom(ctx, n.ns, fmt.Sprintf("%s:%d", p.ip.Addr(), port)); err == nil {
					c.Close()
					t.Errorf("node to pod port %d: connected; only the declared ports go to the guest", port)
				}
			}
			// From inside the pod, to the pod address (the output chain).
			if body, err := httpGet(p.ns, "http://"+p.ip.Addr().String()+"/"); err != nil || !strings.Contains(body, "kubevisor-guest ok") {
				t.Errorf("HTTP from the pod to its own address: %q, %v", body, err)
			}
			// Outbound: the node sees the guest as the pod.
			l := listen(t, n.ns, clusterGW+":0")
			got := make(chan string, 1)
			go func() {
				if c, err := l.Accept(); err == nil {
					got <- c.RemoteAddr().(*net.TCPAddr).IP.String()
					c.Close()
				}
			}()
			c, err := dialFrom(ctx, g.ns, l.Addr().String())
			if err != nil {
				t.Fatalf("guest to node: %v", err)
			}
			c.Close()
			if src := <-got; src != p.ip.Addr().String() {
				t.Errorf("the node sees the guest's connection from %s, want the pod address %s", src, p.ip.Addr())
			}
			if err := ping(g.ns, netip.MustParseAddr(clusterGW), 5*time.Second); err != nil {
				t.Errorf("guest pings the node: %v", err)
			}

			if err := d.Teardown(ctx, teardownReq(vmi, p.ns, req.Interfaces...)); err != nil {
				t.Fatalf("Teardown: %v", err)
			}
			if got := slices.DeleteFunc(links(t, p.ns), func(s string) bool { return strings.HasPrefix(s, "kvg") }); !slices.Equal(got, beforeLinks) {
				t.Errorf("links after Teardown %v, want %v", got, beforeLinks)
			}
			if tables, rules := nftRuleset(t, p.ns); len(tables) != 0 || rules != 0 {
				t.Errorf("nftables after Teardown: %v, %d rules", tables, rules)
			}
			if v := sysctl(t, p.ns, sysctlForward4); v != beforeForward {
				t.Errorf("ip_forward after Teardown is %q, want %q (as it was)", v, beforeForward)
			}
			if n := d.dhcp.count(); n != 0 {
				t.Errorf("%d DHCP servers run after Teardown", n)
			}
		})
	}
}

// TestMasqueradeIPv6: on a dual-stack pod, the masquerade binding adds fd10:0:2::1/120 to its
// bridge and NAT66 (table ip6 kubevisor_eth0), and configures the guest's IPv6 as
// virt-launcher does: router advertisements (M flag, default route, on-link fd10:0:2::/120)
// and DHCPv6 (fd10:0:2::2, the pod's IPv6 name servers). The guest takes what they give.
func TestMasqueradeIPv6(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	n := newDualStackNode(t)
	p := n.newPod(t)
	if !p.ip6.IsValid() {
		t.Fatalf("the dual-stack pod has no IPv6 address")
	}
	// An IPv6 name server too, for DHCPv6 to hand out.
	const dns6 = "fd00:88::53"
	resolv := filepath.Join(etcNetNS, p.name, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+clusterDNS+"\nnameserver "+dns6+"\nsearch "+clusterSearch+"\n"), 0o644); err != nil {
		t.Fatalf("%v", err)
	}
	d := n.newDriver(t, "")
	vmi := newVMIID()
	req := setupReq(vmi, p.ns, iface("default", BindingMasquerade, "", &networkv1.Port{Protocol: "TCP", Port: 80}))
	resp, err := d.Setup(ctx, req)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	// DHCPv4, and for IPv6 the DHCPv6 server and the RA sender.
	if c := d.dhcp.count(); c != 1+serversPerIPv6 {
		t.Errorf("%d servers after a dual-stack Setup, want %d", c, 1+serversPerIPv6)
	}
	if socks := ipv6ServerSockets(t, p.ns); len(socks) != 2 {
		t.Errorf("IPv6 configuration sockets in the pod namespace %v, want DHCPv6 and ICMPv6", socks)
	}
	if got := resp.GetInterfaces()[0].GetIpAddresses(); !slices.Equal(got, []string{"10.0.2.2/24", "fd10:0:2::2/120"}) {
		t.Errorf("guest addresses %v, want [10.0.2.2/24 fd10:0:2::2/120]", got)
	}
	// Behind NAT the guest is reached at the pod's addresses.
	reach := resp.GetInterfaces()[0].GetReachableAddresses()
	if len(reach) != 2 || netip.MustParsePrefix(reach[0]) != p.ip || netip.MustParsePrefix(reach[1]) != p.ip6 {
		t.Errorf("reachable addresses %v, want the pod's %s and %s", reach, p.ip, p.ip6)
	}
	tables, _ := nftRuleset(t, p.ns)
	if !slices.Equal(tables, []string{"ip kubevisor_eth0", "ip6 kubevisor_eth0"}) {
		t.Errorf("nftables tables %v", tables)
	}
	if v := sysctl(t, p.ns, sysctlForward6); v != "1" {
		t.Errorf("IPv6 forwarding %q, want 1", v)
	}
	if v := sysctl(t, p.ns, sysctlAcceptRA("eth0")); v != "2" {
		t.Errorf("accept_ra of eth0 %q, want 2", v)
	}
	if _, err := d.Check(ctx, checkReq(vmi, p.ns, req.Interfaces...)); err != nil {
		t.Fatalf("Check: %v", err)
	}

	g := attachGuest(t, p.ns, "k6t-eth0", resp.GetInterfaces()[0].GetMac(), clusterMTU)
	g.waitLinkLocal(t)
	ra, router, err := g.routerAdvertisement(t, 15*time.Second)
	if err != nil {
		t.Fatalf("router advertisement: %v", err)
	}
	if !router.IsLinkLocalUnicast() {
		t.Errorf("router advertisement from %s, want a link-local address", router)
	}
	if !ra.ManagedConfiguration || ra.RouterLifetime <= 0 {
		t.Errorf("router advertisement: managed %v, router lifetime %s; want managed, a lifetime", ra.ManagedConfiguration, ra.RouterLifetime)
	}
	var prefixes []string
	var mtu uint32
	for _, o := range ra.Options {
		switch o := o.(type) {
		case *ndp.PrefixInformation:
			prefixes = append(prefixes, fmt.Sprintf("%s/%d on-link=%v autonomous=%v", o.Prefix, o.PrefixLength, o.OnLink, o.AutonomousAddressConfiguration))
		case *ndp.MTU:
			mtu = o.MTU
		}
	}
	if want := []string{"fd10:0:2::/120 on-link=true autonomous=false"}; !slices.Equal(prefixes, want) {
		t.Errorf("router advertisement prefixes %v, want %v", prefixes, want)
	}
	if mtu != clusterMTU {
		t.Errorf("router advertisement MTU %d, want %d", mtu, clusterMTU)
	}
	reply, err := g.dhcp6(t)
	if err != nil {
		t.Fatalf("DHCPv6: %v", err)
	}
	ia := reply.Options.OneIANA()
	if reply.Type() != dhcpv6.MessageTypeReply || ia == nil || ia.Options.OneAddress() == nil {
		t.Fatalf("DHCPv6 answer %s, want a REPLY with an address", reply.Summary())
	}
	addr, _ := netip.AddrFromSlice(ia.Options.OneAddress().IPv6Addr)
	if addr.String() != "fd10:0:2::2" {
		t.Errorf("DHCPv6 address %s, want fd10:0:2::2", addr)
	}
	if dns := reply.Options.DNS(); len(dns) != 1 || dns[0].String() != dns6 {
		t.Errorf("DHCPv6 DNS %v, want %s (the pod's resolv.conf)", dns, dns6)
	}
	g.configure6(t, addr, router)
	serveHTTP(t, g.ns)
	url := "http://[" + p.ip6.Addr().String() + "]/"
	var body string
	deadline := time.Now().Add(10 * time.Second)
	for {
		body, err = httpGet(n.ns, url)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil || !strings.Contains(body, "kubevisor-guest ok") {
		t.Errorf("HTTP from the node to %s: %q, %v", url, body, err)
	}
	l := listen(t, n.ns, "["+clusterGW6+"]:0")
	got := make(chan string, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			got <- c.RemoteAddr().(*net.TCPAddr).IP.String()
			c.Close()
		}
	}()
	c, err := dialFrom(ctx, g.ns, l.Addr().String())
	if err != nil {
		t.Fatalf("guest to node over IPv6: %v", err)
	}
	c.Close()
	if src := <-got; src != p.ip6.Addr().String() {
		t.Errorf("the node sees the guest's IPv6 connection from %s, want the pod's %s", src, p.ip6.Addr())
	}
	if err := d.Teardown(ctx, teardownReq(vmi, p.ns, req.Interfaces...)); err != nil {
		t.Fatalf("Teardown: %v", err)
	}
	if tables, _ := nftRuleset(t, p.ns); len(tables) != 0 {
		t.Errorf("nftables after Teardown: %v", tables)
	}
	if v := sysctl(t, p.ns, sysctlForward6); v != "0" {
		t.Errorf("IPv6 forwarding after Teardown %q, want 0", v)
	}
	if c := d.dhcp.count(); c != 0 {
		t.Errorf("%d servers after Teardown", c)
	}
	if socks := ipv6ServerSockets(t, p.ns); len(socks) != 0 {
		t.Errorf("sockets left in the pod namespace after Teardown: %v", socks)
	}
}
