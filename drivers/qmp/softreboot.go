package qmp

import (
	"context"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/driver"
)

// A soft reboot is the guest's own restart in answer to the ACPI power button, the way libvirt's
// "fake reboot" does it for a guest without an agent:
//
//  1. SoftReboot sets QEMU's shutdown action to pause (`set-action shutdown=pause`), records the
//     pending reboot (record.SoftReboot, so that a restarted driver finishes it) and presses the
//     power button (`system_powerdown`). It returns then; the guest decides.
//  2. When the guest powers off, QEMU reports SHUTDOWN (guest-shutdown) and STOP and stays, paused
//     in its "shutdown" run state, instead of exiting. The driver does not report either: the VM
//     stays RUNNING. A guest may write its power-off twice before its vCPU stops, which QEMU
//     reports as a second SHUTDOWN (measured with the test's boot-sector guest under load):
//     that one is the same power-off, not reported either.
//  3. The driver resets the machine (`system_reset`, reported as RESET with reason GuestReset:
//     one boot more), continues it (`cont`) and sets the shutdown action back to poweroff.
//
// A pending reboot ends when it is finished, when the guest resets itself (a guest whose power
// button reboots), when QEMU exits, or when Shutdown is asked for (which sets poweroff back
// before it presses the button). `quit` and SIGTERM exit QEMU whatever the shutdown action is.
// A guest that ignores the button keeps the reboot pending: its next power-off restarts it.

// softRebootWait bounds the QMP commands that finish a soft reboot.
const softRebootWait = 10 * time.Second

// SoftReboot implements driver.SoftRebooter.
func (d *Driver) SoftReboot(ctx context.Context, id string) error {
	v, s, unlock, err := d.lockRunning(id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := setShutdownAction(ctx, s.mon, "pause"); err != nil {
		return status.Errorf(codes.Internal, "vm %q: %v", id, err)
	}
	v.mu.Lock()
	v.rec.SoftReboot = true
	d.persistLocked(v)
	v.mu.Unlock()
	if _, err := s.mon.Run(ctx, "system_powerdown", nil); err != nil {
		d.cancelSoftReboot(ctx, v, s)
		return status.Errorf(codes.Internal, "vm %q: %v", id, err)
	}
	return nil
}

// setShutdownAction sets what QEMU does when the guest powers off: "poweroff" (exit, the
// default) or "pause".
func setShutdownAction(ctx context.Context, mon Monitor, action string) error {
	_, err := mon.Run(ctx, "set-action", map[string]string{"shutdown": action})
	return err
}

// cancelSoftReboot drops a pending soft reboot of s: the guest's next power-off stops the VM.
func (d *Driver) cancelSoftReboot(ctx context.Context, v *vm, s *session) {
	v.mu.Lock()
	pending := v.rec.SoftReboot && !s.softRebooting
	if pending {
		v.rec.SoftReboot = false
		d.persistLocked(v)
	}
	v.mu.Unlock()
	if !pending {
		return
	}
	if err := setShutdownAction(ctx, s.mon, "poweroff"); err != nil {
		d.log.Warn("set the shutdown action back to poweroff", "id", v.id, "error", err)
	}
}

// softRebootEventLocked is what a QMP event means to a VM with a soft reboot pending: the event
// to apply as usual (e itself, or the reset as the guest's), or consumed when there is none.
func (d *Driver) softRebootEventLocked(v *vm, s *session, e qmp.Event) (_ qmp.Event, consumed bool) {
	if !v.rec.SoftReboot {
		return e, false
	}
	guest, _ := e.Data["guest"].(bool)
	reason, _ := e.Data["reason"].(string)
	switch {
	case e.Event == "SHUTDOWN" && guest && reason == "guest-shutdown" && !s.softRebooting:
		d.log.Info("guest powered off for a soft reboot, booting it again", "id", v.id)
		s.softRebooting = true
		go d.finishSoftReboot(v, s)
		return e, true
	case e.Event == "SHUTDOWN" && guest && s.softRebooting:
		// The guest wrote its power-off again before the vCPU stopped (TCG runs a few more
		// instructions; a guest's power-off routine may retry): the same power-off.
		return e, true
	case e.Event == "STOP" && s.softRebooting:
		return e, true // QEMU paused at the guest's power-off: it is not a user's pause
	case e.Event == "RESET" && !guest && s.softRebooting:
		// Our system_reset, which is the guest's reboot.
		return qmp.Event{Event: e.Event, Data: map[string]any{"guest": true, "reason": "guest-reset"}, Timestamp: e.Timestamp}, false
	case e.Event == "RESET" && guest && !s.softRebooting && time.Since(v.reset) >= firmwareReset:
		// The guest restarted on its own: the request is answered.
		v.rec.SoftReboot = false
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), softRebootWait)
			defer cancel()
			if err := setShutdownAction(ctx, s.mon, "poweroff"); err != nil {
				d.log.Warn("set the shutdown action back to poweroff", "id", v.id, "error", err)
			}
		}()
	}
	return e, false
}

// finishSoftReboot boots again a guest that powered off for a soft reboot: reset, continue, and
// the shutdown action back to poweroff. When QEMU does not do it, the VM is stopped, as the
// guest's power-off would have stopped it.
func (d *Driver) finishSoftReboot(v *vm, s *session) {
	ctx, cancel := context.WithTimeout(context.Background(), softRebootWait)
	defer cancel()
	err := resetAndContinue(ctx, s.mon)
	v.mu.Lock()
	s.softRebooting = false
	if v.sess == s {
		v.rec.SoftReboot = false
		d.persistLocked(v)
	}
	v.mu.Unlock()
	if err != nil {
		d.log.Error("soft reboot: the guest powered off and could not be booted again; stopping it", "id", v.id, "error", err)
		v.mu.Lock()
		s.guestShutdown = true
		v.mu.Unlock()
		_ = d.stop(ctx, v, s, driver.ReasonGuestShutdown)
	}
}

// resetAndContinue boots a QEMU paused at the guest's power-off again.
func resetAndContinue(ctx context.Context, mon Monitor) error {
	for _, cmd := range []string{"system_reset", "cont"} {
		if _, err := mon.Run(ctx, cmd, nil); err != nil {
			return err
		}
	}
	return setShutdownAction(ctx, mon, "poweroff")
}
