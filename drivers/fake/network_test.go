package fake_test

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	"github.com/kubevisor/kubevisor/drivers/fake"
)

func TestNetworkResults(t *testing.T) {
	req := &networkv1.SetupRequest{VmiId: "uid-1", Interfaces: []*networkv1.Interface{
		{Name: "default", Binding: "masquerade", Ports: []*networkv1.Port{{Name: "http", Port: 80}, {Protocol: "UDP", Port: 53}}},
		{Name: "secondary", Binding: "bridge", NetworkName: "ns/net-a"},
		{Name: "third", Binding: "bridge", NetworkName: "ns/net-b", Mac: "02:aa:bb:cc:dd:ee"},
	}}
	n := fake.NewNetwork()
	configure(t, n, `{"mtu": 9000}`)
	resp, err := n.Setup(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	subnet := netip.MustParsePrefix("10.244.0.0/16")
	for i, r := range resp.GetInterfaces() {
		hw, err := net.ParseMAC(r.GetMac())
		if err != nil || hw[0] != 0x02 {
			t.Errorf("%s: MAC %q is not locally administered unicast (02:...)", r.GetName(), r.GetMac())
		}
		if !strings.HasPrefix(r.GetTapName(), "tap") || len(r.GetTapName()) > 15 {
			t.Errorf("%s: tap name %q", r.GetName(), r.GetTapName())
		}
		if p, err := netip.ParsePrefix(r.GetIpAddresses()[0]); err != nil || p.Bits() != 24 || !subnet.Contains(p.Addr()) {
			t.Errorf("%s: address %q is not a /24 in 10.244.0.0/16", r.GetName(), r.GetIpAddresses())
		}
		if r.GetMtu() != 9000 {
			t.Errorf("%s: MTU %d, want the configured 9000", r.GetName(), r.GetMtu())
		}
		if want := []string{"eth0", "net1", "net2"}[i]; r.GetPodInterface() != want {
			t.Errorf("%s: pod interface %q, want %q", r.GetName(), r.GetPodInterface(), want)
		}
	}
	if got := resp.GetInterfaces()[2].GetMac(); got != "02:aa:bb:cc:dd:ee" {
		t.Errorf("requested MAC not honoured: %s", got)
	}
	if a, b := resp.GetInterfaces()[0].GetTapName(), resp.GetInterfaces()[1].GetTapName(); a == b {
		t.Errorf("two interfaces share tap %s", a)
	}
	// Another driver instance (a restarted process) derives the same results.
	again, err := fake.NewNetwork().Setup(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	for i := range again.GetInterfaces() {
		if a, b := again.GetInterfaces()[i], resp.GetInterfaces()[i]; a.GetMac() != b.GetMac() || a.GetTapName() != b.GetTapName() || a.GetIpAddresses()[0] != b.GetIpAddresses()[0] {
			t.Errorf("a new driver instance gave %v, want %v", a, b)
		}
	}
}

func TestNetworkRejects(t *testing.T) {
	n := fake.NewNetwork()
	for _, c := range []struct {
		name  string
		req   *networkv1.SetupRequest
		names string
	}{
		{"NoVMI", &networkv1.SetupRequest{}, "vmi_id"},
		{"NoBinding", &networkv1.SetupRequest{VmiId: "v", Interfaces: []*networkv1.Interface{{Name: "default"}}}, "default"},
		{"Duplicate", &networkv1.SetupRequest{VmiId: "v", Interfaces: []*networkv1.Interface{{Name: "a", Binding: "bridge"}, {Name: "a", Binding: "bridge"}}}, "duplicate"},
		{"MulticastMAC", &networkv1.SetupRequest{VmiId: "v", Interfaces: []*networkv1.Interface{{Name: "a", Binding: "bridge", Mac: "01:00:5e:00:00:01"}}}, "a"},
		{"BridgePorts", &networkv1.SetupRequest{VmiId: "v", Interfaces: []*networkv1.Interface{{Name: "a", Binding: "bridge", Ports: []*networkv1.Port{{Port: 80}}}}}, "masquerade"},
		{"BadProtocol", &networkv1.SetupRequest{VmiId: "v", Interfaces: []*networkv1.Interface{{Name: "a", Binding: "masquerade", Ports: []*networkv1.Port{{Protocol: "SCTP", Port: 80}}}}}, "ports[0]"},
		{"BadPort", &networkv1.SetupRequest{VmiId: "v", Interfaces: []*networkv1.Interface{{Name: "a", Binding: "masquerade", Ports: []*networkv1.Port{{Port: 70000}}}}}, "ports[0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := n.Setup(t.Context(), c.req)
			expectCode(t, err, codes.InvalidArgument, c.names)
		})
	}
	for _, config := range []string{`{"mtu": 10}`, `{"mtu": "big"}`} {
		t.Run("Config", func(t *testing.T) {
			expectCode(t, fake.NewNetwork().Configure(t.Context(), configReq(config)), codes.InvalidArgument, "config")
		})
	}
}

func TestNetworkCheck(t *testing.T) {
	n := fake.NewNetwork()
	iface := &networkv1.Interface{Name: "default", Binding: "bridge"}
	if _, err := n.Setup(t.Context(), &networkv1.SetupRequest{VmiId: "v", Interfaces: []*networkv1.Interface{iface}}); err != nil {
		t.Fatal(err)
	}
	changed := &networkv1.Interface{Name: "default", Binding: "masquerade"}
	_, err := n.Check(t.Context(), &networkv1.CheckRequest{VmiId: "v", Interfaces: []*networkv1.Interface{changed}})
	expectCode(t, err, codes.FailedPrecondition, "default")
	_, err = n.Check(t.Context(), &networkv1.CheckRequest{VmiId: "v", Interfaces: []*networkv1.Interface{{Name: "other", Binding: "bridge"}}})
	expectCode(t, err, codes.FailedPrecondition, "other")
	if resp, err := n.Check(t.Context(), &networkv1.CheckRequest{VmiId: "v"}); err != nil || len(resp.GetInterfaces()) != 1 {
		t.Errorf("Check of every interface = %v, %v", resp, err)
	}
}
