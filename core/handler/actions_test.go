package handler

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	"github.com/kubevisor/kubevisor/drivers/fake"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

func paused(st v1alpha1.VirtualMachineInstanceStatus) bool {
	for _, c := range st.Conditions {
		if c.Type == v1alpha1.VirtualMachineInstancePaused {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func ctx5s(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestActionsChangeTheVMAndItsStatus: pause, unpause and reset reach the driver, and the VMI's
// status shows a pause at once through the one status derivation; a VM not in the state for an
// action is FailedPrecondition and is left as it is.
func TestActionsChangeTheVMAndItsStatus(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	h := e.start()
	vmi := testVMI("demo", "uid-actions", e.disk)
	mustRun(t, h, vmi)
	ctx := ctx5s(t)
	if uid, ok := h.Find("default", "demo"); !ok || uid != vmi.UID {
		t.Fatalf("Find = %q, %v", uid, ok)
	}
	if _, ok := h.Find("other", "demo"); ok {
		t.Fatal("Find found the VMI in another namespace")
	}

	if err := h.Pause(ctx, vmi.UID); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if st, _ := h.Status(vmi.UID); !paused(st) {
		t.Errorf("status after Pause has no Paused condition: %+v", st.Conditions)
	}
	if vs, _ := vmOf(h, fakeHV, vmi.UID); vs.GetState() != hypervisorv1.State_STATE_PAUSED {
		t.Errorf("VM after Pause: %v", vs)
	}
	if err := h.Pause(ctx, vmi.UID); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "paused") {
		t.Errorf("Pause of a paused VMI = %v, want FailedPrecondition saying it is paused", err)
	}
	if err := h.CheckStream(ctx, vmi.UID, StreamPortForward); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("CheckStream(portforward) of a paused VMI = %v, want FailedPrecondition", err)
	}
	if err := h.CheckStream(ctx, vmi.UID, StreamConsole); err != nil {
		t.Errorf("CheckStream(console) of a paused VMI = %v, want it allowed", err)
	}
	if err := h.Reset(ctx, vmi.UID); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Reset of a paused VMI = %v, want FailedPrecondition", err)
	}

	if err := h.Unpause(ctx, vmi.UID); err != nil {
		t.Fatalf("Unpause: %v", err)
	}
	if st, _ := h.Status(vmi.UID); paused(st) || st.Phase != v1alpha1.Running {
		t.Errorf("status after Unpause: phase %s, conditions %+v", st.Phase, st.Conditions)
	}
	if err := h.Unpause(ctx, vmi.UID); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Unpause of a running VMI = %v, want FailedPrecondition", err)
	}
	if err := h.CheckStream(ctx, vmi.UID, StreamConsole); err != nil {
		t.Errorf("CheckStream(console) of a running VMI = %v", err)
	}

	before, _ := vmOf(h, fakeHV, vmi.UID)
	if err := h.Reset(ctx, vmi.UID); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	if after, _ := vmOf(h, fakeHV, vmi.UID); after.GetBoots() != before.GetBoots()+1 || after.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Errorf("VM after Reset: %v (before: boots %d)", after, before.GetBoots())
	}

	// The fake driver's guest restarts at once when asked: one boot more, still running.
	before, _ = vmOf(h, fakeHV, vmi.UID)
	if err := h.SoftReboot(ctx, vmi.UID); err != nil {
		t.Fatalf("SoftReboot: %v", err)
	}
	eventually(t, "the soft reboot", 5*time.Second, func() error {
		if after, _ := vmOf(h, fakeHV, vmi.UID); after.GetBoots() != before.GetBoots()+1 || after.GetState() != hypervisorv1.State_STATE_RUNNING {
			return fmt.Errorf("VM %v, want RUNNING with boots %d", after, before.GetBoots()+1)
		}
		return nil
	})

	// The fake driver's simulated guest agent answers at once.
	if info, err := h.GuestOSInfo(ctx, vmi.UID); err != nil || info.Name != fake.FakeGuestOS.Name || info.Version != fake.FakeGuestOS.VersionId ||
		info.KernelRelease != fake.FakeGuestOS.KernelRelease || info.Machine != fake.FakeGuestOS.Machine {
		t.Errorf("GuestOSInfo = %+v, %v; want the fake agent's %v", info, err, fake.FakeGuestOS)
	}
	// No display in the fake driver's protocol.
	for what, err := range map[string]error{
		"CheckStream(vnc)": h.CheckStream(ctx, vmi.UID, StreamVNC),
		"Display":          h.Display(ctx, vmi.UID, strings.NewReader(""), io.Discard),
	} {
		if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), `hypervisor driver "fake" does not offer a VNC display`) {
			t.Errorf("%s = %v, want Unimplemented naming the driver and the VNC display", what, err)
		}
	}
}

