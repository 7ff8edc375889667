package qmp

import (
	"context"
	"errors"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/drivers/qmp/qga"
)

// agentTimeout bounds one GuestAgentInfo: the dial, the resynchronisation and every query
// share it, so that a guest without an agent costs the caller this much at most.
const agentTimeout = 3 * time.Second

// GuestAgentInfo implements driver.GuestAgent: the QEMU guest agent's answers over the VM's
// agent socket (Paths.Agent), one connection per call. It holds neither the VM's operation lock
// nor its state lock while it waits for the guest, only the VM's agent lock (QEMU's chardev
// serves one client at a time).
func (d *Driver) GuestAgentInfo(ctx context.Context, id string) (*hypervisorv1.GuestAgentInfoResponse, error) {
	v, err := d.get(id)
	if err != nil {
		return nil, err
	}
	if _, st, err := v.running(); err != nil {
		return nil, err
	} else if st != hypervisorv1.State_STATE_RUNNING {
		return nil, status.Errorf(codes.FailedPrecondition, "vm %q is %s, not running", id, driver.StateWord(st))
	}
	ctx, cancel := context.WithTimeout(ctx, agentTimeout)
	defer cancel()
	unlock, err := v.lockAgent(ctx)
	if err != nil {
		return &hypervisorv1.GuestAgentInfoResponse{Message: err.Error()}, nil
	}
	defer unlock()
	return queryAgent(ctx, v.paths.Agent), nil
}

// lockAgent takes the VM's agent lock, or fails when ctx ends first (another caller talks to
// a guest that does not answer).
func (v *vm) lockAgent(ctx context.Context) (func(), error) {
	select {
	case v.agent <- struct{}{}:
		return func() { <-v.agent }, nil
	case <-ctx.Done():
		return nil, errors.New("the guest agent is busy with another caller")
	}
}

// queryAgent asks the agent at path; an agent that cannot be reached is connected false with the
// reason in message.
func queryAgent(ctx context.Context, path string) *hypervisorv1.GuestAgentInfoResponse {
	c, err := qga.Dial(ctx, path, agentTimeout)
	if err != nil {
		return &hypervisorv1.GuestAgentInfoResponse{Message: agentMessage(err)}
	}
	defer c.Close()
	info, err := c.Query(ctx)
	if err != nil {
		return &hypervisorv1.GuestAgentInfoResponse{Message: agentMessage(err)}
	}
	resp := &hypervisorv1.GuestAgentInfoResponse{
		Connected: true,
		Version:   info.Version,
		Os: &hypervisorv1.GuestOSInfo{
			Name: info.OS.Name, KernelRelease: info.OS.KernelRelease, Version: info.OS.Version,
			PrettyName: info.OS.PrettyName, VersionId: info.OS.VersionID,
			KernelVersion: info.OS.KernelVersion, Machine: info.OS.Machine, Id: info.OS.ID,
		},
		HostName:              info.HostName,
		Timezone:              info.Timezone.Zone,
		TimezoneOffsetSeconds: int32(info.Timezone.Offset),
	}
	var msgs []string
	for _, e := range info.Errors {
		msgs = append(msgs, e.Error())
	}
	resp.Message = strings.Join(msgs, "; ")
	return resp
}

// agentMessage says why the agent is not connected, in words for a condition's message.
func agentMessage(err error) string {
	if errors.Is(err, qga.ErrNoAnswer) {
		return "the guest agent does not answer on " + AgentPort
	}
	return err.Error()
}
