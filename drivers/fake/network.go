package fake

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// NetworkConfig is the JSON configuration of the fake network driver.
type NetworkConfig struct {
	// MTU is the MTU of every interface; 0 means 1500.
	MTU uint32 `json:"mtu,omitempty"`
}

// Network is the fake network driver. It makes nothing in any namespace: Setup computes, from
// the VMI id and the interface name, a stable locally administered MAC (02:...), a tap name and
// an address in 10.244.0.0/16, and remembers them for Check until Teardown.
type Network struct {
	base

	mu     sync.Mutex
	cfg    NetworkConfig
	setups map[string]*networkSetup
}

// networkSetup is what Setup made for one VMI.
type networkSetup struct {
	interfaces []*networkv1.Interface
	results    []*networkv1.InterfaceResult
}

var (
	_ driver.Network        = (*Network)(nil)
	_ driver.NetworkChecker = (*Network)(nil)
)

// Bindings the fake network driver supports.
var bindings = []string{"bridge", "masquerade"}

// NewNetwork returns a fake network driver with the default configuration.
func NewNetwork() *Network {
	return &Network{
		base:   newBase(basev1.Kind_KIND_NETWORK, "simulated network: interfaces are computed, nothing is made in the sandbox"),
		setups: map[string]*networkSetup{},
	}
}

// Capabilities implements driver.Driver: Check, the bridge and masquerade bindings, and
// multi-queue taps (none is made).
func (n *Network) Capabilities(context.Context) (*basev1.Capabilities, error) {
	return &basev1.Capabilities{
		Features:       []basev1.Feature{basev1.Feature_FEATURE_NETWORK_CHECK},
		Bindings:       slices.Clone(bindings),
		MultiQueueTaps: true,
	}, nil
}

// Fingerprint implements driver.Driver.
func (n *Network) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	return n.fingerprint(ctx, send, func() *basev1.FingerprintResponse {
		return healthy("simulated network: nothing is made in the sandbox")
	})
}

// Configure implements driver.Driver. The configuration is a NetworkConfig.
func (n *Network) Configure(_ context.Context, req *basev1.ConfigureRequest) error {
	var cfg NetworkConfig
	if err := decodeConfig(req.GetConfig(), &cfg); err != nil {
		return err
	}
	if cfg.MTU != 0 && (cfg.MTU < 68 || cfg.MTU > 65535) {
		return invalid("config: mtu %d is not between 68 and 65535", cfg.MTU)
	}
	n.mu.Lock()
	n.cfg = cfg
	n.mu.Unlock()
	return nil
}

// Setup implements driver.Network. It is a pure function of the request (and the MTU), so it
// is idempotent; an invalid interface makes it fail before it remembers anything.
func (n *Network) Setup(_ context.Context, req *networkv1.SetupRequest) (*networkv1.SetupResponse, error) {
	if req.GetVmiId() == "" {
		return nil, invalid("vmi_id: required")
	}
	if err := validateInterfaces(req.GetInterfaces()); err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	mtu := n.cfg.MTU
	if mtu == 0 {
		mtu = 1500
	}
	s := &networkSetup{}
	secondary := 0
	for _, iface := range req.GetInterfaces() {
		podIface := "eth0"
		if iface.GetNetworkName() != "" {
			secondary++
			podIface = fmt.Sprintf("net%d", secondary)
		}
		s.interfaces = append(s.interfaces, proto.CloneOf(iface))
		s.results = append(s.results, interfaceResult(req.GetVmiId(), iface, podIface, mtu))
	}
	n.setups[req.GetVmiId()] = s
	return &networkv1.SetupResponse{Interfaces: cloneResults(s.results)}, nil
}

