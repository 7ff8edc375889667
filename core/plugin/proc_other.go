//go:build !linux

package plugin

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// This file keeps the package building on other systems (a developer's workstation). Drivers
// run on Linux nodes; without /proc and pidfds a reattach cannot prove a pid is still the plugin
// the host started, so it is never attempted here, and exits are found by polling.

func sysProcAttr() *syscall.SysProcAttr { return nil }

var errProcessGone = errors.New("process is gone")

type proc struct {
	pid int
	p   *os.Process
}

func openProc(pid int) (*proc, error) {
	p, err := os.FindProcess(pid)
	if err != nil {
		return nil, errProcessGone
	}
	return &proc{pid: pid, p: p}, nil
}

func (p *proc) wait() {
	for !p.exited() {
		time.Sleep(200 * time.Millisecond)
	}
}

func (p *proc) exited() bool { return p.p.Signal(syscall.Signal(0)) != nil }

func (p *proc) kill() error { return p.p.Kill() }

func (p *proc) reap() (string, bool) { return "", false }

func (p *proc) close() { _ = p.p.Release() }

func procStat(int) (byte, uint64, error) { return 0, 0, errors.ErrUnsupported }

func bootID() string { return "" }

func exeSHA256(int) (string, error) { return "", errors.ErrUnsupported }

func lockFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
}
