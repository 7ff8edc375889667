package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	crhandler "sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/layout"
)

// DefaultHostStateDir is where launcher pods' per-VMI directories live on the node (package
// layout).
const DefaultHostStateDir = layout.DefaultHostStateDir

// AgentConfig configures the node agent.
type AgentConfig struct {
	// NodeName is the node the agent runs VMIs for.
	NodeName string
	// HostStateDir holds the launcher pods' per-VMI directories. Default: DefaultHostStateDir.
	HostStateDir string
	// Resync is how often the agent looks for VMIs the handler runs that the API no longer
	// has. Default: 30s.
	Resync time.Duration
	// DialTimeout bounds the wait for a VMI's launcher, and for each of its containerDisk
	// containers, to answer. Default: 10s.
	DialTimeout time.Duration
	// PodResourcesSocket is the kubelet's pod-resources API, asked which devices of a VMI's
	// gpus[] and hostDevices[] its launcher pod got. Default: DefaultPodResourcesSocket.
	PodResourcesSocket string
	// KubeletRoot is the kubelet's root directory (--root-dir), where the per-VMI directory of
	// a launcher pod is (an emptyDir: vmidir.go). Default: DefaultKubeletRoot.
	KubeletRoot string
	// Controller are the options of the agent's controller. MaxConcurrentReconciles 0 means
	// DefaultWorkers.
	Controller controller.Options
	// Log receives the agent's logs. Default: the manager's logger.
	Log logr.Logger
	// Migration is the agent's part in live migrations (migration.go).
	Migration MigrationConfig
}

func (c AgentConfig) withDefaults() (AgentConfig, error) {
	if c.NodeName == "" {
		return c, errors.New("node agent: no node name")
	}
	if c.HostStateDir == "" {
		c.HostStateDir = DefaultHostStateDir
	}
	if c.Resync <= 0 {
		c.Resync = 30 * time.Second
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.PodResourcesSocket == "" {
		c.PodResourcesSocket = DefaultPodResourcesSocket
	}
	if c.KubeletRoot == "" {
		c.KubeletRoot = DefaultKubeletRoot
	}
	if c.Controller.MaxConcurrentReconciles <= 0 {
		c.Controller.MaxConcurrentReconciles = DefaultWorkers
	}
	return c, nil
}

// DefaultWorkers is how many VMIs the agent syncs at once by default. The handler is safe for
// concurrent use and serialises the calls for one VMI; one worker made 20 VMIs created together
// wait for each other's storage, network and hypervisor steps.
const DefaultWorkers = 4

// CacheOptions restrict a manager's cache to what one node's agent needs: the VMIs labelled
// with the node, and the launcher pods bound to it.
func CacheOptions(node string) cache.Options {
	launcherPods, _ := labels.Parse(v1alpha1.CreatedByLabel)
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&v1alpha1.VirtualMachineInstance{}: {Label: labels.SelectorFromSet(labels.Set{v1alpha1.NodeNameLabel: node})},
		&corev1.Pod{}: {
			Label: launcherPods,
			Field: fields.OneTermEqualSelector("spec.nodeName", node),
		},
	}}
}

// Agent runs the VMIs scheduled to its node through a handler.Handler: when a VMI's launcher
// pod runs, it syncs the VMI into the launcher's sandbox (podSandbox); when the VMI or its pod
// is deleted, it stops the VM and undoes what the drivers set up; when the pod ends under a
// running VM, it ends the VMI's sandbox, which fails the VMI (LauncherExited); it writes what
// the handler derives into the VMI's status. For a running VMI it also writes the serial
// console log and serves the guest probe socket of its exec and guestAgentPing probes.
type Agent struct {
	cfg    AgentConfig
	client client.Client
	// reader reads from the API server what the agent does not cache (a pod's events).
	reader client.Reader
	events recorder.EventRecorder
	disks  containerDisks
	claims podClaims
	h      *handler.Handler
	// consoles writes each running VMI's serial console into its host directory.
	consoles *consoleLogs
	// probes serves the guest probe socket of each running VMI with an exec or guestAgentPing
	// probe.
	probes *guestProbes
	log    logr.Logger
	// changed carries VMIs whose status the handler changed to the reconciler.
	changed chan event.GenericEvent

	mu        sync.Mutex
	names     map[types.UID]types.NamespacedName
	sandboxes map[types.UID]*podSandbox

	// migrations are the node's live migrations (migration.go); targets the target pods the
	// agent prepared a VM in, by pod.
	migrations *migrations
	targetsMu  sync.Mutex
	targets    map[types.NamespacedName]targetOf
}

