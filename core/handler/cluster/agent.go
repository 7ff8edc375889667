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
	"k8s.io/apimachinery/pkg/api/equality"
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
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/launcher"
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
	return c, nil
}

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
// pod runs, it syncs the VMI into the launcher's sandbox; when the VMI or its pod is deleted, it
// stops the VM and undoes what the drivers set up; it writes what the handler derives into
// the VMI's status.
//
// Make it with NewAgent, pass HandlerOptions to handler.New, then Setup with the handler.
type Agent struct {
	cfg    AgentConfig
	client client.Client
	disks  containerDisks
	h      *handler.Handler
	// consoles writes each running VMI's serial console into its host directory.
	consoles *consoleLogs
	log      logr.Logger
	// changed carries VMIs whose status the handler changed to the reconciler.
	changed chan event.GenericEvent

	mu    sync.Mutex
	names map[types.UID]types.NamespacedName
}

// NewAgent makes the agent of cfg.NodeName.
func NewAgent(c client.Client, cfg AgentConfig, log logr.Logger) (*Agent, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Agent{
		cfg: cfg, client: c, log: log,
		disks:   containerDisks{root: cfg.HostStateDir, timeout: cfg.DialTimeout, log: log, warnOnce: new(sync.Once)},
		changed: make(chan event.GenericEvent, 1024),
		names:   map[types.UID]types.NamespacedName{},
	}, nil
}

