package libvirt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	golibvirt "libvirt.org/go/libvirt"

	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/core/driver/serial"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

// Live migration between two VMs' daemons (driver.Migrator), libvirt's peer-to-peer tunnelled
// migration: the package doc's "Live migration" says how and what it does not do.

const (
	// migrationPoll is how often the source's watcher looks at the completion timeout.
	migrationPoll = 500 * time.Millisecond
	// cancelWait bounds waiting for an aborted migration to end.
	cancelWait = 30 * time.Second
	// finalFiguresWait bounds waiting for libvirt's job-completed event after the migration
	// call returned.
	finalFiguresWait = 2 * time.Second
	// statusWait bounds MigrationStatus's wait for libvirt's job statistics.
	statusWait = 500 * time.Millisecond
	// targetConnectWait bounds reaching the target's daemon for its domain XML.
	targetConnectWait = 10 * time.Second
	// migrateFlags: live, the source's daemon connecting to the target's (peer to peer), the
	// migration stream inside that one libvirt connection (tunnelled), and unsafe: libvirt
	// refuses a writable disk whose cache mode is not none unless its file system is one it
	// knows to be shared (NFS, ...), while the contract leaves which disks the target shares to
	// the host (a driver without migration_disks is given VMs whose disks it shares).
	migrateFlags = golibvirt.MIGRATE_LIVE | golibvirt.MIGRATE_PEER2PEER | golibvirt.MIGRATE_TUNNELLED | golibvirt.MIGRATE_UNSAFE
)

// migration is a VM's current or last migration (under vm.mu).
type migration struct {
	info              *hypervisorv1.MigrationInfo
	completionTimeout time.Duration
	// cancelReason, when set, is why the driver aborted the migration.
	cancelReason string
	// final are libvirt's figures of the completed job (its job-completed event).
	final *golibvirt.DomainJobInfo
	// switchedAt is when the source paused for the switch-over (its SUSPENDED, migrated event).
	switchedAt time.Time
	// done is closed when the source's migration call returned (nil at the target).
	done chan struct{}
	// jobs are the source's disk copies and disksSocket the target's NBD socket they write to
	// (migratedisks.go), none without disks.
	jobs        []diskJob
	disksSocket string
}

// migrationRecord is a migration in the VM's record, for Recover.
type migrationRecord struct {
	Info              []byte        `json:"info"`
	CompletionTimeout time.Duration `json:"completionTimeout,omitempty"`
	Disks             []diskJob     `json:"disks,omitempty"`
	DisksSocket       string        `json:"disksSocket,omitempty"`
}

// record is m as the VM's record keeps it (nil when its info does not marshal).
func (m *migration) record() *migrationRecord {
	raw, err := protojson.Marshal(m.info)
	if err != nil {
		return nil
	}
	return &migrationRecord{Info: raw, CompletionTimeout: m.completionTimeout, Disks: m.jobs, DisksSocket: m.disksSocket}
}

func (m *migration) ended() bool {
	if m == nil {
		return true
	}
	return driver.MigrationEnded(m.info.GetPhase())
}

func (m *migration) source() bool {
	return m != nil && m.info.GetRole() == hypervisorv1.MigrationRole_MIGRATION_ROLE_SOURCE
}

func (m *migration) target() bool {
	return m != nil && m.info.GetRole() == hypervisorv1.MigrationRole_MIGRATION_ROLE_TARGET
}

// migrationBusyLocked is FailedPrecondition while v migrates (either end) or waits for an
// incoming migration: what the contract forbids meanwhile.
func (v *vm) migrationBusyLocked() error {
	switch {
	case v.mig.ended():
		return nil
	case v.mig.target():
		return status.Errorf(codes.FailedPrecondition, "vm %q is the target of a migration that has not completed", v.id)
	default:
		return status.Errorf(codes.FailedPrecondition, "vm %q is migrating (cancel the migration first)", v.id)
	}
}

// waitingIncomingLocked says v is a target whose domain has not arrived: no QEMU runs.
func (v *vm) waitingIncomingLocked() bool {
	return v.mig.target() && !v.mig.ended() && v.pid == 0
}

// emitMigrationLocked records v.mig and reports it in a MIGRATION event.
func (d *Driver) emitMigrationLocked(v *vm) {
	if r := v.mig.record(); r != nil {
		v.rec.Migration = r
	}
	d.persistLocked(v)
	d.events.Publish(&hypervisorv1.Event{
		Id: v.id, Type: hypervisorv1.EventType_EVENT_TYPE_MIGRATION, Time: timestamppb.Now(),
		State: v.state, Reason: v.reason, Message: v.message, Migration: proto.CloneOf(v.mig.info),
	})
	v.signalLocked()
}

// endMigrationLocked ends v.mig with phase and message, reporting it; nothing when it ended.
func (d *Driver) endMigrationLocked(v *vm, phase hypervisorv1.MigrationPhase, msg string) {
	m := v.mig
	if m.ended() {
		return
	}
	m.info.Phase, m.info.Message, m.info.EndedAt = phase, msg, timestamppb.Now()
	if m.info.GetTotalTime() == nil || m.target() {
		m.info.TotalTime = durationpb.New(time.Since(m.info.GetStartedAt().AsTime()))
	}
	d.log.Info("migration ended", "id", v.id, "role", m.info.GetRole().String(), "phase", phase.String(), "message", msg)
	d.emitMigrationLocked(v)
}

