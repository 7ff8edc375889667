package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// supervisor keeps one child of this test process running under the program name name (its
// argv[0]), starting it again whenever it exits, as the handler's plugin host does.
type supervisor struct {
	t    *testing.T
	name string
	mu   sync.Mutex
	pids []int         // every child started, in order
	ends []string      // how each ended
	stop chan struct{} // closed: do not start another
	done chan struct{}
}

func supervise(t *testing.T, name string) *supervisor {
	s := &supervisor{t: t, name: name, stop: make(chan struct{}), done: make(chan struct{})}
	started := make(chan struct{})
	go func() {
		defer close(s.done)
		first := true
		for {
			cmd := exec.Command("sleep", "60")
			cmd.Args[0] = name
			if err := cmd.Start(); err != nil {
				t.Errorf("start %s: %v", name, err)
				return
			}
			s.mu.Lock()
			s.pids = append(s.pids, cmd.Process.Pid)
			s.mu.Unlock()
			if first {
				close(started)
				first = false
			}
			exited := make(chan string, 1)
			go func() { exited <- fmt.Sprint(cmd.Wait()) }()
			select {
			case how := <-exited:
				s.mu.Lock()
				s.ends = append(s.ends, how)
				s.mu.Unlock()
				time.Sleep(200 * time.Millisecond) // a restart backoff
			case <-s.stop:
				_ = cmd.Process.Kill()
				<-exited
				return
			}
		}
	}()
	<-started
	t.Cleanup(func() { close(s.stop); <-s.done })
	return s
}

func (s *supervisor) state() ([]int, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.pids...), append([]string(nil), s.ends...)
}

