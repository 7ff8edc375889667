package handler

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// Live migration on the node. The handler does the node's half of each end of a migration
// through the hypervisor driver's Migrator; the program around it (package cluster) decides
// when, carries the streams between nodes (the migration proxy) and reports on the VMI.
//
// Target: SyncIncoming runs the sync pipeline of a VMI into the target's sandbox with the domain
// spec's incoming_migration set, so the VM process starts waiting for the source's state
// (PAUSED, IncomingMigration) on IncomingSocketName in the VMI's run directory. The VMI's state
// on disk records the migration (Incoming) until the VM runs here, so that a handler restart
// keeps a waiting target and Incoming tells a target from a VMI the node lost. Once the VM runs
// (RUNNING, Migrated) the VMI is the node's like any other: Sync observes it and clears the
// record.
//
// Source: Migrate starts the driver's migration of a running VM to a unix socket (the proxy's,
// or the target's own on one node); MigrationStatus and CancelMigration follow and stop it. Once
// the driver reports the migration completed, the VM is STOPPED with reason Migrated here and
// MigratedAway says so: the VMI lives on the target, and its status is no longer this node's to
// write.

// IncomingSocketName is the target VM's incoming migration socket in its run directory, and
// IncomingDisksSocketName the one on which it serves the disks the source copies (NBD).
const (
	IncomingSocketName      = "migration-in.sock"
	IncomingDisksSocketName = "migration-disks.sock"
)

// MigratedDisks are the disks of vmi that a migration copies to the target, by name: its
// writable node-local ones (VirtualMachineInstanceSpec.LocalWritableDisks). A containerDisk's
// overlay is copied top only (the target has the same image beneath its own fresh overlay); an
// emptyDisk whole.
func MigratedDisks(vmi *v1alpha1.VirtualMachineInstance) []*hypervisorv1.MigrateDisk {
	var out []*hypervisorv1.MigrateDisk
	for _, d := range vmi.Spec.LocalWritableDisks() {
		out = append(out, &hypervisorv1.MigrateDisk{Name: d.Name, TopOnly: d.Overlay})
	}
	return out
}

// Incoming is what a migration target needs to know of its migration.
type Incoming struct {
	// MigrationUID is the VirtualMachineInstanceMigration's UID.
	MigrationUID types.UID
	// AllowPostCopy lets the source switch the migration to post-copy.
	AllowPostCopy bool
}

// IncomingSockets are where a target VM waits for the source: the migration stream's socket,
// and the socket of its disks (NBD) when the source copies any (MigratedDisks), else "".
type IncomingSockets struct {
	Memory, Disks string
}

func incomingSockets(vmi *v1alpha1.VirtualMachineInstance, runDir string) IncomingSockets {
	s := IncomingSockets{Memory: filepath.Join(runDir, IncomingSocketName)}
	if len(MigratedDisks(vmi)) > 0 {
		s.Disks = filepath.Join(runDir, IncomingDisksSocketName)
	}
	return s
}

// SyncIncoming makes this node the target of migration in of vmi: the sync pipeline, as Sync
// runs it, with the VM started waiting for the source. It is idempotent, and returns the
// sockets the source's streams must reach. It fails with FailedPrecondition when the node
// already runs the VMI otherwise (a VMI cannot migrate to where it runs).
func (h *Handler) SyncIncoming(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, in Incoming) (IncomingSockets, error) {
	if vmi == nil || vmi.UID == "" {
		return IncomingSockets{}, fmt.Errorf("sync incoming: the VMI has no UID")
	}
	if in.MigrationUID == "" {
		return IncomingSockets{}, fmt.Errorf("sync incoming: no migration UID")
	}
	if h.isClosed() {
		return IncomingSockets{}, fmt.Errorf("sync incoming: the handler is closed")
	}
	unlock := h.locks.Lock(string(vmi.UID))
	defer unlock()
	e := h.entryFor(vmi)
	h.mu.Lock()
	st := e.state
	h.mu.Unlock()
	if st != nil && st.Incoming != in.MigrationUID {
		return IncomingSockets{}, status.Errorf(codes.FailedPrecondition, "VMI %s already runs on this node (not as the target of migration %s)", vmiName(vmi), in.MigrationUID)
	}
	if st != nil && st.Started {
		h.observe(ctx, e)
		h.publish(e)
		return incomingSockets(vmi, st.RunDir), nil
	}
	h.mu.Lock()
	e.incoming = &in
	h.mu.Unlock()
	h.sandboxOf(e, vmi)
	err := h.run(ctx, e, vmi)
	h.publish(e)
	if err != nil {
		return IncomingSockets{}, err
	}
	h.mu.Lock()
	dir := e.state.RunDir
	h.mu.Unlock()
	return incomingSockets(vmi, dir), nil
}

