package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The functions of this file work on the network namespace of the calling thread: they run
// inside inNS.

// errNotOurs is returned when a link Setup would make exists but another owner made it.
var errNotOurs = errors.New("exists and was not made for this VMI")

// bridgeFakeIP is the address of the bridge of the index-th interface with the bridge
// binding, from which its DHCP server answers (KubeVirt's 169.254.75.1x).
func bridgeFakeIP(index int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{169, 254, 75, byte(10 + index%240)}), 32)
}

// readPod reads the pod interface as it is before Setup changes it.
func readPod(name string) (*podInfo, error) {
	link, err := netlink.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil, status.Errorf(codes.FailedPrecondition, "pod interface %s is not in the sandbox network namespace", name)
		}
		return nil, fmt.Errorf("find pod interface %s: %w", name, err)
	}
	a := link.Attrs()
	if a.MasterIndex != 0 {
		master, _ := netlink.LinkByIndex(a.MasterIndex)
		m := fmt.Sprint(a.MasterIndex)
		if master != nil {
			m = master.Attrs().Name
		}
		return nil, status.Errorf(codes.FailedPrecondition, "pod interface %s is already a port of %s (a Setup whose state is lost?)", name, m)
	}
	info := &podInfo{MAC: a.HardwareAddr.String(), MTU: a.MTU}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses of %s: %w", name, err)
	}
	for _, ad := range addrs {
		switch {
		case ad.IP.To4() != nil && ad.Scope == unix.RT_SCOPE_UNIVERSE:
			info.Addrs = append(info.Addrs, ad.IPNet.String())
		case ad.IP.To4() == nil && ad.Scope == unix.RT_SCOPE_UNIVERSE:
			info.Addrs6 = append(info.Addrs6, ad.IPNet.String())
		}
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: a.Index, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes of %s: %w", name, err)
	}
	for _, r := range routes {
		if r.Protocol == unix.RTPROT_KERNEL {
			continue // made by the kernel for an address: comes back with the address
		}
		ri := routeInfo{Scope: uint8(r.Scope), Priority: r.Priority, Protocol: int(r.Protocol)}
		if r.Dst != nil && !isDefault(r.Dst) {
			ri.Dst = r.Dst.String()
		}
		if r.Gw != nil {
			ri.Gw = r.Gw.String()
		}
		if r.Src != nil {
			ri.Src = r.Src.String()
		}
		info.Routes = append(info.Routes, ri)
	}
	return info, nil
}

func isDefault(n *net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0 && n.IP.IsUnspecified()
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// ownedLink returns the link name when it exists and carries alias, nil when there is none,
// errNotOurs when another made it.
func ownedLink(name, alias string) (netlink.Link, error) {
	link, err := netlink.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("find %s: %w", name, err)
	}
	if link.Attrs().Alias != alias {
		return link, fmt.Errorf("%s %w (alias %q)", name, errNotOurs, link.Attrs().Alias)
	}
	return link, nil
}

// ensureBridge makes the bridge name (or checks the one there), with mtu and mac, up.
func ensureBridge(name, alias string, mtu int, mac net.HardwareAddr) (netlink.Link, error) {
	link, err := ownedLink(name, alias)
	if err != nil {
		return nil, err
	}
	if link == nil {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu, HardwareAddr: mac, TxQLen: -1}}
		if err := netlink.LinkAdd(br); err != nil {
			return nil, fmt.Errorf("add bridge %s: %w", name, err)
		}
		if link, err = netlink.LinkByName(name); err != nil {
			return nil, fmt.Errorf("find bridge %s: %w", name, err)
		}
		if err := netlink.LinkSetAlias(link, alias); err != nil {
			_ = netlink.LinkDel(link)
			return nil, fmt.Errorf("set alias of %s: %w", name, err)
		}
	} else if link.Type() != "bridge" {
		return nil, fmt.Errorf("%s is a %s, not a bridge", name, link.Type())
	}
	if link.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(link, mtu); err != nil {
			return nil, fmt.Errorf("set MTU of %s: %w", name, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("set %s up: %w", name, err)
	}
	return link, nil
}