func validateInterfaces(ifaces []*networkv1.Interface) error {
	names := map[string]bool{}
	for i, iface := range ifaces {
		field := fmt.Sprintf("interfaces[%d]", i)
		if iface.GetName() == "" {
			return invalid("%s.name: required", field)
		}
		field = fmt.Sprintf("interfaces[%d] (%s)", i, iface.GetName())
		if names[iface.GetName()] {
			return invalid("%s: duplicate interface name", field)
		}
		names[iface.GetName()] = true
		if !slices.Contains(bindings, iface.GetBinding()) {
			return invalid("%s: binding %q is not supported (want one of %v)", field, iface.GetBinding(), bindings)
		}
		if mac := iface.GetMac(); mac != "" {
			hw, err := net.ParseMAC(mac)
			if err != nil || len(hw) != 6 || hw[0]&1 == 1 {
				return invalid("%s: mac %q is not a unicast MAC address", field, mac)
			}
		}
		if q := iface.GetQueues(); q > 256 {
			return invalid("%s: queues %d is more than a tap has (256)", field, q)
		}
		if len(iface.GetPorts()) > 0 && iface.GetBinding() != "masquerade" {
			return invalid("%s: ports are only forwarded with the masquerade binding", field)
		}
		for j, p := range iface.GetPorts() {
			if p.GetProtocol() != "" && p.GetProtocol() != "TCP" && p.GetProtocol() != "UDP" {
				return invalid("%s.ports[%d]: protocol %q is not TCP or UDP", field, j, p.GetProtocol())
			}
			if p.GetPort() < 1 || p.GetPort() > 65535 {
				return invalid("%s.ports[%d]: port %d is not between 1 and 65535", field, j, p.GetPort())
			}
		}
	}
	return nil
}

// interfaceResult derives what Setup returns for one interface from the VMI id and the
// interface name alone.
func interfaceResult(vmiID string, iface *networkv1.Interface, podIface string, mtu uint32) *networkv1.InterfaceResult {
	sum := sha256.Sum256([]byte(vmiID + "/" + iface.GetName()))
	mac := iface.GetMac()
	if mac == "" {
		// 02: a locally administered unicast address.
		mac = net.HardwareAddr{0x02, sum[0], sum[1], sum[2], sum[3], sum[4]}.String()
	}
	return &networkv1.InterfaceResult{
		Name:         iface.GetName(),
		TapName:      fmt.Sprintf("tap%x", sum[5:9]),
		Mac:          mac,
		IpAddresses:  []string{fmt.Sprintf("10.244.%d.%d/24", sum[9], 2+sum[10]%252)},
		Mtu:          mtu,
		PodInterface: podIface,
	}
}

// Check implements driver.NetworkChecker: FailedPrecondition when the VMI is not set up or an
// interface asked about is not as Setup made it.
func (n *Network) Check(_ context.Context, req *networkv1.CheckRequest) (*networkv1.CheckResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s, ok := n.setups[req.GetVmiId()]
	if !ok {
		return nil, precondition("VMI %q is not set up", req.GetVmiId())
	}
	if len(req.GetInterfaces()) == 0 {
		return &networkv1.CheckResponse{Interfaces: cloneResults(s.results)}, nil
	}
	resp := &networkv1.CheckResponse{}
	for _, want := range req.GetInterfaces() {
		i := slices.IndexFunc(s.interfaces, func(have *networkv1.Interface) bool { return have.GetName() == want.GetName() })
		if i < 0 {
			return nil, precondition("interface %q of VMI %q is not set up", want.GetName(), req.GetVmiId())
		}
		if have := s.interfaces[i]; have.GetBinding() != want.GetBinding() || (want.GetMac() != "" && want.GetMac() != s.results[i].GetMac()) {
			return nil, precondition("interface %q of VMI %q is not as set up", want.GetName(), req.GetVmiId())
		}
		resp.Interfaces = append(resp.Interfaces, proto.CloneOf(s.results[i]))
	}
	return resp, nil
}

// Teardown implements driver.Network. It forgets the VMI; it always succeeds.
func (n *Network) Teardown(_ context.Context, req *networkv1.TeardownRequest) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.setups, req.GetVmiId())
	return nil
}

func cloneResults(rs []*networkv1.InterfaceResult) []*networkv1.InterfaceResult {
	out := make([]*networkv1.InterfaceResult, len(rs))
	for i, r := range rs {
		out[i] = proto.CloneOf(r)
	}
	return out
}
