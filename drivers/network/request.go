package network

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// maxLinkName is the longest Linux interface name (IFNAMSIZ - 1).
const maxLinkName = 15

// maxTapQueues is the most queues a Linux tap has (the kernel's MAX_TAP_QUEUES).
const maxTapQueues = 256

// Address plan of the masquerade binding (KubeVirt's defaults: vmNetworkCIDR 10.0.2.0/24 and
// vmIPv6NetworkCIDR fd10:0:2::/120).
const (
	masqGateway4 = "10.0.2.1/24"
	masqGuest4   = "10.0.2.2/24"
	masqGateway6 = "fd10:0:2::1/120"
	masqGuest6   = "fd10:0:2::2/120"
)

// ifacePlan is one interface of a request, with every name Setup derives for it.
type ifacePlan struct {
	// index is the interface's position in the request.
	index   int
	name    string
	binding string
	// network is the secondary network's name; "" for the pod network.
	network string
	// mac is the requested guest MAC, "" when none.
	mac   string
	ports []*networkv1.Port
	// queues is Interface.queues: above 1, the tap is multi-queue.
	queues uint32
	// dhcp is the interface's extra DHCP options, nil for none.
	dhcp *dhcpOptions

	// podIface is the sandbox interface: the configured pod interface, or net1, net2, ...
	podIface string
	bridge   string
	tap      string
}

// multiQueue reports whether the interface's tap is multi-queue.
func (p *ifacePlan) multiQueue() bool { return p.queues > 1 }

// key identifies the interface of a VMI in the driver's maps.
func (p *ifacePlan) key(vmiID string) string { return vmiID + "/" + p.name }

// secondary reports whether the interface is on a secondary network (run with CNI).
func (p *ifacePlan) secondary() bool { return p.network != "" }

// what names the interface in error messages.
func (p *ifacePlan) what() string { return fmt.Sprintf("interface %q", p.name) }

// invalid is an InvalidArgument status error.
func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// planInterfaces checks the interfaces of a Setup or Check request and derives their names.
// Every error is InvalidArgument and names the interface.
func planInterfaces(ifaces []*networkv1.Interface, podIface string) ([]*ifacePlan, error) {
	var plans []*ifacePlan
	names := map[string]bool{}
	podNetwork := ""
	secondary := 0
	var err error
	for i, iface := range ifaces {
		if iface.GetName() == "" {
			return nil, invalid("interfaces[%d]: name is required", i)
		}
		p := &ifacePlan{
			index: i, name: iface.GetName(), binding: iface.GetBinding(), network: iface.GetNetworkName(),
			mac: iface.GetMac(), ports: iface.GetPorts(), queues: iface.GetQueues(),
		}
		if names[p.name] {
			return nil, invalid("%s: more than one interface has this name", p.what())
		}
		names[p.name] = true
		if !slices.Contains(Bindings, p.binding) {
			return nil, invalid("%s: binding %q is not supported (want one of %s)", p.what(), p.binding, strings.Join(Bindings, ", "))
		}
		if p.mac != "" {
			hw, err := net.ParseMAC(p.mac)
			if err != nil || len(hw) != 6 || hw[0]&1 == 1 {
				return nil, invalid("%s: mac %q is not a unicast MAC address", p.what(), p.mac)
			}
			p.mac = hw.String()
		}
		if p.queues > maxTapQueues {
			return nil, invalid("%s: queues %d is more than a tap has (%d)", p.what(), p.queues, maxTapQueues)
		}
		if err := checkPorts(p); err != nil {
			return nil, err
		}
		if p.dhcp, err = parseDHCPOptions(iface.GetDhcpOptions()); err != nil {
			return nil, invalid("%s: dhcpOptions.%v", p.what(), err)
		}
		if p.secondary() {
			if err := checkNetworkName(p.network); err != nil {
				return nil, invalid("%s: network_name %q: %v", p.what(), p.network, err)
			}
			if p.binding == BindingMasquerade {
				return nil, invalid("%s: the masquerade binding is only for the pod network, not for secondary network %q", p.what(), p.network)
			}
			secondary++
			p.podIface = fmt.Sprintf("net%d", secondary)
		} else {
			if podNetwork != "" {
				return nil, invalid("%s: interface %q is already on the pod network; a second interface needs network_name (a secondary network)", p.what(), podNetwork)
			}
			podNetwork = p.name
			p.podIface = podIface
		}
		p.bridge = linkName("k6t-", p.podIface)
		p.tap = linkName("tap", p.podIface)
		plans = append(plans, p)
	}
	return plans, nil
}

func checkPorts(p *ifacePlan) error {
	if len(p.ports) > 0 && p.binding != BindingMasquerade {
		return invalid("%s: ports are forwarded only with the masquerade binding, not with %q", p.what(), p.binding)
	}
	for j, port := range p.ports {
		switch port.GetProtocol() {
		case "", "TCP", "UDP":
		default:
			return invalid("%s: ports[%d]: protocol %q is not TCP or UDP", p.what(), j, port.GetProtocol())
		}
		if port.GetPort() < 1 || port.GetPort() > 65535 {
			return invalid("%s: ports[%d]: port %d is not between 1 and 65535", p.what(), j, port.GetPort())
		}
	}
	return nil
}

// checkNetworkName accepts "name" and "namespace/name" (multus networkName).
func checkNetworkName(s string) error {
	parts := strings.Split(s, "/")
	if len(parts) > 2 {
		return fmt.Errorf("want NAME or NAMESPACE/NAME")
	}
	for _, p := range parts {
		if p == "" {
			return fmt.Errorf("want NAME or NAMESPACE/NAME")
		}
	}
	return nil
}

// linkName is prefix+base when that is a valid interface name, else prefix and a hash of base.
func linkName(prefix, base string) string {
	if n := prefix + base; len(n) <= maxLinkName {
		return n
	}
	sum := sha256.Sum256([]byte(base))
	return prefix + hex.EncodeToString(sum[:])[:maxLinkName-len(prefix)]
}

// validLinkName reports whether s can name a Linux interface.
func validLinkName(s string) error {
	if s == "" || len(s) > maxLinkName || s == "." || s == ".." || strings.ContainsAny(s, "/: \t\n") {
		return fmt.Errorf("%q is not an interface name (1 to %d characters, no '/', ':' or space)", s, maxLinkName)
	}
	return nil
}

// derivedMAC is a locally administered unicast MAC, stable per (vmi, interface, purpose).
func derivedMAC(vmiID, iface, purpose string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("kubevisor/" + vmiID + "/" + iface + "/" + purpose))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

// owner is the alias of every link Setup makes for a VMI.
func owner(vmiID string) string { return "kubevisor:" + vmiID }
