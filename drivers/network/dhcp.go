package network

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"sync"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"

	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// lease is what a guest's DHCP server hands out: one address, for ever, to one MAC.
type lease struct {
	// MAC is the guest's: requests from any other client are not answered (the bridge
	// binding's broadcast domain is the pod network's).
	MAC net.HardwareAddr
	// Addr is the guest's address and prefix length.
	Addr netip.Prefix
	// ServerID is the server's address (the bridge's).
	ServerID netip.Addr
	// Router is the default gateway; invalid for none.
	Router netip.Addr
	// Routes, when any, are sent as classless static routes (option 121), the default route
	// among them: a client that takes them ignores the router option.
	Routes []staticRoute
	DNS    []netip.Addr
	Search []string
	MTU    int
	// Hostname is sent as the host name option (12) when set.
	Hostname string
	// Extra are the interface's DHCP options (Interface.dhcp_options), sent in every answer
	// with an address (OFFER, ACK), and in the ACK of an INFORM, whether or not the client
	// asks for them; nil for none.
	Extra *dhcpOptions
}

// dhcpOptions are the extra DHCP options of an interface (Interface.dhcp_options), checked.
type dhcpOptions struct {
	// BootFileName is sent as option 67, TFTPServerName as option 66, when set.
	BootFileName   string `json:"bootFileName,omitempty"`
	TFTPServerName string `json:"tftpServerName,omitempty"`
	// NTPServers are sent as option 42, in order, when any.
	NTPServers []netip.Addr `json:"ntpServers,omitempty"`
	// Private are site-specific options, each sent as its value's bytes.
	Private []privateOption `json:"private,omitempty"`
}

// privateOption is a site-specific DHCP option (code 224 to 254).
type privateOption struct {
	Code  uint8  `json:"code"`
	Value string `json:"value"`
}

// Limits of Interface.dhcp_options (the contract's DHCPOptions).
const (
	// maxOptionBytes is the longest value of one DHCP option (its length is one byte). Longer
	// values would be split in several options (RFC 3396), which not every client joins.
	maxOptionBytes = 255
	// privateOptionMin to privateOptionMax are the site-specific option codes (RFC 3942).
	privateOptionMin = 224
	privateOptionMax = 254
)

// parseDHCPOptions checks an interface's DHCP options; nil for none. Its errors name the field
// under dhcpOptions.
func parseDHCPOptions(o *networkv1.DHCPOptions) (*dhcpOptions, error) {
	if o == nil {
		return nil, nil
	}
	out := &dhcpOptions{BootFileName: o.GetBootFileName(), TFTPServerName: o.GetTftpServerName()}
	for _, f := range []struct{ name, value string }{{"bootFileName", out.BootFileName}, {"tftpServerName", out.TFTPServerName}} {
		if len(f.value) > maxOptionBytes {
			return nil, fmt.Errorf("%s: %d bytes, more than one DHCP option holds (%d)", f.name, len(f.value), maxOptionBytes)
		}
	}
	for i, s := range o.GetNtpServers() {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return nil, fmt.Errorf("ntpServers[%d]: %q is not an IPv4 address", i, s)
		}
		out.NTPServers = append(out.NTPServers, a)
	}
	if n := len(out.NTPServers); n*4 > maxOptionBytes {
		return nil, fmt.Errorf("ntpServers: %d addresses, more than one DHCP option holds (%d)", n, maxOptionBytes/4)
	}
	seen := map[uint32]bool{}
	for i, po := range o.GetPrivateOptions() {
		code := po.GetCode()
		switch {
		case code < privateOptionMin || code > privateOptionMax:
			return nil, fmt.Errorf("privateOptions[%d]: code %d is not a site-specific option (%d to %d)", i, code, privateOptionMin, privateOptionMax)
		case seen[code]:
			return nil, fmt.Errorf("privateOptions[%d]: code %d is given twice", i, code)
		case len(po.GetValue()) > maxOptionBytes:
			return nil, fmt.Errorf("privateOptions[%d]: value of %d bytes, more than one DHCP option holds (%d)", i, len(po.GetValue()), maxOptionBytes)
		}
		seen[code] = true
		out.Private = append(out.Private, privateOption{Code: uint8(code), Value: po.GetValue()})
	}
	return out, nil
}

// modifiers are the options of o for a reply.
func (o *dhcpOptions) modifiers() []dhcpv4.Modifier {
	if o == nil {
		return nil
	}
	var mods []dhcpv4.Modifier
	if o.TFTPServerName != "" {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptTFTPServerName(o.TFTPServerName)))
	}
	if o.BootFileName != "" {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptBootFileName(o.BootFileName)))
	}
	if len(o.NTPServers) > 0 {
		var ips []net.IP
		for _, a := range o.NTPServers {
			ips = append(ips, a.AsSlice())
		}
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptNTPServers(ips...)))
	}
	for _, po := range o.Private {
		mods = append(mods, dhcpv4.WithGeneric(dhcpv4.GenericOptionCode(po.Code), []byte(po.Value)))
	}
	return mods
}

