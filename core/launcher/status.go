package launcher

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	launcherv1 "github.com/kubevisor/kubevisor/core/driver/launcher/v1"
)

// Reasons a launcher exits with (Status.Reason).
const (
	// ReasonVMExited: terminating, the process exited before the deadline.
	ReasonVMExited = "vm-exited"
	// ReasonKilledAtDeadline: terminating, the process still ran at the deadline and was killed.
	ReasonKilledAtDeadline = "killed-at-deadline"
	// ReasonLauncherTerminated: told to exit (SIGTERM, SIGINT, Exit) with no process running.
	ReasonLauncherTerminated = "launcher-terminated"
	// ReasonStartFailed: the launcher could not serve, or its last Start had failed.
	ReasonStartFailed = "start-failed"
)

// Exit codes of the launcher.
const (
	ExitOK               = 0
	ExitStartFailed      = 1
	ExitKilledAtDeadline = 2
)

// Status is why a launcher exited: DIR/launcher-status.json and the launcher's last log line.
type Status struct {
	Reason   string    `json:"reason"`
	Message  string    `json:"message"`
	ExitCode int       `json:"exitCode"`
	VMI      string    `json:"vmi,omitempty"`
	Time     time.Time `json:"time"`
	// Process is the launcher's last process, if it started one.
	Process *StatusProcess `json:"process,omitempty"`
}

// StatusProcess is the last process of a launcher in its Status.
type StatusProcess struct {
	Name string `json:"name,omitempty"`
	Pid  int64  `json:"pid"`
	// Exit is how it ended; nil if it was still running (which only a failed kill leaves).
	Exit *StatusExit `json:"exit,omitempty"`
}

// StatusExit is how a process ended.
type StatusExit struct {
	Code        int32     `json:"code"`
	Signal      int32     `json:"signal,omitempty"`
	Description string    `json:"description"`
	Time        time.Time `json:"time,omitzero"`
}

func statusProcess(p *launcherv1.ProcessState) *StatusProcess {
	if p == nil {
		return nil
	}
	sp := &StatusProcess{Name: p.GetProcess().GetName(), Pid: p.GetProcess().GetPid()}
	if e := p.GetExit(); e != nil {
		sp.Exit = &StatusExit{Code: e.GetCode(), Signal: e.GetSignal(), Description: e.GetDescription()}
		if e.GetTime() != nil {
			sp.Exit.Time = e.GetTime().AsTime()
		}
	}
	return sp
}

// ReadStatus reads the status a launcher left in dir. An error satisfying
// errors.Is(err, fs.ErrNotExist) means the launcher did not write one: it is still running, or it
// was killed.
func ReadStatus(dir string) (*Status, error) {
	raw, err := os.ReadFile(filepath.Join(dir, StatusFileName))
	if err != nil {
		return nil, err
	}
	var st Status
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", StatusFileName, err)
	}
	return &st, nil
}

// writeStatus writes st to dir atomically.
func writeStatus(dir string, st *Status) error {
	raw, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, StatusFileName+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(append(raw, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, StatusFileName))
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}
