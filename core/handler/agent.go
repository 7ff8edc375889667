package handler

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// agentCallTimeout bounds one GuestAgentInfo call (the contract asks the driver for a few
// seconds at most).
const agentCallTimeout = 10 * time.Second

// pollAgents asks the hypervisor driver, every Config.GuestAgentPollInterval and when kicked (a
// VM started), what the guest agent of every running VM reports, and publishes the VMI's status.
// publish calls OnStatus only when the derived status changed, so an agent that answers the same
// costs no status write.
func (h *Handler) pollAgents() {
	t := time.NewTicker(h.cfg.GuestAgentPollInterval.Duration)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-t.C:
		case <-h.agentKick:
		}
		h.pollAgentsOnce(h.ctx)
	}
}

// kickAgents asks pollAgents for a round now.
func (h *Handler) kickAgents() {
	select {
	case h.agentKick <- struct{}{}:
	default:
	}
}

// pollAgentsOnce asks about the agent of every running VM, in parallel. It holds no VMI lock
// while the driver talks to the guest: a guest whose agent does not answer holds up no Sync or
// Stop.
func (h *Handler) pollAgentsOnce(ctx context.Context) {
	h.mu.Lock()
	var uids []types.UID
	for uid, e := range h.vmis {
		if e.state != nil && e.state.Started && !e.stopping && e.vm.GetState() == hypervisorv1.State_STATE_RUNNING {
			uids = append(uids, uid)
		}
	}
	h.mu.Unlock()
	done := make(chan struct{}, len(uids))
	for _, uid := range uids {
		go func() {
			defer func() { done <- struct{}{} }()
			h.pollAgent(ctx, uid)
		}()
	}
	for range uids {
		<-done
	}
}

// pollAgent asks about the agent of VMI uid's VM and publishes its status.
func (h *Handler) pollAgent(ctx context.Context, uid types.UID) {
	h.mu.Lock()
	e := h.vmis[uid]
	var st *vmiState
	if e != nil {
		st = e.state
	}
	h.mu.Unlock()
	if st == nil {
		return
	}
	hv, _, err := h.hypervisorFor(st)
	if err != nil {
		return
	}
	ga, ok := driver.Optional[driver.GuestAgent](ctx, hv)
	if !ok {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
	info, err := ga.GuestAgentInfo(cctx, string(uid))
	cancel()
	switch {
	case status.Code(err) == codes.FailedPrecondition, status.Code(err) == codes.NotFound:
		return // the VM stopped or paused meanwhile: its status says so
	case err != nil:
		if ctx.Err() == nil {
			h.log.Debug("guest agent info", "uid", uid, "error", err)
		}
		return
	}
	h.mu.Lock()
	if h.vmis[uid] != e || e.state == nil {
		h.mu.Unlock()
		return
	}
	e.agent = info
	h.mu.Unlock()
	h.publish(e)
}

// GuestAgentPing pings the guest agent of VMI uid's VM through the hypervisor driver
// (driver.GuestExecer), for its guestAgentPing probe: Unimplemented when the driver does not
// offer it, NotFound or FailedPrecondition when the VMI does not run here; an agent that does not
// answer is connected false.
func (h *Handler) GuestAgentPing(ctx context.Context, uid types.UID) (*hypervisorv1.GuestAgentPingResponse, error) {
	_, hv, err := h.startedVM(uid)
	if err != nil {
		return nil, err
	}
	ge, ok := driver.Optional[driver.GuestExecer](ctx, hv)
	if !ok {
		return nil, h.unoffered(uid, "guest agent probes (it does not declare FEATURE_HYPERVISOR_GUEST_EXEC)")
	}
	return ge.GuestAgentPing(ctx, string(uid))
}

// GuestAgentExec runs command in the guest of VMI uid's VM through its guest agent
// (driver.GuestExecer), for its exec probe, waiting up to timeout for it to end; the errors are
// GuestAgentPing's.
func (h *Handler) GuestAgentExec(ctx context.Context, uid types.UID, command []string, timeout time.Duration) (*hypervisorv1.GuestAgentExecResponse, error) {
	_, hv, err := h.startedVM(uid)
	if err != nil {
		return nil, err
	}
	ge, ok := driver.Optional[driver.GuestExecer](ctx, hv)
	if !ok {
		return nil, h.unoffered(uid, "guest agent probes (it does not declare FEATURE_HYPERVISOR_GUEST_EXEC)")
	}
	return ge.GuestAgentExec(ctx, string(uid), command, timeout)
}
