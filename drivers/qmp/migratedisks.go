package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// Block migration of writable node-local disks (driver.Migrator's "Disks"), with QEMU's NBD
// server at the target and its mirror jobs at the source:
//
// Target: Start, after migrate-incoming, runs `nbd-server-start` on
// incoming_migration.disks_socket_path and `block-export-add` (type nbd, writable) of each
// named disk's format node under the disk's name. QEMU activates an exported node of an
// incoming VM, so the source can write it before the migration completes. runMigratedIn runs
// `nbd-server-stop` (and removes the socket) before `cont`; a target whose migration failed
// exits with its server.
//
// Source: Migrate connects a `blockdev-add` nbd node (kvmig-nbd<i>) to each export and starts
// `blockdev-mirror` (job kvmig-mirror<i>, sync top or full, auto-dismiss off so that a job's
// end, error included, stays readable in query-block-jobs across a driver restart) from the
// disk's format node (speed: the request's bandwidth limit, if any), and returns: phase ACTIVE. The disk watcher samples query-block-jobs every
// diskPoll; once every job is ready it sets the capability "pause-before-switchover" (set with
// the others) in effect by running `migrate`. At the switch-over QEMU pauses the guest and stops
// in the state "pre-switchover" (a MIGRATION event, and query-migrate for a restarted driver):
// the driver then runs `block-job-cancel` (not forced) on each ready job, which completes it with
// the target in sync, waits for each to conclude without an error, dismisses it, removes the
// nbd nodes, and runs `migrate-continue`: the device state follows, so the target runs only with
// every write in its images. A mirror that fails, a migration that fails or is cancelled (in the
// disk phase by the driver itself: no QEMU migration runs yet) cancels every job with force and
// removes the nbd nodes: the source's disks were never switched, it runs on them.
//
// The jobs, the target's NBD socket and whether the memory migration was started are in the
// VM's record, so that Recover re-adopts a migration in its disk phase or at its switch-over.

const (
	// diskPoll is how often the source samples its mirror jobs.
	diskPoll = 200 * time.Millisecond
	// mirrorEndWait bounds the completion (or the cancel) of the mirrors.
	mirrorEndWait = 2 * time.Minute
	// mirrorJobPrefix and nbdNodePrefix name the source's mirror jobs and nbd client nodes.
	mirrorJobPrefix = "kvmig-mirror"
	nbdNodePrefix   = "kvmig-nbd"
	// exportPrefix names the target's block exports.
	exportPrefix = "kvmig-export"
)

// DiskCopy is one disk a source copies (in its migration and its record). The libvirt driver
// checks its requests with the same rules (MigrationDisks).
type DiskCopy struct {
	Name    string `json:"name"`
	Index   int    `json:"index"` // in the spec's disks: node disk<Index>
	TopOnly bool   `json:"topOnly,omitempty"`
}

func (c DiskCopy) job() string  { return fmt.Sprintf("%s%d", mirrorJobPrefix, c.Index) }
func (c DiskCopy) node() string { return fmt.Sprintf("%s%d", nbdNodePrefix, c.Index) }

// DiskIndex is the index of the disk named name in spec, or -1.
func DiskIndex(spec *domainv1.DomainSpec, name string) int {
	return slices.IndexFunc(spec.GetDisks(), func(d *domainv1.Disk) bool { return d.GetName() == name })
}

// CopyableDisk says why disk d cannot be copied in a migration, "" when it can.
func CopyableDisk(d *domainv1.Disk) string {
	switch {
	case d.GetDevice() != domainv1.DiskDevice_DISK_DEVICE_DISK:
		return "a " + strings.ToLower(strings.TrimPrefix(d.GetDevice().String(), "DISK_DEVICE_")) + ", not a disk"
	case d.GetReadOnly():
		return "read-only (read-only media are made again on the target, not copied)"
	}
	return ""
}