// TestActionsUndeclared: a driver that implements pause and reboot without declaring them is
// not called: Unimplemented naming the feature, and the VM runs on.
func TestActionsUndeclared(t *testing.T) {
	e := newEnv(t, testHVSet, withoutFeatures(t, basev1.Feature_FEATURE_HYPERVISOR_PAUSE, basev1.Feature_FEATURE_HYPERVISOR_REBOOT,
		basev1.Feature_FEATURE_HYPERVISOR_SOFT_REBOOT, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE, basev1.Feature_FEATURE_HYPERVISOR_GUEST_AGENT,
		basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC))
	h := e.start()
	vmi := testVMI("demo", "uid-undeclared", e.disk)
	mustRun(t, h, vmi)
	ctx := ctx5s(t)
	_, osErr := h.GuestOSInfo(ctx, vmi.UID)
	_, pingErr := h.GuestAgentPing(ctx, vmi.UID)
	_, execErr := h.GuestAgentExec(ctx, vmi.UID, []string{"true"}, time.Second)
	for name, c := range map[string]struct {
		err     error
		feature string
	}{
		"Pause":                {h.Pause(ctx, vmi.UID), "FEATURE_HYPERVISOR_PAUSE"},
		"Unpause":              {h.Unpause(ctx, vmi.UID), "FEATURE_HYPERVISOR_PAUSE"},
		"Reset":                {h.Reset(ctx, vmi.UID), "FEATURE_HYPERVISOR_REBOOT"},
		"SoftReboot":           {h.SoftReboot(ctx, vmi.UID), "FEATURE_HYPERVISOR_SOFT_REBOOT"},
		"CheckStream(console)": {h.CheckStream(ctx, vmi.UID, StreamConsole), "FEATURE_HYPERVISOR_CONSOLE"},
		"GuestOSInfo":          {osErr, "FEATURE_HYPERVISOR_GUEST_AGENT"},
		"GuestAgentPing":       {pingErr, "FEATURE_HYPERVISOR_GUEST_EXEC"},
		"GuestAgentExec":       {execErr, "FEATURE_HYPERVISOR_GUEST_EXEC"},
	} {
		if status.Code(c.err) != codes.Unimplemented || !strings.Contains(c.err.Error(), c.feature) || !strings.Contains(c.err.Error(), testHV) {
			t.Errorf("%s = %v, want Unimplemented naming %s and the driver", name, c.err, c.feature)
		}
	}
	if vs, _ := vmOf(h, testHV, vmi.UID); vs.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Errorf("VM %v, want it running", vs)
	}
}

// TestActionsOfAnUnknownVMI are NotFound.
func TestActionsOfAnUnknownVMI(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	h := e.start()
	ctx := ctx5s(t)
	uid := types.UID("uid-nowhere")
	_, dialErr := h.DialGuest(ctx, uid, 22)
	_, osErr := h.GuestOSInfo(ctx, uid)
	_, pingErr := h.GuestAgentPing(ctx, uid)
	_, execErr := h.GuestAgentExec(ctx, uid, []string{"true"}, time.Second)
	for name, err := range map[string]error{
		"Pause": h.Pause(ctx, uid), "Unpause": h.Unpause(ctx, uid), "Reset": h.Reset(ctx, uid),
		"SoftReboot": h.SoftReboot(ctx, uid), "CheckStream": h.CheckStream(ctx, uid, StreamConsole),
		"Display": h.Display(ctx, uid, nil, io.Discard), "DialGuest": dialErr, "GuestOSInfo": osErr,
		"GuestAgentPing": pingErr, "GuestAgentExec": execErr,
	} {
		if status.Code(err) != codes.NotFound {
			t.Errorf("%s = %v, want NotFound", name, err)
		}
	}
	if _, ok := h.Find("default", "nowhere"); ok {
		t.Error("Find found a VMI the handler does not run")
	}
}

