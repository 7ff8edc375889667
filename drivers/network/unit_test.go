package network

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

func TestPlanInterfaces(t *testing.T) {
	plans, err := planInterfaces([]*networkv1.Interface{
		iface("a", BindingBridge, "ns/net-a"),
		iface("default", BindingMasquerade, ""),
		iface("b", BindingBridge, "net-b"),
		{Name: "c", Binding: BindingBridge, NetworkName: "net-c", Mac: "02:AA:BB:CC:DD:EE"},
	}, "eth0")
	if err != nil {
		t.Fatalf("planInterfaces: %v", err)
	}
	var got []string
	for _, p := range plans {
		got = append(got, p.podIface+" "+p.bridge+" "+p.tap+" "+p.mac)
	}
	want := []string{"net1 k6t-net1 tapnet1 ", "eth0 k6t-eth0 tapeth0 ", "net2 k6t-net2 tapnet2 ", "net3 k6t-net3 tapnet3 02:aa:bb:cc:dd:ee"}
	if !slices.Equal(got, want) {
		t.Errorf("plans %q, want %q", got, want)
	}
	long, err := planInterfaces([]*networkv1.Interface{iface("default", BindingBridge, "")}, "podinterface0")
	if err != nil {
		t.Fatalf("%v", err)
	}
	if b, tap := long[0].bridge, long[0].tap; len(b) > maxLinkName || len(tap) > maxLinkName || !strings.HasPrefix(b, "k6t-") || !strings.HasPrefix(tap, "tap") {
		t.Errorf("names for a long pod interface: %q, %q", b, tap)
	}
}

func TestDerivedMAC(t *testing.T) {
	a := derivedMAC("vmi-1", "default", "guest")
	if a[0]&1 != 0 || a[0]&2 == 0 {
		t.Errorf("%s is not a locally administered unicast MAC", a)
	}
	if b := derivedMAC("vmi-1", "default", "guest"); b.String() != a.String() {
		t.Errorf("not stable: %s then %s", a, b)
	}
	seen := map[string]bool{a.String(): true}
	for _, m := range []net.HardwareAddr{derivedMAC("vmi-2", "default", "guest"), derivedMAC("vmi-1", "other", "guest"), derivedMAC("vmi-1", "default", "pod")} {
		if seen[m.String()] {
			t.Errorf("%s derived twice", m)
		}
		seen[m.String()] = true
	}
}

func TestLabelList(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{nil, ""},
		{[]string{"bridge", "host-local"}, "bridge.host-local"},
		{[]string{"weird name!", "_x_"}, "weird-name.x"},
		{[]string{strings.Repeat("a", 40), strings.Repeat("b", 30), "c"}, strings.Repeat("a", 40)},
	} {
		if got := labelList(tc.in); got != tc.want {
			t.Errorf("labelList(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestResolvConf(t *testing.T) {
	dns, search := parseResolvConf([]byte("# comment\nnameserver 10.96.0.10\nnameserver fd00::10\nnameserver 1.1.1.1 ; x\nsearch ns.svc.cluster.local svc.cluster.local\noptions ndots:5\n"))
	if !slices.Equal(dns, []string{"10.96.0.10", "1.1.1.1"}) || !slices.Equal(search, []string{"ns.svc.cluster.local", "svc.cluster.local"}) {
		t.Errorf("parseResolvConf: %v %v", dns, search)
	}
	for in, want := range map[string]string{
		"/proc/42/ns/net":        "/proc/42/root/etc/resolv.conf",
		"/run/netns/cni-1234":    "/etc/netns/cni-1234/resolv.conf",
		"/var/run/netns/pod":     "/etc/netns/pod/resolv.conf",
		"/var/lib/somewhere/net": "",
	} {
		if got := resolvConfPath(in); got != want {
			t.Errorf("resolvConfPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLeaseReply(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	info := &podInfo{
		MTU: 1450, Addrs: []string{"10.1.2.3/32"}, DNS: []string{"10.96.0.10"}, Search: []string{"svc.cluster.local"},
		// Calico: a /32 address, the gateway on the link.
		Routes: []routeInfo{{Gw: "169.254.1.1"}, {Dst: "169.254.1.1/32", Scope: 253}},
	}
	l, err := bridgeLease(mac, info, netip.MustParseAddr("169.254.75.10"))
	if err != nil {
		t.Fatalf("bridgeLease: %v", err)
	}
	discover, _ := dhcpv4.NewDiscovery(mac)
	offer, err := l.reply(discover)
	if err != nil || offer == nil {
		t.Fatalf("reply to DISCOVER: %v, %v", offer, err)
	}
	if offer.MessageType() != dhcpv4.MessageTypeOffer || offer.YourIPAddr.String() != "10.1.2.3" || offer.ServerIdentifier().String() != "169.254.75.10" {
		t.Errorf("OFFER: %s", offer.Summary())
	}
	if ones, _ := offer.SubnetMask().Size(); ones != 32 {
		t.Errorf("mask /%d, want /32", ones)
	}
	routes := offer.ClasslessStaticRoute()
	var rs []string
	for _, r := range routes {
		rs = append(rs, r.Dest.String()+" via "+r.Router.String())
	}
	if !slices.Equal(rs, []string{"0.0.0.0/0 via 169.254.1.1", "169.254.1.1/32 via 0.0.0.0"}) {
		t.Errorf("classless routes %v: want the default route and an on-link route to the gateway", rs)
	}
	request, _ := dhcpv4.NewRequestFromOffer(offer)
	if ack, _ := l.reply(request); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || ack.IPAddressLeaseTime(0) != time.Duration(^uint32(0))*time.Second {
		t.Errorf("reply to REQUEST: %v", ack)
	}
	other, _ := dhcpv4.NewRequestFromOffer(offer, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 1, 2, 4))))
	if nak, _ := l.reply(other); nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Errorf("reply to REQUEST of another address: %v, want NAK", nak)
	}
	elsewhere, _ := dhcpv4.NewRequestFromOffer(offer, dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 0, 0, 1))))
	if r, _ := l.reply(elsewhere); r != nil {
		t.Errorf("reply to a REQUEST for another server: %v, want none", r)
	}
	stranger, _ := dhcpv4.NewDiscovery(net.HardwareAddr{0x02, 0, 0, 0, 0, 2})
	if r, _ := l.reply(stranger); r != nil {
		t.Errorf("reply to another client: %v, want none", r)
	}
	release, _ := dhcpv4.New(dhcpv4.WithHwAddr(mac), dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease))
	if r, _ := l.reply(release); r != nil {
		t.Errorf("reply to RELEASE: %v, want none", r)
	}

	// An in-subnet gateway and no other route: the router option only.
	plain, _ := bridgeLease(mac, &podInfo{MTU: 1500, Addrs: []string{"10.88.0.5/24"}, Routes: []routeInfo{{Gw: "10.88.0.1"}}}, netip.MustParseAddr("169.254.75.10"))
	if plain.Router.String() != "10.88.0.1" || len(plain.Routes) != 0 {
		t.Errorf("lease %+v: want router 10.88.0.1 without classless routes", plain)
	}
	// No address: no lease.
	if none, err := bridgeLease(mac, &podInfo{MTU: 1500}, netip.MustParseAddr("169.254.75.10")); none != nil || err != nil {
		t.Errorf("lease without an address: %v, %v", none, err)
	}
}

