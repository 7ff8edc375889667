package network

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	"github.com/kubevisor/kubevisor/drivers/qmp"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// The project's test guest (hack/guest, `make guest`) prints these on its console.
const (
	guestReady  = "KUBEVISOR-GUEST-READY"
	guestBootTO = 3 * time.Minute
)

// guestIPLine is the console line of each DHCP lease: "KUBEVISOR-IP: <addr> <iface> <mac>".
var guestIPLine = regexp.MustCompile(`KUBEVISOR-IP: (\S+) (\S+) (\S+)`)

// guestDHCPOptionsLine is the console line of each lease's extra options, just before its IP
// line: "KUBEVISOR-DHCP-OPTIONS: <iface> tftp=... bootfile=... ntpsrv=a,b optNNN=<hex> ..." or
// "<iface> none".
var guestDHCPOptionsLine = regexp.MustCompile(`KUBEVISOR-DHCP-OPTIONS: (\S+)(.*)`)

// guestDir is where `make guest` builds the test guest, or $KUBEVISOR_GUEST_DIR.
func guestDir(t tb) string {
	t.Helper()
	dir := os.Getenv("KUBEVISOR_GUEST_DIR")
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			t.Fatalf("%v", err)
		}
		dir = filepath.Join(root, "_output", "guest")
	}
	return dir
}

// requireGuest skips unless the test guest is built and QEMU is installed, as the qmp
// driver's tests do.
func requireGuest(t testing.TB) string {
	t.Helper()
	dir := guestDir(t)
	for _, f := range []string{"vmlinuz", "initramfs.cpio.gz"} {
		testenv.File(t, filepath.Join(dir, f), "guest")
	}
	testenv.Command(t, "qemu-system-x86_64", "qemu-system-x86")
	return dir
}

// console collects a VM's serial output.
type console struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
	in      io.Writer
}

func (c *console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf.Write(p)
	close(c.changed)
	c.changed = make(chan struct{})
	return len(p), nil
}

func (c *console) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// wait waits until the output matches re, and returns the submatches of the first match.
func (c *console) wait(t tb, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		c.mu.Lock()
		m := re.FindStringSubmatch(c.buf.String())
		changed := c.changed
		c.mu.Unlock()
		if m != nil {
			return m
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no %q on the console within %s; console:\n%s", re, timeout, c.String())
		}
	}
}

// run types a command on the guest's console shell.
func (c *console) run(t tb, cmd string) {
	t.Helper()
	if _, err := io.WriteString(c.in, cmd+"\n"); err != nil {
		t.Fatalf("console input: %v", err)
	}
}

// bootGuest boots the test guest with the qmp driver inside the pod namespace, on the tap of
// each result, and waits for its READY marker.
func bootGuest(t tb, podNS string, results []*networkv1.InterfaceResult) *console {
	t.Helper()
	dir := guestDir(t)
	ctx := context.Background()
	hv := qmp.New()
	work := tempDir(t)
	if err := hv.Configure(ctx, &basev1.ConfigureRequest{StateDir: filepath.Join(work, "state")}); err != nil {
		t.Fatalf("qmp Configure: %v", err)
	}
	runDir := filepath.Join(work, "run")
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		t.Fatalf("%v", err)
	}
	cmdline := "console=ttyS0"
	if raw, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil {
		cmdline = strings.TrimSpace(string(raw))
	}
	id := "kvnet-" + randHex(8)
	spec := &domainv1.DomainSpec{
		Id: id, Name: "test/" + id,
		Memory: &domainv1.Memory{GuestBytes: 256 << 20},
		Firmware: &domainv1.Firmware{Boot: &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{
			KernelPath: filepath.Join(dir, "vmlinuz"), InitrdPath: filepath.Join(dir, "initramfs.cpio.gz"), Cmdline: cmdline,
		}}},
		Sandbox: &domainv1.Sandbox{NetnsPath: podNS},
		RunDir:  runDir,
	}
	for _, r := range results {
		spec.Nics = append(spec.Nics, &domainv1.NIC{Name: r.GetName(), TapName: r.GetTapName(), Mac: r.GetMac(), Mtu: r.GetMtu()})
	}
	if _, err := hv.Create(ctx, spec); err != nil {
		t.Fatalf("qmp Create: %v", err)
	}
	t.Cleanup(func() {
		_ = hv.Kill(context.Background(), id)
		_ = hv.Delete(context.Background(), id)
		_ = hv.Close()
	})
	start := time.Now()
	if err := hv.Start(ctx, id); err != nil {
		t.Fatalf("qmp Start: %v", err)
	}
	pr, pw := io.Pipe()
	c := &console{changed: make(chan struct{}), in: pw}
	cctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = hv.Console(cctx, id, pr, c)
	}()
	t.Cleanup(func() { cancel(); pw.Close(); <-done })
	c.wait(t, regexp.MustCompile(guestReady), guestBootTO)
	t.Logf("guest booted (TCG) to %s in %s", guestReady, time.Since(start).Round(time.Millisecond))
	return c
}