// HandlerOptions returns opts with the agent's sandbox lookup, containerDisk resolver
// (containerDisks) and status callback; a status callback already in opts is still called.
func (a *Agent) HandlerOptions(opts handler.Options) handler.Options {
	next := opts.OnStatus
	opts.Sandbox = a.sandbox
	opts.ContainerDisks = diskResolver{disks: a.disks}
	opts.OnStatus = func(uid types.UID, st v1alpha1.VirtualMachineInstanceStatus) {
		if next != nil {
			next(uid, st)
		}
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
	return opts
}

// sandbox finds a VMI's launcher: its socket in the per-VMI directory, and its network
// namespace through the pid of the process serving that socket. It mounts the VMI's
// containerDisk disks into the per-VMI directory, and has the handler keep the VMI's files
// there (Sandbox.Dir), where the launcher container sees them at the same path.
func (a *Agent) sandbox(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (handler.Sandbox, error) {
	socket := filepath.Join(layout.LauncherDir(a.cfg.HostStateDir, vmi.UID), launcher.SocketName)
	dctx, cancel := context.WithTimeout(ctx, a.cfg.DialTimeout)
	defer cancel()
	c, err := launcher.Dial(dctx, socket)
	if err != nil {
		return handler.Sandbox{}, err
	}
	defer c.Close()
	pid := c.LauncherPid()
	if pid <= 0 {
		return handler.Sandbox{}, fmt.Errorf("launcher at %s: its pid is not visible from the handler (the handler needs the host's pid namespace)", socket)
	}
	if err := a.disks.MountAll(ctx, vmi); err != nil {
		return handler.Sandbox{}, err
	}
	return handler.Sandbox{
		LauncherSocket: socket, NetNSPath: fmt.Sprintf("/proc/%d/ns/net", pid),
		Dir: layout.VMIDir(a.cfg.HostStateDir, vmi.UID),
	}, nil
}

// Setup registers the agent's controller with mgr; h must have been made with HandlerOptions.
func (a *Agent) Setup(mgr ctrl.Manager, h *handler.Handler, opts controller.Options) error {
	a.h = h
	a.consoles = newConsoleLogs(h, a.cfg.HostStateDir, a.log.WithName("console"))
	if err := mgr.Add(runnable(func(ctx context.Context) error {
		<-ctx.Done()
		a.consoles.close()
		return nil
	})); err != nil {
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
		WithOptions(opts).
		For(&v1alpha1.VirtualMachineInstance{}).
		Watches(&corev1.Pod{}, podToVMI).
		WatchesRawSource(source.Channel(a.changed, &crhandler.EnqueueRequestForObject{})).
		Complete(a)
}

// runnable adapts a function to a manager.Runnable.
type runnable func(ctx context.Context) error

func (m runnable) Start(ctx context.Context) error { return m(ctx) }

// The node agent's permissions (the handler DaemonSet's ClusterRole): its node's VMIs and their
// status, the launcher pods it reads, and its Node's labels.
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances,verbs=get;list;watch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch

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

	pod, err := a.launcherPod(ctx, &vmi)
	if err != nil {
		return reconcile.Result{}, err
	}
	_, known := a.h.Status(vmi.UID)
	podEnded := pod == nil || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded ||
		launcherExited(pod)
	stopping := vmi.DeletionTimestamp != nil || (pod != nil && pod.DeletionTimestamp != nil) ||
		phaseRank(vmi.Status.Phase) == 5
	switch {
	case stopping || (podEnded && known):
		if !known {
			return reconcile.Result{}, a.disks.Release(vmi.UID)
		}
		if podEnded && !stopping {
			why := "the launcher pod is gone"
			if pod != nil {
				why = fmt.Sprintf("launcher pod %s ended (%s)", pod.Name, pod.Status.Phase)
				if launcherExited(pod) {
					why = fmt.Sprintf("the launcher container of pod %s exited", pod.Name)
				}
			}
			a.h.SandboxExited(vmi.UID, why)
		}
		a.consoles.stop(vmi.UID)
		st, err := a.h.Stop(ctx, &vmi, grace(&vmi))
		if err == nil {
			// The VM is gone and the storage driver released its overlays.
			err = a.disks.Release(vmi.UID)
		}
		if werr := a.writeStatus(ctx, req.NamespacedName, st); werr != nil {
			err = errors.Join(err, werr)
		}
		return reconcile.Result{}, err
	case podEnded:
		// Ended before the handler ran anything (or after it undid a failed sync).
		return reconcile.Result{}, a.disks.Release(vmi.UID)
	case pod.Status.Phase != corev1.PodRunning:
		// Not started yet: the pod's next change brings the VMI back.
		return reconcile.Result{}, nil
	}
	st, err := a.h.Sync(ctx, &vmi)
	if werr := a.writeStatus(ctx, req.NamespacedName, st); werr != nil {
		return reconcile.Result{}, werr
	}
	if err != nil {
		// The handler undid what it made and said why in the status; try again later, as
		// the sandbox may not be ready yet.
		a.log.Info("sync failed", "vmi", req.NamespacedName, "error", err.Error())
		return reconcile.Result{RequeueAfter: 5 * time.Second}, nil
	}
	if st.Phase == v1alpha1.Running {
		// For the launcher pod's guest-console-log container.
		a.consoles.ensure(context.Background(), vmi.UID)
	}
	return reconcile.Result{}, nil
}

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

// launcherPod returns the VMI's launcher pod on this node, nil when there is none.
func (a *Agent) launcherPod(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (*corev1.Pod, error) {
	var pods corev1.PodList
	if err := a.client.List(ctx, &pods, client.InNamespace(vmi.Namespace),
		client.MatchingLabels{v1alpha1.CreatedByLabel: string(vmi.UID)}); err != nil {
		return nil, fmt.Errorf("list launcher pods: %w", err)
	}
	var found *corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != a.cfg.NodeName || p.Labels[v1alpha1.MigrationUIDLabel] != "" {
			continue // another node's, or a migration target
		}
		if found == nil || p.CreationTimestamp.After(found.CreationTimestamp.Time) {
			found = p
		}
	}
	return found, nil
}

// writeStatus lays the handler's status over the VMI's stored one (MergeStatus) and writes it
// when it differs, retrying on conflicts with the control plane's writes.
func (a *Agent) writeStatus(ctx context.Context, name types.NamespacedName, node v1alpha1.VirtualMachineInstanceStatus) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var vmi v1alpha1.VirtualMachineInstance
		if err := a.client.Get(ctx, name, &vmi); err != nil {
			return client.IgnoreNotFound(err)
		}
		merged := MergeStatus(vmi.Status, node)
		if equality.Semantic.DeepEqual(merged, vmi.Status) {
			return nil
		}
		vmi.Status = merged
		if err := a.client.Status().Update(ctx, &vmi); err != nil {
			return client.IgnoreNotFound(err)
		}
		return nil
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
	a.consoles.stop(uid)
	if _, known := a.h.Status(uid); known {
		stub := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name, UID: uid}}
		if _, err := a.h.Stop(ctx, stub, 0); err != nil {
			return err
		}
		a.log.Info("stopped a VM whose VMI is gone", "vmi", name, "uid", uid)
	}
	if err := a.disks.Release(uid); err != nil {
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
		if err := a.disks.Release(uid); err != nil {
			a.log.Error(err, "release the containerDisks of a VMI directory left behind", "uid", uid)
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
