package qmp

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// Live migration with QEMU's own migration over unix sockets (driver.Migrator):
//
// Target: a spec with incoming_migration starts QEMU with `-incoming defer` (and -S, as every
// VM), sets the capabilities "events" (MIGRATION events) and, when allowed, "postcopy-ram" (which
// both ends must have), and runs `migrate-incoming unix:<socket_path>`: QEMU listens, the VM is
// PAUSED (IncomingMigration). When QEMU reports the migration completed, the driver runs `cont`
// (QEMU was started with -S) and reports STARTED (RUNNING, Migrated). A target whose migration
// fails exits by itself (QEMU 7.2 ends an incoming migration that fails): STOPPED,
// MigrationFailed.
//
// Source: Migrate sets the capabilities "events", "return-path" (the target tells the source
// whether it loaded the state, so "completed" means the target runs it), "auto-converge" and
// "postcopy-ram" as allowed, the parameter max-bandwidth (the request's, else unlimitedBandwidth
// in place of QEMU's default of 32 MiB/s), then `migrate unix:<path>`, and returns. A watcher
// samples `query-migrate` every migrationPoll: it switches to post-copy
// (`migrate-start-postcopy`) when allowed and pre-copy does not converge (two passes in a row
// leave at least as much to send as the pass before), or at the completion timeout, where it
// cancels (`migrate_cancel`) a migration that cannot switch. QEMU pauses the source for the
// switch-over and resumes it when the migration fails; neither is reported (the VM stays
// RUNNING). Once completed the driver reads QEMU's final figures (downtime, total time) and
// ends QEMU: STOPPED, Migrated.
//
// Emulated VMs on QEMU before 9.0 migrate paused (MIGRATION_MODE_PAUSED): under TCG those QEMUs
// lose some of the guest's writes made while memory is copied (the fast path of their dirty
// bitmap sync clears dirty bits without resetting TCG's TLB, so later stores through it mark no
// page dirty again; fixed in QEMU 9.0 by "physmem: Fix migration dirty bitmap coherency with TCG
// memory access"), and the target then runs with stale pages: the guest's kernel oopses within
// seconds under a writing workload (kubevisor-bench migrate found it with raw QEMU as with
// Kubevisor). So the driver pauses the guest (`stop`) before `migrate`, and the copy is
// downtime; where post-copy is allowed it switches to post-copy at once, so the guest resumes at
// the target after the device state and pulls the rest of its memory from there. A failed or
// cancelled paused migration resumes the guest (afterFailedOut). KVM tracks dirty pages itself
// and migrates live on every version.
//
// The migration is recorded in the VM's record (state dir), so a restarted driver's Recover
// re-adopts it as the contract says (recoverMigration).

const (
	// migrationPoll is how often the source's watcher samples query-migrate.
	migrationPoll = 500 * time.Millisecond
	// unlimitedBandwidth is max-bandwidth without a limit: 1 TiB/s (QEMU's default is 32 MiB/s).
	unlimitedBandwidth = 1 << 40
	// migrationCommandWait bounds each QMP command of a migration.
	migrationCommandWait = 5 * time.Second
	// cancelWait bounds waiting for a cancelled migration to end.
	cancelWait = 30 * time.Second
	// notConverging is how many passes in a row that leave no less to send than the pass
	// before make pre-copy "not converging".
	notConverging = 2
	// tcgDirtyTrackingFixed is the first QEMU major version whose TCG keeps every guest write
	// of a live migration (see above).
	tcgDirtyTrackingFixed = 9
)

// TCGLosesMigrationWrites says whether QEMU of version ("7.2.22") loses, under TCG, guest
// writes made while a live migration copies memory: the versions before 9.0, and a version it
// cannot read.
func TCGLosesMigrationWrites(version string) bool {
	major, _, ok := strings.Cut(version, ".")
	n, err := strconv.Atoi(major)
	return !ok || err != nil || n < tcgDirtyTrackingFixed
}

// PausesMigration says whether a VM of accel on the QEMU behind mon migrates paused: an
// emulated VM on a QEMU that loses its writes in a live copy (query-version; a QEMU that does
// not answer counts as one).
func PausesMigration(ctx context.Context, mon Monitor, accel Accel) bool {
	if accel != AccelTCG {
		return false
	}
	raw, err := mon.Run(ctx, "query-version", nil)
	var v struct {
		QEMU struct{ Major, Minor, Micro int } `json:"qemu"`
	}
	if err != nil || json.Unmarshal(raw, &v) != nil {
		return true
	}
	return TCGLosesMigrationWrites(fmt.Sprintf("%d.%d.%d", v.QEMU.Major, v.QEMU.Minor, v.QEMU.Micro))
}