// NewAgent makes the agent of cfg.NodeName on mgr, with its node handler: it starts the handler
// (handler.New with hcfg, and with hopts given the agent's sandboxes, containerDisk resolver
// and, unless hopts has one, the Resolver that finds Secrets and claims in the launcher pod
// (podResolver); an OnStatus of hopts is still called) and registers the agent's controller and background
// work with mgr. ctx bounds the drivers' first start. The handler outlives mgr: once mgr has
// stopped, end it with Handler().Detach, which leaves the VMs running for the next handler, or
// Close.
func NewAgent(ctx context.Context, mgr ctrl.Manager, cfg AgentConfig, hcfg handler.Config, hopts handler.Options) (*Agent, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = mgr.GetLogger().WithName("agent")
	}
	if hcfg.NodeName == "" {
		hcfg.NodeName = cfg.NodeName
	}
	warnOnce := new(sync.Once) // one warning about the host state directory's propagation
	a := &Agent{
		cfg: cfg, client: mgr.GetClient(), reader: mgr.GetAPIReader(), log: cfg.Log, events: mgr.GetEventRecorder(EventSource),
		disks:      containerDisks{root: cfg.HostStateDir, timeout: cfg.DialTimeout, log: cfg.Log, warnOnce: warnOnce},
		claims:     podClaims{root: cfg.HostStateDir, log: cfg.Log, warnOnce: warnOnce},
		changed:    make(chan event.GenericEvent, 1024),
		names:      map[types.UID]types.NamespacedName{},
		sandboxes:  map[types.UID]*podSandbox{},
		migrations: newMigrations(),
		targets:    map[types.NamespacedName]targetOf{},
	}
	next := hopts.OnStatus
	hopts.Sandboxes = handler.SandboxesFunc(func(vmi *v1alpha1.VirtualMachineInstance) handler.Sandbox { return a.sandbox(vmi) })
	hopts.ContainerDisks = diskResolver{disks: a.disks}
	if hopts.Resolver == nil {
		hopts.Resolver = podResolver{MapResolver: handler.MapResolver{Images: hcfg.Images, Claims: hcfg.Claims}, a: a}
	}
	hopts.OnStatus = func(uid types.UID, st v1alpha1.VirtualMachineInstanceStatus) {
		if next != nil {
			next(uid, st)
		}
		a.statusChanged(uid)
	}
	if a.h, err = handler.New(ctx, hcfg, hopts); err != nil {
		return nil, err
	}
	if err := a.setup(mgr); err != nil {
		return nil, errors.Join(err, a.h.Detach())
	}
	return a, nil
}

// Handler is the agent's node handler.
func (a *Agent) Handler() *handler.Handler { return a.h }

// statusChanged brings a VMI whose status the handler changed to the reconciler.
func (a *Agent) statusChanged(uid types.UID) {
	a.mu.Lock()
	name, ok := a.names[uid]
	a.mu.Unlock()
	if !ok {
		return
	}
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name}}
	select {
	case a.changed <- event.GenericEvent{Object: vmi}:
	default:
		// The queue is full: the reconciler has plenty to do, and reads the latest status
		// when it gets to this VMI; the next change or the resync brings it.
	}
}

// setup registers the agent's controller and background work with mgr.
func (a *Agent) setup(mgr ctrl.Manager) error {
	a.consoles = newConsoleLogs(a.h, a.cfg.HostStateDir, a.log.WithName("console"))
	a.probes = newGuestProbes(a.h, a.cfg.HostStateDir, a.log.WithName("guest-probe"))
	// Both are the VMI's files in its directory, which the pod reads at its SELinux level and,
	// when it is unprivileged, as its user.
	mark := func(uid types.UID, p string, recurse bool) error {
		if err := a.h.LabelFiles(uid, p, recurse); err != nil {
			return err
		}
		return a.h.OwnFiles(uid, p, recurse)
	}
	a.consoles.label, a.probes.label = mark, mark
	if err := mgr.Add(runnable(func(ctx context.Context) error {
		<-ctx.Done()
		a.consoles.close()
		a.probes.close()
		a.migrations.close()
		return nil
	})); err != nil {
		return err
	}
	if err := a.setupMigrationTargets(mgr); err != nil {
		return err
	}
	podToVMI := crhandler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		name := o.GetLabels()[v1alpha1.VirtualMachineInstanceNameLabel]
		if name == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
	})
	if err := mgr.Add(runnable(a.collect)); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("node-agent").
		WithOptions(a.cfg.Controller).
		For(&v1alpha1.VirtualMachineInstance{}).
		Watches(&corev1.Pod{}, podToVMI).
		WatchesRawSource(source.Channel(a.changed, &crhandler.EnqueueRequestForObject{})).
		Complete(a)
}