// ensureTap makes the tap name in bridge (or checks the one there), with mtu, up. A
// multi-queue tap (IFF_MULTI_QUEUE) is what a hypervisor opening it several times, one
// descriptor per queue, needs; the kernel refuses to open a tap whose queue mode differs
// from the opener's, so a tap that is there already must be as asked.
func ensureTap(name, alias string, bridge netlink.Link, mtu int, uid, gid uint32, multiQueue bool) (netlink.Link, error) {
	link, err := ownedLink(name, alias)
	if err != nil {
		return nil, err
	}
	if link == nil {
		// No packet information, virtio-net headers: what QEMU opens by ifname.
		flags := netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR | unix.IFF_TUN_EXCL
		if multiQueue {
			flags |= netlink.TUNTAP_MULTI_QUEUE
		}
		tap := &netlink.Tuntap{
			LinkAttrs: netlink.LinkAttrs{Name: name},
			Mode:      netlink.TUNTAP_MODE_TAP,
			// Queues 0: netlink opens the tap once to make it persistent, then closes it.
			Flags: flags,
			Owner: uid,
			Group: gid,
		}
		if err := netlink.LinkAdd(tap); err != nil {
			return nil, fmt.Errorf("add tap %s: %w", name, err)
		}
		if link, err = netlink.LinkByName(name); err != nil {
			return nil, fmt.Errorf("find tap %s: %w", name, err)
		}
		if err := netlink.LinkSetAlias(link, alias); err != nil {
			_ = netlink.LinkDel(link)
			return nil, fmt.Errorf("set alias of %s: %w", name, err)
		}
	} else if link.Type() != "tuntap" {
		return nil, fmt.Errorf("%s is a %s, not a tap", name, link.Type())
	}
	if err := tapQueueMode(link, multiQueue); err != nil {
		return nil, err
	}
	if link.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(link, mtu); err != nil {
			return nil, fmt.Errorf("set MTU of %s: %w", name, err)
		}
	}
	if link.Attrs().MasterIndex != bridge.Attrs().Index {
		if err := netlink.LinkSetMaster(link, bridge); err != nil {
			return nil, fmt.Errorf("add %s to %s: %w", name, bridge.Attrs().Name, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("set %s up: %w", name, err)
	}
	return link, nil
}

// tapQueueMode reports, as FailedPrecondition, a tap whose queue mode is not the one asked
// (multi-queue or single-queue).
func tapQueueMode(link netlink.Link, multiQueue bool) error {
	t, ok := link.(*netlink.Tuntap)
	if !ok {
		return fmt.Errorf("%s is a %s, not a tap", link.Attrs().Name, link.Type())
	}
	if has := t.Flags&netlink.TUNTAP_MULTI_QUEUE != 0; has != multiQueue {
		mode := map[bool]string{true: "multi-queue", false: "single-queue"}
		return status.Errorf(codes.FailedPrecondition, "tap %s is %s, but the interface needs a %s tap (remove it, or tear the VMI down first)",
			link.Attrs().Name, mode[has], mode[multiQueue])
	}
	return nil
}

// ensureAddr puts the address on link unless it is there.
func ensureAddr(link netlink.Link, prefix string) error {
	addr, err := netlink.ParseAddr(prefix)
	if err != nil {
		return fmt.Errorf("parse %s: %w", prefix, err)
	}
	if addr.IP.To4() == nil {
		addr.Flags = unix.IFA_F_NODAD // the guest's side needs it at once
	}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("add %s to %s: %w", prefix, link.Attrs().Name, err)
	}
	return nil
}

// hasAddr reports whether link has the address prefix.
func hasAddr(link netlink.Link, prefix string) (bool, error) {
	addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return false, fmt.Errorf("list addresses of %s: %w", link.Attrs().Name, err)
	}
	return slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IPNet.String() == prefix }), nil
}

// enslavePod makes the pod interface a port of bridge: its IPv4 addresses go (the guest gets
// them), its MAC becomes podMAC when that is set.
func enslavePod(name string, bridge netlink.Link, info *podInfo, podMAC net.HardwareAddr) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find pod interface %s: %w", name, err)
	}
	a := link.Attrs()
	if podMAC != nil && a.HardwareAddr.String() != podMAC.String() {
		if err := netlink.LinkSetDown(link); err != nil {
			return fmt.Errorf("set %s down: %w", name, err)
		}
		if err := netlink.LinkSetHardwareAddr(link, podMAC); err != nil {
			return fmt.Errorf("set MAC of %s: %w", name, err)
		}
	}
	for _, prefix := range info.Addrs {
		addr, err := netlink.ParseAddr(prefix)
		if err != nil {
			return fmt.Errorf("parse %s: %w", prefix, err)
		}
		if err := netlink.AddrDel(link, addr); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("remove %s from %s: %w", prefix, name, err)
		}
	}
	if a.MasterIndex != bridge.Attrs().Index {
		if err := netlink.LinkSetMaster(link, bridge); err != nil {
			return fmt.Errorf("add %s to %s: %w", name, bridge.Attrs().Name, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

// restorePod gives the pod interface back what enslavePod took: it leaves any bridge, gets
// its MAC, addresses and routes back. A missing interface is fine (a CNI DEL or the runtime
// removed it).
func restorePod(name string, info *podInfo) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("find pod interface %s: %w", name, err)
	}
	if link.Attrs().MasterIndex != 0 {
		if err := netlink.LinkSetNoMaster(link); err != nil {
			return fmt.Errorf("remove %s from its bridge: %w", name, err)
		}
	}
	if info == nil {
		return nil
	}
	if mac, err := net.ParseMAC(info.MAC); err == nil && link.Attrs().HardwareAddr.String() != mac.String() {
		if err := netlink.LinkSetDown(link); err != nil {
			return fmt.Errorf("set %s down: %w", name, err)
		}
		if err := netlink.LinkSetHardwareAddr(link, mac); err != nil {
			return fmt.Errorf("restore MAC of %s: %w", name, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	for _, prefix := range info.Addrs {
		if err := ensureAddr(link, prefix); err != nil {
			return fmt.Errorf("restore address: %w", err)
		}
	}
	for _, ri := range info.Routes {
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Scope: netlink.Scope(ri.Scope), Priority: ri.Priority,
			Protocol: netlink.RouteProtocol(ri.Protocol), Table: unix.RT_TABLE_MAIN}
		if ri.Dst != "" {
			_, r.Dst, _ = net.ParseCIDR(ri.Dst)
		}
		r.Gw = net.ParseIP(ri.Gw)
		r.Src = net.ParseIP(ri.Src)
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("restore route %s via %s on %s: %w", orDefault(ri.Dst), ri.Gw, name, err)
		}
	}
	return nil
}

func orDefault(dst string) string {
	if dst == "" {
		return "default"
	}
	return dst
}

// deleteOwned deletes the link name when it carries alias; a link of that name made by
// another is left alone.
func deleteOwned(name, alias string) error {
	link, err := ownedLink(name, alias)
	switch {
	case errors.Is(err, errNotOurs):
		return nil
	case err != nil:
		return err
	case link == nil:
		return nil
	}
	if err := netlink.LinkDel(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}