func TestGuestAddress(t *testing.T) {
	iface := func(addrs ...string) *networkv1.InterfaceResult {
		return &networkv1.InterfaceResult{Name: "default", IpAddresses: addrs, ReachableAddresses: []string{"192.0.2.9/24"}}
	}
	for _, c := range []struct {
		name string
		ifs  []*networkv1.InterfaceResult
		want string
	}{
		{"masquerade: the guest behind the bridge, not the pod", []*networkv1.InterfaceResult{iface("10.0.2.2/24", "fd10:0:2::2/120")}, "10.0.2.2"},
		{"IPv4 first", []*networkv1.InterfaceResult{iface("fd10:0:2::2/120", "10.0.2.2/24")}, "10.0.2.2"},
		{"IPv6 only", []*networkv1.InterfaceResult{iface("fd10:0:2::2/120")}, "fd10:0:2::2"},
		{"bare address", []*networkv1.InterfaceResult{iface("10.244.0.7")}, "10.244.0.7"},
		{"first interface with IPv4", []*networkv1.InterfaceResult{iface(), iface("garbage", "10.1.0.2/16")}, "10.1.0.2"},
		{"none", []*networkv1.InterfaceResult{iface()}, ""},
		{"no interfaces", nil, ""},
	} {
		got, ok := GuestAddress(&networkv1.SetupResponse{Interfaces: c.ifs})
		if (c.want == "") == ok || (ok && got != netip.MustParseAddr(c.want)) {
			t.Errorf("%s: GuestAddress = %v, %v; want %q", c.name, got, ok, c.want)
		}
	}
}

// TestDialGuestInsideTheSandbox: DialGuest connects, from inside the VMI's sandbox network
// namespace, to the address the network driver gave the guest (here on the namespace's
// loopback, as nothing else plays the guest), which the handler's own namespace does not reach.
func TestDialGuestInsideTheSandbox(t *testing.T) {
	testenv.Root(t, "ip netns add")
	ip := testenv.Command(t, "ip", "iproute2")
	name := fmt.Sprintf("kvh-dial-%d", os.Getpid())
	if out, err := exec.Command(ip, "netns", "add", name).CombinedOutput(); err != nil {
		testenv.Missing(t, "ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command(ip, "netns", "del", name).Run() })
	nsPath := "/run/netns/" + name

	vmi := testVMI("demo", "uid-dial", "")
	sb := newTestSandbox(SandboxSpec{NetNSPath: nsPath})
	e := newEnv(t, fakeSet, fakeManifests(t))
	e.opts.Sandboxes = sandboxesOf(map[types.UID]*testSandbox{vmi.UID: sb})
	vmi.Spec.Volumes[0].ContainerDisk.Image = e.disk
	h := e.start()
	mustRun(t, h, vmi)
	addr, ok := GuestAddress(h.entryState(vmi.UID).setupResponse())
	if !ok {
		t.Fatal("the network driver gave the guest no address")
	}
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", addr.String() + "/32", "dev", "lo"}} {
		if out, err := exec.Command(ip, append([]string{"-n", name}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	ln := listenIn(t, nsPath, net.JoinHostPort(addr.String(), "0"))
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("guest here\n"))
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), 500*time.Millisecond); err == nil {
		c.Close()
		t.Fatalf("%s answers in the test's own namespace", ln.Addr())
	}

	ctx := ctx5s(t)
	conn, err := h.DialGuest(ctx, vmi.UID, port)
	if err != nil {
		t.Fatalf("DialGuest: %v", err)
	}
	got, _ := io.ReadAll(conn)
	conn.Close()
	if string(got) != "guest here\n" {
		t.Fatalf("read %q from the guest", got)
	}
	if _, err := h.DialGuest(ctx, vmi.UID, port+1); status.Code(err) != codes.Unavailable {
		t.Errorf("DialGuest of a closed port = %v, want Unavailable", err)
	}
	if _, err := h.DialGuest(ctx, vmi.UID, 0); status.Code(err) != codes.InvalidArgument {
		t.Errorf("DialGuest of port 0 = %v, want InvalidArgument", err)
	}
}

// listenIn listens on addr inside the network namespace at path.
func listenIn(t *testing.T, path, addr string) net.Listener {
	t.Helper()
	type result struct {
		ln  net.Listener
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread ends with the goroutine
		ns, err := netns.GetFromPath(path)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			done <- result{err: err}
			return
		}
		ln, err := net.Listen("tcp", addr)
		done <- result{ln, err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.ln
}
