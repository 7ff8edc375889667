package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/handler/migrationproxy"
)

// The node's half of a live migration (the migration controller, controlplane/migration, runs
// the object's lifecycle and hands a migration to the nodes by writing the VMI's
// status.migrationState).
//
// Target node. The migration target controller follows the target launcher pods on this node
// (labelled with the migration's UID). Once the VMI's migrationState names the pod (the
// hand-off), it syncs the VMI into the pod with the VM waiting for the source's state
// (handler.SyncIncoming), has the migration proxy accept the source node's connections for the
// migration and carry them to the VM's incoming socket, and writes targetNodeAddress (its proxy's
// address) and targetNodeDomainReadyTimestamp. A target that cannot be prepared writes failed
// with the reason. A target whose migration fails or is cancelled, or whose pod goes, is stopped
// and undone. Until the migration completes the VMI is not this node's: it is read from the API
// server (the agent's cache holds this node's VMIs only) and its status is not written here.
//
// Source node. When the node's running VMI has a migrationState with this node as source and
// the target's address, a runner starts the migration through the proxy (handler.Migrate to the
// proxy's socket in the VM's run directory) with the migration's configuration, writes
// startTimestamp and mode, and polls the driver's MigrationStatus: it cancels the migration when
// the VMI's migrationState is withdrawn, failed or abortRequested (the object was deleted, the
// target pod failed) and when the memory left to copy reaches no new low for progressTimeout;
// the driver enforces completionTimeoutPerGiB. When the migration ends it writes completed or
// failed with the driver's reason, and endTimestamp. The VM then stopped here (Migrated) and its
// status is the target's: the agent no longer writes it, and lets the VM go (undoes what the
// node made for it) when the VMI controller moves the VMI to the target node.
//
// Both sides write their fields of status.migrationState by merge patch, preconditioned on the
// VMI's resourceVersion and only while the state is the migration's they work for.

// MigrationConfig is the node agent's part in live migrations.
type MigrationConfig struct {
	// Proxy is the node's migration proxy; nil: this node takes part in no migration (a
	// migration to or from it fails with the reason).
	Proxy MigrationProxy
	// Address is the proxy's address other nodes' handlers reach, host:port (the handler
	// pod's IP and nodeapi.MigrationPort).
	Address string
	// Poll is how often the source asks the driver how its migration goes. Default: 1 s.
	Poll time.Duration
}

// MigrationProxy is what the agent uses of the node's migration proxy (migrationproxy.Proxy).
type MigrationProxy interface {
	Incoming(spec migrationproxy.IncomingSpec) (*migrationproxy.Migration, error)
	Outgoing(spec migrationproxy.OutgoingSpec) (*migrationproxy.Migration, error)
	// WaitServing returns once the proxy serves (migrationproxy.Proxy.WaitServing).
	WaitServing(ctx context.Context) error
}

// How long a migration waits for the node's migration proxy to serve: a handler pod that just
// started (an upgrade, a restart) serves it once its node certificate is there, a few seconds
// later; a migration started meanwhile waits instead of failing. The target side waits within
// its reconcile, so for less.
const (
	proxySourceWait = time.Minute
	proxyTargetWait = 10 * time.Second
)

// targetRecheck is how often a target looks at its VMI again while the migration is not over:
// the target controller follows pods, and the VMI's migrationState changes are not its events.
const targetRecheck = 2 * time.Second