// migration is a VM's current or last migration (under vm.mu).
type migration struct {
	info              *hypervisorv1.MigrationInfo
	completionTimeout time.Duration
	// cancelReason, when set, is why the driver cancelled the migration (CancelMigration, the
	// completion timeout): QEMU's "cancelled" then carries it.
	cancelReason string
	// passes are the bytes left after each pass of pre-copy, for the convergence rule.
	passes  []uint64
	lastSeq uint64
	// disks are the disks the source copies (migratedisks.go); memoryStarted says `migrate`
	// ran (after the disk phase), switching that the switch-over of the disks began.
	disks         []DiskCopy
	memoryStarted bool
	switching     bool
	// paused: the guest is paused for the copy of its memory (MIGRATION_MODE_PAUSED, see
	// above); post-copy, where allowed, follows at once. pausedAt is when the driver paused it,
	// switchedAt when QEMU switched to post-copy (zero: it did not).
	paused               bool
	pausedAt, switchedAt time.Time
}

// pausedDowntime is the downtime of a paused migration that completed at end: QEMU counts
// downtime from its own stop of the guest, which was already paused, so the guest stood still
// from pausedAt to the end, or, after a switch to post-copy, to the switch plus QEMU's downtime
// (qemu) of it.
func (m *migration) pausedDowntime(qemu time.Duration, end time.Time) time.Duration {
	if m.switchedAt.IsZero() {
		return end.Sub(m.pausedAt)
	}
	return m.switchedAt.Sub(m.pausedAt) + qemu
}

// migrationRecord is a migration in the VM's record.
type migrationRecord struct {
	Info              json.RawMessage `json:"info"`
	CompletionTimeout time.Duration   `json:"completionTimeout,omitempty"`
	Disks             []DiskCopy      `json:"disks,omitempty"`
	MemoryStarted     bool            `json:"memoryStarted,omitempty"`
}

func (m *migration) ended() bool {
	if m == nil {
		return true
	}
	return driver.MigrationEnded(m.info.GetPhase())
}

func (m *migration) role() hypervisorv1.MigrationRole { return m.info.GetRole() }

// migrationBusyLocked is FailedPrecondition while v is migrating (either end) or waits for an
// incoming migration: what the contract forbids meanwhile.
func (v *vm) migrationBusyLocked() error {
	switch {
	case v.mig == nil || v.mig.ended():
		return nil
	case v.mig.role() == hypervisorv1.MigrationRole_MIGRATION_ROLE_TARGET:
		return status.Errorf(codes.FailedPrecondition, "vm %q is the target of a migration that has not completed", v.id)
	default:
		return status.Errorf(codes.FailedPrecondition, "vm %q is migrating (cancel the migration first)", v.id)
	}
}

// persistMigrationLocked copies v.mig into v.rec, for persistLocked.
func (v *vm) persistMigrationLocked() {
	if v.mig == nil {
		v.rec.Migration = nil
		return
	}
	raw, err := protojson.Marshal(v.mig.info)
	if err != nil {
		return
	}
	v.rec.Migration = &migrationRecord{Info: raw, CompletionTimeout: v.mig.completionTimeout, Disks: v.mig.disks, MemoryStarted: v.mig.memoryStarted}
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
	return &migration{info: info, completionTimeout: r.CompletionTimeout, disks: r.Disks, memoryStarted: r.MemoryStarted || len(r.Disks) == 0,
		paused: info.GetMode() == hypervisorv1.MigrationMode_MIGRATION_MODE_PAUSED}
}

// emitMigrationLocked records v.mig and reports it in a MIGRATION event.
func (d *Driver) emitMigrationLocked(v *vm) {
	v.persistMigrationLocked()
	d.persistLocked(v)
	d.events.Publish(&hypervisorv1.Event{
		Id: v.id, Type: hypervisorv1.EventType_EVENT_TYPE_MIGRATION, Time: timestamppb.Now(),
		State: v.state, Reason: v.reason, Message: v.message, Migration: proto.CloneOf(v.mig.info),
	})
	v.signalLocked()
}

// endMigrationLocked ends v.mig with phase and message, reporting it; nothing when it ended.
func (d *Driver) endMigrationLocked(v *vm, phase hypervisorv1.MigrationPhase, msg string) {
	if v.mig.ended() {
		return
	}
	v.mig.info.Phase = phase
	v.mig.info.Message = msg
	v.mig.info.EndedAt = timestamppb.Now()
	if st := v.mig.info.GetStartedAt(); st != nil {
		v.mig.info.TotalTime = durationpb.New(time.Since(st.AsTime()))
	}
	d.log.Info("migration ended", "id", v.id, "role", v.mig.role().String(), "phase", phase.String(), "message", msg)
	d.emitMigrationLocked(v)
}