// MigrationDisks checks a MigrateRequest's disks against spec: the disks to copy and the
// target's NBD socket, or why not.
func MigrationDisks(spec *domainv1.DomainSpec, req *hypervisorv1.MigrateRequest) ([]DiskCopy, string, error) {
	path := req.GetTargetDisksSocketPath()
	if len(req.GetDisks()) == 0 {
		if path != "" {
			return nil, "", status.Errorf(codes.InvalidArgument, "targetDisksSocketPath: set without disks to copy")
		}
		return nil, "", nil
	}
	var disks []DiskCopy
	for i, md := range req.GetDisks() {
		f := fmt.Sprintf("disks[%d]", i)
		idx := DiskIndex(spec, md.GetName())
		switch {
		case idx < 0:
			return nil, "", status.Errorf(codes.InvalidArgument, "%s: %q is not a disk of the VM", f, md.GetName())
		case slices.ContainsFunc(disks, func(c DiskCopy) bool { return c.Index == idx }):
			return nil, "", status.Errorf(codes.InvalidArgument, "%s: disk %q is named twice", f, md.GetName())
		}
		if why := CopyableDisk(spec.GetDisks()[idx]); why != "" {
			return nil, "", status.Errorf(codes.InvalidArgument, "%s: disk %q is %s", f, md.GetName(), why)
		}
		disks = append(disks, DiskCopy{Name: md.GetName(), Index: idx, TopOnly: md.GetTopOnly()})
	}
	switch {
	case path == "":
		return nil, "", status.Errorf(codes.InvalidArgument, "targetDisksSocketPath: required with disks")
	case !filepath.IsAbs(path):
		return nil, "", status.Errorf(codes.InvalidArgument, "targetDisksSocketPath: %q is not an absolute path", path)
	}
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return nil, "", status.Errorf(codes.FailedPrecondition, "targetDisksSocketPath: no socket at %s: %v", path, err)
	case fi.Mode()&os.ModeSocket == 0:
		return nil, "", status.Errorf(codes.FailedPrecondition, "targetDisksSocketPath: %s is not a socket", path)
	}
	return disks, path, nil
}

// startMirrors connects to the target's exports and starts a mirror job per disk, each limited
// to speed bytes/s (0: none). On an error it removes what it started.
func startMirrors(ctx context.Context, mon Monitor, disks []DiskCopy, socket string, speed uint64) error {
	for i, c := range disks {
		_, err := mon.Run(ctx, "blockdev-add", map[string]any{
			"driver": "nbd", "node-name": c.node(), "export": c.Name,
			"server": map[string]any{"type": "unix", "path": socket},
		})
		if err != nil {
			cancelMirrors(ctx, mon, disks[:i])
			return fmt.Errorf("disks[%d]: connect to the target's export %q: %w", i, c.Name, err)
		}
		sync := "full"
		if c.TopOnly {
			sync = "top"
		}
		args := map[string]any{
			"job-id": c.job(), "device": fmt.Sprintf("disk%d", c.Index), "target": c.node(), "sync": sync,
			"auto-dismiss": false,
		}
		if speed > 0 {
			args["speed"] = speed
		}
		_, err = mon.Run(ctx, "blockdev-mirror", args)
		if err != nil {
			_, _ = mon.Run(ctx, "blockdev-del", map[string]any{"node-name": c.node()})
			cancelMirrors(ctx, mon, disks[:i])
			return fmt.Errorf("disks[%d]: mirror disk %q: %w", i, c.Name, err)
		}
	}
	return nil
}

// blockJob is what this driver reads of query-block-jobs.
type blockJob struct {
	Device string `json:"device"` // the job's id
	Len    uint64 `json:"len"`
	Offset uint64 `json:"offset"`
	Ready  bool   `json:"ready"`
	Status string `json:"status"`
	Error  string `json:"error"`
}

// queryJobs returns the mirror jobs of this driver by id.
func queryJobs(ctx context.Context, mon Monitor) (map[string]blockJob, error) {
	raw, err := mon.Run(ctx, "query-block-jobs", nil)
	if err != nil {
		return nil, err
	}
	var all []blockJob
	if err := json.Unmarshal(raw, &all); err != nil {
		return nil, fmt.Errorf("query-block-jobs: %w", err)
	}
	jobs := map[string]blockJob{}
	for _, j := range all {
		if strings.HasPrefix(j.Device, mirrorJobPrefix) {
			jobs[j.Device] = j
		}
	}
	return jobs, nil
}