// IncomingOf returns the migration a VMI waits for on this node as its target, if it does: from
// SyncIncoming until its VM runs here and Sync saw it.
func (h *Handler) IncomingOf(uid types.UID) (types.UID, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.vmis[uid]
	if e == nil {
		return "", false
	}
	if e.state != nil && e.state.Incoming != "" {
		return e.state.Incoming, true
	}
	if e.state == nil && e.incoming != nil {
		return e.incoming.MigrationUID, true
	}
	return "", false
}

// incomingDone clears the record of an incoming migration once its VM runs here. Call it with
// the VMI's lock held.
func (h *Handler) incomingDone(e *entry) {
	h.mu.Lock()
	st := e.state
	running := e.vm.GetState() == hypervisorv1.State_STATE_RUNNING || e.vm.GetState() == hypervisorv1.State_STATE_PAUSED && e.vm.GetReason() != driver.ReasonIncomingMigration
	if st == nil || st.Incoming == "" || !running {
		h.mu.Unlock()
		return
	}
	st.Incoming = ""
	e.incoming = nil
	// What the target published while it waited was never the VMI's: the status is derived
	// afresh from the VMI as stored (Running, its phases) and the running VM.
	e.status = v1alpha1.VirtualMachineInstanceStatus{}
	h.mu.Unlock()
	if err := h.states.save(st); err != nil {
		h.log.Warn("VMI migrated in, but its state was not saved", "uid", st.UID, "error", err)
		return
	}
	h.log.Info("VMI migrated in: it runs on this node", "uid", st.UID)
}

// Outgoing is how a source VM migrates.
type Outgoing struct {
	// MigrationUID is the VirtualMachineInstanceMigration's UID.
	MigrationUID types.UID
	// TargetSocket is the unix socket on this node that carries the stream to the target.
	TargetSocket string
	// BandwidthBytesPerSecond limits the stream; 0: no limit of the host's.
	BandwidthBytesPerSecond uint64
	// AllowAutoConverge and AllowPostCopy are the migration's policy.
	AllowAutoConverge, AllowPostCopy bool
	// CompletionTimeout bounds the migration (post-copy or cancel at the end); 0: none.
	CompletionTimeout time.Duration
	// TargetDisksSocket is the unix socket on this node that reaches the target's disks
	// (NBD), for the VMI's MigratedDisks; needed when it has any.
	TargetDisksSocket string
}

func diskNames(disks []*hypervisorv1.MigrateDisk) string {
	names := make([]string, len(disks))
	for i, d := range disks {
		names[i] = d.GetName()
	}
	return quotedList(names)
}

// migrator returns the started VM of VMI uid and its hypervisor driver's Migrator, or why not.
func (h *Handler) migrator(ctx context.Context, uid types.UID) (*entry, driver.Migrator, error) {
	e, hv, err := h.startedVM(uid)
	if err != nil {
		return nil, nil, err
	}
	m, ok := driver.Optional[driver.Migrator](ctx, hv)
	if !ok {
		return nil, nil, h.unoffered(uid, "live migration")
	}
	return e, m, nil
}

