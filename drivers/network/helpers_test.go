package network

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/google/nftables"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// tb is what the helpers need of a test: *testing.T and conformance.T both have it.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Cleanup(func())
}

// The subnets of the test node's networks.
const (
	clusterSubnet = "10.88.0.0/24"
	clusterGW     = "10.88.0.1"
	clusterMTU    = 1400
	clusterDNS    = "10.88.0.53"
	clusterSearch = "kv.test"
	secSubnet     = "10.77.0.0/24"
)

// requiredPlugins are the CNI plugins the tests run.
var requiredPlugins = []string{"bridge", "host-local", "loopback", "ptp"}

func requireRoot(t testing.TB) {
	t.Helper()
	testenv.Root(t, "CAP_NET_ADMIN, CAP_SYS_ADMIN: makes network namespaces, links and nftables rules")
}

// cniBin returns the directory of the CNI plugins: $KUBEVISOR_CNI_BIN, else the repository's
// _output/cni/bin, which hack/cni/build.sh fills.
func cniBin(t tb) string {
	t.Helper()
	dir := os.Getenv("KUBEVISOR_CNI_BIN")
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			t.Fatalf("find the repository root: %v", err)
		}
		dir = filepath.Join(root, "_output", "cni", "bin")
	}
	for _, p := range requiredPlugins {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Fatalf("CNI plugin %s is not in %s: run hack/cni/build.sh (make cni-plugins), or set KUBEVISOR_CNI_BIN", p, dir)
		}
	}
	return dir
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/kubevisor/kubevisor\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of github.com/kubevisor/kubevisor above the working directory")
		}
		dir = parent
	}
}

func randHex(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// newNetNS makes a named network namespace (/run/netns/kvtest-<what>-<random>) with its
// loopback up, deleted when the test ends.
func newNetNS(t tb, what string) string {
	t.Helper()
	name := "kvtest-" + what + "-" + randHex(8)
	// NewNamed moves the calling thread into the namespace: onThread moves it back.
	if err := onThread(func() error {
		h, err := netns.NewNamed(name)
		if err != nil {
			return err
		}
		h.Close()
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		t.Fatalf("make network namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := netns.DeleteNamed(name); err != nil {
			t.Logf("delete network namespace %s: %v", name, err)
		}
	})
	return "/run/netns/" + name
}

// nsDo runs fn in the namespace and fails the test when it cannot enter it.
func nsDo(t tb, ns string, fn func() error) error {
	t.Helper()
	var ferr error
	if err := inNS(ns, func() error { ferr = fn(); return nil }); err != nil {
		t.Fatalf("enter %s: %v", ns, err)
	}
	return ferr
}

// nodeExec runs CNI plugins in a network namespace: the "node" whose runtime they serve.
type nodeExec struct {
	invoke.RawExec
	version.PluginDecoder
	ns string
}

func (e *nodeExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) (out []byte, err error) {
	if nerr := inNS(e.ns, func() error {
		out, err = e.RawExec.ExecPlugin(ctx, pluginPath, stdin, environ)
		return nil
	}); nerr != nil {
		return nil, nerr
	}
	return out, err
}

var _ invoke.Exec = (*nodeExec)(nil)

// node is a test "node": a network namespace whose cluster network (the CNI bridge plugin's
// bridge kvnode0 with host-local IPAM, as a cluster CNI makes) gives pods their eth0.
type node struct {
	ns      string
	bin     string
	dir     string
	cluster *libcni.NetworkConfigList
	cni     *libcni.CNIConfig
	// extraBin are more plugin directories of the driver.
	extraBin []string
}

func newNode(t tb) *node { return newNodeWith(t, false) }

// newDualStackNode is newNode whose cluster network gives pods an IPv6 address too
// (clusterSubnet6, gateway clusterGW6).
func newDualStackNode(t tb) *node { return newNodeWith(t, true) }

// The IPv6 subnet of a dual-stack test node.
const (
	clusterSubnet6 = "fd00:88::/64"
	clusterGW6     = "fd00:88::1"
)

func newNodeWith(t tb, dualStack bool) *node {
	t.Helper()
	n := &node{bin: cniBin(t), dir: tempDir(t)}
	n.ns = newNetNS(t, "node")
	n.cni = libcni.NewCNIConfigWithCacheDir([]string{n.bin}, filepath.Join(n.dir, "cluster-cache"), &nodeExec{ns: n.ns})
	ranges := [][]map[string]string{{{"subnet": clusterSubnet, "gateway": clusterGW}}}
	routes := []map[string]string{{"dst": "0.0.0.0/0"}}
	if dualStack {
		ranges = append(ranges, []map[string]string{{"subnet": clusterSubnet6, "gateway": clusterGW6}})
		routes = append(routes, map[string]string{"dst": "::/0"})
	}
	list, err := libcni.NetworkConfFromBytes(mustJSON(map[string]any{
		"cniVersion": "1.0.0",
		"name":       "kvcluster",
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": "kvnode0", "isGateway": true, "mtu": clusterMTU,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  ranges,
				"routes":  routes,
				"dataDir": filepath.Join(n.dir, "cluster-ipam"),
			},
		}},
	}))
	if err != nil {
		t.Fatalf("cluster network list: %v", err)
	}
	n.cluster = list
	return n
}