// migrations is the agent's migration work: the proxy's registrations and the source runners.
type migrations struct {
	mu       sync.Mutex
	incoming map[types.UID]*migrationproxy.Migration // by migration UID
	outgoing map[types.UID]types.UID                 // VMI UID → migration UID of its runner
	// bg bounds the source runners: the agent's lifetime.
	bg     context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newMigrations() *migrations {
	bg, cancel := context.WithCancel(context.Background())
	return &migrations{incoming: map[types.UID]*migrationproxy.Migration{}, outgoing: map[types.UID]types.UID{}, bg: bg, cancel: cancel}
}

// close stops the source runners (the migrations go on in the VM processes; a new handler takes
// them up) and closes the proxy's registrations.
func (m *migrations) close() {
	m.cancel()
	m.wg.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, in := range m.incoming {
		_ = in.Close()
		delete(m.incoming, id)
	}
}

func (m *migrations) closeIncoming(id types.UID) {
	m.mu.Lock()
	in := m.incoming[id]
	delete(m.incoming, id)
	m.mu.Unlock()
	if in != nil {
		_ = in.Close()
	}
}

// setupMigrationTargets registers the migration target controller with mgr.
func (a *Agent) setupMigrationTargets(mgr ctrl.Manager) error {
	isTarget := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetLabels()[v1alpha1.MigrationUIDLabel] != ""
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("migration-target").
		WithOptions(a.cfg.Controller).
		For(&corev1.Pod{}, builder.WithPredicates(isTarget)).
		Complete(reconcile.Func(a.reconcileTarget))
}

// reconcileTarget follows one target launcher pod on this node.
func (a *Agent) reconcileTarget(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pod := &corev1.Pod{}
	if err := a.client.Get(ctx, req.NamespacedName, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, a.dropTarget(ctx, req.NamespacedName, "its target pod is gone")
		}
		return reconcile.Result{}, err
	}
	migUID := types.UID(pod.Labels[v1alpha1.MigrationUIDLabel])
	vmiName := pod.Labels[v1alpha1.VirtualMachineInstanceNameLabel]
	if migUID == "" || vmiName == "" || pod.Spec.NodeName != a.cfg.NodeName {
		return reconcile.Result{}, nil
	}
	key := types.NamespacedName{Namespace: pod.Namespace, Name: vmiName}
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := a.reader.Get(ctx, key, vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, a.dropTarget(ctx, req.NamespacedName, "its VMI is gone")
		}
		return reconcile.Result{}, err
	}
	if string(vmi.UID) != pod.Labels[v1alpha1.CreatedByLabel] {
		return reconcile.Result{}, nil
	}
	ms := vmi.Status.MigrationState
	ours := ms != nil && ms.MigrationUID == migUID && ms.TargetPod == pod.Name && ms.TargetNode == a.cfg.NodeName
	a.targetsMu.Lock()
	a.targets[req.NamespacedName] = targetOf{vmi: vmi.UID, name: key, migration: migUID}
	a.targetsMu.Unlock()
	switch {
	case ours && ms.Completed:
		// The VM runs here: the VMI is this node's once the VMI controller moves it (its node
		// label brings it to the agent's main controller). The proxy has nothing more to carry.
		a.migrations.closeIncoming(migUID)
		return reconcile.Result{}, nil
	case pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded || launcherExited(pod):
		return reconcile.Result{}, a.dropTarget(ctx, req.NamespacedName, "its target pod ended")
	case ms != nil && ms.MigrationUID == migUID && (ms.Failed || ms.AbortRequested):
		return reconcile.Result{}, a.dropTarget(ctx, req.NamespacedName, "the migration failed or was cancelled")
	case !ours:
		// Not handed off yet (the migration controller does when this pod runs), or handed to
		// another migration: the pod's deletion ends it then.
		return reconcile.Result{RequeueAfter: targetRecheck}, nil
	case pod.Status.Phase != corev1.PodRunning:
		return reconcile.Result{}, nil
	}
	return a.prepareTarget(ctx, vmi, pod)
}

// targetOf is what the agent remembers of a target pod, to undo its VM when the pod is gone.
type targetOf struct {
	vmi       types.UID
	name      types.NamespacedName
	migration types.UID
}

