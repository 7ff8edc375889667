package network

import (
	"context"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// BenchmarkSetupTeardown measures Setup and Teardown of one interface per binding, each
// iteration a whole cycle; it reports the medians (run with -benchtime 50x or more):
//
//	go test -run '^$' -bench SetupTeardown -benchtime 50x ./drivers/network/
//
// "secondary" is a bridge-bound secondary network, whose Setup runs CNI ADD and CHECK
// (bridge + host-local plugins) and Teardown CNI DEL.
func BenchmarkSetupTeardown(b *testing.B) {
	requireRoot(b)
	n := newNode(b)
	n.addSecondary(b, "net-a")
	for _, tc := range []struct{ name, binding, network string }{
		{"bridge", BindingBridge, ""},
		{"masquerade", BindingMasquerade, ""},
		{"secondary", BindingBridge, "net-a"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p := n.newPod(b)
			d := n.newDriver(b, "")
			ctx := context.Background()
			ifc := iface("default", tc.binding, tc.network)
			var setup, teardown []time.Duration
			b.ResetTimer()
			for range b.N {
				vmi := newVMIID()
				start := time.Now()
				if _, err := d.Setup(ctx, setupReq(vmi, p.ns, ifc)); err != nil {
					b.Fatalf("Setup: %v", err)
				}
				mid := time.Now()
				if err := d.Teardown(ctx, teardownReq(vmi, p.ns, ifc)); err != nil {
					b.Fatalf("Teardown: %v", err)
				}
				setup, teardown = append(setup, mid.Sub(start)), append(teardown, time.Since(mid))
			}
			b.StopTimer()
			b.ReportMetric(float64(median(setup).Microseconds())/1000, "setup-ms(median)")
			b.ReportMetric(float64(median(teardown).Microseconds())/1000, "teardown-ms(median)")
			b.Logf("%s: %d cycles, Setup median %s, Teardown median %s", tc.name, len(setup), median(setup), median(teardown))
		})
	}
}

// throughputBytes is what each throughput measurement sends.
const (
	throughputBytes   = 256 << 20
	throughputBytesVM = 32 << 20
)

// BenchmarkThroughput measures guest-to-node TCP throughput (a Go TCP sink in the node
// namespace) through each binding, against a plain veth pair as the baseline, and prints
// the ratios:
//
//	veth           a namespace on a veth pair with the node: no binding, no VM
//	netns/<b>      a namespace plugged into the binding's bridge in place of the tap: the
//	               binding's datapath (bridge, NAT) without a VM
//	vm/<b>         the test guest under QEMU (busybox dd | nc), through the tap: under TCG
//	               this measures the emulator more than the network (skipped without the
//	               guest, `make guest`)
//
//	go test -run '^$' -bench Throughput -benchtime 1x ./drivers/network/
func BenchmarkThroughput(b *testing.B) {
	requireRoot(b)
	n := newNode(b)
	results := map[string]float64{}
	var mu sync.Mutex
	record := func(name string, mbps float64) {
		mu.Lock()
		results[name] = mbps
		mu.Unlock()
	}

	b.Run("veth", func(b *testing.B) {
		client := vethToNode(b, n)
		record("veth", measure(b, n, throughputBytes, func(addr string) { send(b, client, addr, throughputBytes) }))
	})
	for _, binding := range Bindings {
		b.Run("netns/"+binding, func(b *testing.B) {
			p := n.newPod(b)
			d := n.newDriver(b, "")
			resp := setupFor(b, d, p, binding)
			g := attachGuest(b, p.ns, "k6t-eth0", resp.GetMac(), clusterMTU)
			ack, err := g.dhcp(b)
			if err != nil {
				b.Fatalf("DHCP: %v", err)
			}
			g.configure(b, ack)
			record("netns/"+binding, measure(b, n, throughputBytes, func(addr string) { send(b, g.ns, addr, throughputBytes) }))
		})
	}
	for _, binding := range Bindings {
		b.Run("vm/"+binding, func(b *testing.B) {
			requireGuest(b)
			p := n.newPod(b)
			d := n.newDriver(b, "")
			resp := setupFor(b, d, p, binding)
			con := bootGuest(b, p.ns, []*networkv1.InterfaceResult{resp})
			con.wait(b, guestIPLine, 30*time.Second)
			run := 0
			record("vm/"+binding, measure(b, n, throughputBytesVM, func(addr string) {
				run++
				host, port, _ := net.SplitHostPort(addr)
				con.run(b, fmt.Sprintf("dd if=/dev/zero bs=64k count=%d 2>/dev/null | nc %s %s; echo KV-NC'-'%d", throughputBytesVM>>16, host, port, run))
				con.wait(b, regexp.MustCompile(fmt.Sprintf(`(?m)^KV-NC-%d`, run)), 5*time.Minute)
			}))
		})
	}

	base := results["veth"]
	var lines []string
	for _, name := range []string{"veth", "netns/bridge", "netns/masquerade", "vm/bridge", "vm/masquerade"} {
		if v, ok := results[name]; ok {
			ratio := ""
			if base > 0 && name != "veth" {
				ratio = fmt.Sprintf("  (%.3g x veth)", v/base)
			}
			lines = append(lines, fmt.Sprintf("  %-17s %9.1f MB/s%s", name, v, ratio))
		}
	}
	if len(lines) > 0 {
		fmt.Printf("guest-to-node TCP throughput (MTU %d):\n%s\n", clusterMTU, strings.Join(lines, "\n"))
		if _, ok := results["vm/bridge"]; ok {
			fmt.Println("  vm/* run under TCG (no usable KVM here): they measure the emulator, not the bindings.")
		}
	}
}