// waitForProgram waits until /proc shows pid running program (an exec'd child shows its
// argv[0] only once exec is done).
func waitForProgram(t *testing.T, pid int, program string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p, err := readProcess("/proc", pid)
		if err == nil && p.program == program {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d never ran %s (%+v, %v)", pid, program, p, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func self() string { return filepath.Base(os.Args[0]) }

func TestKillsTheChildAndSeesItsSuccessor(t *testing.T) {
	victim := supervise(t, "kubevisor-driver-victim")
	other := supervise(t, "kubevisor-driver-other")
	vp, _ := victim.state()
	op, _ := other.state()
	waitForProgram(t, vp[0], "kubevisor-driver-victim")
	waitForProgram(t, op[0], "kubevisor-driver-other")

	var out bytes.Buffer
	err := run(options{proc: "/proc", name: "kubevisor-driver-victim", parent: self(), signal: syscall.SIGKILL, wait: 10 * time.Second, out: &out})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	pids, ends := victim.state()
	if len(pids) < 2 || len(ends) < 1 {
		t.Fatalf("the victim was not restarted: pids %v, ends %v\n%s", pids, ends, out.String())
	}
	if ends[0] != "signal: killed" {
		t.Errorf("the first victim ended with %q, want signal: killed", ends[0])
	}
	for _, want := range []string{
		fmt.Sprintf("before kubevisor-driver-other %d\n", op[0]),
		fmt.Sprintf("before kubevisor-driver-victim %d\n", pids[0]),
		fmt.Sprintf("parent %s %d\n", self(), os.Getpid()),
		fmt.Sprintf("signalled kubevisor-driver-victim %d SIGKILL\n", pids[0]),
		fmt.Sprintf("restarted kubevisor-driver-victim %d\n", pids[1]),
		fmt.Sprintf("after kubevisor-driver-other %d\n", op[0]),
		fmt.Sprintf("after kubevisor-driver-victim %d\n", pids[1]),
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if _, oe := other.state(); len(oe) != 0 {
		t.Errorf("the other child ended: %v", oe)
	}
}

func TestNoSuccessorIsAnError(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	cmd.Args[0] = "kubevisor-driver-once"
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitForProgram(t, cmd.Process.Pid, "kubevisor-driver-once")
	var out bytes.Buffer
	err := run(options{proc: "/proc", name: "kubevisor-driver-once", parent: self(), signal: syscall.SIGTERM, wait: time.Second, out: &out})
	if err == nil || !strings.Contains(err.Error(), "no new kubevisor-driver-once process") {
		t.Fatalf("run: %v, want no new process\n%s", err, out.String())
	}
	if err := cmd.Wait(); err == nil || err.Error() != "signal: terminated" {
		t.Errorf("the child ended with %v, want signal: terminated", err)
	}
}

func TestRefusesNoneOrSeveral(t *testing.T) {
	var pids []int
	for range 2 {
		cmd := exec.Command("sleep", "60")
		cmd.Args[0] = "kubevisor-driver-twin"
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		waitForProgram(t, cmd.Process.Pid, "kubevisor-driver-twin")
		pids = append(pids, cmd.Process.Pid)
	}
	for _, c := range []struct{ name, parent, want string }{
		{"kubevisor-driver-twin", self(), "2 kubevisor-driver-twin processes"},
		{"kubevisor-driver-absent", self(), "no kubevisor-driver-absent process whose parent is " + self()},
		{"kubevisor-driver-twin", "no-such-parent", "no no-such-parent process"},
	} {
		var out bytes.Buffer
		err := run(options{proc: "/proc", name: c.name, parent: c.parent, signal: syscall.SIGKILL, wait: time.Second, out: &out})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run %s under %s: %v, want %q", c.name, c.parent, err, c.want)
		}
		if strings.Contains(out.String(), "signalled") {
			t.Errorf("run %s under %s signalled:\n%s", c.name, c.parent, out.String())
		}
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err != nil {
			t.Errorf("twin %d is gone: %v", pid, err)
		}
	}
}

func TestReadProcessStat(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "42")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// comm with a space and a parenthesis, as a process may name itself.
	stat := "42 (a) b) S 7 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 98765 1000 100\n"
	must(t, os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "cmdline"), []byte("/usr/local/bin/kubevisor-driver-qmp\x00--flag\x00"), 0o644))
	p, err := readProcess(root, 42)
	if err != nil {
		t.Fatal(err)
	}
	if want := (process{pid: 42, ppid: 7, program: "kubevisor-driver-qmp", start: 98765}); p != want {
		t.Errorf("readProcess = %+v, want %+v", p, want)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Two nodes on one machine (hostPID): two handlers, each with its plugin, each the child of its
// pod's shim; e2e-signal, in an ephemeral container of one pod, takes that pod's handler only.
func TestOwnPod(t *testing.T) {
	ps := []process{
		{pid: 1, program: "init"},
		{pid: 10, ppid: 1, program: "containerd-shim-runc-v2"},
		{pid: 11, ppid: 10, program: "kubevisor-handler"},
		{pid: 12, ppid: 11, program: "kubevisor-driver-qmp"},
		{pid: 20, ppid: 1, program: "containerd-shim-runc-v2"},
		{pid: 21, ppid: 20, program: "kubevisor-handler"},
		{pid: 22, ppid: 21, program: "kubevisor-driver-qmp"},
		{pid: 30, ppid: 20, program: "e2e-signal"},     // in the second pod
		{pid: 40, ppid: 1, program: "e2e-signal"},      // under no shim
		{pid: 50, ppid: 1, program: "containerd-shim"}, // a shim of another pod
		{pid: 51, ppid: 50, program: "sh"},
		{pid: 52, ppid: 51, program: "e2e-signal"}, // started by a shell in that pod
	}
	handlers := filter(ps, func(p process) bool { return p.program == "kubevisor-handler" })
	pids := func(ps []process) []int {
		var out []int
		for _, p := range ps {
			out = append(out, p.pid)
		}
		return out
	}
	for _, c := range []struct {
		self int
		want []int
	}{
		{30, []int{21}},     // its own pod's handler
		{40, []int{11, 21}}, // no shim above it: both, as before (the caller refuses two)
		{52, []int{11, 21}}, // a shim, but no handler under it: both
	} {
		if got := pids(ownPod(ps, c.self, handlers)); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("self %d: parents %v, want %v", c.self, got, c.want)
		}
	}
	if got := pids(ownPod(ps, 30, handlers[:1])); fmt.Sprint(got) != "[11]" {
		t.Errorf("one parent: %v, want it kept", got)
	}
}
