package network

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// TestBadInput: every bad request fails with a status code and a message that names the
// interface and the cause, and leaves nothing behind (the first interface of each request is
// a good one, set up before the bad one fails).
func TestBadInput(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	n := newNode(t)
	n.addSecondary(t, "net-a")
	withFailPlugin(t, n)
	n.addSecondary(t, "net-fail", map[string]any{"type": "kvfail"})
	n.writeConf(t, "net-noplugin.conflist", []byte(`{"cniVersion":"1.0.0","name":"net-noplugin","plugins":[{"type":"kvnosuchplugin"}]}`))
	n.writeConf(t, "net-broken.conflist", []byte(`{"cniVersion":"1.0.0","name":"net-broken","plugins":"not a list"}`))
	n.writeConf(t, "zz-garbage.conflist", []byte(`{not json`))
	p := n.newPod(t)
	empty := newNetNS(t, "empty") // a sandbox without eth0
	stateDir := tempDir(t)
	d := n.newDriver(t, stateDir)
	before := snap(t, p.ns)
	good := iface("default", BindingMasquerade, "")

	for _, tc := range []struct {
		name   string
		vmi    string
		ns     string
		ifaces []*networkv1.Interface
		code   codes.Code
		want   []string
	}{
		{"NoVMIID", "", p.ns, []*networkv1.Interface{good}, codes.InvalidArgument, []string{"vmi_id"}},
		{"VMIIDNotAContainerID", "bad/id", p.ns, []*networkv1.Interface{good, iface("blue", BindingBridge, "net-a")}, codes.InvalidArgument, []string{`interface "blue"`, "container id"}},
		{"NoNamespace", "x", "", []*networkv1.Interface{good}, codes.InvalidArgument, []string{"netns_path"}},
		{"NamespaceMissing", "x", "/run/netns/kvtest-no-such-namespace", []*networkv1.Interface{good}, codes.FailedPrecondition, []string{"kvtest-no-such-namespace"}},
		{"NoPodInterface", "x", empty, []*networkv1.Interface{good}, codes.FailedPrecondition, []string{`interface "default"`, "pod interface eth0"}},
		{"UnknownBinding", "x", p.ns, []*networkv1.Interface{good, iface("weird", "sriov", "net-a")}, codes.InvalidArgument, []string{`interface "weird"`, `binding "sriov"`}},
		{"NoName", "x", p.ns, []*networkv1.Interface{good, iface("", BindingBridge, "net-a")}, codes.InvalidArgument, []string{"interfaces[1]", "name"}},
		{"DuplicateName", "x", p.ns, []*networkv1.Interface{good, iface("default", BindingBridge, "net-a")}, codes.InvalidArgument, []string{`interface "default"`}},
		{"SecondPodNetworkInterface", "x", p.ns, []*networkv1.Interface{good, iface("second", BindingBridge, "")}, codes.InvalidArgument, []string{`interface "second"`, "network_name"}},
		{"MasqueradeOnSecondary", "x", p.ns, []*networkv1.Interface{good, iface("blue", BindingMasquerade, "net-a")}, codes.InvalidArgument, []string{`interface "blue"`, "masquerade"}},
		{"PortsOnBridge", "x", p.ns, []*networkv1.Interface{iface("default", BindingBridge, "", &networkv1.Port{Port: 80})}, codes.InvalidArgument, []string{`interface "default"`, "ports"}},
		{"BadPort", "x", p.ns, []*networkv1.Interface{iface("default", BindingMasquerade, "", &networkv1.Port{Protocol: "SCTP", Port: 80})}, codes.InvalidArgument, []string{`interface "default"`, "SCTP"}},
		{"BadMAC", "x", p.ns, []*networkv1.Interface{{Name: "default", Binding: BindingBridge, Mac: "01:00:5e:00:00:01"}}, codes.InvalidArgument, []string{`interface "default"`, "unicast"}},
		{"BadDHCPOption", "x", p.ns, []*networkv1.Interface{good, withDHCP(iface("blue", BindingBridge, "net-a"), &networkv1.DHCPOptions{PrivateOptions: []*networkv1.DHCPPrivateOption{{Code: 67, Value: "boot"}}})},
			codes.InvalidArgument, []string{`interface "blue"`, "dhcpOptions.privateOptions[0]: code 67 is not a site-specific option"}},
		{"BadNetworkName", "x", p.ns, []*networkv1.Interface{good, iface("blue", BindingBridge, "a/b/c")}, codes.InvalidArgument, []string{`interface "blue"`, "a/b/c"}},
		{"NetworkListMissing", "x", p.ns, []*networkv1.Interface{good, iface("blue", BindingBridge, "tenant/net-nope")}, codes.FailedPrecondition, []string{`interface "blue"`, `no CNI network list named "tenant/net-nope" or "net-nope"`, "zz-garbage.conflist"}},
		{"NetworkListUnparsable", "x", p.ns, []*networkv1.Interface{good, iface("blue", BindingBridge, "net-broken")}, codes.FailedPrecondition, []string{`interface "blue"`, `"net-broken"`, "does not parse"}},
		{"PluginMissing", "x", p.ns, []*networkv1.Interface{good, iface("blue", BindingBridge, "net-noplugin")}, codes.FailedPrecondition, []string{`interface "blue"`, "kvnosuchplugin"}},
		{"PluginFails", "x", p.ns, []*networkv1.Interface{good, iface("blue", BindingBridge, "net-a"), iface("red", BindingBridge, "net-fail")}, codes.Internal, []string{`interface "red"`, "kvfail: refusing on purpose"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vmi := tc.vmi
			if vmi == "x" {
				vmi = newVMIID()
			}
			_, err := d.Setup(ctx, setupReq(vmi, tc.ns, tc.ifaces...))
			if status.Code(err) != tc.code {
				t.Fatalf("Setup: %v; want %s", err, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(status.Convert(err).Message(), w) {
					t.Errorf("Setup: %q does not say %q", status.Convert(err).Message(), w)
				}
			}
			t.Logf("Setup: %s: %s", status.Code(err), status.Convert(err).Message())
			expectClean(t, n, d, p.ns, before, stateDir)
			if err := d.Teardown(ctx, teardownReq(vmi, tc.ns, tc.ifaces...)); err != nil && vmi != "" {
				t.Errorf("Teardown after the failed Setup: %v", err)
			}
		})
	}
}

// withDHCP is ifc with DHCP options.
func withDHCP(ifc *networkv1.Interface, o *networkv1.DHCPOptions) *networkv1.Interface {
	ifc.DhcpOptions = o
	return ifc
}