// applyJobs copies the jobs' progress into info (the disks of the migration).
func applyJobs(info *hypervisorv1.MigrationInfo, disks []DiskCopy, jobs map[string]blockJob) {
	if len(disks) == 0 {
		return
	}
	if len(info.Disks) != len(disks) {
		info.Disks = make([]*hypervisorv1.MigrationDisk, len(disks))
		for i, c := range disks {
			info.Disks[i] = &hypervisorv1.MigrationDisk{Name: c.Name, TopOnly: c.TopOnly}
		}
	}
	info.DiskTotalBytes, info.DiskTransferredBytes = 0, 0
	for i, c := range disks {
		md := info.Disks[i]
		if j, ok := jobs[c.job()]; ok {
			md.TotalBytes, md.TransferredBytes = j.Len, j.Offset
			md.Ready = j.Ready || md.Ready && j.Status == "concluded" && j.Error == ""
		}
		info.DiskTotalBytes += md.TotalBytes
		info.DiskTransferredBytes += md.TransferredBytes
	}
}

// mirrorsState sums the jobs up: all ready, or the first that failed (concluded with an error, or
// gone before it was ready) and why.
func mirrorsState(disks []DiskCopy, jobs map[string]blockJob) (allReady bool, failed string) {
	allReady = true
	for _, c := range disks {
		j, ok := jobs[c.job()]
		switch {
		case !ok:
			return false, fmt.Sprintf("the copy of disk %q ended before it was in sync", c.Name)
		case j.Error != "":
			return false, fmt.Sprintf("the copy of disk %q failed: %s", c.Name, j.Error)
		case j.Status == "concluded" || j.Status == "aborting" || j.Status == "null":
			return false, fmt.Sprintf("the copy of disk %q ended (%s) before it was in sync", c.Name, j.Status)
		case !j.Ready:
			allReady = false
		}
	}
	return allReady, ""
}

// cancelMirrors ends every job of disks at once (forced: the target's copy is abandoned) and
// removes the nbd nodes. The source never switched to the copies: it goes on on its disks.
func cancelMirrors(ctx context.Context, mon Monitor, disks []DiskCopy) {
	for _, c := range disks {
		_, _ = mon.Run(ctx, "block-job-cancel", map[string]any{"device": c.job(), "force": true})
	}
	_ = waitJobs(ctx, mon, disks, false)
	for _, c := range disks {
		_, _ = mon.Run(ctx, "blockdev-del", map[string]any{"node-name": c.node()})
	}
}

// waitJobs waits until every job of disks has concluded and dismisses it. With complete, a job
// that concluded with an error, or that is gone (unless it concluded before), is an error.
func waitJobs(ctx context.Context, mon Monitor, disks []DiskCopy, complete bool) error {
	pending := slices.Clone(disks)
	var errs []error
	for len(pending) > 0 {
		jobs, err := queryJobs(ctx, mon)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		var still []DiskCopy
		for _, c := range pending {
			j, ok := jobs[c.job()]
			switch {
			case !ok:
				if complete {
					errs = append(errs, fmt.Errorf("the copy of disk %q is gone", c.Name))
				}
			case j.Status == "concluded":
				if complete && j.Error != "" {
					errs = append(errs, fmt.Errorf("the copy of disk %q failed: %s", c.Name, j.Error))
				}
				_, _ = mon.Run(ctx, "job-dismiss", map[string]any{"id": c.job()})
			default:
				still = append(still, c)
			}
		}
		pending = still
		if len(pending) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return errors.Join(append(errs, fmt.Errorf("the copies of %d disks did not end: %w", len(pending), ctx.Err()))...)
		case <-time.After(diskPoll / 4):
		}
	}
	return errors.Join(errs...)
}

// completeMirrors completes every (ready) job at the switch-over: the target's images then
// hold every write; then it removes the nbd nodes.
func completeMirrors(ctx context.Context, mon Monitor, disks []DiskCopy) error {
	jobs, err := queryJobs(ctx, mon)
	if err != nil {
		return err
	}
	for _, c := range disks {
		if jobs[c.job()].Status == "concluded" {
			// Completed already (by a driver that restarted since): waitJobs reads how.
			continue
		}
		if _, err := mon.Run(ctx, "block-job-cancel", map[string]any{"device": c.job()}); err != nil {
			return fmt.Errorf("complete the copy of disk %q: %w", c.Name, err)
		}
	}
	if err := waitJobs(ctx, mon, disks, true); err != nil {
		return err
	}
	for _, c := range disks {
		if _, err := mon.Run(ctx, "blockdev-del", map[string]any{"node-name": c.node()}); err != nil {
			return fmt.Errorf("disconnect from the target's export %q: %w", c.Name, err)
		}
	}
	return nil
}