// socketURI is the libvirt URI of a session daemon reached at the unix socket path.
func socketURI(path string) string { return "qemu+unix:///session?socket=" + path }

// bandwidthMiB is a limit in bytes per second as libvirt takes it, MiB/s (rounded down, at
// least 1); 0 is no limit.
func bandwidthMiB(bps uint64) uint64 {
	if bps == 0 {
		return 0
	}
	return max(bps>>20, 1)
}

// targetDomainXML reads the domain the target's driver defined on its daemon (listenIncoming),
// through the socket the source migrates to: the XML the target's QEMU must run with (its own
// run dir's sockets, its emulator), which the source gives libvirt as the destination XML.
func targetDomainXML(ctx context.Context, path string) (string, error) {
	conn, err := connect(ctx, socketURI(path), targetConnectWait, nil)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	dom, err := conn.LookupDomainByName(DomainName)
	if err != nil {
		return "", fmt.Errorf("the target's libvirtd has no domain waiting for the migration: %s", libvirtMessage(err))
	}
	defer dom.Free()
	if active, err := dom.IsActive(); err == nil && active {
		return "", errors.New("the target's domain runs already: it is not waiting for a migration")
	}
	return dom.GetXMLDesc(golibvirt.DOMAIN_XML_SECURE | golibvirt.DOMAIN_XML_MIGRATABLE)
}

// Migrate implements driver.Migrator: the source side.
func (d *Driver) Migrate(ctx context.Context, req *hypervisorv1.MigrateRequest) error {
	v, err := d.get(req.GetId())
	if err != nil {
		return err
	}
	path, err := driver.MigrationSocket("libvirt", req)
	if err != nil {
		return err
	}
	copies, disksSocket, err := qmp.MigrationDisks(v.spec, req)
	if err != nil {
		return err
	}
	v.op.Lock()
	defer v.op.Unlock()
	v.mu.Lock()
	st := v.state
	busy := v.migrationBusyLocked()
	v.mu.Unlock()
	switch {
	case busy != nil:
		return busy
	case st != hypervisorv1.State_STATE_RUNNING:
		return status.Errorf(codes.FailedPrecondition, "vm %q is %s: only a running VM migrates", v.id, st)
	}
	// The migration call, which lasts as long as the migration, has a connection of its own:
	// on the VM's connection it held up other calls (MigrationStatus's) for seconds.
	mconn, err := golibvirt.NewConnect(v.dmn.uri())
	if err != nil {
		return status.Errorf(codes.Unavailable, "vm %q: connect to the VM's libvirtd: %s", v.id, libvirtMessage(err))
	}
	dom, err := mconn.LookupDomainByName(DomainName)
	if err != nil {
		_, _ = mconn.Close()
		return status.Errorf(codes.Unavailable, "vm %q: %s", v.id, libvirtMessage(err))
	}
	release := func() {
		_ = dom.Free()
		_, _ = mconn.Close()
	}
	// The source's daemon, the VM's user, connects to the socket: the user's ACL entry on it.
	if err := grantAccess(v.rec.User, path, true); err != nil {
		release()
		return status.Errorf(codes.FailedPrecondition, "targetSocketPath: let the VM's user (%s) connect to %s: %v", v.rec.User.Name, path, err)
	}
	if disksSocket != "" {
		// The source's QEMU, the VM's user, connects to the target's NBD server.
		if err := grantAccess(v.rec.User, disksSocket, true); err != nil {
			release()
			return status.Errorf(codes.FailedPrecondition, "targetDisksSocketPath: let the VM's user (%s) connect to %s: %v", v.rec.User.Name, disksSocket, err)
		}
	}
	// A pending soft reboot would make the guest's power-off a boot at the target: not while
	// it moves.
	v.mu.Lock()
	v.softReboot = false
	v.mu.Unlock()
	plan, err := d.planMemory(ctx, v, path, req.GetBandwidthBytesPerSecond(), req.GetAllowAutoConverge(), len(copies) > 0)
	if err != nil {
		release()
		return err
	}
	var jobs []diskJob
	if len(copies) > 0 {
		if jobs, err = startDiskCopies(dom, copies, disksSocket, req.GetBandwidthBytesPerSecond()); err != nil {
			release()
			return err
		}
	}
	v.mu.Lock()
	if v.state != hypervisorv1.State_STATE_RUNNING {
		v.mu.Unlock()
		abortDiskCopies(dom, jobs)
		release()
		return status.Errorf(codes.FailedPrecondition, "vm %q stopped", v.id)
	}
	mig := &migration{
		completionTimeout: req.GetCompletionTimeout().AsDuration(),
		done:              make(chan struct{}),
		info: &hypervisorv1.MigrationInfo{
			Role: hypervisorv1.MigrationRole_MIGRATION_ROLE_SOURCE, Phase: hypervisorv1.MigrationPhase_MIGRATION_PHASE_SETUP,
			Mode: plan.mode, StartedAt: timestamppb.Now(), Target: path,
			BandwidthLimitBytesPerSecond: req.GetBandwidthBytesPerSecond(), AutoConverge: req.GetAllowAutoConverge(), PostCopy: req.GetAllowPostCopy(),
		},
	}
	mig.jobs, mig.disksSocket = jobs, disksSocket
	if len(jobs) > 0 {
		// The disk phase: the copies run.
		mig.info.Phase = hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE
		for _, j := range jobs {
			mig.info.Disks = append(mig.info.Disks, &hypervisorv1.MigrationDisk{Name: j.Name, TopOnly: j.TopOnly})
		}
	}
	v.mig = mig
	d.emitMigrationLocked(v)
	v.mu.Unlock()
	d.log.Info("migrating", "id", v.id, "target", path, "disks", len(jobs), "bandwidth", req.GetBandwidthBytesPerSecond(), "auto_converge", req.GetAllowAutoConverge(),
		"post_copy", req.GetAllowPostCopy(), "completion_timeout", mig.completionTimeout.String())
	memory := func() { d.runMigration(v, dom, release, socketURI(path), plan.params, plan.flags, mig) }
	if len(jobs) > 0 {
		go d.runDiskPhase(v, dom, release, mig, jobs, disksSocket, memory)
	} else {
		go memory()
	}
	go d.watchMigration(v, mig)
	return nil
}

