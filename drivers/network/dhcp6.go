package network

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/dhcpv6/server6"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// lease6 is what the masquerade binding's guest gets over IPv6: router advertisements (M
// flag, default route, the on-link prefix) and, by DHCPv6, one address (IA_NA) for ever and
// the sandbox's IPv6 name servers.
type lease6 struct {
	// GuestMAC is the guest's: router solicitations that carry another source link-layer
	// address are not answered.
	GuestMAC net.HardwareAddr
	// RouterMAC is the bridge's, advertised as the router's link-layer address and the
	// DHCPv6 server's DUID-LL.
	RouterMAC net.HardwareAddr
	// Addr is the guest's address, Prefix the on-link prefix (not autonomous: a /120 cannot
	// be used by SLAAC).
	Addr   netip.Addr
	Prefix netip.Prefix
	DNS    []netip.Addr
	Search []string
	MTU    int
}

// masqueradeLease6 is the IPv6 lease of the masquerade binding's guest: fd10:0:2::2 on
// fd10:0:2::/120 behind the bridge.
func masqueradeLease6(guestMAC, bridgeMAC net.HardwareAddr, info *podInfo) *lease6 {
	guest := netip.MustParsePrefix(masqGuest6)
	l := &lease6{
		GuestMAC: guestMAC, RouterMAC: bridgeMAC, Addr: guest.Addr(), Prefix: guest.Masked(),
		Search: info.Search, MTU: info.MTU,
	}
	for _, s := range info.DNS6 {
		if a, err := netip.ParseAddr(s); err == nil && a.Is6() && !a.Is4In6() {
			l.DNS = append(l.DNS, a)
		}
	}
	return l
}

// Router advertisement timing: the first few unsolicited ones come quickly (the bridge's
// link-local address, their source, may still be tentative when the first goes out), then
// one every raInterval; the router lifetime covers several intervals (RFC 4861 6.2.1).
const (
	raInitialInterval = 4 * time.Second
	raInitialCount    = 3
	raInterval        = 200 * time.Second
	raRouterLifetime  = 1800 * time.Second
)

// routerAdvertisement is the RA the bridge sends: managed (addresses by DHCPv6), other
// configuration (DNS by DHCPv6), the bridge as default router, the on-link prefix, MTU and,
// when there are any, the IPv6 name servers (RDNSS) and search domains (DNSSL).
func (l *lease6) routerAdvertisement() *ndp.RouterAdvertisement {
	ra := &ndp.RouterAdvertisement{
		CurrentHopLimit:      64,
		ManagedConfiguration: true,
		OtherConfiguration:   true,
		RouterLifetime:       raRouterLifetime,
		Options: []ndp.Option{
			&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: l.RouterMAC},
			&ndp.PrefixInformation{
				PrefixLength: uint8(l.Prefix.Bits()), OnLink: true,
				ValidLifetime: ndp.Infinity, PreferredLifetime: ndp.Infinity,
				Prefix: l.Prefix.Addr(),
			},
		},
	}
	if l.MTU > 0 {
		ra.Options = append(ra.Options, ndp.NewMTU(uint32(l.MTU)))
	}
	if len(l.DNS) > 0 {
		ra.Options = append(ra.Options, &ndp.RecursiveDNSServer{Lifetime: raRouterLifetime, Servers: l.DNS})
	}
	if len(l.DNS) > 0 && len(l.Search) > 0 {
		ra.Options = append(ra.Options, &ndp.DNSSearchList{Lifetime: raRouterLifetime, DomainNames: l.Search})
	}
	return ra
}

// answersRS reports whether a router solicitation is the guest's: one that names another
// source link-layer address is not (one from the unspecified address names none).
func (l *lease6) answersRS(rs *ndp.RouterSolicitation) bool {
	for _, o := range rs.Options {
		if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Source {
			return bytes.Equal(lla.Addr, l.GuestMAC)
		}
	}
	return true
}

// serverDUID is the DHCPv6 server's identifier, from the bridge's MAC.
func (l *lease6) serverDUID() dhcpv6.DUID {
	return &dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: l.RouterMAC}
}

