package network

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"

	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// vmiState is what Setup found and made for one VMI, kept in a file of the state directory
// from before Setup changes anything until Teardown has removed it all.
type vmiState struct {
	VMIID string `json:"vmiId"`
	NetNS string `json:"netns"`
	// NSID is the identity of the namespace Setup worked in.
	NSID nsID `json:"nsId"`
	// Hostname is the guest's host name (SetupRequest.hostname), sent in DHCP answers.
	Hostname   string        `json:"hostname,omitempty"`
	Interfaces []*ifaceState `json:"interfaces"`
}

// ifaceState is one interface of a vmiState.
type ifaceState struct {
	Name     string            `json:"name"`
	Binding  string            `json:"binding"`
	Network  string            `json:"network,omitempty"`
	MAC      string            `json:"requestedMac,omitempty"`
	Ports    []portState       `json:"ports,omitempty"`
	PodIface string            `json:"podInterface"`
	Bridge   string            `json:"bridge"`
	Tap      string            `json:"tap"`
	GuestMAC string            `json:"guestMac,omitempty"`
	Pod      *podInfo          `json:"pod,omitempty"`
	CNI      *cniState         `json:"cni,omitempty"`
	Sysctls  map[string]string `json:"sysctls,omitempty"`
	// MultiQueue says the tap is multi-queue (Interface.queues above 1); a state written
	// before the field has single-queue taps.
	MultiQueue bool `json:"multiQueue,omitempty"`
	// DHCP is the interface's extra DHCP options (Interface.dhcp_options) of the last Setup.
	DHCP *dhcpOptions `json:"dhcpOptions,omitempty"`
	// Done is set once the interface was set up completely.
	Done bool `json:"done,omitempty"`
}

type portState struct {
	Protocol string `json:"protocol"`
	Port     int32  `json:"port"`
}

// podInfo is the pod interface as Setup found it, before it changed anything.
type podInfo struct {
	MAC string `json:"mac"`
	MTU int    `json:"mtu"`
	// Addrs are its IPv4 addresses (CIDR), Addrs6 its global IPv6 addresses.
	Addrs  []string `json:"addrs,omitempty"`
	Addrs6 []string `json:"addrs6,omitempty"`
	// Routes are its IPv4 routes in the main table, but those the kernel adds for an address.
	Routes []routeInfo `json:"routes,omitempty"`
	// DNS (IPv4), DNS6 (IPv6) and Search come from the sandbox's resolv.conf.
	DNS    []string `json:"dns,omitempty"`
	DNS6   []string `json:"dns6,omitempty"`
	Search []string `json:"search,omitempty"`
}

type routeInfo struct {
	// Dst is the destination (CIDR); "" is the default route.
	Dst      string `json:"dst,omitempty"`
	Gw       string `json:"gw,omitempty"`
	Src      string `json:"src,omitempty"`
	Scope    uint8  `json:"scope,omitempty"`
	Priority int    `json:"priority,omitempty"`
	Protocol int    `json:"protocol,omitempty"`
}

// cniState is the CNI attachment of a secondary network's interface.
type cniState struct {
	// List is the network list's name, File the file it came from, Config its bytes as run.
	List   string `json:"list"`
	File   string `json:"file,omitempty"`
	Config []byte `json:"config"`
	IfName string `json:"ifName"`
	// Added is set once ADD succeeded; DEL runs whenever ADD may have run.
	Added bool `json:"added,omitempty"`
	// DNS and Search are the name servers and search domains of the ADD result.
	DNS    []string `json:"dns,omitempty"`
	Search []string `json:"search,omitempty"`
}

func newIfaceState(p *ifacePlan) *ifaceState {
	s := &ifaceState{
		Name: p.name, Binding: p.binding, Network: p.network, MAC: p.mac,
		PodIface: p.podIface, Bridge: p.bridge, Tap: p.tap, MultiQueue: p.multiQueue(), DHCP: p.dhcp,
	}
	for _, port := range p.ports {
		proto := port.GetProtocol()
		if proto == "" {
			proto = "TCP"
		}
		s.Ports = append(s.Ports, portState{Protocol: proto, Port: port.GetPort()})
	}
	return s
}

// sameAs reports whether s was set up from the interface p describes.
func (s *ifaceState) sameAs(p *ifacePlan) bool {
	n := newIfaceState(p)
	return s.Name == n.Name && s.Binding == n.Binding && s.Network == n.Network && s.MAC == n.MAC &&
		slices.Equal(s.Ports, n.Ports) && s.PodIface == n.PodIface && s.MultiQueue == n.MultiQueue
}

// result is what Setup returns for the interface.
func (s *ifaceState) result() *networkv1.InterfaceResult {
	r := &networkv1.InterfaceResult{Name: s.Name, TapName: s.Tap, Mac: s.GuestMAC, PodInterface: s.PodIface}
	if s.Pod == nil {
		return r
	}
	r.Mtu = uint32(s.Pod.MTU)
	switch s.Binding {
	case BindingBridge:
		r.IpAddresses = slices.Clone(s.Pod.Addrs)
	case BindingMasquerade:
		r.IpAddresses = []string{masqGuest4}
		if len(s.Pod.Addrs6) > 0 {
			r.IpAddresses = append(r.IpAddresses, masqGuest6)
		}
		// Behind NAT the guest is reached at the pod's addresses (declared ports, or all).
		r.ReachableAddresses = append(slices.Clone(s.Pod.Addrs), s.Pod.Addrs6...)
	}
	return r
}

// stateStore keeps one JSON file per VMI in a directory.
type stateStore struct{ dir string }

func (s stateStore) path(vmiID string) string {
	return filepath.Join(s.dir, "vmis", url.PathEscape(vmiID)+".json")
}

// load returns the VMI's state, nil when there is none.
func (s stateStore) load(vmiID string) (*vmiState, error) {
	b, err := os.ReadFile(s.path(vmiID))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	var st vmiState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("parse state %s: %w", s.path(vmiID), err)
	}
	return &st, nil
}

// save writes the VMI's state atomically.
func (s stateStore) save(st *vmiState) error {
	path := s.path(st.VMIID)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	return nil
}

// remove deletes the VMI's state; a missing one is fine.
func (s stateStore) remove(vmiID string) error {
	if err := os.Remove(s.path(vmiID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove state: %w", err)
	}
	return nil
}
