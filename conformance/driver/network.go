package conformance

import (
	"net"
	"net/netip"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// Network runs the conformance checks of a network driver as subtests of t: the checks of
// every driver, then
//
//	Setup/Idempotent, Setup/StableMAC, Setup/RequestedMAC, Setup/UnknownBinding
//	Setup/DHCPOptions, Setup/BadDHCPOptions   (interface option "dhcp-options")
//	Teardown/Twice, Teardown/WithoutSetup
//	Check/AfterSetup, Check/NotSetUp     (FEATURE_NETWORK_CHECK)
//
// Each VMI it sets up has one interface, "default", on the pod network, with the first binding
// the driver declares, in the namespace from WithNetNS.
func Network(t T, f NetworkFactory, opts ...Option) {
	t.Helper()
	s := &netSuite{newSuite(t, basev1.Kind_KIND_NETWORK, func(t T) driver.Driver { return nilIfNil(f(t)) }, opts)}
	s.baseChecks(t)
	t.Run("Setup", func(t T) {
		t.Run("Idempotent", s.checkSetupIdempotent)
		t.Run("StableMAC", s.checkSetupStableMAC)
		t.Run("RequestedMAC", s.checkSetupRequestedMAC)
		t.Run("UnknownBinding", s.checkSetupUnknownBinding)
		t.Run("DHCPOptions", s.checkSetupDHCPOptions)
		t.Run("BadDHCPOptions", s.checkSetupBadDHCPOptions)
	})
	t.Run("Teardown", func(t T) {
		t.Run("Twice", s.checkTeardownTwice)
		t.Run("WithoutSetup", s.checkTeardownWithoutSetup)
	})
	t.Run("Check", func(t T) {
		t.Run("AfterSetup", s.checkCheckAfterSetup)
		t.Run("NotSetUp", s.checkCheckNotSetUp)
	})
}

type netSuite struct{ *suite }

// network returns the configured network driver under test and its capabilities.
func (s *netSuite) network(t T) (driver.Network, *basev1.Capabilities) {
	t.Helper()
	d := s.driver(t).(driver.Network)
	return d, s.capabilities(t, d)
}

// binding returns the binding the checks use, skipping the check when there is none.
func binding(t T, caps *basev1.Capabilities) string {
	t.Helper()
	if len(caps.GetBindings()) == 0 {
		t.Skipf("driver declares no interface binding (Capabilities.bindings)")
	}
	return caps.GetBindings()[0]
}

// vmi is one VMI's request, reused for Setup, Check and Teardown.
type vmi struct {
	id         string
	netns      string
	interfaces []*networkv1.Interface
}

func (s *netSuite) newVMI(t T, caps *basev1.Capabilities) *vmi {
	t.Helper()
	v := &vmi{id: newID(), interfaces: []*networkv1.Interface{{Name: "default", Binding: binding(t, caps)}}}
	if s.opts.NetNS != nil {
		v.netns = s.opts.NetNS(t)
	}
	return v
}

func (v *vmi) setup() *networkv1.SetupRequest {
	return &networkv1.SetupRequest{VmiId: v.id, NetnsPath: v.netns, Interfaces: v.interfaces}
}

func (v *vmi) check() *networkv1.CheckRequest {
	return &networkv1.CheckRequest{VmiId: v.id, NetnsPath: v.netns, Interfaces: v.interfaces}
}

func (v *vmi) teardown() *networkv1.TeardownRequest {
	return &networkv1.TeardownRequest{VmiId: v.id, NetnsPath: v.netns, Interfaces: v.interfaces}
}

// setup sets up v, which is torn down when the check ends, and checks the result's form.
func (s *netSuite) setup(t T, d driver.Network, v *vmi) *networkv1.SetupResponse {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := s.cleanupCtx()
		defer cancel()
		if err := d.Teardown(ctx, v.teardown()); err != nil {
			t.Logf("cleanup: Teardown %s: %s", v.id, describe(err))
		}
	})
	resp, err := d.Setup(s.ctx(t), v.setup())
	if err != nil {
		t.Fatalf("Setup: %s", describe(err))
	}
	checkResults(t, v, resp.GetInterfaces())
	return resp
}

// checkResults checks that results has one well-formed result per interface of v.
func checkResults(t T, v *vmi, results []*networkv1.InterfaceResult) {
	t.Helper()
	if len(results) != len(v.interfaces) {
		t.Fatalf("Setup returned %d interfaces for %d asked: %v", len(results), len(v.interfaces), results)
	}
	for i, r := range results {
		if r.GetName() != v.interfaces[i].GetName() {
			t.Errorf("Setup result %d is of interface %q, want %q (results follow the order of the request)", i, r.GetName(), v.interfaces[i].GetName())
		}
		if hw, err := net.ParseMAC(r.GetMac()); err != nil || len(hw) != 6 || hw[0]&1 == 1 {
			t.Errorf("interface %q: MAC %q is not a unicast MAC address", r.GetName(), r.GetMac())
		}
		if n := len(r.GetTapName()); n == 0 || n > 15 {
			t.Errorf("interface %q: tap name %q is not a Linux interface name (1 to 15 characters)", r.GetName(), r.GetTapName())
		}
		for _, ip := range r.GetIpAddresses() {
			if _, err := netip.ParsePrefix(ip); err != nil {
				t.Errorf("interface %q: address %q is not in CIDR form", r.GetName(), ip)
			}
		}
	}
}