// watchDisks is the source's watcher of the disk phase: progress, a failed copy, the completion
// timeout, until every mirror is ready; it then starts the memory migration and watchMigration.
func (d *Driver) watchDisks(v *vm, s *session, mig *migration) {
	tick := time.NewTicker(diskPoll)
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
		if v.mig != mig || mig.ended() || mig.memoryStarted || mig.cancelReason != "" {
			v.mu.Unlock()
			return
		}
		v.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), migrationCommandWait)
		jobs, err := queryJobs(ctx, s.mon)
		cancel()
		if err != nil {
			d.log.Debug("query-block-jobs", "id", v.id, "error", err)
			continue
		}
		ready, failed := mirrorsState(mig.disks, jobs)
		v.mu.Lock()
		if v.mig != mig || mig.ended() || mig.cancelReason != "" {
			v.mu.Unlock()
			return
		}
		applyJobs(mig.info, mig.disks, jobs)
		timedOut := ""
		if t := mig.completionTimeout; t > 0 && time.Since(mig.info.GetStartedAt().AsTime()) >= t {
			timedOut = fmt.Sprintf("the migration did not complete within its completion timeout of %s (its disks were being copied)", t)
			mig.cancelReason = timedOut
		}
		if failed == "" && timedOut == "" && ready {
			mig.memoryStarted = true
			v.persistMigrationLocked()
			d.persistLocked(v)
		}
		v.mu.Unlock()
		switch {
		case failed != "":
			d.log.Warn("migration: a disk copy failed", "id", v.id, "why", failed)
			d.abortDisks(v, s, mig, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, failed)
			return
		case timedOut != "":
			d.log.Info("cancelling the migration", "id", v.id, "why", timedOut)
			d.abortDisks(v, s, mig, hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED, timedOut)
			return
		case ready:
			d.log.Info("migration: every disk copy is in sync, the memory follows", "id", v.id, "disks", len(mig.disks))
			ctx, cancel := context.WithTimeout(context.Background(), migrationCommandWait)
			err := d.startMemory(ctx, v, s, mig)
			cancel()
			if err != nil {
				d.abortDisks(v, s, mig, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, err.Error())
				return
			}
			v.mu.Lock()
			cancelled := mig.cancelReason != ""
			v.mu.Unlock()
			if cancelled {
				// CancelMigration came between the disks' readiness and migrate, and its
				// migrate_cancel may have found nothing to cancel yet.
				ctx, cancel := context.WithTimeout(context.Background(), migrationCommandWait)
				_, _ = s.mon.Run(ctx, "migrate_cancel", nil)
				cancel()
			}
			d.watchMigration(v, s, mig)
			return
		}
	}
}

// abortDisks ends a migration in its disk phase (no memory migration runs): the mirrors are
// cancelled and the migration ends with phase and msg, the VM running on its own disks.
func (d *Driver) abortDisks(v *vm, s *session, mig *migration, phase hypervisorv1.MigrationPhase, msg string) {
	ctx, cancel := context.WithTimeout(context.Background(), mirrorEndWait)
	defer cancel()
	cancelMirrors(ctx, s.mon, mig.disks)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.mig == mig {
		d.endMigrationLocked(v, phase, msg)
	}
}

// switchOver completes the mirrors of a source paused at pre-switchover, then lets QEMU send
// the device state; a mirror that does not complete cancels the migration (the guest resumes
// here on its own disks).
func (d *Driver) switchOver(v *vm, s *session, mig *migration) {
	ctx, cancel := context.WithTimeout(context.Background(), mirrorEndWait)
	defer cancel()
	start := time.Now()
	jobs, _ := queryJobs(ctx, s.mon)
	err := completeMirrors(ctx, s.mon, mig.disks)
	v.mu.Lock()
	if jobs != nil {
		applyJobs(mig.info, mig.disks, jobs)
	}
	if err != nil && mig.cancelReason == "" {
		mig.cancelReason = "the copy of the disks did not complete at the switch-over: " + err.Error()
	}
	v.mu.Unlock()
	if err != nil {
		d.log.Warn("migration: the disk copies did not complete at the switch-over; cancelling", "id", v.id, "error", err)
		cancelMirrors(ctx, s.mon, mig.disks)
		if _, err := s.mon.Run(ctx, "migrate_cancel", nil); err != nil {
			d.log.Warn("migrate_cancel", "id", v.id, "error", err)
		}
		return
	}
	d.log.Info("migration: disk copies completed at the switch-over", "id", v.id, "took", time.Since(start).Round(time.Millisecond).String())
	if _, err := s.mon.Run(ctx, "migrate-continue", map[string]any{"state": "pre-switchover"}); err != nil {
		d.log.Warn("migrate-continue", "id", v.id, "error", err)
	}
}

