package libvirt

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	golibvirt "libvirt.org/go/libvirt"

	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// A soft reboot is libvirt's "fake reboot": virDomainReboot with the ACPI power button presses
// the button and marks the domain; when the guest powers off, QEMU stays (libvirt runs it with
// -no-shutdown), paused in its shutdown state, and the daemon resets and continues it. The
// daemon reports on the way a SHUTDOWN (the guest's power-off), a SUSPENDED (QEMU stopped at it),
// the reset (a reboot event: one boot more, GuestReset) and a RESUMED. While a soft reboot is
// pending (vm.softReboot) and the VM runs, the driver reports none of these but the reset: the VM
// stays RUNNING in the same QEMU.
//
// A pending reboot ends when the guest comes back (RESUMED after its power-off), when the
// domain stops, or when Shutdown is asked for (the VM is then no longer RUNNING, and libvirt
// drops its fake reboot when asked to shut down). A guest that ignores the button keeps it
// pending. The pending mark is the daemon's too: a driver restarted while one is pending does
// not know of it, and would report the guest's power-off that the daemon turns into a reboot.

// SoftReboot implements driver.SoftRebooter.
func (d *Driver) SoftReboot(ctx context.Context, id string) error {
	v, err := d.get(id)
	if err != nil {
		return err
	}
	v.op.Lock()
	defer v.op.Unlock()
	v.mu.Lock()
	st := v.state
	v.mu.Unlock()
	if st != hypervisorv1.State_STATE_RUNNING {
		return status.Errorf(codes.FailedPrecondition, "vm %q is %s, not running", id, driver.StateWord(st))
	}
	dom, err := v.domain()
	if err != nil {
		return status.Errorf(codes.Unavailable, "vm %q: %v", id, err)
	}
	defer dom.Free()
	v.mu.Lock()
	v.softReboot, v.softRebooting = true, false
	v.mu.Unlock()
	if err := dom.Reboot(golibvirt.DOMAIN_REBOOT_ACPI_POWER_BTN); err != nil {
		v.mu.Lock()
		v.softReboot = false
		v.mu.Unlock()
		return status.Errorf(codes.Internal, "libvirt: %v", err)
	}
	return nil
}

// softRebootEventLocked says whether a lifecycle event of v is part of a pending soft reboot,
// not to be reported.
func (d *Driver) softRebootEventLocked(v *vm, ev *golibvirt.DomainEventLifecycle) bool {
	if !v.softReboot {
		return false
	}
	if v.state != hypervisorv1.State_STATE_RUNNING {
		v.softReboot, v.softRebooting = false, false
		return false
	}
	switch ev.Event {
	case golibvirt.DOMAIN_EVENT_SHUTDOWN:
		d.log.Info("guest powered off for a soft reboot, libvirt boots it again", "id", v.id)
		v.softRebooting = true
		return true
	case golibvirt.DOMAIN_EVENT_SUSPENDED:
		return v.softRebooting
	case golibvirt.DOMAIN_EVENT_RESUMED:
		if v.softRebooting {
			v.softReboot, v.softRebooting = false, false
			return true
		}
	case golibvirt.DOMAIN_EVENT_STOPPED, golibvirt.DOMAIN_EVENT_CRASHED:
		v.softReboot, v.softRebooting = false, false
	}
	return false
}