// reply is the DHCPv6 server's answer to msg: an ADVERTISE to a SOLICIT (a REPLY when it
// asks for rapid commit), a REPLY with the address to a REQUEST, RENEW, REBIND or CONFIRM,
// a REPLY without address to an INFORMATION-REQUEST, RELEASE or DECLINE; nil for relayed
// messages, messages to another server and any other message.
//
// DHCPv6 names clients by DUID, which a guest may derive from anything (its machine id, one
// DUID for all its interfaces), so the server cannot pick the guest out by MAC: it answers
// every client on the bridge, whose only port is the guest's tap.
func (l *lease6) reply(d dhcpv6.DHCPv6) (*dhcpv6.Message, error) {
	msg, ok := d.(*dhcpv6.Message)
	if !ok || msg.Options.ClientID() == nil {
		return nil, nil
	}
	sid := l.serverDUID()
	if other := msg.Options.ServerID(); other != nil && !other.Equal(sid) {
		return nil, nil // for another server
	}
	mods := []dhcpv6.Modifier{dhcpv6.WithServerID(sid)}
	if len(l.DNS) > 0 {
		var dns []net.IP
		for _, a := range l.DNS {
			dns = append(dns, a.AsSlice())
		}
		mods = append(mods, dhcpv6.WithDNS(dns...))
		if len(l.Search) > 0 {
			mods = append(mods, dhcpv6.WithDomainSearchList(l.Search...))
		}
	}
	withAddr := func() {
		ia := &dhcpv6.OptIANA{T1: infinite6, T2: infinite6}
		if req := msg.Options.OneIANA(); req != nil {
			ia.IaId = req.IaId
		}
		ia.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: l.Addr.AsSlice(), PreferredLifetime: infinite6, ValidLifetime: infinite6})
		mods = append(mods, dhcpv6.WithOption(ia))
	}
	switch msg.Type() {
	case dhcpv6.MessageTypeSolicit:
		if msg.Options.OneIANA() == nil {
			return nil, nil // asks for no address: nothing to offer
		}
		withAddr()
		if msg.GetOneOption(dhcpv6.OptionRapidCommit) != nil {
			return dhcpv6.NewReplyFromMessage(msg, mods...)
		}
		return dhcpv6.NewAdvertiseFromSolicit(msg, mods...)
	case dhcpv6.MessageTypeRequest, dhcpv6.MessageTypeRenew, dhcpv6.MessageTypeRebind, dhcpv6.MessageTypeConfirm:
		if msg.Type() == dhcpv6.MessageTypeRequest && msg.Options.ServerID() == nil {
			return nil, nil // a REQUEST names its server (RFC 8415 16.4)
		}
		if msg.Options.OneIANA() != nil {
			withAddr()
		}
		return dhcpv6.NewReplyFromMessage(msg, mods...)
	case dhcpv6.MessageTypeInformationRequest, dhcpv6.MessageTypeRelease:
		return dhcpv6.NewReplyFromMessage(msg, mods...)
	case dhcpv6.MessageTypeDecline:
		// NewReplyFromMessage does not take a DECLINE; the reply is the same.
		rep := &dhcpv6.Message{MessageType: dhcpv6.MessageTypeReply, TransactionID: msg.TransactionID}
		rep.AddOption(dhcpv6.OptClientID(msg.Options.ClientID()))
		for _, m := range mods {
			m(rep)
		}
		return rep, nil
	}
	return nil, nil
}

// infinite6 is the DHCPv6 "infinity" of lifetimes and T1/T2 (RFC 8415 7.7).
const infinite6 = time.Duration(0xffffffff) * time.Second

// ipv6Server is the IPv6 configuration service of one guest interface: a DHCPv6 server on a
// UDP socket (port 547, bound to the bridge) and a router advertisement sender on an ICMPv6
// socket, both opened in the sandbox namespace and served by goroutines of the driver
// process.
type ipv6Server struct {
	ns      nsID
	ifindex int
	lease   lease6
	dhcp    *server6.Server
	ra      *ndp.Conn
	// nl is a netlink socket of the sandbox namespace: the RA sender looks up the bridge's
	// link-local address with it.
	nl *netlink.Handle
	// stop ends the RA sender; wg waits for the DHCPv6 server's and the RA goroutines.
	stop chan struct{}
	wg   sync.WaitGroup
}

