package conformance

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubevisor/kubevisor/internal/testenv"
)

func TestConfinementCapabilities(t *testing.T) {
	c, err := newConfinement([]string{"setgid", "CAP_SETUID"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.caps, []string{"SETGID", "SETUID"}) || c.mask != 0xc0 {
		t.Errorf("caps %v mask %#x, want [SETGID SETUID] 0xc0", c.caps, c.mask)
	}
	if _, err := newConfinement([]string{"SETUID", "FLY"}); err == nil || !strings.Contains(err.Error(), `"FLY"`) {
		t.Errorf("an unknown capability: error %v, want one naming it", err)
	}
}

// TestConfinementVerify starts a process as the VM checks start a confined launcher and checks
// what verify reads of it: the confinement it runs under passes, another one fails, and so
// does a process run with root's full sets.
func TestConfinementVerify(t *testing.T) {
	testenv.Root(t, "setpriv confines a process started by root")
	testenv.Command(t, "setpriv", "util-linux")
	sleep := testenv.Command(t, "sleep", "coreutils")
	start := func(c *confinement) int {
		path, args := c.command(sleep, []string{"60"})
		cmd := exec.Command(path, args...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		// setpriv execs sleep in the same process.
		for deadline := time.Now().Add(5 * time.Second); ; {
			comm, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/comm")
			if strings.TrimSpace(string(comm)) == "sleep" {
				return cmd.Process.Pid
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s %v did not exec sleep", path, args)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	confine := func(caps ...string) *confinement {
		c, err := newConfinement(caps)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	setgid, none := confine("SETGID"), confine()
	pid := start(setgid)
	if err := setgid.verify(pid); err != nil {
		t.Errorf("a process confined to SETGID: %v", err)
	}
	if err := none.verify(pid); err == nil || !strings.Contains(err.Error(), "CapBnd 0000000000000040, want 0000000000000000") {
		t.Errorf("a process keeping SETGID checked for none: error %v, want CapBnd's", err)
	}
	if err := none.verify(start(none)); err != nil {
		t.Errorf("a process keeping no capability: %v", err)
	}
	var unconfined *confinement
	if err := none.verify(start(unconfined)); err == nil {
		t.Errorf("a process with root's full capability sets passes the check of a confinement to none")
	}
}