// capability is one entry of migrate-set-capabilities.
type capability struct {
	Capability string `json:"capability"`
	State      bool   `json:"state"`
}

func setCapabilities(ctx context.Context, mon Monitor, caps ...capability) error {
	_, err := mon.Run(ctx, "migrate-set-capabilities", map[string]any{"capabilities": caps})
	return err
}

// Migrate implements driver.Migrator: the source side, as the comment above says.
func (d *Driver) Migrate(ctx context.Context, req *hypervisorv1.MigrateRequest) error {
	vv, err := d.get(req.GetId())
	if err != nil {
		return err
	}
	path, err := driver.MigrationSocket("qmp", req)
	if err != nil {
		return err
	}
	disks, disksSocket, err := MigrationDisks(vv.spec, req)
	if err != nil {
		return err
	}
	v, s, unlock, err := d.lockRunning(req.GetId())
	if err != nil {
		return err
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(ctx, migrationCommandWait)
	defer cancel()
	// A pending soft reboot would make QEMU pause the guest at its power-off: not while it moves.
	d.cancelSoftReboot(ctx, v, s)
	bandwidth := req.GetBandwidthBytesPerSecond()
	if err := setCapabilities(ctx, s.mon,
		capability{"events", true}, capability{"return-path", true},
		capability{"auto-converge", req.GetAllowAutoConverge()}, capability{"postcopy-ram", req.GetAllowPostCopy()},
		// With disks QEMU waits at the switch-over, the guest paused, until the mirrors are
		// completed (switchOver).
		capability{"pause-before-switchover", len(disks) > 0},
	); err != nil {
		return status.Errorf(codes.FailedPrecondition, "vm %q: %v", v.id, err)
	}
	limit := bandwidth
	if limit == 0 {
		limit = unlimitedBandwidth
	}
	if _, err := s.mon.Run(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": limit}); err != nil {
		return status.Errorf(codes.InvalidArgument, "bandwidthBytesPerSecond: %v", err)
	}
	mode := hypervisorv1.MigrationMode_MIGRATION_MODE_PRE_COPY
	if PausesMigration(ctx, s.mon, v.rec.Accel) {
		mode = hypervisorv1.MigrationMode_MIGRATION_MODE_PAUSED
	}
	v.mu.Lock()
	if v.sess != s {
		v.mu.Unlock()
		return status.Errorf(codes.FailedPrecondition, "vm %q stopped", v.id)
	}
	v.mig = &migration{
		completionTimeout: req.GetCompletionTimeout().AsDuration(),
		paused:            mode == hypervisorv1.MigrationMode_MIGRATION_MODE_PAUSED,
		info: &hypervisorv1.MigrationInfo{
			Role: hypervisorv1.MigrationRole_MIGRATION_ROLE_SOURCE, Phase: hypervisorv1.MigrationPhase_MIGRATION_PHASE_SETUP,
			Mode: mode, StartedAt: timestamppb.Now(), Target: path,
			BandwidthLimitBytesPerSecond: bandwidth, AutoConverge: req.GetAllowAutoConverge(), PostCopy: req.GetAllowPostCopy(),
		},
		disks: disks, memoryStarted: len(disks) == 0,
	}
	mig := v.mig
	applyJobs(mig.info, disks, nil)
	d.emitMigrationLocked(v)
	v.mu.Unlock()
	if len(disks) > 0 {
		d.log.Info("migrating: copying disks first", "id", v.id, "target", path, "disks_target", disksSocket, "disks", len(disks))
		if err := startMirrors(ctx, s.mon, disks, disksSocket, bandwidth); err != nil {
			v.mu.Lock()
			d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, err.Error())
			v.mu.Unlock()
			return status.Errorf(codes.FailedPrecondition, "vm %q: %v", v.id, err)
		}
		v.mu.Lock()
		if v.mig == mig && !mig.ended() {
			mig.info.Phase = hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE
			d.emitMigrationLocked(v)
		}
		v.mu.Unlock()
		go d.watchDisks(v, s, mig)
		return nil
	}
	d.log.Info("migrating", "id", v.id, "target", path, "bandwidth", bandwidth, "auto_converge", req.GetAllowAutoConverge(),
		"post_copy", req.GetAllowPostCopy(), "completion_timeout", mig.completionTimeout.String(), "paused", mig.paused)
	if err := d.startMemory(ctx, v, s, mig); err != nil {
		v.mu.Lock()
		d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, err.Error())
		v.mu.Unlock()
		return status.Errorf(codes.FailedPrecondition, "vm %q: %v", v.id, err)
	}
	go d.watchMigration(v, s, mig)
	return nil
}