// prepareTarget makes the VM that waits for the source, and tells the source where to send it.
func (a *Agent) prepareTarget(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) (reconcile.Result, error) {
	ms := vmi.Status.MigrationState
	key := types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}
	log := a.log.WithValues("vmi", key, "migration", ms.MigrationUID, "pod", pod.Name)
	fail := func(reason string) (reconcile.Result, error) {
		log.Info("migration target failed", "reason", reason)
		_, err := a.patchMigrationState(ctx, key, ms.MigrationUID, func(s *v1alpha1.VirtualMachineInstanceMigrationState) {
			if !s.Completed && !s.Failed {
				now := metav1.Now()
				s.Failed, s.FailureReason, s.EndTimestamp = true, "target node "+a.cfg.NodeName+": "+reason, &now
			}
		})
		return reconcile.Result{}, err
	}
	proxy := a.cfg.Migration.Proxy
	if proxy == nil || a.cfg.Migration.Address == "" {
		return fail("the handler's migration proxy is off (kubevisor-handler --migration-addr)")
	}
	if pod.Labels[v1alpha1.HypervisorDriverLabel] != "" {
		vmi.Status.HypervisorDriver = pod.Labels[v1alpha1.HypervisorDriverLabel]
	}
	if ms.SourceNode == a.cfg.NodeName {
		return fail("the source node is this node")
	}
	postCopy := ms.MigrationConfiguration != nil && ms.MigrationConfiguration.AllowPostCopy != nil && *ms.MigrationConfiguration.AllowPostCopy
	socks, err := a.h.SyncIncoming(ctx, vmi, handler.Incoming{MigrationUID: ms.MigrationUID, AllowPostCopy: postCopy})
	if err != nil {
		// SyncIncoming undid what it made.
		return fail(fmt.Sprintf("prepare the VM: %v", err))
	}
	a.migrations.mu.Lock()
	_, registered := a.migrations.incoming[ms.MigrationUID]
	a.migrations.mu.Unlock()
	if !registered {
		waitCtx, cancel := context.WithTimeout(ctx, proxyTargetWait)
		err := proxy.WaitServing(waitCtx)
		cancel()
		if err != nil {
			return fail(fmt.Sprintf("migration proxy: %v", err))
		}
		in, err := proxy.Incoming(migrationproxy.IncomingSpec{ID: string(ms.MigrationUID), SourceNode: ms.SourceNode,
			TargetSocket: socks.Memory, DisksTargetSocket: socks.Disks})
		if err != nil && !errors.Is(err, migrationproxy.ErrExists) {
			return fail(fmt.Sprintf("migration proxy: %v", err))
		}
		if in != nil {
			a.migrations.mu.Lock()
			a.migrations.incoming[ms.MigrationUID] = in
			a.migrations.mu.Unlock()
		}
		log.Info("migration target ready", "socket", socks.Memory, "disksSocket", socks.Disks, "address", a.cfg.Migration.Address)
	}
	if ms.TargetNodeAddress != a.cfg.Migration.Address {
		if _, err := a.patchMigrationState(ctx, key, ms.MigrationUID, func(s *v1alpha1.VirtualMachineInstanceMigrationState) {
			now := metav1.Now()
			s.TargetNodeAddress, s.TargetNodeDomainReadyTimestamp = a.cfg.Migration.Address, &now
		}); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{RequeueAfter: targetRecheck}, nil
}

// dropTarget stops and undoes the VM a target pod was prepared with, unless it runs the VMI now.
func (a *Agent) dropTarget(ctx context.Context, podKey types.NamespacedName, why string) error {
	a.targetsMu.Lock()
	t, ok := a.targets[podKey]
	a.targetsMu.Unlock()
	if !ok {
		return nil
	}
	a.migrations.closeIncoming(t.migration)
	if mig, waiting := a.h.IncomingOf(t.vmi); waiting && mig == t.migration {
		stub := &v1alpha1.VirtualMachineInstance{}
		stub.Namespace, stub.Name, stub.UID = t.name.Namespace, t.name.Name, t.vmi
		if _, err := a.h.Stop(ctx, stub, 0); err != nil {
			return fmt.Errorf("stop the migration target of %s: %w", t.name, err)
		}
		if err := a.releaseMounts(t.vmi); err != nil {
			return err
		}
		a.log.Info("migration target stopped", "vmi", t.name, "migration", t.migration, "why", why)
	}
	a.targetsMu.Lock()
	delete(a.targets, podKey)
	a.targetsMu.Unlock()
	return nil
}