// runnable adapts a function to a manager.Runnable.
type runnable func(ctx context.Context) error

func (m runnable) Start(ctx context.Context) error { return m(ctx) }

// The node agent's permissions (the handler DaemonSet's ClusterRole): its node's VMIs and their
// status (server-side apply is a patch), the launcher pods it reads, and its Node's labels.
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances,verbs=get;list;watch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=list
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings the node to what a VMI and its launcher pod ask for.
func (a *Agent) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var vmi v1alpha1.VirtualMachineInstance
	if err := a.client.Get(ctx, req.NamespacedName, &vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, a.forget(ctx, req.NamespacedName)
		}
		return reconcile.Result{}, err
	}
	if vmi.Labels[v1alpha1.NodeNameLabel] != a.cfg.NodeName {
		return reconcile.Result{}, nil
	}
	a.mu.Lock()
	a.names[vmi.UID] = req.NamespacedName
	a.mu.Unlock()
	if a.h.MigratedAway(vmi.UID) || migratedAway(&vmi, a.cfg.NodeName) {
		// The VMI runs on the target now; its status is the target node's to write. The VM is
		// let go here when the VMI controller moves the VMI (its label) or deletes this pod.
		return reconcile.Result{}, nil
	}

	pod, err := a.launcherPod(ctx, &vmi)
	if err != nil {
		return reconcile.Result{}, err
	}
	_, known := a.h.Status(vmi.UID)
	podEnded := pod == nil || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded ||
		launcherExited(pod)
	stopping := vmi.DeletionTimestamp != nil || (pod != nil && pod.DeletionTimestamp != nil) ||
		vmi.Status.Phase.IsFinal()
	switch {
	case stopping || (podEnded && known):
		if !known {
			return reconcile.Result{}, a.releaseMounts(vmi.UID)
		}
		if podEnded && !stopping {
			why := "the launcher pod is gone"
			if pod != nil {
				why = fmt.Sprintf("launcher pod %s ended (%s)", pod.Name, pod.Status.Phase)
				if launcherExited(pod) {
					why = fmt.Sprintf("the launcher container of pod %s exited", pod.Name)
				}
			}
			a.sandbox(&vmi).end(why)
		}
		a.consoles.stop(vmi.UID)
		a.probes.stop(vmi.UID)
		// Stop closes the VMI's sandbox last, which releases its containerDisk and claim mounts.
		st, err := a.h.Stop(ctx, &vmi, grace(&vmi))
		if werr := a.writeStatus(ctx, req.NamespacedName, a.probed(ctx, &vmi, pod, st)); werr != nil {
			err = errors.Join(err, werr)
		}
		return reconcile.Result{}, err
	case podEnded:
		// Ended before the handler ran anything (or after it undid a failed sync).
		return reconcile.Result{}, a.releaseMounts(vmi.UID)
	case pod.Status.Phase != corev1.PodRunning:
		// Not started yet: the pod's next change brings the VMI back.
		return reconcile.Result{}, nil
	}
	if d := pod.Labels[v1alpha1.HypervisorDriverLabel]; d != "" {
		// The driver of the class the pod was built for, set with the pod: the VMI's
		// status.hypervisorDriver, written by the same pass of the VMI controller, may trail it.
		vmi.Status.HypervisorDriver = d
	}
	st, err := a.h.Sync(ctx, &vmi)
	st = a.probed(ctx, &vmi, pod, st)
	if werr := a.writeStatus(ctx, req.NamespacedName, st); werr != nil {
		return reconcile.Result{}, errors.Join(err, werr)
	}
	if err != nil {
		// The handler undid what it made and said why in the status. The work queue tries
		// again with its backoff (the sandbox may not be ready yet) and counts the error.
		return reconcile.Result{}, err
	}
	if st.Phase == v1alpha1.Running {
		a.ensureOutgoing(&vmi)
		if vmi.Spec.SerialConsoleLogged() {
			// For the launcher pod's guest-console-log container.
			a.consoles.ensure(context.Background(), vmi.UID)
		}
		if tl, ok := a.h.TakeTimeline(vmi.UID); ok {
			// One event per started VM: where the handler's part of its start went.
			a.events.Eventf(&vmi, pod, corev1.EventTypeNormal, v1alpha1.ReasonStarted, actionStart, "%s", tl.Note())
		}
		if vmi.Spec.LivenessProbe.UsesGuestAgent() || vmi.Spec.ReadinessProbe.UsesGuestAgent() {
			// For the compute container's kubevisor-probe. Until it is served the probes fail,
			// as they do while the guest agent does not answer.
			if err := a.probes.ensure(vmi.UID, checksOf(vmi.Spec.LivenessProbe, vmi.Spec.ReadinessProbe)); err != nil {
				// The work queue tries again with its backoff.
				return reconcile.Result{}, err
			}
		}
	}
	return reconcile.Result{}, nil
}