type staticRoute struct {
	Dst netip.Prefix
	// Router is the gateway; the unspecified address for a destination on the link.
	Router netip.Addr
}

// bridgeLease is the lease of the bridge binding's guest: the pod interface's first IPv4
// address, its default gateway and routes, and the sandbox's DNS.
func bridgeLease(mac net.HardwareAddr, info *podInfo, serverID netip.Addr) (*lease, error) {
	if len(info.Addrs) == 0 {
		return nil, nil
	}
	addr, err := netip.ParsePrefix(info.Addrs[0])
	if err != nil {
		return nil, fmt.Errorf("pod address %q: %w", info.Addrs[0], err)
	}
	l := &lease{MAC: mac, Addr: addr, ServerID: serverID, MTU: info.MTU, Search: info.Search}
	l.DNS = parseAddrs(info.DNS)
	var routes []staticRoute
	classless := false
	for _, r := range info.Routes {
		gw, _ := netip.ParseAddr(r.Gw)
		if gw.IsValid() && !gw.Is4() {
			continue
		}
		if !gw.IsValid() {
			gw = netip.IPv4Unspecified()
		}
		dst := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if r.Dst != "" {
			if dst, err = netip.ParsePrefix(r.Dst); err != nil || !dst.Addr().Is4() {
				continue
			}
		} else if !gw.IsUnspecified() && !l.Router.IsValid() {
			l.Router = gw
			// A gateway outside the guest's subnet (Calico's 169.254.1.1) is reachable only
			// with a route to it: classless routes carry one.
			if !addr.Masked().Contains(gw) {
				classless = true
			}
		}
		if r.Dst != "" {
			classless = true
		}
		routes = append(routes, staticRoute{Dst: dst, Router: gw})
	}
	if classless {
		l.Routes = routes
	}
	return l, nil
}

// masqueradeLease is the lease of the masquerade binding's guest: 10.0.2.2/24 behind 10.0.2.1.
func masqueradeLease(mac net.HardwareAddr, info *podInfo) *lease {
	gw := netip.MustParsePrefix(masqGateway4)
	return &lease{
		MAC: mac, Addr: netip.MustParsePrefix(masqGuest4), ServerID: gw.Addr(), Router: gw.Addr(),
		DNS: parseAddrs(info.DNS), Search: info.Search, MTU: info.MTU,
	}
}

func parseAddrs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
			out = append(out, a)
		}
	}
	return out
}

// reply is the server's answer to req: an OFFER to a DISCOVER, an ACK (or a NAK when another
// address is asked for) to a REQUEST, an ACK without address to an INFORM; nil for any other
// message and for every message of another client.
func (l *lease) reply(req *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, error) {
	if req.OpCode != dhcpv4.OpcodeBootRequest || !bytes.Equal(req.ClientHWAddr, l.MAC) {
		return nil, nil
	}
	ip := net.IP(l.Addr.Addr().AsSlice())
	mods := []dhcpv4.Modifier{dhcpv4.WithOption(dhcpv4.OptServerIdentifier(l.ServerID.AsSlice()))}
	switch req.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		mods = append(mods, dhcpv4.WithMessageType(dhcpv4.MessageTypeOffer), dhcpv4.WithYourIP(ip))
	case dhcpv4.MessageTypeRequest:
		if sid := req.ServerIdentifier(); sid != nil && !sid.Equal(l.ServerID.AsSlice()) {
			return nil, nil // the client chose another server's offer
		}
		want := req.RequestedIPAddress()
		if want == nil || want.IsUnspecified() {
			want = req.ClientIPAddr
		}
		if want != nil && !want.IsUnspecified() && !want.Equal(ip) {
			return dhcpv4.NewReplyFromRequest(req, append(mods, dhcpv4.WithMessageType(dhcpv4.MessageTypeNak))...)
		}
		mods = append(mods, dhcpv4.WithMessageType(dhcpv4.MessageTypeAck), dhcpv4.WithYourIP(ip))
	case dhcpv4.MessageTypeInform:
		mods = append(mods, dhcpv4.WithMessageType(dhcpv4.MessageTypeAck))
	default:
		return nil, nil
	}
	if req.MessageType() != dhcpv4.MessageTypeInform {
		mods = append(mods, dhcpv4.WithLeaseTime(math.MaxUint32)) // infinite (RFC 2131 3.3)
	}
	mods = append(mods, dhcpv4.WithNetmask(net.CIDRMask(l.Addr.Bits(), 32)))
	if l.Router.IsValid() {
		mods = append(mods, dhcpv4.WithRouter(l.Router.AsSlice()))
	}
	if len(l.Routes) > 0 {
		var routes []*dhcpv4.Route
		for _, r := range l.Routes {
			routes = append(routes, &dhcpv4.Route{
				Dest:   &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), 32)},
				Router: r.Router.AsSlice(),
			})
		}
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptClasslessStaticRoute(routes...)))
	}
	if len(l.DNS) > 0 {
		var dns []net.IP
		for _, a := range l.DNS {
			dns = append(dns, a.AsSlice())
		}
		mods = append(mods, dhcpv4.WithDNS(dns...))
	}
	if len(l.Search) > 0 {
		mods = append(mods, dhcpv4.WithDomainSearchList(l.Search...))
	}
	if l.Hostname != "" {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptHostName(l.Hostname)))
	}
	if l.MTU > 0 {
		mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionInterfaceMTU, binary.BigEndian.AppendUint16(nil, uint16(l.MTU))))
	}
	mods = append(mods, l.Extra.modifiers()...)
	return dhcpv4.NewReplyFromRequest(req, mods...)
}