// startMemory starts the copy of the VM's memory to the migration's target (`migrate`). A paused
// migration stops the guest first (and resumes it if `migrate` fails), and switches to post-copy
// at once where allowed: the guest resumes at the target after the device state.
func (d *Driver) startMemory(ctx context.Context, v *vm, s *session, mig *migration) error {
	if mig.paused {
		if _, err := s.mon.Run(ctx, "stop", nil); err != nil {
			return fmt.Errorf("pause the guest for its migration: %w", err)
		}
		v.mu.Lock()
		mig.pausedAt = time.Now()
		v.mu.Unlock()
	}
	if _, err := s.mon.Run(ctx, "migrate", map[string]any{"uri": "unix:" + mig.info.GetTarget()}); err != nil {
		if mig.paused {
			if _, cerr := s.mon.Run(ctx, "cont", nil); cerr != nil {
				d.log.Warn("resume the guest after migrate failed", "id", v.id, "error", cerr)
			}
		}
		return fmt.Errorf("migrate: %w", err)
	}
	if mig.paused && mig.info.GetPostCopy() {
		if _, err := s.mon.Run(ctx, "migrate-start-postcopy", nil); err != nil {
			// The paused copy goes on to its end.
			d.log.Warn("migrate-start-postcopy", "id", v.id, "error", err)
		}
	}
	return nil
}

// queryMigrate is what this driver reads of query-migrate.
type queryMigrate struct {
	Status           string `json:"status"`
	TotalTime        int64  `json:"total-time"`
	Downtime         *int64 `json:"downtime"`
	ExpectedDowntime int64  `json:"expected-downtime"`
	Throttle         uint32 `json:"cpu-throttle-percentage"`
	ErrorDesc        string `json:"error-desc"`
	RAM              *struct {
		Transferred    uint64  `json:"transferred"`
		Remaining      uint64  `json:"remaining"`
		Total          uint64  `json:"total"`
		DirtyPagesRate uint64  `json:"dirty-pages-rate"`
		Mbps           float64 `json:"mbps"`
		DirtySyncCount uint64  `json:"dirty-sync-count"`
		PageSize       uint64  `json:"page-size"`
	} `json:"ram"`
}

func runQueryMigrate(ctx context.Context, mon Monitor) (*queryMigrate, error) {
	raw, err := mon.Run(ctx, "query-migrate", nil)
	if err != nil {
		return nil, err
	}
	q := &queryMigrate{}
	if err := json.Unmarshal(raw, q); err != nil {
		return nil, fmt.Errorf("query-migrate: %w", err)
	}
	return q, nil
}

// applyQueryLocked copies QEMU's figures into info.
func applyQuery(info *hypervisorv1.MigrationInfo, q *queryMigrate) {
	if r := q.RAM; r != nil {
		info.TotalBytes, info.TransferredBytes, info.RemainingBytes = r.Total, r.Transferred, r.Remaining
		info.DirtyRateBytesPerSecond = r.DirtyPagesRate * max(r.PageSize, 4096)
		info.ThroughputBytesPerSecond = uint64(r.Mbps * 1e6 / 8)
		info.Iterations = r.DirtySyncCount
	}
	info.ThrottlePercent = q.Throttle
	if q.TotalTime > 0 {
		info.TotalTime = durationpb.New(time.Duration(q.TotalTime) * time.Millisecond)
	}
	if q.ExpectedDowntime > 0 {
		info.ExpectedDowntime = durationpb.New(time.Duration(q.ExpectedDowntime) * time.Millisecond)
	}
	if q.Downtime != nil {
		info.Downtime = durationpb.New(time.Duration(*q.Downtime) * time.Millisecond)
	}
	if q.Status == "postcopy-active" {
		info.Mode = hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY
	}
}