// EventSource is the reporting controller of the agent's events.
const EventSource = "kubevisor-handler"

// actionStart is the action of the Started event (events.k8s.io/v1 wants one with every event).
const actionStart = "Start"

// launcherExited says whether the pod's launcher container terminated. The pod of a VMI with
// containerDisk volumes stays Running after that: their containers run until the pod is deleted.
func launcherExited(pod *corev1.Pod) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == layout.ComputeContainer && cs.State.Terminated != nil {
			return true
		}
	}
	return false
}

// grace is the VMI's terminationGracePeriodSeconds, or the default.
func grace(vmi *v1alpha1.VirtualMachineInstance) time.Duration {
	return vmi.Spec.GracePeriod()
}

// nodePods returns the VMI's launcher pods on this node.
func (a *Agent) nodePods(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := a.client.List(ctx, &pods, client.InNamespace(vmi.Namespace),
		client.MatchingLabels{v1alpha1.CreatedByLabel: string(vmi.UID)}); err != nil {
		return nil, fmt.Errorf("list launcher pods: %w", err)
	}
	here := pods.Items[:0]
	for _, p := range pods.Items {
		if p.Spec.NodeName == a.cfg.NodeName {
			here = append(here, p)
		}
	}
	return here, nil
}

// launcherPod returns the VMI's launcher pod on this node, nil when there is none.
func (a *Agent) launcherPod(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (*corev1.Pod, error) {
	pods, err := a.nodePods(ctx, vmi)
	if err != nil {
		return nil, err
	}
	var found *corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.Name == vmi.Status.LauncherPodName || migratedTo(vmi, a.cfg.NodeName, p.Name) {
			return p, nil
		}
		if p.Labels[v1alpha1.MigrationUIDLabel] != "" {
			continue // a migration target, not (yet) the VMI's launcher pod
		}
		if found == nil || p.CreationTimestamp.After(found.CreationTimestamp.Time) {
			found = p
		}
	}
	return found, nil
}

// writeStatus writes, by server-side apply under the node's field manager, the fields of the
// handler's status node that the handler owns (handlerStatus), when they differ from the VMI's
// stored ones; it reads the VMI again and starts over when the VMI changed under it.
func (a *Agent) writeStatus(ctx context.Context, name types.NamespacedName, node v1alpha1.VirtualMachineInstanceStatus) error {
	manager := v1alpha1.HandlerFieldManager(a.cfg.NodeName)
	return retry.OnError(retry.DefaultRetry, apierrors.IsConflict, func() error {
		var vmi v1alpha1.VirtualMachineInstance
		if err := a.client.Get(ctx, name, &vmi); err != nil {
			return client.IgnoreNotFound(err)
		}
		if a.h != nil && a.h.MigratedAway(vmi.UID) {
			// Its VM stopped here because it runs on the migration's target: the status the
			// handler derived of that (Succeeded) is not the VMI's.
			return nil
		}
		w := handlerStatus(&vmi, node, manager)
		body, changes, err := w.apply(&vmi)
		if err != nil || !changes {
			return err
		}
		opts := []client.SubResourceApplyOption{client.FieldOwner(manager)}
		if w.TakeOver {
			opts = append(opts, client.ForceOwnership)
		}
		return client.IgnoreNotFound(a.client.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(body), opts...))
	})
}

// forget stops a VMI that left the API while the handler ran it.
func (a *Agent) forget(ctx context.Context, name types.NamespacedName) error {
	a.mu.Lock()
	var uids []types.UID
	for uid, n := range a.names {
		if n == name {
			uids = append(uids, uid)
		}
	}
	a.mu.Unlock()
	var errs []error
	for _, uid := range uids {
		errs = append(errs, a.stopUnknown(ctx, uid, name))
	}
	return errors.Join(errs...)
}

