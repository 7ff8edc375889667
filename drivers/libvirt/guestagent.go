package libvirt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	golibvirt "libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/drivers/qmp"
	"github.com/kubevisor/kubevisor/drivers/qmp/qga"
)

// The guest agent: every domain has the QEMU guest agent's channel, a virtio-serial port named
// org.qemu.guest_agent.0 (as KubeVirt and the qmp driver give every VM, whether or not its guest
// runs an agent), whose host side is a unix socket in the run dir (agent.sock: libvirt's own
// path, below its XDG_CONFIG_HOME, would not fit in a socket address). The VM's daemon is the
// agent's one client: it connects to that socket itself and follows the port's state, so the
// driver talks to the agent through the daemon, with virDomainQemuAgentCommand (libvirt-qemu),
// the same commands as the qmp driver's (qga).

// agentTimeout bounds one GuestAgentInfo or GuestAgentPing.
const agentTimeout = 3 * time.Second

// execTimeout is a GuestAgentExec's timeout when the caller gives none.
const execTimeout = 5 * time.Second

// execPoll is the first and the longest wait between two guest-exec-status of a command.
const (
	execPollFirst = 5 * time.Millisecond
	execPollMax   = 100 * time.Millisecond
)

var (
	_ driver.GuestAgent   = (*Driver)(nil)
	_ driver.GuestExecer  = (*Driver)(nil)
	_ driver.SoftRebooter = (*Driver)(nil)
)

// agentSocket is the agent channel's socket.
func agentSocket(runDir string) string { return filepath.Join(runDir, "agent.sock") }

// agentChannel adds the guest agent's channel.
func (b *builder) agentChannel(d *libvirtxml.Domain) {
	if b.env.AgentSocket == "" {
		return
	}
	d.Devices.Channels = append(d.Devices.Channels, libvirtxml.DomainChannel{
		Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind", Path: b.env.AgentSocket}},
		Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: qmp.AgentPort}},
	})
	// The channel's virtio-serial controller, of the spec's virtio kind (libvirt would add a
	// transitional-or-not one of its own choosing).
	d.Devices.Controllers = append(d.Devices.Controllers, libvirtxml.DomainController{Type: "virtio-serial", Model: b.virtioModel()})
}

// agentErr is a failed agent command: the agent not reachable (not connected, not answering),
// or its own error (connected).
type agentErr struct {
	err       error
	connected bool
}

func (e *agentErr) Error() string { return e.err.Error() }

// agentCommand runs one agent command through the VM's daemon and decodes its return into out.
func (v *vm) agentCommand(ctx context.Context, cmd string, args any, out any) error {
	dom, err := v.domain()
	if err != nil {
		return &agentErr{err: err}
	}
	defer dom.Free()
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	wait := agentTimeout
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	secs := max(int(wait.Round(time.Second)/time.Second), 1)
	reply, err := dom.QemuAgentCommand(string(b), golibvirt.DomainQemuAgentCommandTimeout(secs), 0)
	if err != nil {
		var lerr golibvirt.Error
		if errors.As(err, &lerr) {
			// AGENT_UNRESPONSIVE: no agent connected in the guest, or it did not answer in time.
			return &agentErr{err: errors.New(lerr.Message), connected: lerr.Code != golibvirt.ERR_AGENT_UNRESPONSIVE && lerr.Code != golibvirt.ERR_OPERATION_INVALID}
		}
		return &agentErr{err: err}
	}
	var r struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal([]byte(reply), &r); err != nil {
		return &agentErr{err: fmt.Errorf("guest agent: %s: not a reply: %q", cmd, reply), connected: true}
	}
	if out != nil {
		if err := json.Unmarshal(r.Return, out); err != nil {
			return &agentErr{err: fmt.Errorf("guest agent: %s: %v", cmd, err), connected: true}
		}
	}
	return nil
}

func agentConnected(err error) bool {
	var ae *agentErr
	return errors.As(err, &ae) && ae.connected
}

// runningVM returns VM id when its domain runs, FailedPrecondition when it does not.
func (d *Driver) runningVM(id string) (*vm, error) {
	v, err := d.get(id)
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	st := v.state
	v.mu.Unlock()
	if st != hypervisorv1.State_STATE_RUNNING {
		return nil, status.Errorf(codes.FailedPrecondition, "vm %q is %s, not running", id, driver.StateWord(st))
	}
	return v, nil
}

