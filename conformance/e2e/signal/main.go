// Command e2e-signal sends a signal to a driver plugin process of the node handler for the
// cluster conformance suite, and waits for the plugin host to start it again. It runs in an
// ephemeral container of the handler pod, which shares the handler's process namespace: it
// finds the one process whose program (argv[0]'s base name, from /proc/<pid>/cmdline) is NAME
// and whose parent's is -parent, signals it, and waits until a process of that name and
// parent runs again with another pid. Stdlib only, so it builds static for a scratch image.
//
// With the host's process namespace (the handler runs with hostPID) it sees every node's
// handler when several nodes share one machine (the local cluster's make up NODES=2): the
// parent is then its own pod's, the one under the same containerd shim (one per pod) as itself.
//
// Its standard output is what the suite reads, one fact per line:
//
//	before <program> <pid>      every child of the parent, before the signal
//	parent <program> <pid>      the parent
//	signalled <program> <pid> <signal>
//	restarted <program> <pid>   the new process (only with -wait)
//	after <program> <pid>       every child of the parent, at the end
//
// It exits non-zero, saying why on standard error, when no such process or more than one is
// found, the signal fails, or no new process came within -wait.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	o := options{proc: "/proc", out: os.Stdout}
	flag.StringVar(&o.parent, "parent", "kubevisor-handler", "the program whose child is signalled")
	sig := flag.String("signal", "KILL", "signal name: KILL, TERM, INT, HUP, QUIT, USR1, USR2, STOP, CONT")
	flag.DurationVar(&o.wait, "wait", 2*time.Minute, "wait this long for a new process of the same program and parent (0: do not wait)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: e2e-signal [-parent PROGRAM] [-signal NAME] [-wait D] PROGRAM")
		os.Exit(2)
	}
	s, ok := signals[strings.TrimPrefix(strings.ToUpper(*sig), "SIG")]
	if !ok {
		fmt.Fprintf(os.Stderr, "e2e-signal: unknown signal %q\n", *sig)
		os.Exit(2)
	}
	o.name, o.signal = flag.Arg(0), s
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "e2e-signal:", err)
		os.Exit(1)
	}
}

var signals = map[string]syscall.Signal{
	"KILL": syscall.SIGKILL, "TERM": syscall.SIGTERM, "INT": syscall.SIGINT, "HUP": syscall.SIGHUP,
	"QUIT": syscall.SIGQUIT, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2,
	"STOP": syscall.SIGSTOP, "CONT": syscall.SIGCONT,
}

type options struct {
	proc   string // the proc file system
	name   string // the program to signal
	parent string // its parent's program
	signal syscall.Signal
	wait   time.Duration
	out    io.Writer
}

// process is what e2e-signal knows of a process.
type process struct {
	pid, ppid int
	program   string // base name of argv[0]
	start     uint64 // start time in clock ticks since boot: with pid, the process's identity
}

func run(o options) error {
	ps, err := processes(o.proc)
	if err != nil {
		return err
	}
	parents := filter(ps, func(p process) bool { return p.program == o.parent })
	if len(parents) == 0 {
		return fmt.Errorf("no %s process in %s: is this container in the handler pod's process namespace?", o.parent, o.proc)
	}
	parents = ownPod(ps, os.Getpid(), parents)
	kids := children(ps, parents)
	printAll(o.out, "before", kids)
	target := filter(kids, func(p process) bool { return p.program == o.name })
	switch {
	case len(target) == 0:
		return fmt.Errorf("no %s process whose parent is %s (%s's children: %s)", o.name, o.parent, o.parent, names(kids))
	case len(target) > 1:
		return fmt.Errorf("%d %s processes whose parent is %s (%s): which one is meant?", len(target), o.name, o.parent, names(target))
	}
	t := target[0]
	parent := parents[slices.IndexFunc(parents, func(p process) bool { return p.pid == t.ppid })]
	fmt.Fprintf(o.out, "parent %s %d\n", parent.program, parent.pid)
	if err := syscall.Kill(t.pid, o.signal); err != nil {
		return fmt.Errorf("signal %s %d: %w", t.program, t.pid, err)
	}
	fmt.Fprintf(o.out, "signalled %s %d %s\n", t.program, t.pid, signalName(o.signal))
	if o.wait > 0 {
		next, err := waitNew(o, t, parent)
		if err != nil {
			return err
		}
		fmt.Fprintf(o.out, "restarted %s %d\n", next.program, next.pid)
	}
	ps, err = processes(o.proc)
	if err != nil {
		return err
	}
	printAll(o.out, "after", children(ps, []process{parent}))
	return nil
}