// patchMigrationState changes, by merge patch preconditioned on the VMI's resourceVersion, the
// VMI's migrationState while it is migration mig's; it reports whether it was.
func (a *Agent) patchMigrationState(ctx context.Context, key types.NamespacedName, mig types.UID, change func(*v1alpha1.VirtualMachineInstanceMigrationState)) (bool, error) {
	ours := false
	err := retry.OnError(retry.DefaultRetry, apierrors.IsConflict, func() error {
		vmi := &v1alpha1.VirtualMachineInstance{}
		if err := a.reader.Get(ctx, key, vmi); err != nil {
			return client.IgnoreNotFound(err)
		}
		ms := vmi.Status.MigrationState
		if ours = ms != nil && ms.MigrationUID == mig; !ours {
			return nil
		}
		before := vmi.DeepCopy()
		change(ms)
		if equality.Semantic.DeepEqual(before.Status.MigrationState, ms) {
			return nil
		}
		return a.client.Status().Patch(ctx, vmi, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	})
	if err != nil {
		return ours, fmt.Errorf("write the migration state of VMI %s: %w", key, err)
	}
	return ours, nil
}

// ensureOutgoing starts the source runner of vmi's migration when this node is its source, the
// target is ready and no runner has it yet.
func (a *Agent) ensureOutgoing(vmi *v1alpha1.VirtualMachineInstance) {
	ms := vmi.Status.MigrationState
	if ms == nil || ms.MigrationUID == "" || ms.SourceNode != a.cfg.NodeName || ms.TargetNodeAddress == "" ||
		ms.Completed || ms.Failed || ms.AbortRequested {
		return
	}
	m := a.migrations
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bg.Err() != nil || m.outgoing[vmi.UID] == ms.MigrationUID {
		return
	}
	m.outgoing[vmi.UID] = ms.MigrationUID
	m.wg.Add(1)
	r := &sourceRun{a: a, key: types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}, uid: vmi.UID, state: *ms.DeepCopy(), vmi: vmi.DeepCopy()}
	r.log = a.log.WithValues("vmi", r.key, "migration", ms.MigrationUID)
	go func() {
		defer m.wg.Done()
		r.run(m.bg)
		m.mu.Lock()
		if m.outgoing[vmi.UID] == ms.MigrationUID {
			delete(m.outgoing, vmi.UID)
		}
		m.mu.Unlock()
	}()
}

// sourceRun is one migration out of this node.
type sourceRun struct {
	a     *Agent
	key   types.NamespacedName
	uid   types.UID
	state v1alpha1.VirtualMachineInstanceMigrationState
	vmi   *v1alpha1.VirtualMachineInstance
	log   logr.Logger
}

func (r *sourceRun) patch(ctx context.Context, change func(*v1alpha1.VirtualMachineInstanceMigrationState)) {
	if _, err := r.a.patchMigrationState(ctx, r.key, r.state.MigrationUID, change); err != nil {
		r.log.Error(err, "write the migration state")
	}
}

func (r *sourceRun) fail(ctx context.Context, reason string) {
	r.log.Info("migration failed", "reason", reason)
	r.patch(ctx, func(s *v1alpha1.VirtualMachineInstanceMigrationState) {
		if s.Completed || s.Failed {
			return
		}
		now := metav1.Now()
		s.Failed, s.FailureReason, s.EndTimestamp = true, reason, &now
	})
}

// run carries the migration from its start to its end (or to the handler's, ctx).
func (r *sourceRun) run(ctx context.Context) {
	a, ms := r.a, r.state
	proxy := a.cfg.Migration.Proxy
	if proxy == nil {
		r.fail(ctx, "source node "+a.cfg.NodeName+": the handler's migration proxy is off (kubevisor-handler --migration-addr)")
		return
	}
	runDir, ok := a.h.RunDir(r.uid)
	if !ok {
		r.fail(ctx, "source node "+a.cfg.NodeName+": the VMI has no VM here")
		return
	}
	spec := migrationproxy.OutgoingSpec{
		ID: string(ms.MigrationUID), TargetNode: ms.TargetNode, TargetAddr: ms.TargetNodeAddress,
		Socket: filepath.Join(runDir, migrationproxy.SocketName), Owner: ownerOf(runDir),
	}
	if len(handler.MigratedDisks(r.vmi)) > 0 {
		spec.DisksSocket = filepath.Join(runDir, migrationproxy.DisksSocketName)
	}
	waitCtx, cancel := context.WithTimeout(ctx, proxySourceWait)
	err := proxy.WaitServing(waitCtx)
	cancel()
	if err != nil {
		r.fail(ctx, fmt.Sprintf("source node %s: migration proxy: %v", a.cfg.NodeName, err))
		return
	}
	out, err := proxy.Outgoing(spec)
	if err != nil {
		r.fail(ctx, fmt.Sprintf("source node %s: migration proxy: %v", a.cfg.NodeName, err))
		return
	}
	defer func() { _ = out.Close() }()

	cfg := ms.MigrationConfiguration
	if cfg == nil {
		cfg = &v1alpha1.MigrationConfiguration{}
	}
	info, err := a.h.MigrationStatus(ctx, r.uid)
	resumed := err == nil && migrating(info)
	if !resumed {
		o := handler.Outgoing{
			MigrationUID: ms.MigrationUID, TargetSocket: spec.Socket,
			AllowAutoConverge: boolOf(cfg.AllowAutoConverge), AllowPostCopy: boolOf(cfg.AllowPostCopy),
			CompletionTimeout: completionTimeout(r.vmi, cfg.CompletionTimeoutPerGiB),
			TargetDisksSocket: spec.DisksSocket,
		}
		if cfg.BandwidthPerMigration != nil && cfg.BandwidthPerMigration.Sign() > 0 {
			o.BandwidthBytesPerSecond = uint64(cfg.BandwidthPerMigration.Value())
		}
		if err := a.h.Migrate(ctx, r.uid, o); err != nil {
			r.fail(ctx, fmt.Sprintf("source node %s: %v", a.cfg.NodeName, err))
			return
		}
	}
	r.log.Info("migration running", "resumed", resumed, "target", spec.TargetAddr)
	r.patch(ctx, func(s *v1alpha1.VirtualMachineInstanceMigrationState) {
		if s.StartTimestamp == nil {
			now := metav1.Now()
			s.StartTimestamp = &now
		}
		if s.Mode == "" {
			s.Mode = v1alpha1.MigrationPreCopy
		}
	})
	r.follow(ctx, time.Duration(int64Of(cfg.ProgressTimeout, 150))*time.Second)
}