// tempDir is a directory removed when the test ends (the helpers take a tb, which has no
// TempDir).
func tempDir(t tb) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvnet-test-")
	if err != nil {
		t.Fatalf("temp dir: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// pod is a sandbox on the node: a namespace with eth0 on the cluster network.
type pod struct {
	ns   string
	name string
	ip   netip.Prefix
	// ip6 is the IPv6 address on a dual-stack node.
	ip6 netip.Prefix
	mac string
}

// newPod makes a pod namespace and runs the cluster network's ADD for it (DEL when the test
// ends). Its resolv.conf (/etc/netns/<name>/resolv.conf) names clusterDNS.
func (n *node) newPod(t tb) *pod {
	t.Helper()
	p := &pod{ns: newNetNS(t, "pod")}
	p.name = filepath.Base(p.ns)
	etc := filepath.Join(etcNetNS, p.name)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(etc) })
	if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver "+clusterDNS+"\nsearch "+clusterSearch+"\noptions ndots:5\n"), 0o644); err != nil {
		t.Fatalf("%v", err)
	}
	rt := &libcni.RuntimeConf{ContainerID: "pod-" + randHex(12), NetNS: p.ns, IfName: "eth0"}
	res, err := n.cni.AddNetworkList(context.Background(), n.cluster, rt)
	if err != nil {
		t.Fatalf("cluster CNI ADD: %v", err)
	}
	t.Cleanup(func() {
		if err := n.cni.DelNetworkList(context.Background(), n.cluster, rt); err != nil {
			t.Logf("cluster CNI DEL: %v", err)
		}
	})
	r, err := types100.NewResultFromResult(res)
	if err != nil || len(r.IPs) == 0 {
		t.Fatalf("cluster CNI ADD result %v: %v", res, err)
	}
	for _, ipc := range r.IPs {
		a, _ := netip.ParsePrefix(ipc.Address.String())
		if a.Addr().Is4() && !p.ip.IsValid() {
			p.ip = a
		} else if a.Addr().Is6() && !p.ip6.IsValid() {
			p.ip6 = a
		}
	}
	for _, ifc := range r.Interfaces {
		if ifc.Sandbox != "" {
			p.mac = ifc.Mac
		}
	}
	return p
}

// testLogger logs to the test until it ends.
type testLogger struct {
	mu   sync.Mutex
	t    tb
	done bool
}

func newTestLogger(t tb) *testLogger {
	l := &testLogger{t: t}
	t.Cleanup(func() { l.mu.Lock(); l.done = true; l.mu.Unlock() })
	return l
}

func (l *testLogger) log(level, msg string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Logf("%s %s %v", level, msg, args)
	}
}
func (l *testLogger) Info(msg string, args ...any) { l.log("INFO", msg, args...) }
func (l *testLogger) Warn(msg string, args ...any) { l.log("WARN", msg, args...) }

// driverConfig is the driver's configuration on the node.
func (n *node) driverConfig() Config {
	return Config{
		CNIConfDir:  filepath.Join(n.dir, "net.d"),
		CNIBinDir:   append([]string{n.bin}, n.extraBin...),
		CNICacheDir: filepath.Join(n.dir, "cache"),
	}
}