// watchMigration is the source's watcher: progress, the convergence rule and the completion
// timeout, until the migration ends or QEMU does.
func (d *Driver) watchMigration(v *vm, s *session, mig *migration) {
	tick := time.NewTicker(migrationPoll)
	defer tick.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-s.detach:
			return
		case <-tick.C:
		}
		v.mu.Lock()
		if v.mig != mig || mig.ended() || s.migratedOut {
			v.mu.Unlock()
			return
		}
		v.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), migrationCommandWait)
		q, err := runQueryMigrate(ctx, s.mon)
		cancel()
		if err != nil {
			d.log.Debug("query-migrate", "id", v.id, "error", err)
			continue
		}
		v.mu.Lock()
		if v.mig != mig || mig.ended() {
			v.mu.Unlock()
			return
		}
		applyQuery(mig.info, q)
		action, why := mig.nextAction(q)
		if q.Status == "pre-switchover" && len(mig.disks) > 0 && !mig.switching {
			// Seen here after a driver restart (else the MIGRATION event started it).
			mig.switching = true
			go d.switchOver(v, s, mig)
		}
		v.mu.Unlock()
		switch action {
		case "postcopy":
			d.log.Info("switching the migration to post-copy", "id", v.id, "why", why)
			ctx, cancel := context.WithTimeout(context.Background(), migrationCommandWait)
			if _, err := s.mon.Run(ctx, "migrate-start-postcopy", nil); err != nil {
				d.log.Warn("migrate-start-postcopy", "id", v.id, "error", err)
			}
			cancel()
			v.mu.Lock()
			mig.passes = nil
			mig.info.Mode = hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY
			d.emitMigrationLocked(v)
			v.mu.Unlock()
		case "cancel":
			d.log.Info("cancelling the migration", "id", v.id, "why", why)
			v.mu.Lock()
			mig.cancelReason = why
			v.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), migrationCommandWait)
			if _, err := s.mon.Run(ctx, "migrate_cancel", nil); err != nil {
				d.log.Warn("migrate_cancel", "id", v.id, "error", err)
			}
			cancel()
		}
	}
}

// nextAction applies the convergence rule and the completion timeout to a sample of an active
// migration: "postcopy", "cancel" or "" (go on), and why.
func (m *migration) nextAction(q *queryMigrate) (string, string) {
	if q.Status != "active" || m.info.GetMode() == hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY || m.cancelReason != "" {
		return "", ""
	}
	if q.RAM != nil && q.RAM.DirtySyncCount != m.lastSeq {
		// The first sample of a new pass: what the last pass left to send.
		m.lastSeq = q.RAM.DirtySyncCount
		if q.RAM.DirtySyncCount >= 2 {
			m.passes = append(m.passes, q.RAM.Remaining)
		}
	}
	if m.info.GetPostCopy() && m.stalled() {
		return "postcopy", fmt.Sprintf("pre-copy does not converge: %d passes in a row left no less to send (%d bytes)", notConverging, m.passes[len(m.passes)-1])
	}
	if t := m.completionTimeout; t > 0 && time.Since(m.info.GetStartedAt().AsTime()) >= t {
		if m.info.GetPostCopy() {
			return "postcopy", fmt.Sprintf("completion timeout of %s reached", t)
		}
		return "cancel", fmt.Sprintf("the migration did not complete within its completion timeout of %s", t)
	}
	return "", ""
}

// stalled says whether the last notConverging passes each left no less than the one before.
func (m *migration) stalled() bool {
	n := len(m.passes)
	if n < notConverging+1 {
		return false
	}
	for i := n - notConverging; i < n; i++ {
		if m.passes[i] < m.passes[i-1] {
			return false
		}
	}
	return true
}

// migrationEventLocked is what a QMP event means to a VM in a migration: consumed when the
// driver handles it here (MIGRATION), or hides it (the source's pause for the switch-over, the
// target's resume, which Start's cont reports as STARTED).
func (d *Driver) migrationEventLocked(v *vm, s *session, e qmp.Event) bool {
	m := v.mig
	switch e.Event {
	case "STOP", "RESUME":
		// The switch-over pauses the source, a failed migration resumes it; an incoming VM is
		// paused until it runs.
		return m != nil && (!m.ended() || s.migratedOut || s.incoming)
	case "MIGRATION_PASS":
		return true
	case "MIGRATION":
	default:
		return false
	}
	st, _ := e.Data["status"].(string)
	if m == nil || m.ended() {
		d.log.Debug("MIGRATION event without a migration", "id", v.id, "status", st)
		return true
	}
	target := m.role() == hypervisorv1.MigrationRole_MIGRATION_ROLE_TARGET
	switch st {
	case "active":
		if m.info.GetPhase() == hypervisorv1.MigrationPhase_MIGRATION_PHASE_SETUP {
			m.info.Phase = hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE
			d.emitMigrationLocked(v)
		}
	case "pre-switchover":
		if !target && len(m.disks) > 0 && !m.switching {
			m.switching = true
			go d.switchOver(v, s, m)
		}
	case "postcopy-active":
		if m.switchedAt.IsZero() {
			m.switchedAt = time.Now()
		}
		if m.info.GetMode() != hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY {
			m.info.Phase = hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE
			m.info.Mode = hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY
			d.emitMigrationLocked(v)
		}
	case "completed":
		if target {
			if !s.incomingDone {
				s.incomingDone = true
				go d.runMigratedIn(v, s)
			}
		} else if !s.migratedOut {
			s.migratedOut = true
			go d.finishMigratedOut(v, s)
		}
	case "failed":
		msg := "QEMU reported the migration failed"
		if target {
			msg = "the incoming migration failed: " + tailLog(v.paths.Log, s.logFrom)
		}
		if !target && m.info.GetMode() == hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY {
			// The guest's memory is split between both ends: the VM is lost here.
			s.postCopyLost = true
			go func() { _ = d.stop(context.Background(), v, s, driver.ReasonMigrationFailed) }()
			msg = "the migration failed in post-copy: the VM is lost"
		} else if !target {
			go d.afterFailedOut(v, s, m.disks)
		}
		d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, msg)
	case "cancelled":
		msg := "cancelled"
		if m.cancelReason != "" {
			msg = m.cancelReason
		}
		if !target {
			go d.afterFailedOut(v, s, m.disks)
		}
		d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED, msg)
	}
	return true
}