// follow polls the migration until it ends.
func (r *sourceRun) follow(ctx context.Context, progressTimeout time.Duration) {
	a := r.a
	poll := a.cfg.Migration.Poll
	if poll <= 0 {
		poll = time.Second
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	var best uint64
	lastProgress := time.Now()
	cancelled, postCopy := "", false
	mode := v1alpha1.MigrationPreCopy // what run wrote at the start
	for {
		select {
		case <-ctx.Done():
			return // the handler stops; the VM process goes on, and the next handler follows
		case <-t.C:
		}
		if cancelled == "" {
			if why := r.withdrawn(ctx); why != "" {
				cancelled = why
				r.cancel(ctx, why)
			}
		}
		info, err := a.h.MigrationStatus(ctx, r.uid)
		if err != nil {
			if status.Code(err) == codes.NotFound {
				r.fail(ctx, "source node "+a.cfg.NodeName+": the VM is gone")
				return
			}
			r.log.V(1).Info("migration status unknown", "error", err.Error())
			continue
		}
		switch info.GetPhase() {
		case hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED:
			r.log.Info("migration completed", "downtime", info.GetDowntime().AsDuration(), "total", info.GetTotalTime().AsDuration(),
				"bytes", info.GetTransferredBytes())
			// The hypervisor's own figures, where a user (and make bench-migrate) reads them.
			a.events.Eventf(r.vmi, nil, corev1.EventTypeNormal, v1alpha1.ReasonMigrated, "Migrate",
				"migration %s from node %s to node %s: total %s, downtime %s, memory %d bytes, disks %d bytes, mode %s (the hypervisor's figures)",
				r.state.MigrationUID, a.cfg.NodeName, r.state.TargetNode, info.GetTotalTime().AsDuration(), info.GetDowntime().AsDuration(),
				info.GetTransferredBytes(), info.GetDiskTransferredBytes(), modeWord(info.GetMode()))
			r.patch(ctx, func(s *v1alpha1.VirtualMachineInstanceMigrationState) {
				now := metav1.Now()
				s.Completed, s.EndTimestamp = true, &now
				if info.GetMode() != hypervisorv1.MigrationMode_MIGRATION_MODE_UNSPECIFIED {
					s.Mode = v1alpha1.MigrationMode(modeWord(info.GetMode()))
				}
			})
			return
		case hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED:
			reason := info.GetMessage()
			if cancelled != "" {
				reason = cancelled
			}
			if reason == "" {
				reason = "the hypervisor driver reports the migration " + info.GetPhase().String()
			}
			r.fail(ctx, reason)
			return
		}
		// The mode as the driver says it: a paused copy from the start, post-copy once switched.
		if m := v1alpha1.MigrationMode(modeWord(info.GetMode())); info.GetMode() != hypervisorv1.MigrationMode_MIGRATION_MODE_UNSPECIFIED && m != mode {
			mode = m
			r.patch(ctx, func(s *v1alpha1.VirtualMachineInstanceMigrationState) { s.Mode = m })
		}
		postCopy = info.GetMode() == hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY
		if rem := info.GetRemainingBytes(); best == 0 || rem < best {
			best, lastProgress = rem, time.Now()
		} else if cancelled == "" && !postCopy && time.Since(lastProgress) > progressTimeout {
			cancelled = fmt.Sprintf("no progress for %s (progressTimeout): %d bytes left to copy", progressTimeout, rem)
			r.cancel(ctx, cancelled)
		}
	}
}

// withdrawn says why the migration must stop, "" while it may go on: the VMI's migrationState
// is no longer this migration's (the object was deleted), or says failed or abortRequested (the
// controller failed it: its target pod failed).
func (r *sourceRun) withdrawn(ctx context.Context) string {
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := r.a.client.Get(ctx, r.key, vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return "the VMI is gone"
		}
		return ""
	}
	ms := vmi.Status.MigrationState
	switch {
	case ms == nil || ms.MigrationUID != r.state.MigrationUID:
		return "cancelled: the migration was withdrawn"
	case ms.AbortRequested:
		return "cancelled: abort requested"
	case ms.Failed:
		return ms.FailureReason
	}
	return ""
}

