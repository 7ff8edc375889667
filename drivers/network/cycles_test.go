package network

import (
	"context"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// cycles is how many setup/teardown cycles TestCycles runs.
const cycles = 100

// TestCycles sets up and tears down a VMI with a pod network interface (bridge and
// masquerade in turn) and a secondary network interface, cycles times, and counts what is
// left: links, addresses, routes, nftables tables and rules, sysctls of the pod namespace;
// host-local allocations, libcni cache entries and state files; DHCP servers, goroutines
// and open file descriptors of the driver process.
func TestCycles(t *testing.T) {
	requireRoot(t)
	n := newNode(t)
	n.addSecondary(t, "net-a")
	p := n.newPod(t)
	stateDir := tempDir(t)
	d := n.newDriver(t, stateDir)

	// One cycle first, so that what the process keeps for good (the runtime's threads,
	// the logger's) is in the baseline.
	runCycle(t, d, p, 0)
	before := snap(t, p.ns)
	goroutines, fds := settledGoroutines(0), openFDs(t)
	var setup, teardown []time.Duration
	for i := 1; i <= cycles; i++ {
		s, td := runCycle(t, d, p, i)
		setup, teardown = append(setup, s), append(teardown, td)
		if t.Failed() {
			t.Fatalf("cycle %d failed", i)
		}
	}
	expectClean(t, n, d, p.ns, before, stateDir)
	if tables, rules := nftRuleset(t, p.ns); len(tables) != 0 || rules != 0 {
		t.Errorf("nftables after %d cycles: tables %v, %d rules", cycles, tables, rules)
	}
	if files := cacheFiles(t, n.driverConfig().CNICacheDir); len(files) != 0 {
		t.Errorf("libcni cache after %d cycles: %v", cycles, files)
	}
	if g := settledGoroutines(goroutines); g > goroutines {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before the cycles, %d after\n%s", goroutines, g, buf[:runtime.Stack(buf, true)])
	}
	if f := openFDs(t); f > fds {
		t.Errorf("open file descriptors: %d before the cycles, %d after", fds, f)
	}
	t.Logf("%d cycles (pod network bridge/masquerade in turn + secondary bridge): setup median %s, teardown median %s",
		cycles, median(setup), median(teardown))
}

// runCycle sets up and tears down one VMI, the pod interface bound with bridge on odd
// cycles and masquerade on even ones.
func runCycle(t *testing.T, d *Driver, p *pod, i int) (setup, teardown time.Duration) {
	t.Helper()
	ctx := context.Background()
	binding := BindingMasquerade
	if i%2 == 1 {
		binding = BindingBridge
	}
	vmi := newVMIID()
	ifaces := []*networkv1.Interface{iface("default", binding, ""), iface("blue", BindingBridge, "net-a")}
	start := time.Now()
	if _, err := d.Setup(ctx, setupReq(vmi, p.ns, ifaces...)); err != nil {
		t.Fatalf("cycle %d: Setup: %v", i, err)
	}
	setup = time.Since(start)
	if d.dhcp.count() != 2 {
		t.Errorf("cycle %d: %d DHCP servers, want 2", i, d.dhcp.count())
	}
	start = time.Now()
	if err := d.Teardown(ctx, teardownReq(vmi, p.ns, ifaces...)); err != nil {
		t.Fatalf("cycle %d: Teardown: %v", i, err)
	}
	return setup, time.Since(start)
}

// settledGoroutines waits up to a few seconds for the number of goroutines to come down to
// want, and returns it.
func settledGoroutines(want int) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("%v", err)
	}
	return len(entries)
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(10 * time.Microsecond)
}