// memoryPlan is how the memory moves: libvirt's parameters and flags, and the mode reported.
type memoryPlan struct {
	params *golibvirt.DomainMigrateParameters
	flags  golibvirt.DomainMigrateFlags
	mode   hypervisorv1.MigrationMode
}

// planMemory reads the target's domain through path (its XML is the destination's) and
// chooses the memory migration's parameters: the bandwidth limit, auto-converge, and whether
// the guest moves paused (disks: the copies end with it paused; under emulation on a QEMU
// before 9.0 a live copy loses guest writes, the qmp driver's TCGLosesMigrationWrites: libvirt's
// offline migration of a running domain, without VIR_MIGRATE_LIVE, pauses it first and resumes
// it at the target, or here when the migration fails). No VIR_MIGRATE_POSTCOPY even when
// allowed: libvirt refuses post-copy in a tunnelled migration.
func (d *Driver) planMemory(ctx context.Context, v *vm, path string, bandwidth uint64, autoConverge, disks bool) (*memoryPlan, error) {
	destXML, err := targetDomainXML(ctx, path)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "vm %q: the target at %s: %v", v.id, path, err)
	}
	host, err := d.hostInfo(ctx)
	if err != nil {
		return nil, err
	}
	p := &memoryPlan{params: &golibvirt.DomainMigrateParameters{DestXML: destXML, DestXMLSet: true},
		flags: migrateFlags, mode: hypervisorv1.MigrationMode_MIGRATION_MODE_PRE_COPY}
	if mib := bandwidthMiB(bandwidth); mib > 0 {
		p.params.Bandwidth, p.params.BandwidthSet = mib, true
	}
	if disks || v.rec.Accel == qmp.AccelTCG && qmp.TCGLosesMigrationWrites(host.Version) {
		p.mode = hypervisorv1.MigrationMode_MIGRATION_MODE_PAUSED
		p.flags &^= golibvirt.MIGRATE_LIVE
	}
	if autoConverge {
		p.flags |= golibvirt.MIGRATE_AUTO_CONVERGE
	}
	return p, nil
}

// runMigration makes the source's daemon migrate the domain, and ends the migration with the
// call's outcome.
func (d *Driver) runMigration(v *vm, dom *golibvirt.Domain, release func(), uri string, params *golibvirt.DomainMigrateParameters, flags golibvirt.DomainMigrateFlags, mig *migration) {
	defer release()
	defer close(mig.done)
	err := dom.MigrateToURI3(uri, params, flags)
	returned := time.Now()
	if err == nil {
		// The figures come in libvirt's job-completed event, on the driver's connection.
		v.waitFor(context.Background(), finalFiguresWait, func() bool { return mig.final != nil })
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.mig != mig || mig.ended() || v.conn == nil {
		// Ended already, or let go of (Close): a later driver's Recover takes the migration.
		return
	}
	if err == nil {
		mig.info.RemainingBytes = 0
		if f := mig.final; f != nil {
			applyJob(mig.info, f)
		}
		if !mig.switchedAt.IsZero() && (mig.info.Downtime == nil || mig.info.GetMode() == hypervisorv1.MigrationMode_MIGRATION_MODE_PAUSED) {
			// No figure from libvirt, or a paused migration, whose whole copy is downtime
			// (QEMU's figure counts from its own stop, at the end): the time from the
			// source's pause to the call's return, an upper bound.
			mig.info.Downtime = durationpb.New(max(returned.Sub(mig.switchedAt), mig.info.GetDowntime().AsDuration()))
		}
		// libvirt's elapsed time leaves out the driver's setup: Migrate to the call's return.
		mig.info.TotalTime = durationpb.New(max(returned.Sub(mig.info.GetStartedAt().AsTime()), mig.info.GetTotalTime().AsDuration()))
		d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED, "")
		return
	}
	msg := libvirtMessage(err)
	phase := hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED
	var lerr golibvirt.Error
	if mig.cancelReason != "" {
		phase, msg = hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED, mig.cancelReason
	} else if errors.As(err, &lerr) && lerr.Code == golibvirt.ERR_OPERATION_ABORTED {
		phase = hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED
	}
	if phase == hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED {
		msg = "libvirt: " + msg
	}
	d.endMigrationLocked(v, phase, msg)
	go d.afterFailedOut(v)
}

