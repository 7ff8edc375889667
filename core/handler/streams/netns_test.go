package streams

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/kubevisor/kubevisor/core/nodeapi"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// listenInNetNS makes the network namespace /run/netns/NAME (removed when the test ends) with
// its loopback up, and listens on 127.0.0.1 inside it.
func listenInNetNS(t *testing.T) (path string, ln net.Listener) {
	t.Helper()
	testenv.Root(t, "ip netns add")
	ip := testenv.Command(t, "ip", "iproute2")
	name := fmt.Sprintf("kvstreams-%d", os.Getpid())
	if out, err := exec.Command(ip, "netns", "add", name).CombinedOutput(); err != nil {
		testenv.Missing(t, "ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command(ip, "netns", "del", name).Run() })
	if out, err := exec.Command(ip, "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	path = "/run/netns/" + name
	done := make(chan error, 1)
	go func() {
		// The thread stays locked, in the namespace, and ends with this goroutine.
		runtime.LockOSThread()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return path, ln
}

// TestPortForwardDialsInsideTheSandboxNamespace: the guest's port is reached from inside the
// VMI's network namespace, where the handler's own namespace has nothing on that port.
func TestPortForwardDialsInsideTheSandboxNamespace(t *testing.T) {
	path, ln := listenInNetNS(t)
	echoServer(t, ln)
	port := ln.Addr().(*net.TCPAddr).Port
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Fatalf("%s answers in the test's own namespace: the listener is not in %s", ln.Addr(), path)
	}
	b := newFakeBackend(t, "vm1")
	b.netns = path
	e := startServer(t, b)
	for range 3 { // each on its own locked thread, which goes back to the handler's namespace
		c := e.mustDial(t, nodeapi.PortForwardPath("default", "vm1", int32(port), "tcp"))
		readUntil(t, c, "hello from the guest\n")
		if _, err := c.Write([]byte("inside\n")); err != nil {
			t.Fatal(err)
		}
		readUntil(t, c, "inside\n")
		c.Close()
	}
	// The endpoint itself still answers from the handler's namespace.
	if st := e.status(t, "PUT", nodeapi.VMIPath("default", "vm1", "reset")); st.Code != 200 {
		t.Fatalf("reset after the forwards: %d %q", st.Code, st.Message)
	}
}