func TestConfigure(t *testing.T) {
	d := New(nil)
	ctx := context.Background()
	for _, tc := range []struct {
		config string
		code   codes.Code
	}{
		{"", codes.OK},
		{`{}`, codes.OK},
		{`{"cniConfDir": "/etc/cni/net.d", "cniBinDir": ["/opt/cni/bin"], "cniCacheDir": "/var/lib/cni", "podInterface": "eth1", "tapOwner": 107, "tapGroup": 107}`, codes.OK},
		{`{"cniConfDirs": "/x"}`, codes.InvalidArgument},
		{`{"cniBinDir": ["relative"]}`, codes.InvalidArgument},
		{`{"podInterface": "this-name-is-too-long"}`, codes.InvalidArgument},
		{`[`, codes.InvalidArgument},
	} {
		err := d.Configure(ctx, &basev1.ConfigureRequest{Config: []byte(tc.config)})
		if status.Code(err) != tc.code {
			t.Errorf("Configure(%s) = %v, want %s", tc.config, err, tc.code)
		}
	}
}

func TestFindNetworkList(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("10-a.conflist", `{"cniVersion":"1.0.0","name":"net-a","plugins":[{"type":"bridge"}]}`)
	write("20-b.conflist", `{"cniVersion":"1.0.0","name":"net-b","plugins":[{"type":"ptp"}]}`)
	write("25-c.conf", `{"cniVersion":"1.0.0","name":"net-c","type":"ptp"}`) // not a list: not read
	write("30-full.conflist", `{"cniVersion":"1.0.0","name":"tenant/net-a","plugins":[{"type":"ptp"}]}`)
	for network, want := range map[string]string{
		"net-a":        "10-a.conflist",
		"other/net-a":  "10-a.conflist",
		"tenant/net-a": "30-full.conflist", // the full name first
		"net-b":        "20-b.conflist",
	} {
		list, file, err := findNetworkList(dir, network)
		if err != nil || filepath.Base(file) != want || len(list.Plugins) != 1 {
			t.Errorf("findNetworkList(%q) = %v, %q, %v; want %s", network, list, file, err, want)
		}
	}
	if _, _, err := findNetworkList(dir, "net-c"); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a single network configuration (.conf): %v, want FailedPrecondition", err)
	}
	if _, _, err := findNetworkList(filepath.Join(dir, "missing"), "net-a"); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a missing directory: %v, want FailedPrecondition", err)
	}
}

func TestFingerprint(t *testing.T) {
	requireRoot(t)
	bin := cniBin(t)
	fp := fingerprint(Config{CNIBinDir: []string{bin, "/nonexistent"}}.withDefaults())
	if fp.GetHealth() != basev1.Health_HEALTH_HEALTHY {
		t.Fatalf("fingerprint: %v", fp)
	}
	if p := fp.GetAttributes()["cni-plugins"]; !strings.Contains(p, "bridge") || !strings.Contains(p, "host-local") {
		t.Errorf("cni-plugins attribute %q lacks the plugins of %s", p, bin)
	}
	t.Logf("fingerprint: %v", fp)
}

// TestLeaseReplyHostname: the guest's host name goes into OFFER and ACK (option 12), and a
// lease without one sends none.
func TestLeaseReplyHostname(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	l := masqueradeLease(mac, &podInfo{MTU: 1500})
	discover, _ := dhcpv4.NewDiscovery(mac)
	if offer, _ := l.reply(discover); offer == nil || offer.HostName() != "" {
		t.Errorf("OFFER without a host name: %v", offer)
	}
	l.Hostname = "db-0"
	offer, _ := l.reply(discover)
	if offer == nil || offer.HostName() != "db-0" {
		t.Fatalf("OFFER host name %q, want db-0", offer.HostName())
	}
	request, _ := dhcpv4.NewRequestFromOffer(offer)
	if ack, _ := l.reply(request); ack == nil || ack.HostName() != "db-0" {
		t.Errorf("ACK host name %v, want db-0", ack)
	}
}