// afterFailedOut makes sure a source whose migration failed or was cancelled runs: libvirt
// resumes a source it paused for the switch-over, unless the failure came at a moment it
// does not.
func (d *Driver) afterFailedOut(v *vm) {
	dom, err := v.domain()
	if err != nil {
		return
	}
	defer dom.Free()
	st, reason, err := dom.GetState()
	v.mu.Lock()
	want := v.state == hypervisorv1.State_STATE_RUNNING
	v.mu.Unlock()
	if err != nil || !want || st != golibvirt.DOMAIN_PAUSED {
		return
	}
	d.log.Info("resuming the source after its migration ended", "id", v.id, "paused_reason", reason)
	if err := dom.Resume(); err != nil {
		d.log.Warn("resume the source", "id", v.id, "error", err)
	}
}

// watchMigration is the source's completion timeout: past it, the migration is aborted (never
// switched to post-copy: libvirt has no post-copy in a tunnelled migration).
func (d *Driver) watchMigration(v *vm, mig *migration) {
	if mig.completionTimeout <= 0 {
		return
	}
	t := time.NewTimer(time.Until(mig.info.GetStartedAt().AsTime().Add(mig.completionTimeout)))
	defer t.Stop()
	select {
	case <-mig.done:
		return
	case <-t.C:
	}
	dom, err := v.domain()
	if err != nil {
		return
	}
	defer dom.Free()
	v.mu.Lock()
	if v.mig != mig || mig.ended() {
		v.mu.Unlock()
		return
	}
	mig.cancelReason = fmt.Sprintf("the migration did not complete within its completion timeout of %s", mig.completionTimeout)
	v.mu.Unlock()
	if err := dom.AbortJob(); err != nil {
		d.log.Warn("abort the migration", "id", v.id, "error", err)
	}
}

// applyJob copies libvirt's job figures into info.
func applyJob(info *hypervisorv1.MigrationInfo, j *golibvirt.DomainJobInfo) {
	if j.MemTotalSet {
		info.TotalBytes = j.MemTotal
	} else if j.DataTotalSet {
		info.TotalBytes = j.DataTotal
	}
	if j.MemProcessedSet {
		info.TransferredBytes = j.MemProcessed
	} else if j.DataProcessedSet {
		info.TransferredBytes = j.DataProcessed
	}
	if j.MemRemainingSet {
		info.RemainingBytes = j.MemRemaining
	} else if j.DataRemainingSet {
		info.RemainingBytes = j.DataRemaining
	}
	if j.MemDirtyRateSet {
		page := uint64(4096)
		if j.MemPageSizeSet && j.MemPageSize > 0 {
			page = j.MemPageSize
		}
		info.DirtyRateBytesPerSecond = j.MemDirtyRate * page
	}
	if j.MemBpsSet {
		info.ThroughputBytesPerSecond = j.MemBps
	}
	if j.MemIterationSet {
		info.Iterations = j.MemIteration
	}
	if j.AutoConvergeThrottleSet {
		info.ThrottlePercent = uint32(max(j.AutoConvergeThrottle, 0))
	}
	if j.TimeElapsedSet && j.TimeElapsed > 0 {
		info.TotalTime = durationpb.New(time.Duration(j.TimeElapsed) * time.Millisecond)
	}
	if j.DowntimeSet {
		if j.Type == golibvirt.DOMAIN_JOB_COMPLETED {
			info.Downtime = durationpb.New(time.Duration(j.Downtime) * time.Millisecond)
		} else {
			info.ExpectedDowntime = durationpb.New(time.Duration(j.Downtime) * time.Millisecond)
		}
	}
}

