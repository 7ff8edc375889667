package libvirt

import (
	"context"
	"encoding/json"
	"os"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	golibvirt "libvirt.org/go/libvirt"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// recoverTimeout bounds reconnecting to a daemon that runs.
const recoverTimeout = 5 * time.Second

// Recover implements driver.Recoverer: it connects again to the VM's daemon, which outlived the
// driver (the launcher's child, not the driver's), and takes its domain as it finds it. A daemon
// that is gone leaves the VM STOPPED (ProcessGone); its QEMU, if it outlived the daemon, is not
// adopted (the daemon is what the driver speaks to).
func (d *Driver) Recover(ctx context.Context, h *hypervisorv1.Handle) (*hypervisorv1.VMStatus, error) {
	var rec record
	if err := json.Unmarshal(h.GetState(), &rec); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "handle.state: not a libvirt driver record: %v", err)
	}
	if rec.ID == "" || rec.ID != h.GetId() || !idRE.MatchString(rec.ID) {
		return nil, status.Errorf(codes.InvalidArgument, "handle.state: record of %q does not match handle id %q", rec.ID, h.GetId())
	}
	if v, err := d.get(rec.ID); err == nil {
		v.mu.Lock()
		defer v.mu.Unlock()
		return v.statusLocked(), nil
	}
	// The state dir's record is newer than the handle (boots, the daemon's pid); without one
	// the VM was deleted (or there is no state dir) and is reported stopped.
	recorded := false
	if p := d.recordPath(rec.ID); p != "" {
		if raw, err := os.ReadFile(p); err == nil {
			var cur record
			if json.Unmarshal(raw, &cur) == nil && cur.ID == rec.ID {
				rec, recorded = cur, true
			}
		}
	}
	spec := &domainv1.DomainSpec{}
	if err := protojson.Unmarshal(rec.Spec, spec); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "handle.state: spec: %v", err)
	}
	v := &vm{id: rec.ID, spec: spec, rec: rec, changed: make(chan struct{}),
		state: hypervisorv1.State_STATE_CREATED, reason: driver.ReasonCreated, mig: loadMigration(rec.Migration)}
	v.dmn = newDaemon(rec.RunDir, rec.User, d.config().Libvirtd)
	d.mu.Lock()
	if _, ok := d.vms[v.id]; ok {
		d.mu.Unlock()
		return d.Status(ctx, v.id)
	}
	d.vms[v.id] = v
	d.mu.Unlock()
	if rec.DaemonPID > 0 && isDaemonOf(rec.DaemonPID, v.dmn) {
		d.readopt(ctx, v)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.state == hypervisorv1.State_STATE_CREATED && v.mig != nil && !v.mig.ended() {
		// In a migration, with no daemon left (or none reachable): it is over.
		v.state, v.reason, v.message = hypervisorv1.State_STATE_STOPPED, driver.ReasonProcessGone, "the VM's libvirtd was gone when the driver restarted, during its migration"
		if v.mig.target() {
			v.reason = driver.ReasonMigrationFailed
		}
		d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, v.message)
		v.removeIncomingLink()
	}
	if v.state == hypervisorv1.State_STATE_CREATED && (rec.Boots > 0 || !recorded) {
		v.state, v.reason = hypervisorv1.State_STATE_STOPPED, driver.ReasonProcessGone
		v.rec.DaemonPID = 0
	}
	d.persistLocked(v)
	d.log.Info("recovered vm", "id", v.id, "state", v.state, "daemon_pid", v.rec.DaemonPID)
	return v.statusLocked(), nil
}

// readopt connects to v's running daemon and takes the state of its domain.
func (d *Driver) readopt(ctx context.Context, v *vm) {
	proc, err := openProcess(v.rec.DaemonPID)
	if err != nil {
		return
	}
	conn, err := connect(ctx, v.dmn.uri(), recoverTimeout, func() bool { return !proc.exited(0) })
	if err != nil {
		d.log.Warn("recover: cannot reach the VM's libvirtd", "id", v.id, "error", err)
		proc.close()
		return
	}
	if err := d.watch(v, conn); err != nil {
		_, _ = conn.Close()
		proc.close()
		return
	}
	v.mu.Lock()
	v.conn, v.proc = conn, proc
	migrating := v.mig != nil && !v.mig.ended()
	v.mu.Unlock()
	if migrating {
		d.recoverMigration(ctx, v, conn)
		return
	}
	dom, err := conn.LookupDomainByName(DomainName)
	if err != nil {
		return // the daemon runs, the domain ended: STOPPED below
	}
	defer dom.Free()
	st, _, err := dom.GetState()
	if err != nil {
		return
	}
	var con = v.con
	if st == golibvirt.DOMAIN_RUNNING || st == golibvirt.DOMAIN_PAUSED {
		con, _ = attachSerial(ctx, v.serialSocket())
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	switch st {
	case golibvirt.DOMAIN_RUNNING:
		v.state = hypervisorv1.State_STATE_RUNNING
	case golibvirt.DOMAIN_PAUSED:
		v.state = hypervisorv1.State_STATE_PAUSED
	default:
		return
	}
	v.reason, v.con, v.pid = driver.ReasonRecovered, con, qemuPID(v.dmn, v.rec.DaemonPID)
}