// waitNew waits until a process of old's program runs under parent that is not old.
func waitNew(o options, old, parent process) (process, error) {
	deadline := time.Now().Add(o.wait)
	for {
		ps, err := processes(o.proc)
		if err != nil {
			return process{}, err
		}
		for _, p := range children(ps, []process{parent}) {
			if p.program == old.program && (p.pid != old.pid || p.start != old.start) {
				return p, nil
			}
		}
		if time.Now().After(deadline) {
			return process{}, fmt.Errorf("no new %s process under %s %d within %s", old.program, parent.program, parent.pid, o.wait)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// processes reads every process of the proc file system at root. A process that exits while
// it is read is left out.
func processes(root string) ([]process, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []process
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !e.IsDir() {
			continue
		}
		p, err := readProcess(root, pid)
		if err != nil {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// readProcess reads a process's program from its cmdline and its parent and start time from
// its stat. A kernel thread (an empty cmdline) has no program.
func readProcess(root string, pid int) (process, error) {
	dir := filepath.Join(root, strconv.Itoa(pid))
	cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil {
		return process{}, err
	}
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return process{}, err
	}
	p := process{pid: pid}
	if argv0, _, _ := strings.Cut(string(cmdline), "\x00"); argv0 != "" {
		p.program = filepath.Base(argv0)
	}
	// stat: pid (comm) state ppid ... with comm possibly holding spaces and parentheses; the
	// fields after the last ')' are state (3), ppid (4), ..., starttime (22).
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return process{}, errors.New("stat: no ')'")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 20 {
		return process{}, fmt.Errorf("stat: %d fields after comm", len(f))
	}
	if p.ppid, err = strconv.Atoi(f[1]); err != nil {
		return process{}, fmt.Errorf("stat ppid: %w", err)
	}
	if p.start, err = strconv.ParseUint(f[19], 10, 64); err != nil {
		return process{}, fmt.Errorf("stat starttime: %w", err)
	}
	return p, nil
}

// ownPod narrows several parents to those in the pod of process self: under the same
// containerd shim, the nearest ancestor whose program is one. Parents stay as they are when
// there is one, when self has no shim above it, or when none shares it.
func ownPod(ps []process, self int, parents []process) []process {
	if len(parents) < 2 {
		return parents
	}
	byPid := make(map[int]process, len(ps))
	for _, p := range ps {
		byPid[p.pid] = p
	}
	shim := shimOf(byPid, self)
	if shim == 0 {
		return parents
	}
	own := filter(parents, func(p process) bool { return shimOf(byPid, p.pid) == shim })
	if len(own) == 0 {
		return parents
	}
	return own
}

// shimOf is the pid of the nearest ancestor of pid whose program is a containerd shim
// (containerd-shim, containerd-shim-runc-v2, ...), 0 when there is none.
func shimOf(byPid map[int]process, pid int) int {
	seen := map[int]bool{}
	for p, ok := byPid[pid]; ok && !seen[p.pid]; p, ok = byPid[p.ppid] {
		seen[p.pid] = true
		if p.pid != pid && strings.HasPrefix(p.program, "containerd-shim") {
			return p.pid
		}
	}
	return 0
}

func filter(ps []process, keep func(process) bool) []process {
	var out []process
	for _, p := range ps {
		if keep(p) {
			out = append(out, p)
		}
	}
	return out
}

// children are the processes of ps whose parent is one of parents, by program then pid.
func children(ps, parents []process) []process {
	out := filter(ps, func(p process) bool {
		return slices.ContainsFunc(parents, func(q process) bool { return q.pid == p.ppid })
	})
	slices.SortFunc(out, func(a, b process) int {
		if c := strings.Compare(a.program, b.program); c != 0 {
			return c
		}
		return a.pid - b.pid
	})
	return out
}

func printAll(w io.Writer, what string, ps []process) {
	for _, p := range ps {
		fmt.Fprintf(w, "%s %s %d\n", what, p.program, p.pid)
	}
}

func names(ps []process) string {
	if len(ps) == 0 {
		return "none"
	}
	var s []string
	for _, p := range ps {
		s = append(s, fmt.Sprintf("%s %d", p.program, p.pid))
	}
	return strings.Join(s, ", ")
}

func signalName(s syscall.Signal) string {
	for n, v := range signals {
		if v == s {
			return "SIG" + n
		}
	}
	return strconv.Itoa(int(s))
}
