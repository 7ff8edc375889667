package network

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// testDHCPOptions are the DHCP options of the tests: every kind, with values a client reads back.
func testDHCPOptions() *networkv1.DHCPOptions {
	return &networkv1.DHCPOptions{
		BootFileName: "pxelinux.0", TftpServerName: "tftp.example.org", NtpServers: []string{"192.0.2.1", "192.0.2.2"},
		PrivateOptions: []*networkv1.DHCPPrivateOption{{Code: 224, Value: "kubevisor"}, {Code: 254, Value: "last one"}},
	}
}

// checkDHCPOptions reports what of testDHCPOptions a reply lacks, read as a client reads them.
func checkDHCPOptions(t *testing.T, what string, m *dhcpv4.DHCPv4) {
	t.Helper()
	if got := m.BootFileNameOption(); got != "pxelinux.0" {
		t.Errorf("%s: boot file name (67) %q, want pxelinux.0", what, got)
	}
	if got := m.TFTPServerName(); got != "tftp.example.org" {
		t.Errorf("%s: TFTP server name (66) %q, want tftp.example.org", what, got)
	}
	var ntp []string
	for _, ip := range m.NTPServers() {
		ntp = append(ntp, ip.String())
	}
	if !slices.Equal(ntp, []string{"192.0.2.1", "192.0.2.2"}) {
		t.Errorf("%s: NTP servers (42) %v, want [192.0.2.1 192.0.2.2]", what, ntp)
	}
	for code, want := range map[uint8]string{224: "kubevisor", 254: "last one"} {
		if got := m.Options.Get(dhcpv4.GenericOptionCode(code)); string(got) != want {
			t.Errorf("%s: option %d is %q, want %q", what, code, got, want)
		}
	}
}

// noDHCPOptions reports any of the extra options in a reply.
func noDHCPOptions(t *testing.T, what string, m *dhcpv4.DHCPv4) {
	t.Helper()
	for _, code := range []uint8{42, 66, 67, 224, 254} {
		if m.Options.Has(dhcpv4.GenericOptionCode(code)) {
			t.Errorf("%s: has option %d (%q), want none", what, code, m.Options.Get(dhcpv4.GenericOptionCode(code)))
		}
	}
}

// TestLeaseReplyDHCPOptions: the interface's DHCP options go into OFFER and ACK, and the ACK of
// an INFORM, though the client does not ask for them (its parameter request list, option 55,
// is busybox udhcpc's default: no 66, 67 or 224-254); a NAK and a lease without them send none.
// The replies are read from their bytes, as a client gets them.
func TestLeaseReplyDHCPOptions(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	opts, err := parseDHCPOptions(testDHCPOptions())
	if err != nil {
		t.Fatal(err)
	}
	l := masqueradeLease(mac, &podInfo{MTU: 1500})
	l.Extra = opts
	udhcpc := dhcpv4.WithRequestedOptions(dhcpv4.OptionSubnetMask, dhcpv4.OptionRouter, dhcpv4.OptionDomainNameServer,
		dhcpv4.OptionHostName, dhcpv4.OptionDomainName, dhcpv4.OptionBroadcastAddress, dhcpv4.OptionNTPServers)
	// onTheWire is a reply as the client reads it: from its bytes.
	onTheWire := func(m *dhcpv4.DHCPv4, err error) *dhcpv4.DHCPv4 {
		t.Helper()
		if err != nil || m == nil {
			t.Fatalf("reply: %v, %v", m, err)
		}
		got, err := dhcpv4.FromBytes(m.ToBytes())
		if err != nil {
			t.Fatalf("parse the reply: %v", err)
		}
		return got
	}
	discover, _ := dhcpv4.NewDiscovery(mac, udhcpc)
	offer := onTheWire(l.reply(discover))
	checkDHCPOptions(t, "OFFER", offer)
	request, _ := dhcpv4.NewRequestFromOffer(offer, udhcpc)
	ack := onTheWire(l.reply(request))
	if ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("answer to REQUEST is a %s", ack.MessageType())
	}
	checkDHCPOptions(t, "ACK", ack)
	inform, _ := dhcpv4.New(dhcpv4.WithHwAddr(mac), dhcpv4.WithMessageType(dhcpv4.MessageTypeInform), dhcpv4.WithClientIP(net.IPv4(10, 0, 2, 2)))
	checkDHCPOptions(t, "ACK to INFORM", onTheWire(l.reply(inform)))

	wrong, _ := dhcpv4.NewRequestFromOffer(offer, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 2, 9))))
	nak := onTheWire(l.reply(wrong))
	if nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("answer to a REQUEST of another address is a %s", nak.MessageType())
	}
	noDHCPOptions(t, "NAK", nak)

	l.Extra = nil
	noDHCPOptions(t, "OFFER of a lease without options", onTheWire(l.reply(discover)))
	// Set but empty: no option either.
	l.Extra, _ = parseDHCPOptions(&networkv1.DHCPOptions{})
	noDHCPOptions(t, "OFFER of empty options", onTheWire(l.reply(discover)))
}