// checkSetupIdempotent: Setup of a set-up VMI succeeds with the same result.
func (s *netSuite) checkSetupIdempotent(t T) {
	d, caps := s.network(t)
	v := s.newVMI(t, caps)
	first := s.setup(t, d, v)
	second, err := d.Setup(s.ctx(t), v.setup())
	if err != nil {
		t.Fatalf("Setup of a set-up VMI: %s, want success", describe(err))
	}
	if !proto.Equal(first, second) {
		t.Errorf("Setup of a set-up VMI returned another result:\nfirst:  %v\nsecond: %v", first, second)
	}
}

// checkSetupStableMAC: a VMI's interface gets the same MAC after Teardown and Setup again, and
// another VMI's interface of the same name another MAC.
func (s *netSuite) checkSetupStableMAC(t T) {
	d, caps := s.network(t)
	v := s.newVMI(t, caps)
	first := s.setup(t, d, v).GetInterfaces()[0].GetMac()
	if err := d.Teardown(s.ctx(t), v.teardown()); err != nil {
		t.Fatalf("Teardown: %s", describe(err))
	}
	again := s.setup(t, d, v).GetInterfaces()[0].GetMac()
	if again != first {
		t.Errorf("interface %q of VMI %s got MAC %s, then %s after Teardown and Setup: MACs must be stable per (vmi, interface)", v.interfaces[0].GetName(), v.id, first, again)
	}
	other := s.newVMI(t, caps)
	if mac := s.setup(t, d, other).GetInterfaces()[0].GetMac(); mac == first {
		t.Errorf("interfaces %q of two VMIs got the same MAC %s", v.interfaces[0].GetName(), mac)
	}
}

// checkSetupRequestedMAC: an interface that asks for a MAC gets it.
func (s *netSuite) checkSetupRequestedMAC(t T) {
	d, caps := s.network(t)
	v := s.newVMI(t, caps)
	const want = "02:00:00:c0:ff:ee"
	v.interfaces[0].Mac = want
	got := s.setup(t, d, v).GetInterfaces()[0].GetMac()
	if hw, err := net.ParseMAC(got); err != nil || hw.String() != want {
		t.Errorf("interface %q asked for MAC %s and got %q", v.interfaces[0].GetName(), want, got)
	}
}

// checkSetupUnknownBinding: an interface with a binding the driver does not know is
// InvalidArgument naming the interface, and the interfaces before it are not left set up.
func (s *netSuite) checkSetupUnknownBinding(t T) {
	d, caps := s.network(t)
	v := s.newVMI(t, caps)
	const bad = "conformance-bad"
	v.interfaces = append(v.interfaces, &networkv1.Interface{Name: bad, Binding: "conformance-no-such-binding"})
	t.Cleanup(func() {
		ctx, cancel := s.cleanupCtx()
		defer cancel()
		_ = d.Teardown(ctx, v.teardown())
	})
	_, err := d.Setup(s.ctx(t), v.setup())
	what := "Setup of an interface with an unknown binding"
	if expectCode(t, err, codes.InvalidArgument, what) {
		expectMessageNames(t, err, what, bad)
	}
	if driver.HasFeature(caps, basev1.Feature_FEATURE_NETWORK_CHECK) {
		c := optional[driver.NetworkChecker](t, d, basev1.Feature_FEATURE_NETWORK_CHECK)
		_, err := c.Check(s.ctx(t), v.check())
		expectCode(t, err, codes.FailedPrecondition, "Check after a failed Setup (it must undo what it made)")
	}
	expectCode(t, d.Teardown(s.ctx(t), v.teardown()), codes.OK, "Teardown after a failed Setup")
}

// requireInterfaceOption skips the check unless the driver declares the interface option.
func requireInterfaceOption(t T, caps *basev1.Capabilities, name string) {
	t.Helper()
	if !slices.Contains(caps.GetInterfaceOptions(), name) {
		t.Skipf("driver does not declare the interface option %q (Capabilities.interface_options)", name)
	}
}

// conformanceDHCPOptions are DHCP options of every kind, all valid.
func conformanceDHCPOptions() *networkv1.DHCPOptions {
	return &networkv1.DHCPOptions{
		BootFileName: "conformance.efi", TftpServerName: "192.0.2.69", NtpServers: []string{"192.0.2.123"},
		PrivateOptions: []*networkv1.DHCPPrivateOption{{Code: 224, Value: "conformance"}, {Code: 254, Value: ""}},
	}
}