// serversPerIPv6 is what one ipv6Server counts for in dhcpServers.count: the DHCPv6 server and
// the RA sender.
const serversPerIPv6 = 2

// ensure6 runs the IPv6 service of key with lease l on the bridge (of index ifindex) in the
// namespace at nsPath (of identity id), unless it already does.
func (s *dhcpServers) ensure6(key, nsPath string, id nsID, bridge string, ifindex int, l *lease6) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.v6[key]; old != nil {
		if old.ns == id && old.ifindex == ifindex && equalLease6(&old.lease, l) {
			return nil
		}
		s.stop6Locked(key)
	}
	srv := &ipv6Server{ns: id, ifindex: ifindex, lease: *l, stop: make(chan struct{})}
	handler := func(c net.PacketConn, peer net.Addr, m dhcpv6.DHCPv6) {
		resp, err := srv.lease.reply(m)
		if err != nil {
			s.log.Warn("DHCPv6: cannot build reply", "interface", key, "error", err)
			return
		}
		if resp == nil {
			return
		}
		if _, err := c.WriteTo(resp.ToBytes(), peer); err != nil {
			s.log.Warn("DHCPv6: cannot send reply", "interface", key, "peer", peer, "error", err)
		}
	}
	err := inNS(nsPath, func() error {
		var err error
		// Bound to the bridge, joined to ff02::1:2 on it: the socket stays in the sandbox
		// namespace and answers only what comes in through that bridge.
		if srv.dhcp, err = server6.NewServer(bridge, nil, handler); err != nil {
			return fmt.Errorf("DHCPv6 server: %w", err)
		}
		ifi, err := net.InterfaceByName(bridge)
		if err != nil {
			srv.dhcp.Close()
			return err
		}
		// The socket stays in the namespace, as the others.
		if srv.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
			srv.dhcp.Close()
			return fmt.Errorf("router advertisements: %w", err)
		}
		// Bound to no address: each RA goes out from the bridge's link-local address, which
		// comes (and goes through DAD) only once the bridge has a port with a carrier.
		if srv.ra, _, err = ndp.Listen(ifi, ndp.Unspecified); err != nil {
			srv.dhcp.Close()
			srv.nl.Close()
			return fmt.Errorf("router advertisements: %w", err)
		}
		var f ipv6.ICMPFilter
		f.SetAll(true)
		f.Accept(ipv6.ICMPTypeRouterSolicitation)
		for _, e := range []error{
			srv.ra.SetICMPFilter(&f),
			srv.ra.SetControlMessage(ipv6.FlagInterface|ipv6.FlagHopLimit, true),
			srv.ra.JoinGroup(netip.IPv6LinkLocalAllRouters()),
		} {
			if e != nil {
				srv.dhcp.Close()
				srv.nl.Close()
				srv.ra.Close()
				return fmt.Errorf("router advertisements: %w", e)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("start IPv6 configuration on %s: %w", bridge, err)
	}
	solicited := make(chan netip.Addr, 1)
	srv.wg.Add(3)
	go func() {
		defer srv.wg.Done()
		_ = srv.dhcp.Serve() // returns when stop closes the socket
	}()
	go func() {
		defer srv.wg.Done()
		srv.readRS(solicited) // returns when stop closes the socket
	}()
	go func() {
		defer srv.wg.Done()
		srv.sendRAs(solicited)
	}()
	s.v6[key] = srv
	s.log.Info("IPv6 configuration started (RA, DHCPv6)", "interface", key, "bridge", bridge, "address", l.Addr, "mac", l.GuestMAC)
	return nil
}

func equalLease6(a, b *lease6) bool {
	return bytes.Equal(a.GuestMAC, b.GuestMAC) && bytes.Equal(a.RouterMAC, b.RouterMAC) && a.Addr == b.Addr &&
		a.Prefix == b.Prefix && a.MTU == b.MTU && fmt.Sprint(a.DNS) == fmt.Sprint(b.DNS) && fmt.Sprint(a.Search) == fmt.Sprint(b.Search)
}

// readRS passes on the guest's router solicitations that came in through the bridge: their
// source, the unspecified address for one that has none.
func (srv *ipv6Server) readRS(solicited chan<- netip.Addr) {
	for {
		m, cm, src, err := srv.ra.ReadFrom()
		if err != nil {
			return
		}
		rs, ok := m.(*ndp.RouterSolicitation)
		if !ok || cm == nil || cm.IfIndex != srv.ifindex || cm.HopLimit != ndp.HopLimit || !srv.lease.answersRS(rs) {
			continue
		}
		select {
		case solicited <- src:
		default: // one is pending already
		}
	}
}

// sendRAs sends the router advertisements: unsolicited ones to all nodes, and one to each
// solicitation (to its source, to all nodes when it has none). Each goes out from the
// bridge's link-local address (RFC 4861 6.1.2: a host drops any other): while the bridge has
// none that passed DAD, the RA waits.
func (srv *ipv6Server) sendRAs(solicited <-chan netip.Addr) {
	ra := srv.lease.routerAdvertisement()
	t := time.NewTimer(0)
	defer t.Stop()
	var pending []netip.Addr // destinations of RAs that wait for a source address
	retry := time.NewTimer(0)
	defer retry.Stop()
	<-retry.C
	waiting := false
	for sent := 0; ; {
		select {
		case <-srv.stop:
			return
		case <-t.C:
			sent++
			if sent < raInitialCount {
				t.Reset(raInitialInterval)
			} else {
				t.Reset(raInterval)
			}
			pending = appendDst(pending, netip.IPv6LinkLocalAllNodes())
		case src := <-solicited:
			dst := netip.IPv6LinkLocalAllNodes()
			if src.IsLinkLocalUnicast() {
				dst = src
			}
			pending = appendDst(pending, dst)
		case <-retry.C:
			waiting = false
		}
		if waiting || len(pending) == 0 {
			continue
		}
		src := srv.linkLocal()
		if !src.IsValid() {
			waiting = true
			retry.Reset(raSourceRetry)
			continue
		}
		cm := &ipv6.ControlMessage{HopLimit: ndp.HopLimit, Src: src.AsSlice(), IfIndex: srv.ifindex}
		for _, dst := range pending {
			// Errors (the link-local address just went) are not worth a log line: the next RA
			// or solicitation tries again.
			_ = srv.ra.WriteTo(ra, cm, dst)
		}
		pending = pending[:0]
	}
}

// raSourceRetry is how often the RA sender looks for the bridge's link-local address while
// there is none.
const raSourceRetry = 250 * time.Millisecond

func appendDst(dsts []netip.Addr, dst netip.Addr) []netip.Addr {
	if slices.Contains(dsts, dst) || len(dsts) >= 8 {
		return dsts
	}
	return append(dsts, dst)
}

// linkLocal is the bridge's link-local address that passed DAD; invalid for none.
func (srv *ipv6Server) linkLocal() netip.Addr {
	addrs, err := srv.nl.AddrList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: srv.ifindex}}, netlink.FAMILY_V6)
	if err != nil {
		return netip.Addr{}
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if ok && ip.IsLinkLocalUnicast() && a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0 {
			return ip
		}
	}
	return netip.Addr{}
}

// close stops the service and waits for its goroutines.
func (srv *ipv6Server) close() {
	close(srv.stop)
	_ = srv.dhcp.Close()
	_ = srv.ra.Close()
	srv.wg.Wait()
	srv.nl.Close()
}

func (s *dhcpServers) stop6Locked(key string) {
	srv := s.v6[key]
	if srv == nil {
		return
	}
	delete(s.v6, key)
	srv.close()
	s.log.Info("IPv6 configuration stopped", "interface", key)
}
