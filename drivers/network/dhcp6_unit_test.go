package network

import (
	"net"
	"slices"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/mdlayher/ndp"
)

func TestLease6(t *testing.T) {
	guest, _ := net.ParseMAC("02:00:00:00:00:02")
	bridge, _ := net.ParseMAC("02:00:00:00:00:01")
	l := masqueradeLease6(guest, bridge, &podInfo{MTU: 1400, DNS6: []string{"fd00::53", "junk"}, Search: []string{"kv.test"}})
	if l.Addr.String() != "fd10:0:2::2" || l.Prefix.String() != "fd10:0:2::/120" || len(l.DNS) != 1 {
		t.Fatalf("lease6 %+v", l)
	}

	sol, err := dhcpv6.NewSolicit(guest)
	if err != nil {
		t.Fatal(err)
	}
	adv, err := l.reply(sol)
	if err != nil || adv == nil || adv.Type() != dhcpv6.MessageTypeAdvertise {
		t.Fatalf("reply to SOLICIT: %v, %v", adv, err)
	}
	ia := adv.Options.OneIANA()
	if ia == nil || ia.IaId != sol.Options.OneIANA().IaId || !ia.Options.OneAddress().IPv6Addr.Equal(net.ParseIP("fd10:0:2::2")) || ia.Options.OneAddress().ValidLifetime != infinite6 {
		t.Errorf("ADVERTISE IA_NA %v", ia)
	}
	if dns := adv.Options.DNS(); len(dns) != 1 || dns[0].String() != "fd00::53" {
		t.Errorf("ADVERTISE DNS %v", dns)
	}
	req, err := dhcpv6.NewRequestFromAdvertise(adv)
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := l.reply(req); err != nil || rep == nil || rep.Type() != dhcpv6.MessageTypeReply || rep.Options.OneIANA() == nil {
		t.Errorf("reply to REQUEST: %v, %v", rep, err)
	}
	// A REQUEST to another server is not answered.
	other, _ := dhcpv6.NewRequestFromAdvertise(adv)
	other.UpdateOption(dhcpv6.OptServerID(&dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: guest}))
	if rep, err := l.reply(other); err != nil || rep != nil {
		t.Errorf("reply to a REQUEST to another server: %v, %v", rep, err)
	}
	rapid, _ := dhcpv6.NewSolicit(guest, dhcpv6.WithRapidCommit)
	if rep, err := l.reply(rapid); err != nil || rep == nil || rep.Type() != dhcpv6.MessageTypeReply {
		t.Errorf("reply to a rapid-commit SOLICIT: %v, %v", rep, err)
	}
	info, _ := dhcpv6.NewMessage(dhcpv6.WithClientID(&dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: guest}))
	info.MessageType = dhcpv6.MessageTypeInformationRequest
	if rep, err := l.reply(info); err != nil || rep == nil || rep.Options.OneIANA() != nil || len(rep.Options.DNS()) != 1 {
		t.Errorf("reply to INFORMATION-REQUEST: %v, %v", rep, err)
	}

	ra := l.routerAdvertisement()
	if !ra.ManagedConfiguration || ra.RouterLifetime <= 0 {
		t.Errorf("RA %+v", ra)
	}
	rs := func(mac net.HardwareAddr) *ndp.RouterSolicitation {
		return &ndp.RouterSolicitation{Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: mac}}}
	}
	if !l.answersRS(rs(guest)) || l.answersRS(rs(bridge)) || !l.answersRS(&ndp.RouterSolicitation{}) {
		t.Errorf("answersRS: guest %v, other %v, none %v", l.answersRS(rs(guest)), l.answersRS(rs(bridge)), l.answersRS(&ndp.RouterSolicitation{}))
	}
}

func TestResolvConf6(t *testing.T) {
	got := parseResolvConf6([]byte("nameserver 10.96.0.10\nnameserver fd00::10\nnameserver fe80::1%eth0\nnameserver fe80::2\n# nameserver fd00::11\nnameserver ::ffff:1.2.3.4\n"))
	if !slices.Equal(got, []string{"fd00::10"}) {
		t.Errorf("parseResolvConf6 = %v", got)
	}
}