// TestParseDHCPOptions: what the contract's DHCPOptions refuses, each error naming the field.
func TestParseDHCPOptions(t *testing.T) {
	long := strings.Repeat("x", 256)
	many := make([]string, 64)
	for i := range many {
		many[i] = "192.0.2.1"
	}
	for _, tc := range []struct {
		name string
		opts *networkv1.DHCPOptions
		want string // "" accepted
	}{
		{"All", testDHCPOptions(), ""},
		{"255 bytes", &networkv1.DHCPOptions{BootFileName: long[:255], PrivateOptions: []*networkv1.DHCPPrivateOption{{Code: 230, Value: long[:255]}}}, ""},
		{"BootFileNameTooLong", &networkv1.DHCPOptions{BootFileName: long}, "bootFileName: 256 bytes"},
		{"TFTPServerNameTooLong", &networkv1.DHCPOptions{TftpServerName: long}, "tftpServerName: 256 bytes"},
		{"NTPServerName", &networkv1.DHCPOptions{NtpServers: []string{"192.0.2.1", "pool.ntp.org"}}, `ntpServers[1]: "pool.ntp.org" is not an IPv4 address`},
		{"NTPServerIPv6", &networkv1.DHCPOptions{NtpServers: []string{"2001:db8::1"}}, `ntpServers[0]: "2001:db8::1" is not an IPv4 address`},
		{"NTPServerMapped", &networkv1.DHCPOptions{NtpServers: []string{"::ffff:192.0.2.1"}}, `ntpServers[0]`},
		{"TooManyNTPServers", &networkv1.DHCPOptions{NtpServers: many}, "ntpServers: 64 addresses"},
		{"PrivateCodeLow", &networkv1.DHCPOptions{PrivateOptions: []*networkv1.DHCPPrivateOption{{Code: 223}}}, "privateOptions[0]: code 223 is not a site-specific option (224 to 254)"},
		{"PrivateCodeEnd", &networkv1.DHCPOptions{PrivateOptions: []*networkv1.DHCPPrivateOption{{Code: 224}, {Code: 255}}}, "privateOptions[1]: code 255"},
		{"PrivateCodeWraps", &networkv1.DHCPOptions{PrivateOptions: []*networkv1.DHCPPrivateOption{{Code: 256 + 224}}}, "code 480"},
		{"PrivateCodeTwice", &networkv1.DHCPOptions{PrivateOptions: []*networkv1.DHCPPrivateOption{{Code: 240}, {Code: 240}}}, "privateOptions[1]: code 240 is given twice"},
		{"PrivateValueTooLong", &networkv1.DHCPOptions{PrivateOptions: []*networkv1.DHCPPrivateOption{{Code: 240, Value: long}}}, "privateOptions[0]: value of 256 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseDHCPOptions(tc.opts)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
	// Through planInterfaces: InvalidArgument naming the interface and the field.
	bad := iface("default", BindingMasquerade, "")
	bad.DhcpOptions = &networkv1.DHCPOptions{NtpServers: []string{"192.0.2.1", "ntp"}}
	_, err := planInterfaces([]*networkv1.Interface{bad}, "eth0")
	if want := `interface "default": dhcpOptions.ntpServers[1]: "ntp" is not an IPv4 address`; status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), want) {
		t.Errorf("planInterfaces: %v; want InvalidArgument saying %q", err, want)
	}
}

