package cluster

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/core/handler/cluster/guestprobe"
	"github.com/kubevisor/kubevisor/core/layout"
)

// guestProber is what answers a VMI's guest probes (handler.Handler does, through the
// hypervisor driver's GuestExecer).
type guestProber interface {
	GuestAgentPing(ctx context.Context, uid types.UID) (*hypervisorv1.GuestAgentPingResponse, error)
	GuestAgentExec(ctx context.Context, uid types.UID, command []string, timeout time.Duration) (*hypervisorv1.GuestAgentExecResponse, error)
}

// guestProbes serves the guest probe socket (package guestprobe) of each running VMI with an
// exec or guestAgentPing probe, in its host directory, for the kubevisor-probe of its launcher
// pod's compute container. The agent ensures it whenever it finds such a VMI Running, which it
// does again for every VMI after a handler restart, and stops it when it stops the VMI.
type guestProbes struct {
	h    guestProber
	root string // host state dir
	log  logr.Logger
	// label, when set, labels a VMI's socket directory and socket with the VMI's SELinux level
	// (handler.Handler.LabelFiles), for kubevisor-probe in the pod to reach.
	label func(uid types.UID, path string, recurse bool) error

	mu      sync.Mutex
	servers map[types.UID]*guestprobe.Server
}

// probeChecks are what a VMI's probes may ask of its guest: the socket answers those only, so
// that a process of the launcher pod cannot use it to run any other command in the guest (as
// root, where the agent runs as root).
type probeChecks struct {
	ping     bool
	commands [][]string
}

// checksOf are the guest agent checks of a VMI's liveness and readiness probes.
func checksOf(probes ...*v1alpha1.Probe) probeChecks {
	var c probeChecks
	for _, p := range probes {
		switch {
		case p == nil:
		case p.GuestAgentPing != nil:
			c.ping = true
		case p.Exec != nil:
			c.commands = append(c.commands, slices.Clone(p.Exec.Command))
		}
	}
	return c
}

// allows says why req is not one of the VMI's probes, or "" when it is.
func (c probeChecks) allows(req guestprobe.Request) string {
	if req.Ping {
		if !c.ping {
			return "the VMI has no guestAgentPing probe"
		}
		return ""
	}
	for _, cmd := range c.commands {
		if slices.Equal(cmd, req.Command) {
			return ""
		}
	}
	return fmt.Sprintf("command %q is not the exec command of one of the VMI's probes", req.Command)
}

func newGuestProbes(h guestProber, root string, log logr.Logger) *guestProbes {
	return &guestProbes{h: h, root: root, log: log, servers: map[types.UID]*guestprobe.Server{}}
}

// ensure serves VMI uid's socket unless it is served, answering the checks of its probes only
// (a VMI's probes do not change while it runs). The socket's directory goes to the owner of the
// VMI's launcher directory, which the launcher made as its own user.
func (g *guestProbes) ensure(uid types.UID, checks probeChecks) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.servers[uid]; ok {
		return nil
	}
	fi, err := os.Lstat(layout.LauncherDir(g.root, uid))
	if err != nil {
		return fmt.Errorf("guest probe socket: the launcher's directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.IsDir() {
		return fmt.Errorf("guest probe socket: %s is not the launcher's directory", layout.LauncherDir(g.root, uid))
	}
	s, err := guestprobe.Listen(layout.GuestProbeSocket(g.root, uid), int(st.Uid), int(st.Gid), func(ctx context.Context, req guestprobe.Request) guestprobe.Result {
		if why := checks.allows(req); why != "" {
			return guestprobe.Result{Reason: why}
		}
		return g.probe(ctx, uid, req)
	})
	if err != nil {
		return err
	}
	if g.label != nil {
		if err := g.label(uid, layout.GuestProbeDir(g.root, uid), true); err != nil {
			_ = s.Close()
			return fmt.Errorf("guest probe socket: %w", err)
		}
	}
	g.servers[uid] = s
	return nil
}

// stop stops serving VMI uid's socket and removes it.
func (g *guestProbes) stop(uid types.UID) {
	g.mu.Lock()
	s := g.servers[uid]
	delete(g.servers, uid)
	g.mu.Unlock()
	if s != nil {
		if err := s.Close(); err != nil {
			g.log.V(1).Info("close the guest probe socket", "uid", uid, "error", err)
		}
	}
}

// close stops every socket.
func (g *guestProbes) close() {
	g.mu.Lock()
	uids := make([]types.UID, 0, len(g.servers))
	for uid := range g.servers {
		uids = append(uids, uid)
	}
	g.mu.Unlock()
	for _, uid := range uids {
		g.stop(uid)
	}
}

// probe answers one request of VMI uid's kubevisor-probe, within ctx (the request's timeout).
func (g *guestProbes) probe(ctx context.Context, uid types.UID, req guestprobe.Request) guestprobe.Result {
	if req.Ping {
		r, err := g.h.GuestAgentPing(ctx, uid)
		switch {
		case err != nil:
			return guestprobe.Result{Reason: handlerReason(err)}
		case !r.GetConnected():
			return guestprobe.Result{Reason: "guest agent not connected: " + oneLine(r.GetMessage())}
		}
		return guestprobe.Result{Success: true}
	}
	if len(req.Command) == 0 || req.Command[0] == "" {
		return guestprobe.Result{Reason: "no command to run in the guest"}
	}
	var timeout time.Duration
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	r, err := g.h.GuestAgentExec(ctx, uid, req.Command, timeout)
	if err != nil {
		return guestprobe.Result{Reason: handlerReason(err)}
	}
	res := guestprobe.Result{Stdout: r.GetStdout(), Stderr: r.GetStderr()}
	switch {
	case !r.GetConnected():
		res.Reason = "guest agent not connected: " + oneLine(r.GetMessage())
	case !r.GetExited():
		res.Reason = fmt.Sprintf("command %q in the guest: %s", req.Command, oneLine(r.GetMessage()))
	case r.GetSignal() != 0:
		res.Reason = fmt.Sprintf("command %q in the guest was killed by signal %d", req.Command, r.GetSignal())
	case r.GetExitCode() != 0:
		res.Reason = fmt.Sprintf("command %q in the guest exited with status %d", req.Command, r.GetExitCode())
	default:
		res.Success = true
	}
	return res
}

// handlerReason is a failure of the handler or the driver, in one line: the gRPC status's
// message without its code's decoration.
func handlerReason(err error) string {
	if s, ok := status.FromError(err); ok {
		return oneLine(s.Message())
	}
	return oneLine(err.Error())
}

// oneLine joins the lines of s, so that a reason stays one line in the kubelet's event.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
