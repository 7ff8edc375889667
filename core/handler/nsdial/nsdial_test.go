package nsdial

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/kubevisor/kubevisor/internal/testenv"
)

func TestDialWithoutNamespaceDialsHere(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := Dial(context.Background(), "", "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func TestDialOfAMissingNamespaceFails(t *testing.T) {
	_, err := Dial(context.Background(), "/run/netns/kubevisor-no-such-namespace", "tcp", "127.0.0.1:1")
	if err == nil {
		t.Fatal("Dial in a missing namespace succeeded")
	}
}

// TestDialLeavesNoThreadInTheNamespace: after dials inside a namespace (which reach what listens
// there, and not what listens here), every thread of the process is back in its own namespace.
func TestDialLeavesNoThreadInTheNamespace(t *testing.T) {
	testenv.Root(t, "ip netns add")
	ip := testenv.Command(t, "ip", "iproute2")
	name := fmt.Sprintf("kvnsdial-%d", os.Getpid())
	if out, err := exec.Command(ip, "netns", "add", name).CombinedOutput(); err != nil {
		testenv.Missing(t, "ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command(ip, "netns", "del", name).Run() })
	path := "/run/netns/" + name
	own, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()

	// Something listens here; the namespace has nothing (not even its loopback up).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for range 20 {
		if c, err := Dial(context.Background(), path, "tcp", ln.Addr().String()); err == nil {
			c.Close()
			t.Fatal("a dial inside the namespace reached a listener of the test's namespace")
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	strays := 0
	for range 64 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cur, err := netns.Get()
			if err != nil {
				return
			}
			defer cur.Close()
			if !cur.Equal(own) {
				mu.Lock()
				strays++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if strays > 0 {
		t.Fatalf("%d threads are in another network namespace after the dials", strays)
	}
}