// dhcpExchange runs a DHCP client (nclient4, whose parameter request list has none of the
// extra options) on the fake guest and returns its OFFER and ACK.
func (g *fakeGuest) dhcpExchange(t tb) (*nclient4.Lease, error) {
	t.Helper()
	var lease *nclient4.Lease
	err := nsDo(t, g.ns, func() error {
		c, err := nclient4.New(g.iface, nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(3))
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		lease, err = c.Request(ctx)
		return err
	})
	return lease, err
}

// TestDHCPOptionsReachGuest: with each binding a real DHCP client in a guest namespace on the
// interface's bridge gets the interface's DHCP options in OFFER and ACK; a Setup with other
// options changes what the server sends, and one without them stops them; Check after a
// restart of the driver (a new process: no servers) serves them again from the state.
func TestDHCPOptionsReachGuest(t *testing.T) {
	requireRoot(t)
	n := newNode(t)
	for _, binding := range Bindings {
		t.Run(binding, func(t *testing.T) {
			ctx := context.Background()
			p := n.newPod(t)
			stateDir := tempDir(t)
			d := n.newDriver(t, stateDir)
			vmi := newVMIID()
			ifc := iface("default", binding, "")
			withOpts := iface("default", binding, "")
			withOpts.DhcpOptions = testDHCPOptions()
			resp, err := d.Setup(ctx, setupReq(vmi, p.ns, withOpts))
			if err != nil {
				t.Fatalf("Setup: %v", err)
			}
			t.Cleanup(func() {
				if err := d.Teardown(context.Background(), teardownReq(vmi, p.ns, ifc)); err != nil {
					t.Errorf("Teardown: %v", err)
				}
			})
			g := attachGuest(t, p.ns, "k6t-eth0", resp.GetInterfaces()[0].GetMac(), clusterMTU)
			lease, err := g.dhcpExchange(t)
			if err != nil {
				t.Fatalf("DHCP from the guest: %v", err)
			}
			checkDHCPOptions(t, "OFFER", lease.Offer)
			checkDHCPOptions(t, "ACK", lease.ACK)

			// Other options: the server answers with them.
			withOpts.DhcpOptions = &networkv1.DHCPOptions{BootFileName: "boot.ipxe", PrivateOptions: []*networkv1.DHCPPrivateOption{{Code: 250, Value: "v2"}}}
			if _, err := d.Setup(ctx, setupReq(vmi, p.ns, withOpts)); err != nil {
				t.Fatalf("Setup with other options: %v", err)
			}
			ack, err := g.dhcp(t)
			if err != nil {
				t.Fatalf("DHCP after the second Setup: %v", err)
			}
			if got, v := ack.BootFileNameOption(), ack.Options.Get(dhcpv4.GenericOptionCode(250)); got != "boot.ipxe" || string(v) != "v2" || ack.Options.Has(dhcpv4.GenericOptionCode(224)) || len(ack.NTPServers()) > 0 {
				t.Errorf("ACK after the second Setup: boot file %q, option 250 %q, 224 present %v, NTP %v; want boot.ipxe, v2, no 224, no NTP",
					got, v, ack.Options.Has(dhcpv4.GenericOptionCode(224)), ack.NTPServers())
			}

			// A new driver process has no servers; Check starts the server again, with the
			// options of the last Setup from the state.
			_ = d.Close()
			d = n.newDriver(t, stateDir)
			if _, err := d.Check(ctx, checkReq(vmi, p.ns, withOpts)); err != nil {
				t.Fatalf("Check by a new driver: %v", err)
			}
			if ack, err = g.dhcp(t); err != nil || ack.BootFileNameOption() != "boot.ipxe" {
				t.Errorf("ACK from the re-made server: %v, %v; want boot file boot.ipxe", ack, err)
			}

			// Without options: none.
			if _, err := d.Setup(ctx, setupReq(vmi, p.ns, ifc)); err != nil {
				t.Fatalf("Setup without options: %v", err)
			}
			if ack, err = g.dhcp(t); err != nil {
				t.Fatalf("DHCP after Setup without options: %v", err)
			}
			noDHCPOptions(t, "ACK without options", ack)
		})
	}
}