// Migrate starts the live migration of VMI uid's running VM to out.TargetSocket and returns once
// it began. The driver's errors come back as they are (InvalidArgument, FailedPrecondition).
func (h *Handler) Migrate(ctx context.Context, uid types.UID, out Outgoing) error {
	unlock := h.locks.Lock(string(uid))
	defer unlock()
	e, m, err := h.migrator(ctx, uid)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	req := &hypervisorv1.MigrateRequest{
		Id: string(uid), TargetSocketPath: out.TargetSocket,
		BandwidthBytesPerSecond: out.BandwidthBytesPerSecond,
		AllowAutoConverge:       out.AllowAutoConverge, AllowPostCopy: out.AllowPostCopy,
	}
	if out.CompletionTimeout > 0 {
		req.CompletionTimeout = durationpb.New(out.CompletionTimeout)
	}
	h.mu.Lock()
	vmi := e.vmi
	h.mu.Unlock()
	if vmi != nil {
		if req.Disks = MigratedDisks(vmi); len(req.Disks) > 0 {
			if out.TargetDisksSocket == "" {
				return status.Errorf(codes.FailedPrecondition, "migrate: the VMI has node-local disks to copy (%s) and no socket to the target's disks", diskNames(req.Disks))
			}
			req.TargetDisksSocketPath = out.TargetDisksSocket
		}
	}
	if err := m.Migrate(ctx, req); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	h.log.Info("VMI migration started", "uid", uid, "migration", out.MigrationUID, "bandwidth", out.BandwidthBytesPerSecond,
		"autoConverge", out.AllowAutoConverge, "postCopy", out.AllowPostCopy, "completionTimeout", out.CompletionTimeout)
	h.observe(ctx, e)
	return nil
}

// MigrationStatus returns the current or last migration of VMI uid's VM on this node (nil when it
// never migrated), as its hypervisor driver reports it. A VM that stopped because it migrated
// away is still asked: the driver keeps its last migration until Delete.
func (h *Handler) MigrationStatus(ctx context.Context, uid types.UID) (*hypervisorv1.MigrationInfo, error) {
	h.mu.Lock()
	e := h.vmis[uid]
	var st *vmiState
	if e != nil {
		st = e.state
	}
	h.mu.Unlock()
	if st == nil || !st.began(stepHypervisor) {
		return nil, status.Errorf(codes.NotFound, "VMI %s has no VM on this node", uid)
	}
	hv, _, err := h.hypervisorFor(st)
	if err != nil {
		return nil, err
	}
	m, ok := driver.Optional[driver.Migrator](ctx, hv)
	if !ok {
		return nil, h.unoffered(uid, "live migration")
	}
	info, err := m.MigrationStatus(ctx, string(uid))
	if status.Code(err) == codes.NotFound {
		if _, rerr := h.recoverVM(ctx, hv, st); rerr == nil {
			info, err = m.MigrationStatus(ctx, string(uid))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	if info.GetPhase() == hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED {
		// The VM's end here (STOPPED, Migrated) reaches the status with the outcome.
		h.observe(ctx, e)
	}
	return info, nil
}

// CancelMigration stops VMI uid's migration in pre-copy (the VM runs on here) and returns once
// it ended; FailedPrecondition when it can no longer be cancelled (post-copy, or it completed).
func (h *Handler) CancelMigration(ctx context.Context, uid types.UID) error {
	unlock := h.locks.Lock(string(uid))
	defer unlock()
	e, m, err := h.migrator(ctx, uid)
	if err != nil {
		return fmt.Errorf("cancel migration: %w", err)
	}
	if err := m.CancelMigration(ctx, string(uid)); err != nil {
		return fmt.Errorf("cancel migration: %w", err)
	}
	h.observe(ctx, e)
	h.log.Info("VMI migration cancelled", "uid", uid)
	return nil
}

// MigratedAway says whether VMI uid's VM left this node by a completed migration (STOPPED,
// Migrated): its status is the target's to write from then on.
func (h *Handler) MigratedAway(uid types.UID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.vmis[uid]
	if e == nil {
		return false
	}
	vm := e.vm
	if e.heldVM != nil {
		vm = e.heldVM
	}
	return vm.GetState() == hypervisorv1.State_STATE_STOPPED && vm.GetReason() == driver.ReasonMigrated
}

// RunDir is the run directory of VMI uid's VM on this node (where a migration's sockets go),
// and whether the node has one.
func (h *Handler) RunDir(uid types.UID) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.vmis[uid]
	if e == nil || e.state == nil {
		return "", false
	}
	return e.state.RunDir, true
}
