package handler

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	"github.com/kubevisor/kubevisor/core/handler/nsdial"
)

// What the stream endpoint (core/nodeapi, package streams) asks of the handler besides the
// actions. Errors are gRPC statuses as for the actions (actions.go).

// Find returns the UID of the VMI namespace/name that this handler runs (it has the VMI's state
// on the node), and whether it runs one. Of two VMIs of that name (a VMI deleted and made again
// while the first is stopping) it gives the one not stopping.
func (h *Handler) Find(namespace, name string) (types.UID, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var found types.UID
	for uid, e := range h.vmis {
		if e.state == nil || e.state.Namespace != namespace || e.state.Name != name {
			continue
		}
		if found == "" || !e.stopping {
			found = uid
		}
	}
	return found, found != ""
}

// Stream kinds of CheckStream.
const (
	StreamConsole     = "console"
	StreamVNC         = "vnc"
	StreamPortForward = "portforward"
)

// CheckStream says whether a stream of kind (StreamConsole, StreamVNC, StreamPortForward) can be
// opened to VMI uid now, so that the endpoint answers with an HTTP error before it upgrades the
// connection: NotFound, Unimplemented when the driver does not declare the ability,
// FailedPrecondition when the VM is not running. A paused VM's console and display can be
// opened (they show the guest once it is unpaused); a port forward to it cannot (nothing would
// answer the connection).
func (h *Handler) CheckStream(ctx context.Context, uid types.UID, kind string) error {
	_, hv, err := h.startedVM(uid)
	if err != nil {
		return err
	}
	running, paused := hypervisorv1.State_STATE_RUNNING, hypervisorv1.State_STATE_PAUSED
	switch kind {
	case StreamConsole:
		if _, ok := driver.Optional[driver.Consoler](ctx, hv); !ok {
			return h.unoffered(uid, "a serial console (it does not declare FEATURE_HYPERVISOR_CONSOLE)")
		}
		return h.vmIn(ctx, hv, uid, running, paused)
	case StreamVNC:
		if _, ok := driver.Optional[driver.Displayer](ctx, hv); !ok {
			return h.unoffered(uid, "a VNC display")
		}
		return h.vmIn(ctx, hv, uid, running, paused)
	case StreamPortForward:
		return h.vmIn(ctx, hv, uid, running)
	}
	return status.Errorf(codes.InvalidArgument, "no stream %q", kind)
}

// Display copies VMI uid's display, an RFB session, to out and in to it (driver.Displayer),
// until ctx is done, in ends or the VM stops. Each call is its own RFB session.
func (h *Handler) Display(ctx context.Context, uid types.UID, in io.Reader, out io.Writer) error {
	_, hv, err := h.startedVM(uid)
	if err != nil {
		return err
	}
	d, ok := driver.Optional[driver.Displayer](ctx, hv)
	if !ok {
		return h.unoffered(uid, "a VNC display")
	}
	return d.Display(ctx, string(uid), in, out)
}

// DialGuest opens a TCP connection to port of VMI uid's guest: from inside the VMI's sandbox
// network namespace (its launcher pod's) to the guest's own address there, the first address
// its network driver gave the guest (GuestAddress). Unavailable when the guest does not accept.
func (h *Handler) DialGuest(ctx context.Context, uid types.UID, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, status.Errorf(codes.InvalidArgument, "port %d is not in 1..65535", port)
	}
	e, hv, err := h.startedVM(uid)
	if err != nil {
		return nil, err
	}
	if err := h.vmIn(ctx, hv, uid, hypervisorv1.State_STATE_RUNNING); err != nil {
		return nil, err
	}
	h.mu.Lock()
	st := e.state
	h.mu.Unlock()
	addr, ok := GuestAddress(st.setupResponse())
	if !ok {
		return nil, status.Error(codes.FailedPrecondition, "the VMI's guest has no address: its network driver reported none")
	}
	target := net.JoinHostPort(addr.String(), strconv.Itoa(port))
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	conn, err := nsdial.Dial(dctx, st.Sandbox.NetNSPath, "tcp", target)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "dial guest %s: %v", target, err)
	}
	return conn, nil
}

// dialTimeout bounds DialGuest's connection attempt: a guest that drops the connection (a
// firewall, a network not up yet) is an error, not a hang.
const dialTimeout = 10 * time.Second

// GuestAddress is the address at which a guest is reached from inside its sandbox namespace:
// the first IPv4 address among the interfaces' ip_addresses (the guest's own: 10.0.2.2 behind
// the masquerade binding's bridge, the pod's address for the bridge binding), else the first
// IPv6 one. Not the reachable_addresses: those are the pod's, whose forwarding (DNAT) may cover
// only the declared ports.
func GuestAddress(resp *networkv1.SetupResponse) (netip.Addr, bool) {
	var v6 netip.Addr
	for _, i := range resp.GetInterfaces() {
		for _, a := range i.GetIpAddresses() {
			addr, err := parseAddr(a)
			if err != nil {
				continue
			}
			if addr.Is4() {
				return addr, true
			}
			if !v6.IsValid() {
				v6 = addr
			}
		}
	}
	return v6, v6.IsValid()
}

// parseAddr reads an address in CIDR form or bare.
func parseAddr(s string) (netip.Addr, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Addr{}, err
		}
		return p.Addr(), nil
	}
	return netip.ParseAddr(s)
}

// GuestOSInfo returns what VMI uid's guest agent reports of its operating system, asked now
// (driver.GuestAgent): Unimplemented when the hypervisor driver has no guest agent,
// FailedPrecondition when the VM does not run or its agent does not answer.
func (h *Handler) GuestOSInfo(ctx context.Context, uid types.UID) (*subv1.GuestOSInfo, error) {
	_, hv, err := h.startedVM(uid)
	if err != nil {
		return nil, err
	}
	ga, ok := driver.Optional[driver.GuestAgent](ctx, hv)
	if !ok {
		return nil, h.unoffered(uid, "guest OS information: no guest agent (it does not declare FEATURE_HYPERVISOR_GUEST_AGENT)")
	}
	info, err := ga.GuestAgentInfo(ctx, string(uid))
	if err != nil {
		return nil, fmt.Errorf("guest agent: %w", err)
	}
	if !info.GetConnected() {
		return nil, status.Errorf(codes.FailedPrecondition, "the guest agent is not connected: %s", info.GetMessage())
	}
	os := info.GetOs()
	return &subv1.GuestOSInfo{Name: os.GetName(), Version: os.GetVersionId(), KernelRelease: os.GetKernelRelease(), Machine: os.GetMachine()}, nil
}