func (r *sourceRun) cancel(ctx context.Context, why string) {
	r.log.Info("cancelling the migration", "why", why)
	if err := r.a.h.CancelMigration(ctx, r.uid); err != nil {
		// In post-copy, or it ended meanwhile: the next status says how it ends.
		r.log.Info("cancel the migration", "error", err.Error())
	}
}

// migrating says whether info is a migration under way (after a handler restart).
func migrating(info *hypervisorv1.MigrationInfo) bool {
	if info.GetRole() != hypervisorv1.MigrationRole_MIGRATION_ROLE_SOURCE {
		return false
	}
	switch info.GetPhase() {
	case hypervisorv1.MigrationPhase_MIGRATION_PHASE_SETUP, hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE:
		return true
	}
	return false
}

// completionTimeout is perGiB seconds per GiB of the guest's memory (at least one GiB); 0 when
// perGiB is not set.
func completionTimeout(vmi *v1alpha1.VirtualMachineInstance, perGiB *int64) time.Duration {
	if perGiB == nil || *perGiB <= 0 {
		return 0
	}
	const gib = 1 << 30
	var mem int64
	d := &vmi.Spec.Domain
	switch {
	case d.Memory != nil && d.Memory.Guest != nil:
		mem = d.Memory.Guest.Value()
	case !d.Resources.Requests.Memory().IsZero():
		mem = d.Resources.Requests.Memory().Value()
	case !d.Resources.Limits.Memory().IsZero():
		mem = d.Resources.Limits.Memory().Value()
	}
	gibs := (mem + gib - 1) / gib
	if gibs < 1 {
		gibs = 1
	}
	return time.Duration(gibs**perGiB) * time.Second
}

// ownerOf is the owner of the VM's run directory: the VM process's user, to whom the proxy's
// socket is given.
func ownerOf(dir string) *migrationproxy.Owner {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	return &migrationproxy.Owner{UID: int(st.Uid), GID: int(st.Gid)}
}

func boolOf(b *bool) bool { return b != nil && *b }

func int64Of(v *int64, def int64) int64 {
	if v == nil || *v <= 0 {
		return def
	}
	return *v
}

// migratedAway says whether vmi's last migration took it from node to another node.
func migratedAway(vmi *v1alpha1.VirtualMachineInstance, node string) bool {
	ms := vmi.Status.MigrationState
	return ms != nil && ms.Completed && ms.SourceNode == node && ms.TargetNode != node
}

// migratedTo says whether vmi's last migration brought it to pod on node: the VMI's launcher
// pod from then on, before the VMI controller writes it as status.launcherPodName (it moves the
// VMI's node label first).
func migratedTo(vmi *v1alpha1.VirtualMachineInstance, node, pod string) bool {
	ms := vmi.Status.MigrationState
	return ms != nil && ms.Completed && ms.TargetNode == node && ms.TargetPod == pod
}

func modeWord(m hypervisorv1.MigrationMode) string {
	switch m {
	case hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY:
		return string(v1alpha1.MigrationPostCopy)
	case hypervisorv1.MigrationMode_MIGRATION_MODE_PAUSED:
		return string(v1alpha1.MigrationPaused)
	}
	return string(v1alpha1.MigrationPreCopy)
}