// newDriver returns a configured driver whose CNI plugins run in the node's namespace.
func (n *node) newDriver(t tb, stateDir string) *Driver {
	t.Helper()
	d := New(newTestLogger(t), WithCNI(func(cfg Config) libcni.CNI {
		return libcni.NewCNIConfigWithCacheDir(cfg.CNIBinDir, cfg.CNICacheDir, &nodeExec{ns: n.ns})
	}))
	if stateDir == "" {
		stateDir = tempDir(t)
	}
	if err := d.Configure(context.Background(), &basev1.ConfigureRequest{Config: mustJSON(n.driverConfig()), StateDir: stateDir}); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// secondaryIPAM is the host-local data directory of the secondary network net-a.
func (n *node) secondaryIPAM() string { return filepath.Join(n.dir, "sec-ipam") }

// addSecondary writes the network list net-a (bridge kvsec0 on the node, host-local in
// secSubnet) into the driver's configuration directory; extra plugins are chained after it.
func (n *node) addSecondary(t tb, name string, extra ...map[string]any) {
	t.Helper()
	n.secondaryBridge(t)
	plugins := []any{map[string]any{
		"type": "bridge", "bridge": "kvsec0",
		"ipam": map[string]any{
			"type":    "host-local",
			"ranges":  [][]map[string]string{{{"subnet": secSubnet}}},
			"dataDir": n.secondaryIPAM(),
		},
	}}
	for _, e := range extra {
		plugins = append(plugins, e)
	}
	n.writeConf(t, name+".conflist", mustJSON(map[string]any{"cniVersion": "1.0.0", "name": name, "plugins": plugins}))
}

// secondaryBridge makes the node's bridge kvsec0 with a fixed MAC, once. The bridge plugin gives
// a bridge without a gateway address no MAC of its own, so it takes the lowest MAC of its ports,
// which changes as pods come and go; the plugin's CHECK (which Setup runs after ADD) then
// fails for every pod on it. A node's network setup pins it, as this does.
func (n *node) secondaryBridge(t tb) {
	t.Helper()
	err := inNS(n.ns, func() error {
		if _, err := netlink.LinkByName("kvsec0"); err == nil {
			return nil
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "kvsec0"
		attrs.HardwareAddr = net.HardwareAddr{0x02, 0x6b, 0x76, 0x73, 0x65, 0x63}
		return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs})
	})
	if err != nil {
		t.Fatalf("node bridge kvsec0: %v", err)
	}
}

func (n *node) writeConf(t tb, file string, b []byte) {
	t.Helper()
	dir := n.driverConfig().CNIConfDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("%v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
		t.Fatalf("%v", err)
	}
}

// ipamAllocations counts host-local's allocations (a file named by each address) in dir.
func ipamAllocations(t tb, dir string) int {
	t.Helper()
	n := 0
	_ = filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			if _, perr := netip.ParseAddr(e.Name()); perr == nil {
				n++
			}
		}
		return nil
	})
	return n
}

// links lists the links of a namespace as "name(type)".
func links(t tb, ns string) []string {
	t.Helper()
	var out []string
	_ = nsDo(t, ns, func() error {
		ls, err := netlink.LinkList()
		if err != nil {
			t.Fatalf("list links: %v", err)
		}
		for _, l := range ls {
			out = append(out, l.Attrs().Name+"("+l.Type()+")")
		}
		return nil
	})
	return out
}

// link returns a link of a namespace, nil when there is none.
func link(t tb, ns, name string) netlink.Link {
	t.Helper()
	var l netlink.Link
	_ = nsDo(t, ns, func() error { l, _ = netlink.LinkByName(name); return nil })
	return l
}

// addrs lists the addresses (CIDR) of a link, of every family but IPv6 link-local ones.
func addrs(t tb, ns, name string) []string {
	t.Helper()
	var out []string
	_ = nsDo(t, ns, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return nil
		}
		as, _ := netlink.AddrList(l, netlink.FAMILY_ALL)
		for _, a := range as {
			if !a.IP.IsLinkLocalUnicast() || a.IP.To4() != nil {
				out = append(out, a.IPNet.String())
			}
		}
		return nil
	})
	return out
}