// checkSetupDHCPOptions: an interface with valid DHCP options is set up, and again with other
// ones (what the guest receives is the driver's own tests' to show: the kit runs no DHCP
// client).
func (s *netSuite) checkSetupDHCPOptions(t T) {
	d, caps := s.network(t)
	requireInterfaceOption(t, caps, driver.InterfaceDHCPOptions)
	v := s.newVMI(t, caps)
	v.interfaces[0].DhcpOptions = conformanceDHCPOptions()
	first := s.setup(t, d, v)
	v.interfaces[0].DhcpOptions = &networkv1.DHCPOptions{BootFileName: "other.efi"}
	again, err := d.Setup(s.ctx(t), v.setup())
	if err != nil {
		t.Fatalf("Setup with other DHCP options: %s", describe(err))
	}
	if !proto.Equal(first, again) {
		t.Errorf("Setup with other DHCP options returned other results:\nfirst: %v\nagain: %v", first, again)
	}
}

// checkSetupBadDHCPOptions: DHCP options the contract refuses (a private option code outside
// 224-254, an NTP server that is not an IPv4 address) are InvalidArgument naming the interface.
func (s *netSuite) checkSetupBadDHCPOptions(t T) {
	d, caps := s.network(t)
	requireInterfaceOption(t, caps, driver.InterfaceDHCPOptions)
	for what, o := range map[string]*networkv1.DHCPOptions{
		"a private option code of 100": {PrivateOptions: []*networkv1.DHCPPrivateOption{{Code: 100, Value: "x"}}},
		"an IPv6 NTP server":           {NtpServers: []string{"2001:db8::123"}},
	} {
		v := s.newVMI(t, caps)
		v.interfaces[0].DhcpOptions = o
		t.Cleanup(func() {
			ctx, cancel := s.cleanupCtx()
			defer cancel()
			_ = d.Teardown(ctx, v.teardown())
		})
		_, err := d.Setup(s.ctx(t), v.setup())
		what := "Setup of an interface with " + what
		if expectCode(t, err, codes.InvalidArgument, what) {
			expectMessageNames(t, err, what, v.interfaces[0].GetName())
		}
	}
}

// checkTeardownTwice: Teardown succeeds twice.
func (s *netSuite) checkTeardownTwice(t T) {
	d, caps := s.network(t)
	v := s.newVMI(t, caps)
	s.setup(t, d, v)
	expectCode(t, d.Teardown(s.ctx(t), v.teardown()), codes.OK, "Teardown of a set-up VMI")
	expectCode(t, d.Teardown(s.ctx(t), v.teardown()), codes.OK, "Teardown of a torn-down VMI")
	if driver.HasFeature(caps, basev1.Feature_FEATURE_NETWORK_CHECK) {
		c := optional[driver.NetworkChecker](t, d, basev1.Feature_FEATURE_NETWORK_CHECK)
		_, err := c.Check(s.ctx(t), v.check())
		expectCode(t, err, codes.FailedPrecondition, "Check after Teardown")
	}
}

// checkTeardownWithoutSetup: Teardown of a VMI never set up succeeds.
func (s *netSuite) checkTeardownWithoutSetup(t T) {
	d, caps := s.network(t)
	v := s.newVMI(t, caps)
	expectCode(t, d.Teardown(s.ctx(t), v.teardown()), codes.OK, "Teardown of a VMI never set up")
}

// checkCheckAfterSetup: Check of a set-up VMI succeeds and reports what Setup made.
func (s *netSuite) checkCheckAfterSetup(t T) {
	d, caps := s.network(t)
	requireFeature(t, caps, basev1.Feature_FEATURE_NETWORK_CHECK)
	c := optional[driver.NetworkChecker](t, d, basev1.Feature_FEATURE_NETWORK_CHECK)
	v := s.newVMI(t, caps)
	made := s.setup(t, d, v).GetInterfaces()
	resp, err := c.Check(s.ctx(t), v.check())
	if err != nil {
		t.Fatalf("Check of a set-up VMI: %s, want success", describe(err))
	}
	got := map[string]*networkv1.InterfaceResult{}
	for _, r := range resp.GetInterfaces() {
		got[r.GetName()] = r
	}
	for _, want := range made {
		r, ok := got[want.GetName()]
		switch {
		case !ok:
			t.Errorf("Check does not report interface %q", want.GetName())
		case r.GetMac() != want.GetMac() || r.GetTapName() != want.GetTapName():
			t.Errorf("Check reports interface %q with MAC %s and tap %s; Setup made MAC %s and tap %s", want.GetName(), r.GetMac(), r.GetTapName(), want.GetMac(), want.GetTapName())
		}
	}
}

// checkCheckNotSetUp: Check of a VMI never set up is FailedPrecondition.
func (s *netSuite) checkCheckNotSetUp(t T) {
	d, caps := s.network(t)
	requireFeature(t, caps, basev1.Feature_FEATURE_NETWORK_CHECK)
	c := optional[driver.NetworkChecker](t, d, basev1.Feature_FEATURE_NETWORK_CHECK)
	v := s.newVMI(t, caps)
	_, err := c.Check(s.ctx(t), v.check())
	expectCode(t, err, codes.FailedPrecondition, "Check of a VMI never set up")
}