// afterFailedOut makes sure a source whose migration failed or was cancelled runs: QEMU resumes
// it by itself, unless the failure came at a moment it does not; the mirrors of its disks, if
// any, are cancelled.
func (d *Driver) afterFailedOut(v *vm, s *session, disks []DiskCopy) {
	if len(disks) > 0 {
		d.cleanupMirrorsAfterFailure(s, disks)
	}
	ctx, cancel := context.WithTimeout(context.Background(), migrationCommandWait)
	defer cancel()
	raw, err := s.mon.Run(ctx, "query-status", nil)
	if err != nil {
		return
	}
	var qs struct {
		Status  string `json:"status"`
		Running bool   `json:"running"`
	}
	if json.Unmarshal(raw, &qs) != nil || qs.Running {
		return
	}
	v.mu.Lock()
	want := v.sess == s && v.state == hypervisorv1.State_STATE_RUNNING
	v.mu.Unlock()
	if want && (qs.Status == "postmigrate" || qs.Status == "paused" || qs.Status == "finish-migrate") {
		d.log.Info("resuming the source after its migration ended", "id", v.id, "qemu_status", qs.Status)
		if _, err := s.mon.Run(ctx, "cont", nil); err != nil {
			d.log.Warn("resume the source", "id", v.id, "error", err)
		}
	}
}

// finishMigratedOut ends the source of a completed migration: QEMU's final figures, then QEMU.
func (d *Driver) finishMigratedOut(v *vm, s *session) {
	ctx, cancel := context.WithTimeout(context.Background(), migrationCommandWait)
	q, err := runQueryMigrate(ctx, s.mon)
	cancel()
	v.mu.Lock()
	if v.mig != nil && !v.mig.ended() {
		if err == nil {
			applyQuery(v.mig.info, q)
		}
		v.mig.info.RemainingBytes = 0
		if m := v.mig; m.paused && !m.pausedAt.IsZero() {
			m.info.Downtime = durationpb.New(m.pausedDowntime(m.info.GetDowntime().AsDuration(), time.Now()))
		}
		total := v.mig.info.GetTotalTime()
		d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED, "")
		if total != nil {
			v.mig.info.TotalTime = total // QEMU's own figure
		}
		v.persistMigrationLocked()
		s.hostStopMessage = "migrated to " + v.mig.info.GetTarget()
	}
	v.mu.Unlock()
	d.log.Info("migrated: stopping the source", "id", v.id, "downtime", v.mig.info.GetDowntime().AsDuration().String())
	if err := d.stop(context.Background(), v, s, driver.ReasonMigrated); err != nil {
		d.log.Error("stop the migrated source", "id", v.id, "error", err)
	}
}

// runMigratedIn runs a target whose state arrived: cont (QEMU was started with -S), then
// RUNNING.
func (d *Driver) runMigratedIn(v *vm, s *session) {
	ctx, cancel := context.WithTimeout(context.Background(), migrationCommandWait)
	defer cancel()
	// The source completed its mirrors before it sent the device state: no writer is left.
	if err := stopIncomingDisks(ctx, s.mon, v.spec); err != nil {
		d.log.Warn("stop serving the migrated disks", "id", v.id, "error", err)
	}
	if _, err := s.mon.Run(ctx, "cont", nil); err != nil {
		d.log.Error("run the migrated VM", "id", v.id, "error", err)
		v.mu.Lock()
		d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, "cont: "+err.Error())
		v.mu.Unlock()
		_ = d.stop(ctx, v, s, driver.ReasonMigrationFailed)
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.sess != s {
		return
	}
	s.incoming = false
	v.state, v.reason, v.message = hypervisorv1.State_STATE_RUNNING, driver.ReasonMigrated, ""
	v.rec.StartedAt = time.Now()
	v.rec.MigratedIn = true
	d.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_STARTED)
	d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED, "")
	d.log.Info("migrated in: running", "id", v.id)
}

