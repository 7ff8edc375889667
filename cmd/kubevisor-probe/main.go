// Command kubevisor-probe is the exec probe of a launcher pod's compute container for a VMI's
// exec or guestAgentPing probe: the kubelet runs it every periodSeconds, and it asks the node
// handler, through the guest probe socket (--socket, layout.GuestProbeSocket), to ping the
// guest agent or to run a command in the guest through it (package
// core/handler/cluster/guestprobe).
//
//	kubevisor-probe --socket PATH --timeout 1s ping
//	kubevisor-probe --socket PATH --timeout 1s exec -- PROGRAM [ARG...]
//
// It exits 0 when the probe succeeded (the agent answered, the command exited 0), 1 otherwise,
// after writing the guest command's output to its own stdout and stderr and, on failure, one
// line saying why on stderr: the kubelet records what it printed in the pod's probe events. It
// is a static binary of the launcher image.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/kubevisor/kubevisor/core/handler/cluster/guestprobe"
	"github.com/kubevisor/kubevisor/core/layout"
)

func main() {
	socket := flag.String("socket", "", "`path` of the node handler's guest probe socket")
	timeout := flag.Duration("timeout", guestprobe.DefaultTimeout, "the probe's timeoutSeconds: the whole probe ends by then")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: %s --socket PATH [--timeout D] ping | exec -- PROGRAM [ARG...]\n", layout.GuestProbeCommand)
		flag.PrintDefaults()
	}
	flag.Parse()
	if *socket == "" || *timeout <= 0 {
		fail(2, "--socket and a positive --timeout are required")
	}
	req := guestprobe.Request{TimeoutMillis: handlerBudget(*timeout).Milliseconds()}
	switch args := flag.Args(); {
	case len(args) == 1 && args[0] == "ping":
		req.Ping = true
	case len(args) >= 2 && args[0] == "exec":
		req.Command = args[1:]
		if req.Command[0] == "--" {
			req.Command = req.Command[1:]
		}
		if len(req.Command) == 0 || req.Command[0] == "" {
			fail(2, "exec: no command")
		}
	default:
		flag.Usage()
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	res, err := guestprobe.Ask(ctx, *socket, req)
	if err != nil {
		fail(1, "%v", err)
	}
	os.Stdout.Write(res.Stdout)
	os.Stderr.Write(res.Stderr)
	if !res.Success {
		fail(1, "%s", res.Reason)
	}
}

// handlerBudget is the part of the probe's timeout the node handler gets: the rest is for this
// process and the answer's way back, so that the probe says why it failed before the kubelet's
// timeout ends it.
func handlerBudget(timeout time.Duration) time.Duration {
	return timeout - min(timeout/5, time.Second)
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, layout.GuestProbeCommand+": "+format+"\n", args...)
	os.Exit(code)
}