// migrationEventLocked is what a lifecycle event means to a VM in a migration: true when it is
// consumed here.
func (d *Driver) migrationEventLocked(v *vm, conn *golibvirt.Connect, ev *golibvirt.DomainEventLifecycle) bool {
	m := v.mig
	if m == nil {
		return false
	}
	switch ev.Event {
	case golibvirt.DOMAIN_EVENT_SUSPENDED:
		if m.source() && !m.ended() && m.switchedAt.IsZero() {
			// The source's pause for the switch-over, or for the whole copy of a paused
			// migration: downtime, not a pause.
			m.switchedAt = time.Now()
		}
		if m.source() && !m.ended() {
			return true
		}
		switch golibvirt.DomainEventSuspendedDetailType(ev.Detail) {
		case golibvirt.DOMAIN_EVENT_SUSPENDED_MIGRATED, golibvirt.DOMAIN_EVENT_SUSPENDED_POSTCOPY:
			// A late one of a migration that ended.
			return true
		}
		if m.target() && !m.ended() && v.pid != 0 && golibvirt.DomainEventSuspendedDetailType(ev.Detail) == golibvirt.DOMAIN_EVENT_SUSPENDED_PAUSED {
			// libvirt's Finish left the arrived domain paused, as the source was when its
			// memory moved: a source that copied disks pauses the guest itself first
			// (migratedisks.go). The guest ran there, so it runs here (RESUMED, below).
			go d.resumeMigratedIn(v)
		}
		// An incoming domain is paused until it runs.
		return m.target() && !m.ended()
	case golibvirt.DOMAIN_EVENT_RESUMED:
		detail := golibvirt.DomainEventResumedDetailType(ev.Detail)
		if m.target() && !m.ended() && v.state == hypervisorv1.State_STATE_PAUSED && v.reason == driver.ReasonIncomingMigration {
			if detail == golibvirt.DOMAIN_EVENT_RESUMED_POSTCOPY {
				m.info.Mode = hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY
			}
			v.reason = driver.ReasonMigrated // once
			go d.runMigratedIn(v, conn)
			return true
		}
		// A source whose migration failed is resumed by libvirt: it was never reported paused.
		return detail == golibvirt.DOMAIN_EVENT_RESUMED_MIGRATED || detail == golibvirt.DOMAIN_EVENT_RESUMED_POSTCOPY ||
			!m.ended()
	case golibvirt.DOMAIN_EVENT_STARTED:
		if m.target() && !m.ended() && golibvirt.DomainEventStartedDetailType(ev.Detail) == golibvirt.DOMAIN_EVENT_STARTED_MIGRATED {
			// libvirt's Prepare started the target's QEMU: the stream is arriving.
			v.pid = qemuPID(v.dmn, v.rec.DaemonPID)
			m.info.Phase = hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE
			v.message = "receiving the migration"
			d.emitMigrationLocked(v)
			return true
		}
	case golibvirt.DOMAIN_EVENT_STOPPED:
		detail := golibvirt.DomainEventStoppedDetailType(ev.Detail)
		if detail == golibvirt.DOMAIN_EVENT_STOPPED_MIGRATED && active(v.state) {
			// The source's QEMU ended once the target ran the VM.
			v.message = "migrated to " + m.info.GetTarget()
			d.endRunLocked(v, hypervisorv1.EventType_EVENT_TYPE_STOPPED, hypervisorv1.State_STATE_STOPPED, driver.ReasonMigrated)
			return true
		}
		if m.target() && !m.ended() && active(v.state) {
			// libvirt ended an incoming migration that failed or was cancelled at the source.
			reason := driver.ReasonMigrationFailed
			if v.hostOp != "" {
				reason = v.hostOp
			}
			v.message = "the incoming migration did not complete: libvirt stopped the domain (" + stoppedDetail(detail) + ")" + qemuTail(v)
			d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, v.message)
			d.endRunLocked(v, hypervisorv1.EventType_EVENT_TYPE_STOPPED, hypervisorv1.State_STATE_STOPPED, reason)
			go d.endIncoming(v)
			return true
		}
	}
	return false
}

func stoppedDetail(d golibvirt.DomainEventStoppedDetailType) string {
	switch d {
	case golibvirt.DOMAIN_EVENT_STOPPED_FAILED:
		return "failed"
	case golibvirt.DOMAIN_EVENT_STOPPED_DESTROYED:
		return "destroyed"
	case golibvirt.DOMAIN_EVENT_STOPPED_CRASHED:
		return "crashed"
	}
	return fmt.Sprintf("detail %d", d)
}

// qemuTail is ": " and the last lines of the VM's QEMU log, or nothing.
func qemuTail(v *vm) string {
	if t := tailLog(v.dmn.qemuLog(), max(fileSize(v.dmn.qemuLog())-512, 0)); t != "" {
		return ": " + t
	}
	return ""
}

// jobCompleted takes libvirt's figures of a completed migration at the source.
func (d *Driver) jobCompleted(v *vm, info *golibvirt.DomainJobInfo) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if m := v.mig; m.source() && !m.ended() {
		m.final = info
		v.signalLocked()
	}
}

// runMigratedIn runs a target whose domain arrived and runs: its serial port, the domain made
// transient as every VM's, RUNNING (Migrated).
func (d *Driver) runMigratedIn(v *vm, conn *golibvirt.Connect) {
	v.releaseIncomingDisks() // released before the domain's QEMU opened them: a formality
	v.mu.Lock()
	con := v.con
	v.mu.Unlock()
	if con == nil {
		var err error
		if con, err = attachSerial(context.Background(), v.serialSocket()); err != nil {
			d.log.Warn("serial console of the migrated VM", "id", v.id, "error", err)
		}
	}
	if dom, err := conn.LookupDomainByName(DomainName); err == nil {
		if err := dom.Undefine(); err != nil {
			d.log.Warn("make the migrated domain transient", "id", v.id, "error", err)
		}
		dom.Free()
	}
	v.removeIncomingLink()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.conn != conn || !active(v.state) {
		if con != nil && con != v.con {
			con.Close()
		}
		return
	}
	v.con = con
	v.pid = qemuPID(v.dmn, v.rec.DaemonPID)
	v.state, v.reason, v.message = hypervisorv1.State_STATE_RUNNING, driver.ReasonMigrated, ""
	v.rec.StartedAt = time.Now()
	d.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_STARTED)
	d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED, "")
	d.persistLocked(v)
	v.signalLocked()
	d.log.Info("migrated in: running", "id", v.id, "qemu_pid", v.pid)
}

// resumeMigratedIn resumes a target whose domain arrived paused.
func (d *Driver) resumeMigratedIn(v *vm) {
	dom, err := v.domain()
	if err != nil {
		return
	}
	defer dom.Free()
	d.log.Info("the migrated domain arrived paused: resuming it", "id", v.id)
	if err := dom.Resume(); err != nil {
		d.log.Warn("resume the migrated domain", "id", v.id, "error", libvirtMessage(err))
	}
}