// dhcpServer is the DHCP server of one guest interface: a UDP socket on port 67 bound to the
// interface's bridge in the sandbox namespace, served by a goroutine of the driver process.
type dhcpServer struct {
	ns      nsID
	ifindex int
	lease   lease
	srv     *server4.Server
	done    chan struct{}
}

// dhcpServers are the running DHCP servers, by VMI interface (ifacePlan.key).
type dhcpServers struct {
	log Logger

	mu      sync.Mutex
	servers map[string]*dhcpServer
	// v6 are the IPv6 configuration services (RA and DHCPv6) of the masquerade binding's
	// dual-stack interfaces, by the same keys.
	v6 map[string]*ipv6Server
}

func newDHCPServers(log Logger) *dhcpServers {
	return &dhcpServers{log: log, servers: map[string]*dhcpServer{}, v6: map[string]*ipv6Server{}}
}

// ensure runs the server of key with lease l on the bridge (of index ifindex) in the
// namespace at nsPath (of identity id), unless it already does.
func (s *dhcpServers) ensure(key, nsPath string, id nsID, bridge string, ifindex int, l *lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.servers[key]; old != nil {
		if old.ns == id && old.ifindex == ifindex && reflect.DeepEqual(old.lease, *l) {
			return nil
		}
		s.stopLocked(key)
	}
	var conn *net.UDPConn
	err := inNS(nsPath, func() error {
		var err error
		// Bound to the bridge: the socket stays in the sandbox namespace and answers only
		// what comes in through that bridge.
		conn, err = server4.NewIPv4UDPConn(bridge, &net.UDPAddr{Port: dhcpv4.ServerPort})
		return err
	})
	if err != nil {
		return fmt.Errorf("start DHCP server on %s: %w", bridge, err)
	}
	srv := &dhcpServer{ns: id, ifindex: ifindex, lease: *l, done: make(chan struct{})}
	handler := func(c net.PacketConn, peer net.Addr, m *dhcpv4.DHCPv4) {
		resp, err := srv.lease.reply(m)
		if err != nil {
			s.log.Warn("DHCP: cannot build reply", "interface", key, "error", err)
			return
		}
		if resp == nil {
			return
		}
		if _, err := c.WriteTo(resp.ToBytes(), peer); err != nil {
			s.log.Warn("DHCP: cannot send reply", "interface", key, "peer", peer, "error", err)
		}
	}
	srv.srv, err = server4.NewServer("", nil, handler, server4.WithConn(conn))
	if err != nil {
		conn.Close()
		return fmt.Errorf("start DHCP server on %s: %w", bridge, err)
	}
	go func() {
		defer close(srv.done)
		_ = srv.srv.Serve() // returns when stop closes the socket
	}()
	s.servers[key] = srv
	s.log.Info("DHCP server started", "interface", key, "bridge", bridge, "address", l.Addr, "mac", l.MAC)
	return nil
}

// stop stops the servers of key (DHCPv4, and RA and DHCPv6), if there are any, and waits for
// them to end.
func (s *dhcpServers) stop(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(key)
	s.stop6Locked(key)
}

// stop6 stops the IPv6 configuration service of key, if there is one.
func (s *dhcpServers) stop6(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stop6Locked(key)
}

func (s *dhcpServers) stopLocked(key string) {
	srv := s.servers[key]
	if srv == nil {
		return
	}
	delete(s.servers, key)
	_ = srv.srv.Close()
	<-srv.done
	s.log.Info("DHCP server stopped", "interface", key)
}

// stopVMI stops every server of the VMI.
func (s *dhcpServers) stopVMI(vmiID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key := range s.servers {
		if strings.HasPrefix(key, vmiID+"/") {
			s.stopLocked(key)
		}
	}
	for key := range s.v6 {
		if strings.HasPrefix(key, vmiID+"/") {
			s.stop6Locked(key)
		}
	}
}

// stopAll stops every server.
func (s *dhcpServers) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key := range s.servers {
		s.stopLocked(key)
	}
	for key := range s.v6 {
		s.stop6Locked(key)
	}
}

// count is the number of running servers: DHCPv4 servers, DHCPv6 servers and RA senders.
func (s *dhcpServers) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.servers) + serversPerIPv6*len(s.v6)
}