// routes lists the IPv4 routes of the main table of a namespace as "dst via gw dev name".
func routes(t tb, ns string) []string {
	t.Helper()
	var out []string
	_ = nsDo(t, ns, func() error {
		rs, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
		for _, r := range rs {
			dev := ""
			if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				dev = l.Attrs().Name
			}
			dst := "default"
			if r.Dst != nil {
				dst = r.Dst.String()
			}
			s := dst
			if r.Gw != nil {
				s += " via " + r.Gw.String()
			}
			out = append(out, s+" dev "+dev)
		}
		return nil
	})
	return out
}

// nftRuleset describes the nftables tables of a namespace and their rule counts.
func nftRuleset(t tb, ns string) (tables []string, rules int) {
	t.Helper()
	_ = nsDo(t, ns, func() error {
		c, err := nftables.New()
		if err != nil {
			t.Fatalf("nftables: %v", err)
		}
		ts, err := c.ListTables()
		if err != nil {
			t.Fatalf("nftables: list tables: %v", err)
		}
		for _, tab := range ts {
			tables = append(tables, familyName(tab.Family)+" "+tab.Name)
			chains, _ := c.ListChainsOfTableFamily(tab.Family)
			for _, ch := range chains {
				if ch.Table.Name == tab.Name {
					rs, _ := c.GetRules(tab, ch)
					rules += len(rs)
				}
			}
		}
		return nil
	})
	return tables, rules
}

// sysctl reads a sysctl of a namespace.
func sysctl(t tb, ns, key string) string {
	t.Helper()
	var v string
	_ = nsDo(t, ns, func() error { v, _ = readSysctl(key); return nil })
	return v
}

// fakeGuest stands in for a VM on a tap: a namespace whose interface (a veth) is a port of
// the binding's bridge, next to the tap, with the guest's MAC.
type fakeGuest struct {
	ns    string
	iface string
	mac   net.HardwareAddr
}

// attachGuest plugs a fake guest with mac into bridge of the pod namespace.
func attachGuest(t tb, podNS, bridge, mac string, mtu int) *fakeGuest {
	t.Helper()
	hw, err := net.ParseMAC(mac)
	if err != nil {
		t.Fatalf("guest MAC %q: %v", mac, err)
	}
	g := &fakeGuest{ns: newNetNS(t, "guest"), iface: "guest0", mac: hw}
	gns, err := netns.GetFromPath(g.ns)
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer gns.Close()
	side := "kvg" + randHex(6)
	err = nsDo(t, podNS, func() error {
		br, err := netlink.LinkByName(bridge)
		if err != nil {
			return err
		}
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: side, MTU: mtu, MasterIndex: br.Attrs().Index}, PeerName: g.iface, PeerHardwareAddr: hw}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		peer, err := netlink.LinkByName(g.iface)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMTU(peer, mtu); err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(peer, int(gns)); err != nil {
			return err
		}
		l, err := netlink.LinkByName(side)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatalf("attach a fake guest to %s: %v", bridge, err)
	}
	t.Cleanup(func() {
		_ = inNS(podNS, func() error {
			if l, err := netlink.LinkByName(side); err == nil {
				_ = netlink.LinkDel(l)
			}
			return nil
		})
	})
	if err := nsDo(t, g.ns, func() error {
		l, err := netlink.LinkByName(g.iface)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	}); err != nil {
		t.Fatalf("fake guest: %v", err)
	}
	return g
}

// dhcp runs a DHCP client (nclient4) on the guest's interface and returns the ACK.
func (g *fakeGuest) dhcp(t tb) (*dhcpv4.DHCPv4, error) { return g.dhcpWithin(t, 2*time.Second, 3) }

// dhcpWithin is dhcp with a timeout per message and a number of tries.
func (g *fakeGuest) dhcpWithin(t tb, timeout time.Duration, tries int) (*dhcpv4.DHCPv4, error) {
	t.Helper()
	var ack *dhcpv4.DHCPv4
	err := nsDo(t, g.ns, func() error {
		c, err := nclient4.New(g.iface, nclient4.WithTimeout(timeout), nclient4.WithRetry(tries))
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		lease, err := c.Request(ctx)
		if err != nil {
			return err
		}
		ack = lease.ACK
		return nil
	})
	return ack, err
}