// cleanupMirrorsAfterFailure ends the mirrors of a source whose memory migration failed or was
// cancelled (QEMU resumed it): they are cancelled, the source goes on on its own disks.
func (d *Driver) cleanupMirrorsAfterFailure(s *session, disks []DiskCopy) {
	ctx, cancel := context.WithTimeout(context.Background(), mirrorEndWait)
	defer cancel()
	jobs, err := queryJobs(ctx, s.mon)
	if err != nil {
		return
	}
	var left []DiskCopy
	for _, c := range disks {
		if _, ok := jobs[c.job()]; ok {
			left = append(left, c)
		}
	}
	cancelMirrors(ctx, s.mon, left)
	// A node whose job ended already (at a switch-over that failed after it) may remain.
	for _, c := range disks {
		_, _ = s.mon.Run(ctx, "blockdev-del", map[string]any{"node-name": c.node()})
	}
}

// serveIncomingDisks makes a migration target's QEMU serve the disks to copy over NBD on
// incoming_migration.disks_socket_path.
func serveIncomingDisks(ctx context.Context, mon Monitor, spec *domainv1.DomainSpec) error {
	in := spec.GetIncomingMigration()
	if len(in.GetDisks()) == 0 {
		return nil
	}
	idxs, err := IncomingDisks(spec)
	if err != nil {
		return err
	}
	path := in.GetDisksSocketPath()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("incomingMigration.disksSocketPath: %w", err)
	}
	if _, err := mon.Run(ctx, "nbd-server-start", map[string]any{
		"addr": map[string]any{"type": "unix", "data": map[string]any{"path": path}},
	}); err != nil {
		return fmt.Errorf("incomingMigration.disksSocketPath: %w", err)
	}
	for i, name := range in.GetDisks() {
		idx := idxs[i]
		if _, err := mon.Run(ctx, "block-export-add", map[string]any{
			"type": "nbd", "id": fmt.Sprintf("%s%d", exportPrefix, idx), "node-name": fmt.Sprintf("disk%d", idx),
			"name": name, "writable": true,
		}); err != nil {
			return fmt.Errorf("incomingMigration.disks[%d]: export disk %q: %w", i, name, err)
		}
	}
	return nil
}

// IncomingDisks checks a target's incoming_migration.disks against its spec: the index in
// the spec's disks of each, or an error naming the field.
func IncomingDisks(spec *domainv1.DomainSpec) ([]int, error) {
	var idxs []int
	for i, name := range spec.GetIncomingMigration().GetDisks() {
		idx := DiskIndex(spec, name)
		if idx < 0 {
			return nil, fmt.Errorf("incomingMigration.disks[%d]: %q is not a disk of the VM", i, name)
		}
		if why := CopyableDisk(spec.GetDisks()[idx]); why != "" {
			return nil, fmt.Errorf("incomingMigration.disks[%d]: disk %q is %s", i, name, why)
		}
		idxs = append(idxs, idx)
	}
	return idxs, nil
}

// stopIncomingDisks stops a target's NBD server once the VM runs, and removes its socket.
func stopIncomingDisks(ctx context.Context, mon Monitor, spec *domainv1.DomainSpec) error {
	in := spec.GetIncomingMigration()
	if len(in.GetDisks()) == 0 {
		return nil
	}
	_, err := mon.Run(ctx, "nbd-server-stop", nil)
	if rerr := os.Remove(in.GetDisksSocketPath()); rerr != nil && !errors.Is(rerr, os.ErrNotExist) && err == nil {
		err = rerr
	}
	return err
}
