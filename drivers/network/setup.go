package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// cniContainerID is what CNI accepts as a container id: secondary networks run with the VMI
// id as one.
var cniContainerID = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`)

// undoTimeout bounds the undo of a failed Setup (CNI DEL runs plugins).
const undoTimeout = time.Minute

// session is one Setup or Check of one VMI, under the VMI's lock.
type session struct {
	d     *Driver
	ctx   context.Context
	cfg   Config
	cni   libcni.CNI
	store stateStore
	st    *vmiState
	// end unlocks the VMI.
	end func()
}

func (s *session) save() error { return s.store.save(s.st) }

// Setup implements driver.Network. It is idempotent: for a VMI set up with the same
// interfaces it checks and repairs what is missing (a DHCP server after a restart of the
// driver) and returns the same result. When it fails, it removes what the VMI has, so that
// the error is the only trace.
func (d *Driver) Setup(ctx context.Context, req *networkv1.SetupRequest) (*networkv1.SetupResponse, error) {
	if h := req.GetHostname(); h != "" && !hostnameRE.MatchString(h) {
		return nil, invalid("hostname %q is not a DNS label (at most 63 of a-z, 0-9 and '-', starting and ending with a letter or digit)", h)
	}
	s, plans, err := d.begin(ctx, req.GetVmiId(), req.GetNetnsPath(), req.GetInterfaces(), true)
	if err != nil {
		return nil, err
	}
	defer s.end()
	if u := req.GetSandboxUser(); u != nil {
		// The VM process is not root: its taps are its user's, for it to open.
		s.cfg.TapOwner, s.cfg.TapGroup = u.GetUid(), u.GetGid()
	}
	// The host name and the DHCP options are what the DHCP servers send: a Setup that changes
	// them changes the servers' answers, and they are kept for a server made again.
	changed := s.st.Hostname != req.GetHostname()
	s.st.Hostname = req.GetHostname()
	for i, p := range plans {
		if is := s.st.Interfaces[i]; !reflect.DeepEqual(is.DHCP, p.dhcp) {
			is.DHCP, changed = p.dhcp, true
		}
	}
	if changed {
		if err := s.save(); err != nil {
			return nil, status.Errorf(codes.Internal, "VMI %s: %v", s.st.VMIID, err)
		}
	}
	resp := &networkv1.SetupResponse{}
	for i, p := range plans {
		is := s.st.Interfaces[i]
		if err := s.setupInterface(p, is); err != nil {
			err = interfaceError(p, err)
			// The undo runs even when ctx (whose end may be the failure) is done.
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
			defer cancel()
			if terr := d.teardownState(uctx, s.cni, s.store, s.st); terr != nil {
				d.log.Warn("undo failed Setup", "vmi", s.st.VMIID, "error", terr)
			}
			return nil, err
		}
		resp.Interfaces = append(resp.Interfaces, is.result())
	}
	d.log.Info("set up", "vmi", s.st.VMIID, "netns", s.st.NetNS, "interfaces", resp.GetInterfaces())
	return resp, nil
}

// Check implements driver.NetworkChecker: FailedPrecondition, naming the interface and what
// is wrong, unless every link, address, nftables rule, CNI attachment and DHCP server Setup
// made is there. A DHCP server that is not running (the driver process restarted) is started
// again.
func (d *Driver) Check(ctx context.Context, req *networkv1.CheckRequest) (*networkv1.CheckResponse, error) {
	s, plans, err := d.begin(ctx, req.GetVmiId(), req.GetNetnsPath(), req.GetInterfaces(), false)
	if err != nil {
		return nil, err
	}
	defer s.end()
	resp := &networkv1.CheckResponse{}
	for i, p := range plans {
		is := s.st.Interfaces[i]
		if err := s.checkInterface(p, is); err != nil {
			return nil, interfaceError(p, err)
		}
		resp.Interfaces = append(resp.Interfaces, is.result())
	}
	return resp, nil
}

// begin checks a Setup or Check request, locks the VMI and loads its state. Setup (create)
// starts a state when there is none; Check finds FailedPrecondition then.
func (d *Driver) begin(ctx context.Context, vmiID, netnsPath string, ifaces []*networkv1.Interface, create bool) (*session, []*ifacePlan, error) {
	cfg, stateDir, cni := d.config()
	if vmiID == "" {
		return nil, nil, invalid("vmi_id is required")
	}
	if netnsPath == "" {
		return nil, nil, invalid("netns_path is required")
	}
	plans, err := planInterfaces(ifaces, cfg.PodInterface)
	if err != nil {
		if !create {
			// No Setup can have made such interfaces: they are not as Setup left them.
			return nil, nil, status.Errorf(codes.FailedPrecondition, "VMI %s is not set up with these interfaces: %s", vmiID, status.Convert(err).Message())
		}
		return nil, nil, err
	}
	for _, p := range plans {
		if p.secondary() && !cniContainerID.MatchString(vmiID) {
			return nil, nil, invalid("%s: vmi_id %q cannot be a CNI container id (letters, digits, '_', '.', '-')", p.what(), vmiID)
		}
	}
	unlock := d.locks.Lock(vmiID)
	s := &session{d: d, ctx: ctx, cfg: cfg, cni: cni, store: stateStore{stateDir}}
	ok := false
	defer func() {
		if !ok {
			unlock()
		}
	}()
	id, err := statNS(netnsPath)
	if err != nil {
		if errors.Is(err, errNSGone) {
			return nil, nil, status.Errorf(codes.FailedPrecondition, "sandbox network namespace: %v", err)
		}
		return nil, nil, status.Errorf(codes.Internal, "sandbox network namespace: %v", err)
	}
	st, err := s.store.load(vmiID)
	if err != nil {
		return nil, nil, status.Errorf(codes.Internal, "VMI %s: %v", vmiID, err)
	}
	if st != nil && (st.NetNS != netnsPath || st.NSID != id) {
		if !create {
			return nil, nil, status.Errorf(codes.FailedPrecondition, "VMI %s was set up in network namespace %s (%s), not in %s (%s)", vmiID, st.NetNS, st.NSID, netnsPath, id)
		}
		// Left from an earlier sandbox of the VMI: undo what can be undone, then start over.
		if err := d.teardownState(ctx, cni, s.store, st); err != nil {
			return nil, nil, status.Errorf(codes.FailedPrecondition, "VMI %s: tear down its setup in network namespace %s: %v", vmiID, st.NetNS, err)
		}
		st = nil
	}
	switch {
	case st == nil && !create:
		return nil, nil, status.Errorf(codes.FailedPrecondition, "VMI %s is not set up", vmiID)
	case st == nil:
		st = &vmiState{VMIID: vmiID, NetNS: netnsPath, NSID: id}
		for _, p := range plans {
			st.Interfaces = append(st.Interfaces, newIfaceState(p))
		}
		s.st = st
		if err := s.save(); err != nil {
			return nil, nil, status.Errorf(codes.Internal, "VMI %s: %v", vmiID, err)
		}
	default:
		if err := sameInterfaces(st, plans); err != nil {
			return nil, nil, status.Errorf(codes.FailedPrecondition, "VMI %s is set up with other interfaces: %v; tear it down first", vmiID, err)
		}
		s.st = st
	}
	ok = true
	s.end = unlock
	return s, plans, nil
}

func sameInterfaces(st *vmiState, plans []*ifacePlan) error {
	if len(st.Interfaces) != len(plans) {
		return fmt.Errorf("%d interfaces, not %d", len(st.Interfaces), len(plans))
	}
	for i, p := range plans {
		if !st.Interfaces[i].sameAs(p) {
			return fmt.Errorf("interface %d is %q (%s binding, network %q), not as asked", i, st.Interfaces[i].Name, st.Interfaces[i].Binding, st.Interfaces[i].Network)
		}
	}
	return nil
}

// interfaceError names the interface in err, keeping its status code (Internal for a plain
// error).
func interfaceError(p *ifacePlan, err error) error {
	if st, ok := status.FromError(err); ok {
		if strings.Contains(st.Message(), p.what()) {
			return err
		}
		return status.Errorf(st.Code(), "%s: %s", p.what(), st.Message())
	}
	if errors.Is(err, errNSGone) {
		return status.Errorf(codes.FailedPrecondition, "%s: %v", p.what(), err)
	}
	if errors.Is(err, errNotOurs) {
		return status.Errorf(codes.FailedPrecondition, "%s: %v", p.what(), err)
	}
	return status.Errorf(codes.Internal, "%s: %v", p.what(), err)
}

// setupInterface makes (or completes, or repairs) one interface.
func (s *session) setupInterface(p *ifacePlan, is *ifaceState) error {
	if p.secondary() {
		if err := s.cniAdd(p, is); err != nil {
			return err
		}
	}
	if is.Pod == nil {
		var info *podInfo
		if err := inNS(s.st.NetNS, func() (err error) { info, err = readPod(p.podIface); return err }); err != nil {
			return err
		}
		if is.CNI != nil {
			info.DNS, info.Search = is.CNI.DNS, is.CNI.Search
		} else {
			info.DNS, info.DNS6, info.Search = readResolvConf(s.st.NetNS)
		}
		is.Pod = info
		switch {
		case p.mac != "":
			is.GuestMAC = p.mac
		case p.binding == BindingBridge:
			// KubeVirt's swap: the guest takes the pod interface's MAC, so that the network
			// sees the MAC it gave the pod; the pod interface takes a derived one.
			is.GuestMAC = info.MAC
		default:
			is.GuestMAC = derivedMAC(s.st.VMIID, p.name, "guest").String()
		}
		// Saved before anything changes the pod interface, so that Teardown can restore it.
		if err := s.save(); err != nil {
			return err
		}
	}
	var err error
	switch p.binding {
	case BindingBridge:
		err = s.bridgeBinding(p, is)
	case BindingMasquerade:
		err = s.masqueradeBinding(p, is)
	}
	if err != nil {
		return err
	}
	if !is.Done {
		is.Done = true
		return s.save()
	}
	return nil
}

// podSideMAC is the MAC the pod interface takes in the bridge binding when the guest takes
// its own; nil when it keeps its MAC.
func (s *session) podSideMAC(p *ifacePlan, is *ifaceState) net.HardwareAddr {
	if p.mac != "" {
		return nil
	}
	return derivedMAC(s.st.VMIID, p.name, "pod")
}

func (s *session) bridgeBinding(p *ifacePlan, is *ifaceState) error {
	alias := owner(s.st.VMIID)
	fakeIP := bridgeFakeIP(p.index)
	var ifindex int
	err := inNS(s.st.NetNS, func() error {
		br, err := ensureBridge(p.bridge, alias, is.Pod.MTU, derivedMAC(s.st.VMIID, p.name, "bridge"))
		if err != nil {
			return err
		}
		ifindex = br.Attrs().Index
		if err := ensureAddr(br, fakeIP.String()); err != nil {
			return err
		}
		if _, err := ensureTap(p.tap, alias, br, is.Pod.MTU, s.cfg.TapOwner, s.cfg.TapGroup, p.multiQueue()); err != nil {
			return err
		}
		return enslavePod(p.podIface, br, is.Pod, s.podSideMAC(p, is))
	})
	if err != nil {
		return err
	}
	return s.ensureDHCP(p, is, ifindex)
}

// hostnameRE is a DNS label (RFC 1123), what SetupRequest.hostname must be.
var hostnameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// ensureDHCP runs the interface's DHCP server, if its guest has an address to get.
func (s *session) ensureDHCP(p *ifacePlan, is *ifaceState, ifindex int) error {
	l, err := s.lease(p, is)
	if err != nil || l == nil {
		return err
	}
	key := p.key(s.st.VMIID)
	if err := s.d.dhcp.ensure(key, s.st.NetNS, s.st.NSID, p.bridge, ifindex, l); err != nil {
		return err
	}
	if p.binding != BindingMasquerade || len(is.Pod.Addrs6) == 0 {
		s.d.dhcp.stop6(key)
		return nil
	}
	// The dual-stack guest's IPv6: router advertisements (M flag, default route) and DHCPv6.
	l6 := masqueradeLease6(l.MAC, derivedMAC(s.st.VMIID, p.name, "bridge"), is.Pod)
	return s.d.dhcp.ensure6(key, s.st.NetNS, s.st.NSID, p.bridge, ifindex, l6)
}

func (s *session) lease(p *ifacePlan, is *ifaceState) (*lease, error) {
	mac, err := net.ParseMAC(is.GuestMAC)
	if err != nil {
		return nil, fmt.Errorf("guest MAC %q: %w", is.GuestMAC, err)
	}
	var l *lease
	if p.binding == BindingMasquerade {
		l = masqueradeLease(mac, is.Pod)
	} else if l, err = bridgeLease(mac, is.Pod, bridgeFakeIP(p.index).Addr()); err != nil || l == nil {
		return l, err
	}
	l.Hostname = s.st.Hostname
	l.Extra = is.DHCP
	return l, nil
}

// Sysctls the masquerade binding sets in the namespace.
const (
	sysctlForward4 = "net/ipv4/ip_forward"
	sysctlForward6 = "net/ipv6/conf/all/forwarding"
)

// sysctlAcceptRA is the key that keeps the pod interface taking router advertisements while
// the namespace forwards IPv6.
func sysctlAcceptRA(podIface string) string { return "net/ipv6/conf/" + podIface + "/accept_ra" }

// natRules returns the masquerade binding's NAT of each family it uses.
func natRules(p *ifacePlan, is *ifaceState) []masqNAT {
	m4 := masqNAT{family: nftables.TableFamilyIPv4, podIface: p.podIface, guest: netip.MustParsePrefix(masqGuest4).Addr(), ports: is.Ports}
	for _, a := range is.Pod.Addrs {
		if pf, err := netip.ParsePrefix(a); err == nil {
			m4.podAddrs = append(m4.podAddrs, pf.Addr())
		}
	}
	out := []masqNAT{m4}
	if len(is.Pod.Addrs6) > 0 {
		m6 := masqNAT{family: nftables.TableFamilyIPv6, podIface: p.podIface, guest: netip.MustParsePrefix(masqGuest6).Addr(), ports: is.Ports}
		for _, a := range is.Pod.Addrs6 {
			if pf, err := netip.ParsePrefix(a); err == nil {
				m6.podAddrs = append(m6.podAddrs, pf.Addr())
			}
		}
		out = append(out, m6)
	}
	return out
}

func (s *session) masqueradeBinding(p *ifacePlan, is *ifaceState) error {
	alias := owner(s.st.VMIID)
	ipv6 := len(is.Pod.Addrs6) > 0
	if is.Sysctls == nil {
		is.Sysctls = map[string]string{}
	}
	sysctls := []struct{ key, value string }{{sysctlForward4, "1"}}
	if ipv6 {
		// accept_ra=2 first: a forwarding namespace otherwise stops taking the router
		// advertisements its default route may come from.
		sysctls = append(sysctls, struct{ key, value string }{sysctlAcceptRA(p.podIface), "2"}, struct{ key, value string }{sysctlForward6, "1"})
	}
	changed := map[string]string{}
	var ifindex int
	err := inNS(s.st.NetNS, func() error {
		if _, err := netlink.LinkByName(p.podIface); err != nil {
			return status.Errorf(codes.FailedPrecondition, "pod interface %s is not in the sandbox network namespace", p.podIface)
		}
		br, err := ensureBridge(p.bridge, alias, is.Pod.MTU, derivedMAC(s.st.VMIID, p.name, "bridge"))
		if err != nil {
			return err
		}
		ifindex = br.Attrs().Index
		if err := ensureAddr(br, masqGateway4); err != nil {
			return err
		}
		if ipv6 {
			if err := ensureAddr(br, masqGateway6); err != nil {
				return err
			}
		}
		if _, err := ensureTap(p.tap, alias, br, is.Pod.MTU, s.cfg.TapOwner, s.cfg.TapGroup, p.multiQueue()); err != nil {
			return err
		}
		for _, sc := range sysctls {
			prev, err := writeSysctl(sc.key, sc.value)
			if err != nil {
				return err
			}
			if prev != sc.value {
				changed[sc.key] = prev
			}
		}
		for _, m := range natRules(p, is) {
			if err := applyNAT(m); err != nil {
				return err
			}
		}
		if !ipv6 {
			return deleteNAT(nftables.TableFamilyIPv6, p.podIface)
		}
		return nil
	})
	for k, v := range changed {
		if _, ok := is.Sysctls[k]; !ok {
			is.Sysctls[k] = v
		}
	}
	if len(changed) > 0 {
		if serr := s.save(); err == nil {
			err = serr
		}
	}
	if err != nil {
		return err
	}
	return s.ensureDHCP(p, is, ifindex)
}

// checkInterface reports what is not as Setup left it, and starts the DHCP server again when
// it does not run.
func (s *session) checkInterface(p *ifacePlan, is *ifaceState) error {
	if !is.Done || is.Pod == nil {
		return status.Error(codes.FailedPrecondition, "its Setup did not complete")
	}
	if is.CNI != nil {
		if err := s.cniCheck(is); err != nil {
			return err
		}
	}
	alias := owner(s.st.VMIID)
	var ifindex int
	err := inNS(s.st.NetNS, func() error {
		br, err := ownedLink(p.bridge, alias)
		if err != nil || br == nil {
			return missing("bridge %s", p.bridge, err)
		}
		ifindex = br.Attrs().Index
		if br.Attrs().Flags&net.FlagUp == 0 {
			return status.Errorf(codes.FailedPrecondition, "bridge %s is down", p.bridge)
		}
		tap, err := ownedLink(p.tap, alias)
		if err != nil || tap == nil {
			return missing("tap %s", p.tap, err)
		}
		if tap.Attrs().MasterIndex != ifindex {
			return status.Errorf(codes.FailedPrecondition, "tap %s is not a port of %s", p.tap, p.bridge)
		}
		if err := tapQueueMode(tap, p.multiQueue()); err != nil {
			return err
		}
		pod, err := netlink.LinkByName(p.podIface)
		if err != nil {
			return missing("pod interface %s", p.podIface, err)
		}
		var addrs []string
		switch p.binding {
		case BindingBridge:
			if pod.Attrs().MasterIndex != ifindex {
				return status.Errorf(codes.FailedPrecondition, "pod interface %s is not a port of %s", p.podIface, p.bridge)
			}
			for _, a := range is.Pod.Addrs {
				if has, err := hasAddr(pod, a); err != nil || has {
					return status.Errorf(codes.FailedPrecondition, "pod interface %s has the guest's address %s again", p.podIface, a)
				}
			}
			addrs = []string{bridgeFakeIP(p.index).String()}
		case BindingMasquerade:
			addrs = []string{masqGateway4}
			if len(is.Pod.Addrs6) > 0 {
				addrs = append(addrs, masqGateway6)
			}
			for k := range is.Sysctls {
				if v, err := readSysctl(k); err != nil || v != sysctlWant(k) {
					return status.Errorf(codes.FailedPrecondition, "sysctl %s is %q, not %q", strings.ReplaceAll(k, "/", "."), v, sysctlWant(k))
				}
			}
			for _, m := range natRules(p, is) {
				if err := checkNAT(m); err != nil {
					return status.Error(codes.FailedPrecondition, err.Error())
				}
			}
		}
		for _, a := range addrs {
			if has, err := hasAddr(br, a); err != nil || !has {
				return status.Errorf(codes.FailedPrecondition, "bridge %s lacks its address %s", p.bridge, a)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return s.ensureDHCP(p, is, ifindex)
}

// sysctlWant is the value the masquerade binding sets key to.
func sysctlWant(key string) string {
	if strings.HasSuffix(key, "/accept_ra") {
		return "2"
	}
	return "1"
}

// missing is the FailedPrecondition of a missing (or foreign) link.
func missing(format, name string, err error) error {
	if err != nil && !isNotFound(err) {
		return status.Errorf(codes.FailedPrecondition, format+": %v", name, err)
	}
	return status.Errorf(codes.FailedPrecondition, format+" is missing", name)
}