// listenIncoming finishes Start of a migration target: its QEMU (-incoming defer, -S) listens
// for the migration stream, and the VM is PAUSED (IncomingMigration) until the state arrives.
func (d *Driver) listenIncoming(ctx context.Context, v *vm, s *session, pid int, logs func() string) error {
	in := v.spec.GetIncomingMigration()
	v.mu.Lock()
	s.incoming = true
	v.mig = &migration{info: &hypervisorv1.MigrationInfo{
		Role: hypervisorv1.MigrationRole_MIGRATION_ROLE_TARGET, Phase: hypervisorv1.MigrationPhase_MIGRATION_PHASE_SETUP,
		Mode: hypervisorv1.MigrationMode_MIGRATION_MODE_PRE_COPY, StartedAt: timestamppb.Now(), Target: in.GetSocketPath(),
		PostCopy: in.GetAllowPostCopy(),
	}}
	v.mu.Unlock()
	if err := d.startIncoming(ctx, v, s); err != nil {
		_ = d.stop(ctx, v, s, driver.ReasonStartFailed)
		return status.Errorf(codes.Internal, "qemu (pid %d): %v: %s", pid, err, logs())
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-s.done:
		return status.Errorf(codes.Internal, "qemu (pid %d) exited: %s", pid, v.message)
	default:
	}
	v.state, v.reason, v.message = hypervisorv1.State_STATE_PAUSED, driver.ReasonIncomingMigration, "waiting for the migration stream on "+in.GetSocketPath()
	v.rec.PID = pid
	d.log.Info("waiting for an incoming migration", "id", v.id, "pid", pid, "socket", in.GetSocketPath())
	d.emitMigrationLocked(v)
	return nil
}

// startIncoming makes a launched QEMU (-incoming defer) listen for the migration stream.
func (d *Driver) startIncoming(ctx context.Context, v *vm, s *session) error {
	in := v.spec.GetIncomingMigration()
	ctx, cancel := context.WithTimeout(ctx, migrationCommandWait)
	defer cancel()
	if err := setCapabilities(ctx, s.mon, capability{"events", true}, capability{"postcopy-ram", in.GetAllowPostCopy()}); err != nil {
		return fmt.Errorf("incomingMigration: %w", err)
	}
	if _, err := s.mon.Run(ctx, "migrate-incoming", map[string]any{"uri": "unix:" + in.GetSocketPath()}); err != nil {
		return fmt.Errorf("incomingMigration.socketPath: %w", err)
	}
	return serveIncomingDisks(ctx, s.mon, v.spec)
}