func (a *Agent) stopUnknown(ctx context.Context, uid types.UID, name types.NamespacedName) error {
	if _, waiting := a.h.IncomingOf(uid); waiting {
		// A migration target: not this node's VMI yet. The target controller stops it when
		// its migration ends without it.
		return nil
	}
	away := a.h.MigratedAway(uid)
	a.consoles.stop(uid)
	a.probes.stop(uid)
	if _, known := a.h.Status(uid); known {
		stub := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name, UID: uid}}
		if _, err := a.h.Stop(ctx, stub, 0); err != nil {
			return err
		}
		if away {
			a.log.Info("let go of a VM that migrated away", "vmi", name, "uid", uid)
		} else {
			a.log.Info("stopped a VM whose VMI is gone", "vmi", name, "uid", uid)
		}
	}
	if err := a.releaseMounts(uid); err != nil {
		return err
	}
	// The VMI is gone, so are its launcher pods (the VMI controller holds the VMI until
	// then): nothing mounts its directory any more.
	if err := os.RemoveAll(layout.VMIDir(a.cfg.HostStateDir, uid)); err != nil {
		return fmt.Errorf("remove the VMI directory: %w", err)
	}
	a.mu.Lock()
	delete(a.names, uid)
	a.mu.Unlock()
	return nil
}

// releaseMounts unmounts what the agent mounted in a VMI's directory (its containerDisk disks,
// its claims and persistent state) and removes the mount points: before the directory is
// removed, which must never reach into a claim's data. The VM must be gone.
func (a *Agent) releaseMounts(uid types.UID) error {
	if err := errors.Join(a.disks.Release(uid), a.claims.Release(uid)); err != nil {
		return err
	}
	return a.unbindVMIDir(uid)
}

// orphanDirAge is how old a VMI directory without VMI, launcher pod or handler state must be
// before the sweep removes it: the kubelet makes the directory when it starts the pod, which
// may be before this agent's cache has the VMI.
const orphanDirAge = 2 * time.Minute

// sweepDirs removes the VMI directories on the node that belong to nothing: no VMI of this
// node in live, no launcher pod, nothing the handler runs (left by VMIs deleted while the
// agent was down).
func (a *Agent) sweepDirs(ctx context.Context, live map[types.UID]bool) {
	root := layout.VMIsDir(a.cfg.HostStateDir)
	entries, err := os.ReadDir(root)
	if err != nil {
		return // none yet
	}
	known := map[types.UID]bool{}
	for _, uid := range a.h.VMIs() {
		known[uid] = true
	}
	for _, e := range entries {
		uid := types.UID(e.Name())
		info, err := e.Info()
		if err != nil || !e.IsDir() || live[uid] || known[uid] || time.Since(info.ModTime()) < orphanDirAge {
			continue
		}
		var pods corev1.PodList
		if err := a.client.List(ctx, &pods, client.MatchingLabels{v1alpha1.CreatedByLabel: string(uid)}); err != nil || len(pods.Items) > 0 {
			continue
		}
		if err := a.releaseMounts(uid); err != nil {
			a.log.Error(err, "release the containerDisks and claims of a VMI directory left behind", "uid", uid)
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			a.log.Error(err, "remove a VMI directory left behind", "uid", uid)
			continue
		}
		a.log.Info("removed a VMI directory left behind", "uid", uid)
	}
}

// collect periodically stops what the handler runs for VMIs the API no longer has on this
// node (deleted while the agent was down, say).
func (a *Agent) collect(ctx context.Context) error {
	t := time.NewTicker(a.cfg.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		var vmis v1alpha1.VirtualMachineInstanceList
		if err := a.client.List(ctx, &vmis, client.MatchingLabels{v1alpha1.NodeNameLabel: a.cfg.NodeName}); err != nil {
			a.log.Error(err, "list VMIs")
			continue
		}
		live := map[types.UID]bool{}
		for _, v := range vmis.Items {
			live[v.UID] = true
		}
		for _, uid := range a.h.VMIs() {
			if live[uid] {
				continue
			}
			a.mu.Lock()
			name := a.names[uid]
			a.mu.Unlock()
			if err := a.stopUnknown(ctx, uid, name); err != nil {
				a.log.Error(err, "stop a VM whose VMI is gone", "uid", uid)
			}
		}
		a.sweepDirs(ctx, live)
	}
}