// GuestAgentPing implements driver.GuestExecer: guest-ping.
func (d *Driver) GuestAgentPing(ctx context.Context, id string) (*hypervisorv1.GuestAgentPingResponse, error) {
	v, err := d.runningVM(id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, agentTimeout)
	defer cancel()
	if err := v.agentCommand(ctx, "guest-ping", nil, nil); err != nil {
		return &hypervisorv1.GuestAgentPingResponse{Message: err.Error()}, nil
	}
	return &hypervisorv1.GuestAgentPingResponse{Connected: true}, nil
}

// GuestAgentInfo implements driver.GuestAgent: the agent's version, the guest's OS, host name
// and time zone, as the qmp driver asks them.
func (d *Driver) GuestAgentInfo(ctx context.Context, id string) (*hypervisorv1.GuestAgentInfoResponse, error) {
	v, err := d.runningVM(id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, agentTimeout)
	defer cancel()
	if err := v.agentCommand(ctx, "guest-ping", nil, nil); err != nil {
		return &hypervisorv1.GuestAgentInfoResponse{Message: err.Error()}, nil
	}
	var (
		version struct {
			Version string `json:"version"`
		}
		host struct {
			HostName string `json:"host-name"`
		}
		osInfo qga.OSInfo
		tz     qga.Timezone
		msgs   []string
	)
	for _, q := range []struct {
		cmd string
		out any
	}{{"guest-info", &version}, {"guest-get-osinfo", &osInfo}, {"guest-get-host-name", &host}, {"guest-get-timezone", &tz}} {
		if err := v.agentCommand(ctx, q.cmd, nil, q.out); err != nil {
			if !agentConnected(err) {
				return &hypervisorv1.GuestAgentInfoResponse{Message: err.Error()}, nil
			}
			msgs = append(msgs, err.Error())
		}
	}
	resp := &hypervisorv1.GuestAgentInfoResponse{
		Connected: true,
		Version:   version.Version,
		Os: &hypervisorv1.GuestOSInfo{
			Name: osInfo.Name, KernelRelease: osInfo.KernelRelease, Version: osInfo.Version,
			PrettyName: osInfo.PrettyName, VersionId: osInfo.VersionID,
			KernelVersion: osInfo.KernelVersion, Machine: osInfo.Machine, Id: osInfo.ID,
		},
		HostName:              host.HostName,
		Timezone:              tz.Zone,
		TimezoneOffsetSeconds: int32(tz.Offset),
	}
	for i, m := range msgs {
		if i > 0 {
			resp.Message += "; "
		}
		resp.Message += m
	}
	return resp, nil
}

// GuestAgentExec implements driver.GuestExecer: guest-exec with the output captured, then
// guest-exec-status until the command exited or timeout passed. A command still running at the
// timeout is left to the agent, which cannot kill it.
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
	args := map[string]any{"path": command[0], "arg": append([]string{}, command[1:]...), "capture-output": true}
	var started struct {
		PID *int64 `json:"pid"`
	}
	if err := v.agentCommand(ctx, "guest-exec", args, &started); err != nil {
		return &hypervisorv1.GuestAgentExecResponse{Connected: agentConnected(err), Message: err.Error()}, nil
	}
	if started.PID == nil {
		return &hypervisorv1.GuestAgentExecResponse{Connected: true, Message: "guest agent: guest-exec: reply without pid"}, nil
	}
	wait := execPollFirst
	for {
		var st qga.ExecStatus
		err := v.agentCommand(ctx, "guest-exec-status", map[string]any{"pid": *started.PID}, &st)
		switch {
		case err == nil && st.Exited:
			return execResponse(&st), nil
		case err != nil && ctx.Err() == nil && agentConnected(err):
			return &hypervisorv1.GuestAgentExecResponse{Connected: true, Message: err.Error()}, nil
		}
		if err == nil {
			t := time.NewTimer(min(wait, time.Until(deadline(ctx))))
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			wait = min(2*wait, execPollMax)
		}
		if ctx.Err() != nil || err != nil {
			return &hypervisorv1.GuestAgentExecResponse{Connected: true,
				Message: fmt.Sprintf("the command was still running after %s", timeout)}, nil
		}
	}
}

func deadline(ctx context.Context) time.Time {
	dl, _ := ctx.Deadline()
	return dl
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