// MigrationStatus implements driver.Migrator: the source's live figures while it migrates.
func (d *Driver) MigrationStatus(ctx context.Context, id string) (*hypervisorv1.MigrationInfo, error) {
	v, err := d.get(id)
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	m, s := v.mig, v.sess
	live := m != nil && !m.ended() && m.role() == hypervisorv1.MigrationRole_MIGRATION_ROLE_SOURCE && s != nil
	v.mu.Unlock()
	if live {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		q, err := runQueryMigrate(qctx, s.mon)
		var jobs map[string]blockJob
		if len(m.disks) > 0 {
			jobs, _ = queryJobs(qctx, s.mon)
		}
		cancel()
		v.mu.Lock()
		if v.mig == m && !m.ended() {
			if err == nil && m.memoryStarted {
				applyQuery(m.info, q)
			}
			if jobs != nil {
				applyJobs(m.info, m.disks, jobs)
			}
		}
		v.mu.Unlock()
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.mig == nil {
		return nil, nil
	}
	info := proto.CloneOf(v.mig.info)
	if !v.mig.ended() && info.GetStartedAt() != nil && info.GetRole() == hypervisorv1.MigrationRole_MIGRATION_ROLE_TARGET {
		info.TotalTime = durationpb.New(time.Since(info.GetStartedAt().AsTime()))
	}
	return info, nil
}

// CancelMigration implements driver.Migrator.
func (d *Driver) CancelMigration(ctx context.Context, id string) error {
	v, err := d.get(id)
	if err != nil {
		return err
	}
	v.mu.Lock()
	m, s := v.mig, v.sess
	switch {
	case m == nil:
		v.mu.Unlock()
		return nil
	case m.ended():
		done := m.info.GetPhase() == hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED && m.role() == hypervisorv1.MigrationRole_MIGRATION_ROLE_SOURCE
		v.mu.Unlock()
		if done {
			return status.Errorf(codes.FailedPrecondition, "vm %q migrated already", id)
		}
		return nil
	case s == nil:
		v.mu.Unlock()
		return nil
	case m.role() == hypervisorv1.MigrationRole_MIGRATION_ROLE_TARGET:
		v.mu.Unlock()
		return d.stop(ctx, v, s, driver.ReasonMigrationCancelled)
	case m.info.GetMode() == hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY:
		v.mu.Unlock()
		return status.Errorf(codes.FailedPrecondition, "vm %q: the migration is in post-copy and can no longer be cancelled", id)
	case s.migratedOut:
		v.mu.Unlock()
		return status.Errorf(codes.FailedPrecondition, "vm %q migrated already", id)
	}
	if !m.memoryStarted {
		// In the disk phase no QEMU migration runs: the driver ends it.
		if m.cancelReason != "" {
			v.mu.Unlock()
			v.waitFor(ctx, cancelWait, func() bool { return v.mig != m || m.ended() || v.sess != s })
			return nil
		}
		m.cancelReason = "cancelled"
		v.mu.Unlock()
		d.abortDisks(v, s, m, hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED, "cancelled while its disks were copied")
		return nil
	}
	if m.cancelReason == "" {
		m.cancelReason = "cancelled"
	}
	v.mu.Unlock()
	qctx, cancel := context.WithTimeout(ctx, migrationCommandWait)
	_, err = s.mon.Run(qctx, "migrate_cancel", nil)
	cancel()
	if err != nil {
		return status.Errorf(codes.Internal, "vm %q: %v", id, err)
	}
	if !v.waitFor(ctx, cancelWait, func() bool { return v.mig != m || m.ended() || v.sess != s }) {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		return status.Errorf(codes.DeadlineExceeded, "vm %q: the migration did not end within %s of migrate_cancel", id, cancelWait)
	}
	return nil
}

// recoverMigration re-adopts the migration of a VM whose QEMU runs, after a driver restart:
// the state the VM is in, and what to do once it is adopted (nil: nothing). qs is QEMU's run
// state.
func (d *Driver) recoverMigration(ctx context.Context, v *vm, mon Monitor, qsStatus string) (hypervisorv1.State, func(*session), bool) {
	m := v.mig
	if m == nil || m.ended() {
		return 0, nil, false
	}
	q, err := runQueryMigrate(ctx, mon)
	qemu := ""
	if err == nil {
		qemu = q.Status
	}
	if m.role() == hypervisorv1.MigrationRole_MIGRATION_ROLE_TARGET {
		switch {
		case qsStatus == "inmigrate":
			v.reason = driver.ReasonIncomingMigration
			return hypervisorv1.State_STATE_PAUSED, func(s *session) {
				v.mu.Lock()
				s.incoming = true
				v.mu.Unlock()
			}, true
		default:
			// The state arrived while no driver ran: run it, as the watcher would have.
			v.reason = driver.ReasonIncomingMigration
			return hypervisorv1.State_STATE_PAUSED, func(s *session) {
				v.mu.Lock()
				s.incoming, s.incomingDone = true, true
				v.mu.Unlock()
				go d.runMigratedIn(v, s)
			}, true
		}
	}
	switch qemu {
	case "completed":
		return hypervisorv1.State_STATE_RUNNING, func(s *session) {
			v.mu.Lock()
			s.migratedOut = true
			v.mu.Unlock()
			go d.finishMigratedOut(v, s)
		}, true
	case "failed", "cancelled":
		phase := hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED
		if qemu == "cancelled" {
			phase = hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED
		}
		return hypervisorv1.State_STATE_RUNNING, func(s *session) {
			v.mu.Lock()
			d.endMigrationLocked(v, phase, "ended while the driver restarted: "+qemu)
			v.mu.Unlock()
			go d.afterFailedOut(v, s, m.disks)
		}, true
	default:
		if err == nil {
			applyQuery(m.info, q)
		}
		if !m.memoryStarted {
			// In the disk phase: the mirrors go on in QEMU.
			return hypervisorv1.State_STATE_RUNNING, func(s *session) { go d.watchDisks(v, s, m) }, true
		}
		return hypervisorv1.State_STATE_RUNNING, func(s *session) { go d.watchMigration(v, s, m) }, true
	}
}
