package libvirt

import (
	"testing"

	golibvirt "libvirt.org/go/libvirt"

	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// TestSoftRebootEvents: while a soft reboot is pending, the guest's power-off, QEMU's stop at it
// and the resume after libvirt's reset are not reported, and the reboot is then over; without
// one, or once the VM no longer runs (Shutdown asked), every event is.
func TestSoftRebootEvents(t *testing.T) {
	d := New()
	ev := func(e golibvirt.DomainEventType) *golibvirt.DomainEventLifecycle {
		return &golibvirt.DomainEventLifecycle{Event: e}
	}
	for _, tc := range []struct {
		name    string
		pending bool
		state   hypervisorv1.State
		events  []golibvirt.DomainEventType
		want    []bool // consumed, per event
		after   bool   // still pending after the events
	}{
		{
			name: "the guest powers off and libvirt boots it again", pending: true, state: hypervisorv1.State_STATE_RUNNING,
			events: []golibvirt.DomainEventType{golibvirt.DOMAIN_EVENT_SHUTDOWN, golibvirt.DOMAIN_EVENT_SUSPENDED, golibvirt.DOMAIN_EVENT_RESUMED, golibvirt.DOMAIN_EVENT_SUSPENDED},
			want:   []bool{true, true, true, false},
		},
		{
			name: "a user's pause before the guest reacts", pending: true, state: hypervisorv1.State_STATE_RUNNING,
			events: []golibvirt.DomainEventType{golibvirt.DOMAIN_EVENT_SUSPENDED},
			want:   []bool{false}, after: true,
		},
		{
			name: "the domain stops", pending: true, state: hypervisorv1.State_STATE_RUNNING,
			events: []golibvirt.DomainEventType{golibvirt.DOMAIN_EVENT_STOPPED, golibvirt.DOMAIN_EVENT_SHUTDOWN},
			want:   []bool{false, false},
		},
		{
			name: "Shutdown asked while pending", pending: true, state: hypervisorv1.State_STATE_SHUTTING_DOWN,
			events: []golibvirt.DomainEventType{golibvirt.DOMAIN_EVENT_SHUTDOWN},
			want:   []bool{false},
		},
		{
			name: "no soft reboot", state: hypervisorv1.State_STATE_RUNNING,
			events: []golibvirt.DomainEventType{golibvirt.DOMAIN_EVENT_SHUTDOWN},
			want:   []bool{false},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &vm{id: "vm", state: tc.state, softReboot: tc.pending}
			for i, e := range tc.events {
				if got := d.softRebootEventLocked(v, ev(e)); got != tc.want[i] {
					t.Errorf("event %d (%v): consumed %v, want %v", i, e, got, tc.want[i])
				}
			}
			if v.softReboot != tc.after {
				t.Errorf("pending after the events: %v, want %v", v.softReboot, tc.after)
			}
		})
	}
}
