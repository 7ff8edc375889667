package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/dhcpv6/nclient6"
	"github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// waitLinkLocal waits until the guest's interface has a link-local address that is no
// longer tentative: what NDP and DHCPv6 clients send from.
func (g *fakeGuest) waitLinkLocal(t tb) {
	t.Helper()
	err := nsDo(t, g.ns, func() error {
		l, err := netlink.LinkByName(g.iface)
		if err != nil {
			return err
		}
		for deadline := time.Now().Add(10 * time.Second); ; {
			addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if a.IP.IsLinkLocalUnicast() && a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0 {
					return nil
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no usable link-local address on %s: %v", g.iface, addrs)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	if err != nil {
		t.Fatalf("fake guest: %v", err)
	}
}

// routerAdvertisement sends router solicitations (with the guest's MAC as source link-layer
// address) until a router advertisement comes, and returns it with its source.
func (g *fakeGuest) routerAdvertisement(t tb, timeout time.Duration) (*ndp.RouterAdvertisement, netip.Addr, error) {
	t.Helper()
	var ra *ndp.RouterAdvertisement
	var src netip.Addr
	err := nsDo(t, g.ns, func() error {
		ifi, err := net.InterfaceByName(g.iface)
		if err != nil {
			return err
		}
		c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
		if err != nil {
			return err
		}
		defer c.Close()
		var f ipv6.ICMPFilter
		f.SetAll(true)
		f.Accept(ipv6.ICMPTypeRouterAdvertisement)
		if err := c.SetICMPFilter(&f); err != nil {
			return err
		}
		rs := &ndp.RouterSolicitation{Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: g.mac}}}
		for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
			if err := c.WriteTo(rs, nil, netip.IPv6LinkLocalAllRouters()); err != nil {
				return fmt.Errorf("send router solicitation: %w", err)
			}
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			for {
				m, _, from, err := c.ReadFrom()
				if err != nil {
					break // timeout: solicit again
				}
				if a, ok := m.(*ndp.RouterAdvertisement); ok {
					ra, src = a, from
					return nil
				}
			}
		}
		return fmt.Errorf("no router advertisement within %s", timeout)
	})
	return ra, src, err
}

// dhcp6 runs a DHCPv6 client (nclient6: SOLICIT, ADVERTISE, REQUEST, REPLY) on the guest's
// interface and returns the REPLY.
func (g *fakeGuest) dhcp6(t tb) (*dhcpv6.Message, error) {
	t.Helper()
	var reply *dhcpv6.Message
	err := nsDo(t, g.ns, func() error {
		c, err := nclient6.New(g.iface, nclient6.WithTimeout(2*time.Second), nclient6.WithRetry(3))
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		adv, err := c.Solicit(ctx, dhcpv6.WithRequestedOptions(dhcpv6.OptionDNSRecursiveNameServer, dhcpv6.OptionDomainSearchList))
		if err != nil {
			return fmt.Errorf("SOLICIT: %w", err)
		}
		reply, err = c.Request(ctx, adv)
		if err != nil {
			return fmt.Errorf("REQUEST: %w", err)
		}
		return nil
	})
	return reply, err
}

// configure6 applies what the guest learnt, as its network configuration would: the DHCPv6
// address (a /128: DHCPv6 carries no prefix length, the on-link prefix comes from the RA)
// and the default route via the router that advertised itself.
func (g *fakeGuest) configure6(t tb, addr netip.Addr, router netip.Addr) {
	t.Helper()
	err := nsDo(t, g.ns, func() error {
		l, err := netlink.LinkByName(g.iface)
		if err != nil {
			return err
		}
		a := &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrAdd(l, a); err != nil {
			return err
		}
		// The kernel of the guest namespace (accept_ra=1) may have added it from the RA
		// already.
		return netlink.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, Gw: router.WithZone("").AsSlice(), Priority: 1024, Protocol: unix.RTPROT_RA})
	})
	if err != nil {
		t.Fatalf("configure the fake guest with %s via %s: %v", addr, router, err)
	}
}

// ipv6ServerSockets lists the sockets of the namespace ns that the IPv6 configuration opens:
// UDP port 547 (DHCPv6) and raw ICMPv6 (router advertisements).
func ipv6ServerSockets(t tb, ns string) []string {
	t.Helper()
	var out []string
	err := nsDo(t, ns, func() error {
		for _, f := range []struct{ file, port string }{{"udp6", "0223"}, {"raw6", "003A"}} {
			// thread-self: /proc/self/net is the namespace of the process's main thread.
			b, err := os.ReadFile("/proc/thread-self/net/" + f.file)
			if err != nil {
				return err
			}
			for _, line := range strings.Split(string(b), "\n")[1:] {
				fields := strings.Fields(line)
				if len(fields) > 1 && strings.HasSuffix(fields[1], ":"+f.port) {
					out = append(out, f.file+" "+fields[1])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("sockets of %s: %v", ns, err)
	}
	return out
}