// configure applies a lease as the guest's DHCP client would: address and default route.
func (g *fakeGuest) configure(t tb, ack *dhcpv4.DHCPv4) {
	t.Helper()
	ones, _ := ack.SubnetMask().Size()
	err := nsDo(t, g.ns, func() error {
		l, err := netlink.LinkByName(g.iface)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ack.YourIPAddr, Mask: net.CIDRMask(ones, 32)}}); err != nil {
			return err
		}
		if rs := ack.Router(); len(rs) > 0 {
			return netlink.RouteAdd(&netlink.Route{Gw: rs[0], LinkIndex: l.Attrs().Index})
		}
		return nil
	})
	if err != nil {
		t.Fatalf("configure the fake guest with %s: %v", ack.YourIPAddr, err)
	}
}

// listen opens a TCP listener in a namespace.
func listen(t tb, ns, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	if err := nsDo(t, ns, func() (err error) { l, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// serveHTTP serves "kubevisor-guest ok" on port 80 of a namespace, as the test guest does.
func serveHTTP(t tb, ns string) {
	t.Helper()
	l := listen(t, ns, ":80")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "kubevisor-guest ok\nremote: %s\n", r.RemoteAddr)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// dialFrom opens a TCP connection from a namespace.
func dialFrom(ctx context.Context, ns, addr string) (net.Conn, error) {
	var c net.Conn
	var derr error
	if err := inNS(ns, func() error {
		c, derr = (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, "tcp", addr)
		return nil
	}); err != nil {
		return nil, err
	}
	return c, derr
}

// httpGet fetches url from a namespace.
func httpGet(ns, url string) (string, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return dialFrom(ctx, ns, addr) },
	}}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// ping sends ICMP echo requests from a namespace to dst until one is answered or the
// timeout passes.
func ping(ns string, dst netip.Addr, timeout time.Duration) error {
	var c *icmp.PacketConn
	if err := inNS(ns, func() (err error) { c, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0"); return err }); err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(timeout)
	id := int(randByte())<<8 | int(randByte())
	for seq := 1; time.Now().Before(deadline); seq++ {
		msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("kubevisor")}}
		b, _ := msg.Marshal(nil)
		if _, err := c.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		for {
			buf := make([]byte, 1500)
			n, peer, err := c.ReadFrom(buf)
			if err != nil {
				break
			}
			m, err := icmp.ParseMessage(1, buf[:n])
			if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
				continue
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && peer.String() == dst.String() {
				return nil
			}
		}
	}
	return fmt.Errorf("no echo reply from %s within %s", dst, timeout)
}

func randByte() byte {
	var b [1]byte
	_, _ = rand.Read(b[:])
	return b[0]
}

// readLine reads one line from a connection with a deadline.
func readLine(c net.Conn) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	return bufio.NewReader(c).ReadString('\n')
}

// iface is a request interface.
func iface(name, binding, network string, ports ...*networkv1.Port) *networkv1.Interface {
	return &networkv1.Interface{Name: name, Binding: binding, NetworkName: network, Ports: ports}
}

func setupReq(vmi, ns string, ifaces ...*networkv1.Interface) *networkv1.SetupRequest {
	return &networkv1.SetupRequest{VmiId: vmi, NetnsPath: ns, Interfaces: ifaces}
}

func checkReq(vmi, ns string, ifaces ...*networkv1.Interface) *networkv1.CheckRequest {
	return &networkv1.CheckRequest{VmiId: vmi, NetnsPath: ns, Interfaces: ifaces}
}

func teardownReq(vmi, ns string, ifaces ...*networkv1.Interface) *networkv1.TeardownRequest {
	return &networkv1.TeardownRequest{VmiId: vmi, NetnsPath: ns, Interfaces: ifaces}
}

func newVMIID() string {
	return randHex(8) + "-" + randHex(4) + "-" + randHex(4) + "-" + randHex(4) + "-" + randHex(12)
}
