package qmp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/drivers/qmp/qga"
)

// execTimeout is a GuestAgentExec's timeout when the caller gives none.
const execTimeout = 5 * time.Second

// maxExecPending bounds the guest-exec pids a VM keeps to reap (vm.execPending).
const maxExecPending = 32

// execPoll is the first and the longest wait between two guest-exec-status of a command.
const (
	execPollFirst = 5 * time.Millisecond
	execPollMax   = 100 * time.Millisecond
)

// runningVM returns VM id when it runs, FailedPrecondition when it does not.
func (d *Driver) runningVM(id string) (*vm, error) {
	v, err := d.get(id)
	if err != nil {
		return nil, err
	}
	if _, st, err := v.running(); err != nil {
		return nil, err
	} else if st != hypervisorv1.State_STATE_RUNNING {
		return nil, status.Errorf(codes.FailedPrecondition, "vm %q is %s, not running", id, driver.StateWord(st))
	}
	return v, nil
}

// GuestAgentPing implements driver.GuestExecer: guest-ping over the VM's agent socket, after a
// resynchronisation, under the VM's agent lock and within agentTimeout.
func (d *Driver) GuestAgentPing(ctx context.Context, id string) (*hypervisorv1.GuestAgentPingResponse, error) {
	v, err := d.runningVM(id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, agentTimeout)
	defer cancel()
	c, unlock, err := v.dialAgent(ctx, agentTimeout)
	if err != nil {
		return &hypervisorv1.GuestAgentPingResponse{Message: agentMessage(err)}, nil
	}
	defer unlock()
	if err := c.Ping(ctx); err != nil {
		return &hypervisorv1.GuestAgentPingResponse{Message: agentMessage(err)}, nil
	}
	return &hypervisorv1.GuestAgentPingResponse{Connected: true}, nil
}

// GuestAgentExec implements driver.GuestExecer: guest-exec with the output captured, then
// guest-exec-status until the command exited or timeout passed (polled every few ms at first,
// every execPollMax at most), all under the VM's agent lock. A command still running at the
// timeout is left to the agent, which cannot kill it; its pid is kept, and a later exchange
// reaps it once it ended so that the agent drops its output.
func (d *Driver) GuestAgentExec(ctx context.Context, id string, command []string, timeout time.Duration) (*hypervisorv1.GuestAgentExecResponse, error) {
	if len(command) == 0 || command[0] == "" {
		return nil, status.Error(codes.InvalidArgument, "guest agent exec: command is required")
	}
	v, err := d.runningVM(id)
	if err != nil {
		return nil, err
	}
	if timeout <= 0 {
		timeout = execTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, unlock, err := v.dialAgent(ctx, timeout)
	if err != nil {
		return &hypervisorv1.GuestAgentExecResponse{Message: agentMessage(err)}, nil
	}
	defer unlock()
	pid, err := c.Exec(ctx, command)
	if err != nil {
		var qe *qga.Error
		if errors.As(err, &qe) {
			// The agent answered and refused: no such program, guest-exec disabled.
			return &hypervisorv1.GuestAgentExecResponse{Connected: true, Message: err.Error()}, nil
		}
		return &hypervisorv1.GuestAgentExecResponse{Message: agentMessage(err)}, nil
	}
	wait := execPollFirst
	for {
		st, err := c.ExecStatus(ctx, pid)
		if err != nil && ctx.Err() == nil && !errors.Is(err, qga.ErrNoAnswer) {
			return &hypervisorv1.GuestAgentExecResponse{Connected: true, Message: err.Error()}, nil
		}
		if err == nil && st.Exited {
			return execResponse(st), nil
		}
		if err == nil {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			wait = min(2*wait, execPollMax)
		}
		if ctx.Err() != nil || err != nil {
			v.execPending = append(v.execPending, pid)
			if n := len(v.execPending); n > maxExecPending {
				v.execPending = slices.Delete(v.execPending, 0, n-maxExecPending)
			}
			return &hypervisorv1.GuestAgentExecResponse{Connected: true,
				Message: fmt.Sprintf("the command was still running after %s", timeout)}, nil
		}
	}
}

// execResponse is GuestAgentExec's answer for a command that ended.
func execResponse(st *qga.ExecStatus) *hypervisorv1.GuestAgentExecResponse {
	r := &hypervisorv1.GuestAgentExecResponse{
		Connected: true, Exited: true, ExitCode: int32(st.ExitCode), Signal: int32(st.Signal),
		Stdout: st.Stdout, Stderr: st.Stderr, Truncated: st.OutTruncated || st.ErrTruncated,
	}
	if len(r.Stdout) > driver.MaxGuestExecOutput {
		r.Stdout, r.Truncated = r.Stdout[:driver.MaxGuestExecOutput], true
	}
	if len(r.Stderr) > driver.MaxGuestExecOutput {
		r.Stderr, r.Truncated = r.Stderr[:driver.MaxGuestExecOutput], true
	}
	return r
}

// dialAgent takes the VM's agent lock and connects to its agent (a resynchronised connection),
// then reaps the commands of earlier GuestAgentExec calls that ended. The caller calls unlock,
// which closes the connection, when done.
func (v *vm) dialAgent(ctx context.Context, timeout time.Duration) (*qga.Client, func(), error) {
	release, err := v.lockAgent(ctx)
	if err != nil {
		return nil, nil, err
	}
	c, err := qga.Dial(ctx, v.paths.Agent, timeout)
	if err != nil {
		release()
		return nil, nil, err
	}
	v.reapExecs(ctx, c)
	return c, func() { c.Close(); release() }, nil
}

// reapExecs asks the agent about the commands in execPending and drops those that ended or that
// the agent no longer knows (under the agent lock).
func (v *vm) reapExecs(ctx context.Context, c *qga.Client) {
	kept := v.execPending[:0]
	for i, pid := range v.execPending {
		st, err := c.ExecStatus(ctx, pid)
		var qe *qga.Error
		switch {
		case err == nil && st.Exited, errors.As(err, &qe):
			continue
		case err != nil:
			// The agent stopped answering: keep the rest for next time.
			kept = append(kept, v.execPending[i:]...)
			v.execPending = kept
			return
		}
		kept = append(kept, pid)
	}
	v.execPending = kept
}