// incomingLink is the target's incoming_migration.socket_path.
func (v *vm) incomingLink() string { return v.spec.GetIncomingMigration().GetSocketPath() }

// removeIncomingLink removes the target's socket_path, when it is the driver's symlink.
func (v *vm) removeIncomingLink() {
	p := v.incomingLink()
	if fi, err := os.Lstat(p); p != "" && err == nil && fi.Mode()&os.ModeSymlink != 0 {
		_ = os.Remove(p)
	}
}

// endIncoming takes away what waited for a migration that will not come: the defined domain
// and the socket_path link.
func (d *Driver) endIncoming(v *vm) {
	v.removeIncomingLink()
	v.releaseIncomingDisks()
	if dom, err := v.domain(); err == nil {
		if active, err := dom.IsActive(); err == nil && !active {
			_ = dom.Undefine()
		}
		dom.Free()
	}
}

// listenIncoming finishes Start of a migration target: the target's domain is defined (not
// started) on its daemon, socket_path is made a symlink to the daemon's socket, and the VM is
// PAUSED (IncomingMigration) until libvirt's Prepare, called by the source's daemon through
// that socket, starts the domain's QEMU for the stream.
func (d *Driver) listenIncoming(v *vm, conn *golibvirt.Connect, xml string) error {
	in := v.spec.GetIncomingMigration()
	dom, err := conn.DomainDefineXML(xml)
	if err != nil {
		return status.Errorf(codes.Internal, "incomingMigration: define the target's domain: %s", libvirtMessage(err))
	}
	dom.Free()
	link := in.GetSocketPath()
	if fi, err := os.Lstat(link); err == nil && fi.Mode()&(os.ModeSymlink|os.ModeSocket) != 0 {
		_ = os.Remove(link)
	}
	if err := os.Symlink(v.dmn.socket(), link); err != nil {
		d.endIncoming(v)
		return status.Errorf(codes.FailedPrecondition, "incomingMigration.socketPath: %v", err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.mig = &migration{info: &hypervisorv1.MigrationInfo{
		Role: hypervisorv1.MigrationRole_MIGRATION_ROLE_TARGET, Phase: hypervisorv1.MigrationPhase_MIGRATION_PHASE_SETUP,
		Mode: hypervisorv1.MigrationMode_MIGRATION_MODE_PRE_COPY, StartedAt: timestamppb.Now(), Target: link,
		PostCopy: in.GetAllowPostCopy(),
	}}
	v.pid, v.hostOp = 0, ""
	v.state, v.reason, v.message = hypervisorv1.State_STATE_PAUSED, driver.ReasonIncomingMigration, "waiting for the migration on "+link+" (the VM's libvirtd)"
	d.log.Info("waiting for an incoming migration", "id", v.id, "socket", link)
	d.emitMigrationLocked(v)
	return nil
}

// stopIncomingLocked stops a target that waits with no QEMU (reason: Kill's, Shutdown's,
// CancelMigration's).
func (d *Driver) stopIncomingLocked(v *vm, reason string) {
	d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED, "the target was stopped before the migration came: "+reason)
	d.endRunLocked(v, hypervisorv1.EventType_EVENT_TYPE_STOPPED, hypervisorv1.State_STATE_STOPPED, reason)
	v.signalLocked()
	go d.endIncoming(v)
}

// MigrationStatus implements driver.Migrator.
func (d *Driver) MigrationStatus(_ context.Context, id string) (*hypervisorv1.MigrationInfo, error) {
	v, err := d.get(id)
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	m := v.mig
	live := m.source() && !m.ended()
	v.mu.Unlock()
	if live {
		// libvirt answers at once but around the switch-over, when its job holds the domain
		// for a second or two: the figures so far then.
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			d.sampleJob(v, m)
		}()
		select {
		case <-sampled:
		case <-time.After(statusWait):
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.mig == nil {
		return nil, nil
	}
	info := proto.CloneOf(v.mig.info)
	if !v.mig.ended() && info.GetStartedAt() != nil {
		info.TotalTime = durationpb.New(time.Since(info.GetStartedAt().AsTime()))
	}
	return info, nil
}

// sampleJob copies the source's job statistics into m (ACTIVE once libvirt reports the
// memory to send).
func (d *Driver) sampleJob(v *vm, m *migration) {
	dom, err := v.domain()
	if err != nil {
		return
	}
	j, err := dom.GetJobStats(0)
	dom.Free()
	v.mu.Lock()
	defer v.mu.Unlock()
	if err == nil && v.mig == m && !m.ended() && j.Type != golibvirt.DOMAIN_JOB_NONE {
		applyJob(m.info, j)
		if m.info.GetPhase() == hypervisorv1.MigrationPhase_MIGRATION_PHASE_SETUP && m.info.GetTotalBytes() > 0 {
			m.info.Phase = hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE
			d.emitMigrationLocked(v)
		}
	}
}

// CancelMigration implements driver.Migrator: the source's migration job is aborted (libvirt
// resumes the source and stops the target's domain); a target is stopped.
func (d *Driver) CancelMigration(ctx context.Context, id string) error {
	v, err := d.get(id)
	if err != nil {
		return err
	}
	v.mu.Lock()
	m := v.mig
	switch {
	case m == nil:
		v.mu.Unlock()
		return nil
	case m.ended():
		done := m.info.GetPhase() == hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED && m.source()
		v.mu.Unlock()
		if done {
			return status.Errorf(codes.FailedPrecondition, "vm %q migrated already", id)
		}
		return nil
	case m.target():
		if v.waitingIncomingLocked() {
			d.stopIncomingLocked(v, driver.ReasonMigrationCancelled)
			v.mu.Unlock()
			return nil
		}
		v.mu.Unlock()
		dom, err := v.domain()
		if err != nil {
			return status.Errorf(codes.Unavailable, "vm %q: %v", id, err)
		}
		defer dom.Free()
		return d.destroy(ctx, v, dom, driver.ReasonMigrationCancelled)
	}
	if m.cancelReason == "" {
		m.cancelReason = "cancelled"
	}
	v.mu.Unlock()
	dom, err := v.domain()
	if err != nil {
		return status.Errorf(codes.Unavailable, "vm %q: %v", id, err)
	}
	err = dom.AbortJob()
	dom.Free()
	if err != nil {
		// No job to abort: the migration has just ended (below).
		var lerr golibvirt.Error
		if !errors.As(err, &lerr) || lerr.Code != golibvirt.ERR_OPERATION_INVALID {
			return status.Errorf(codes.Internal, "vm %q: abort the migration: %s", id, libvirtMessage(err))
		}
	}
	if !v.waitFor(ctx, cancelWait, func() bool { return v.mig != m || m.ended() }) {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		return status.Errorf(codes.DeadlineExceeded, "vm %q: the migration did not end within %s of its abort", id, cancelWait)
	}
	return nil
}

// loadMigration is the migration of a record, nil when it has none.
func loadMigration(r *migrationRecord) *migration {
	if r == nil {
		return nil
	}
	info := &hypervisorv1.MigrationInfo{}
	if protojson.Unmarshal(r.Info, info) != nil {
		return nil
	}
	return &migration{info: info, completionTimeout: r.CompletionTimeout, jobs: r.Disks, disksSocket: r.DisksSocket}
}

// recoverMigration re-adopts v's unfinished migration (v.mig) after a driver restart, from the
// state of the domain on v's daemon (conn): the migration goes on in the daemons, which
// outlived the driver; one that ended while no driver ran is finished as if it had been
// watched.
func (d *Driver) recoverMigration(ctx context.Context, v *vm, conn *golibvirt.Connect) {
	m := v.mig
	st := golibvirt.DOMAIN_SHUTOFF
	dom, err := conn.LookupDomainByName(DomainName)
	defined := err == nil
	copying := false
	if defined {
		st, _, _ = dom.GetState()
		if m.source() && len(m.jobs) > 0 {
			// In its disk phase: the copies run (in QEMU) and no migration job does.
			j, err := dom.GetJobStats(0)
			copying = err == nil && j.Type == golibvirt.DOMAIN_JOB_NONE && diskCopiesIn(dom) > 0
		}
		dom.Free()
	}
	running := st == golibvirt.DOMAIN_RUNNING || st == golibvirt.DOMAIN_PAUSED
	var con *serial.Console
	if running {
		con, _ = attachSerial(ctx, v.serialSocket())
	}
	if m.source() && !running {
		// The source's domain ended while no driver ran: completed when the target runs it.
		d.recoverEndedSource(ctx, v, m)
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	defer d.persistLocked(v)
	if m.source() {
		v.con, v.pid = con, qemuPID(v.dmn, v.rec.DaemonPID)
		v.state, v.reason, v.message = hypervisorv1.State_STATE_RUNNING, driver.ReasonRecovered, ""
		m.done = make(chan struct{})
		d.log.Info("recover: the migration goes on", "id", v.id, "target", m.info.GetTarget(), "copying_disks", copying)
		if copying {
			go d.readoptDiskPhase(v, m)
		} else {
			go d.watchRecoveredSource(v, m)
		}
		go d.watchMigration(v, m)
		return
	}
	lostDisks := false
	if defined && m.info.GetPhase() == hypervisorv1.MigrationPhase_MIGRATION_PHASE_SETUP && !running {
		// A target still receiving its disks: the copies' connections ended with the driver
		// process's relay, so the migration fails (the storage daemon, which outlived it,
		// goes).
		lostDisks = d.releaseLeftoverDisks(ctx, v)
	}
	switch {
	case running:
		// The stream arrived (or arrives): PAUSED until it runs here.
		v.con, v.pid = con, qemuPID(v.dmn, v.rec.DaemonPID)
		v.state, v.reason, v.message = hypervisorv1.State_STATE_PAUSED, driver.ReasonIncomingMigration, "receiving the migration"
		m.info.Phase = hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE
		if st == golibvirt.DOMAIN_RUNNING {
			// It ran while no driver did: run it, as the RESUMED event would have.
			v.reason = driver.ReasonMigrated
			go d.runMigratedIn(v, conn)
		}
	case lostDisks:
		v.state, v.reason = hypervisorv1.State_STATE_STOPPED, driver.ReasonMigrationFailed
		v.message = "the driver restarted while the target received the disks: their copy broke off"
		m.info.Phase, m.info.Message, m.info.EndedAt = hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, v.message, timestamppb.Now()
		go d.endIncoming(v)
	case defined && m.info.GetPhase() == hypervisorv1.MigrationPhase_MIGRATION_PHASE_SETUP:
		v.state, v.reason, v.message = hypervisorv1.State_STATE_PAUSED, driver.ReasonIncomingMigration, "waiting for the migration on "+v.incomingLink()+" (the VM's libvirtd)"
		if _, err := os.Lstat(v.incomingLink()); err != nil {
			_ = os.Symlink(v.dmn.socket(), v.incomingLink())
		}
	default:
		v.state, v.reason = hypervisorv1.State_STATE_STOPPED, driver.ReasonMigrationFailed
		v.message = "the incoming migration ended while the driver restarted, its domain gone"
		m.info.Phase, m.info.Message, m.info.EndedAt = hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, v.message, timestamppb.Now()
		go d.endIncoming(v)
	}
	if r := m.record(); r != nil {
		v.rec.Migration = r
	}
}

// recoverEndedSource finishes a source whose domain ended while no driver ran: the migration
// completed when the target's daemon (through the socket it migrated to) runs the domain;
// otherwise its end is unknown (FAILED), the VM STOPPED.
func (d *Driver) recoverEndedSource(ctx context.Context, v *vm, m *migration) {
	migrated := false
	if c, err := connect(ctx, socketURI(m.info.GetTarget()), targetConnectWait/2, nil); err == nil {
		if dom, err := c.LookupDomainByName(DomainName); err == nil {
			if uuid, err := dom.GetUUIDString(); err == nil && uuid == domainUUID(v.spec) {
				migrated, _ = dom.IsActive()
			}
			dom.Free()
		}
		_, _ = c.Close()
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if migrated {
		m.info.RemainingBytes = 0
		v.state, v.reason, v.message = hypervisorv1.State_STATE_STOPPED, driver.ReasonMigrated, "migrated to "+m.info.GetTarget()+" while the driver restarted"
		d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED, "completed while the driver restarted")
	} else {
		v.state, v.reason, v.message = hypervisorv1.State_STATE_STOPPED, driver.ReasonProcessGone, "the VM's domain ended while the driver restarted, during its migration"
		d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, "the source's domain ended while the driver restarted, and the target does not run it")
	}
	d.persistLocked(v)
}

// watchRecoveredSource watches a source's migration that a driver before this one started,
// until libvirt's job ends: its outcome then (the domain gone: migrated; running: failed or
// cancelled).
func (d *Driver) watchRecoveredSource(v *vm, m *migration) {
	defer close(m.done)
	tick := time.NewTicker(migrationPoll)
	defer tick.Stop()
	for range tick.C {
		v.mu.Lock()
		gone := v.mig != m || m.ended() || v.conn == nil
		v.mu.Unlock()
		if gone {
			return
		}
		dom, err := v.domain()
		if err != nil {
			if !errors.Is(err, errNoDaemon) {
				// The transient domain is gone: it migrated (its STOPPED event says so).
				d.finishRecoveredSource(v, m, hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED, "")
			}
			return
		}
		j, err := dom.GetJobStats(0)
		if err == nil && j.Type != golibvirt.DOMAIN_JOB_NONE {
			dom.Free()
			continue
		}
		isActive, _ := dom.IsActive()
		last, _ := dom.GetJobStats(golibvirt.DOMAIN_JOB_STATS_COMPLETED)
		copies := 0
		if isActive && len(m.info.GetDisks()) > 0 {
			// No migration job: the driver stopped in the disk phase, or between its end and
			// the memory's start. The copies go.
			copies = abortLeftoverCopies(dom)
		}
		dom.Free()
		switch {
		case !isActive:
			d.finishRecoveredSource(v, m, hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED, "")
		case len(m.info.GetDisks()) > 0 && (last == nil || last.Type == golibvirt.DOMAIN_JOB_NONE):
			d.finishRecoveredSource(v, m, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED,
				fmt.Sprintf("the driver restarted before the memory moved: the disk copies were aborted (%d running), the guest runs on here", copies))
		case last != nil && last.Type == golibvirt.DOMAIN_JOB_CANCELLED:
			d.finishRecoveredSource(v, m, hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED, "cancelled")
		default:
			msg := "the migration ended without completing"
			if last != nil && last.ErrorMessageSet {
				msg += ": " + last.ErrorMessage
			}
			d.finishRecoveredSource(v, m, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, msg)
		}
		return
	}
}

func (d *Driver) finishRecoveredSource(v *vm, m *migration, phase hypervisorv1.MigrationPhase, msg string) {
	if phase == hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED {
		v.waitFor(context.Background(), finalFiguresWait, func() bool { return m.final != nil })
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.mig != m || m.ended() {
		return
	}
	if phase == hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED {
		m.info.RemainingBytes = 0
		if m.final != nil {
			applyJob(m.info, m.final)
		}
		if active(v.state) {
			// Its STOPPED event was missed.
			v.message = "migrated to " + m.info.GetTarget()
			d.endRunLocked(v, hypervisorv1.EventType_EVENT_TYPE_STOPPED, hypervisorv1.State_STATE_STOPPED, driver.ReasonMigrated)
		}
	} else {
		if m.cancelReason != "" {
			phase, msg = hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED, m.cancelReason
		}
		go d.afterFailedOut(v)
	}
	d.endMigrationLocked(v, phase, msg)
}