// TestGuest boots the project's test guest with the qmp driver in a pod namespace, on the
// tap of each binding: it gets its address by DHCP, with the interface's DHCP options as its
// DHCP client (busybox udhcpc) reads them, and answers ping and HTTP from the node (bridge: at
// the pod address; masquerade: the declared port 80 through the DNAT).
func TestGuest(t *testing.T) {
	requireRoot(t)
	requireGuest(t)
	n := newNode(t)
	for _, binding := range Bindings {
		t.Run(binding, func(t *testing.T) {
			ctx := context.Background()
			p := n.newPod(t)
			d := n.newDriver(t, "")
			vmi := newVMIID()
			ifc := iface("default", binding, "")
			if binding == BindingMasquerade {
				ifc.Ports = []*networkv1.Port{{Name: "http", Protocol: "TCP", Port: 80}}
			}
			ifc.DhcpOptions = testDHCPOptions()
			resp, err := d.Setup(ctx, setupReq(vmi, p.ns, ifc))
			if err != nil {
				t.Fatalf("Setup: %v", err)
			}
			t.Cleanup(func() {
				if err := d.Teardown(context.Background(), teardownReq(vmi, p.ns, ifc)); err != nil {
					t.Errorf("Teardown: %v", err)
				}
			})
			r := resp.GetInterfaces()[0]
			con := bootGuest(t, p.ns, resp.GetInterfaces())

			m := con.wait(t, guestIPLine, 30*time.Second)
			want := strings.Split(r.GetIpAddresses()[0], "/")[0]
			if m[1] != want || !strings.EqualFold(m[3], r.GetMac()) {
				t.Fatalf("guest lease %s on %s (MAC %s); want %s with MAC %s", m[1], m[2], m[3], want, r.GetMac())
			}
			t.Logf("guest: %s", m[0])
			// udhcpc names 66, 67 and 42, and gives 224 and 254 as hex.
			opts := con.wait(t, guestDHCPOptionsLine, time.Second)
			for _, want := range []string{"tftp=tftp.example.org", "bootfile=pxelinux.0", "ntpsrv=192.0.2.1,192.0.2.2",
				"opt224=" + hex.EncodeToString([]byte("kubevisor")), "opt254=" + hex.EncodeToString([]byte("last one"))} {
				if !slices.Contains(strings.Fields(opts[2]), want) {
					t.Errorf("guest's DHCP options %q lack %s", strings.TrimSpace(opts[0]), want)
				}
			}
			t.Logf("guest: %s", strings.TrimSpace(opts[0]))

			url := "http://" + p.ip.Addr().String() + "/"
			var body string
			deadline := time.Now().Add(30 * time.Second)
			for {
				body, err = httpGet(n.ns, url)
				if err == nil || time.Now().After(deadline) {
					break
				}
				time.Sleep(500 * time.Millisecond)
			}
			if err != nil || !strings.Contains(body, "kubevisor-guest ok") {
				t.Errorf("HTTP from the node to %s: %q, %v; console:\n%s", url, body, err, con.String())
			}
			switch binding {
			case BindingBridge:
				if err := ping(n.ns, p.ip.Addr(), 10*time.Second); err != nil {
					t.Errorf("ping the guest at the pod address from the node: %v", err)
				}
			case BindingMasquerade:
				// Only port 80 is the guest's; the guest pings out through the NAT. (The quotes
				// keep the console's echo of the command from matching.)
				con.run(t, "ping -c 1 -W 5 "+clusterGW+" >/dev/null && echo KV-PING'-'OK || echo KV-PING'-'FAILED")
				if m := con.wait(t, regexp.MustCompile(`(?m)^KV-PING-(OK|FAILED)`), 30*time.Second); m[1] != "OK" {
					t.Errorf("guest pings the node through the masquerade: %s; console:\n%s", m[0], con.String())
				}
			}
		})
	}
}