// setupFor sets up one pod network interface with binding, torn down when b ends.
func setupFor(b *testing.B, d *Driver, p *pod, binding string) *networkv1.InterfaceResult {
	b.Helper()
	vmi := newVMIID()
	ifc := iface("default", binding, "")
	resp, err := d.Setup(context.Background(), setupReq(vmi, p.ns, ifc))
	if err != nil {
		b.Fatalf("Setup: %v", err)
	}
	b.Cleanup(func() { _ = d.Teardown(context.Background(), teardownReq(vmi, p.ns, ifc)) })
	return resp.GetInterfaces()[0]
}

// vethToNode makes a namespace joined to the node namespace by a veth pair (10.99.0.2 and
// 10.99.0.1, MTU as the pod network's), and returns the namespace.
func vethToNode(b *testing.B, n *node) string {
	b.Helper()
	client := newNetNS(b, "veth")
	cns, err := netns.GetFromPath(client)
	if err != nil {
		b.Fatalf("%v", err)
	}
	defer cns.Close()
	if err := nsDo(b, n.ns, func() error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "kvbase0", MTU: clusterMTU}, PeerName: "kvbase1"}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		l, _ := netlink.LinkByName("kvbase0")
		addr, _ := netlink.ParseAddr("10.99.0.1/24")
		if err := netlink.AddrAdd(l, addr); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		peer, _ := netlink.LinkByName("kvbase1")
		if err := netlink.LinkSetMTU(peer, clusterMTU); err != nil {
			return err
		}
		return netlink.LinkSetNsFd(peer, int(cns))
	}); err != nil {
		b.Fatalf("veth pair: %v", err)
	}
	if err := nsDo(b, client, func() error {
		l, err := netlink.LinkByName("kvbase1")
		if err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr("10.99.0.2/24")
		if err := netlink.AddrAdd(l, addr); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	}); err != nil {
		b.Fatalf("veth pair: %v", err)
	}
	return client
}

// measure runs sendFn b.N times against a TCP sink in the node namespace (on the address
// the peer reaches the node at) and returns the sink's throughput in MB/s (10^6 bytes),
// from the first byte received to the last.
func measure(b *testing.B, n *node, size int64, sendFn func(addr string)) float64 {
	b.Helper()
	l := listen(b, n.ns, "0.0.0.0:0")
	_, port, _ := net.SplitHostPort(l.Addr().String())
	host := clusterGW
	if strings.HasPrefix(b.Name(), "BenchmarkThroughput/veth") {
		host = "10.99.0.1"
	}
	addr := net.JoinHostPort(host, port)
	var total time.Duration
	b.ResetTimer()
	for range b.N {
		done := make(chan time.Duration, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				done <- 0
				return
			}
			defer c.Close()
			first := make([]byte, 1)
			if _, err := io.ReadFull(c, first); err != nil {
				done <- 0
				return
			}
			start := time.Now()
			if _, err := io.CopyN(io.Discard, c, size-1); err != nil {
				done <- 0
				return
			}
			done <- time.Since(start)
		}()
		sendFn(addr)
		d := <-done
		if d == 0 {
			b.Fatalf("the sink did not get %d bytes", size)
		}
		total += d
	}
	b.StopTimer()
	mbps := float64(size) * float64(b.N) / total.Seconds() / 1e6
	b.ReportMetric(mbps, "sink-MB/s")
	return mbps
}

// send writes size zero bytes to addr from a namespace.
func send(b *testing.B, ns, addr string, size int64) {
	b.Helper()
	c, err := dialFrom(context.Background(), ns, addr)
	if err != nil {
		b.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	buf := make([]byte, 256<<10)
	for left := size; left > 0; {
		chunk := min(left, int64(len(buf)))
		if _, err := c.Write(buf[:chunk]); err != nil {
			b.Fatalf("send: %v", err)
		}
		left -= chunk
	}
}
