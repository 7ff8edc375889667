package evacuation

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/kubevisor/kubevisor/controlplane/migration"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// ControllerName is the name of the controller (metrics, logs, events).
const ControllerName = "evacuation"

// Reasons of the evacuation controller's events.
const (
	// ReasonEvacuationMigrationCreated says a migration was created to move a VMI off the node
	// its launcher pod was evicted from.
	ReasonEvacuationMigrationCreated = "EvacuationMigrationCreated"
	// ReasonEvacuationFailed says the controller could not create that migration.
	ReasonEvacuationFailed = "EvacuationFailed"
	// ReasonEvacuated says the VMI left the node it was marked to leave.
	ReasonEvacuated = "Evacuated"
	// ReasonDisruptionBudgetCreated and ReasonDisruptionBudgetDeleted say the VMI's
	// PodDisruptionBudget was created or removed.
	ReasonDisruptionBudgetCreated = "DisruptionBudgetCreated"
	ReasonDisruptionBudgetDeleted = "DisruptionBudgetDeleted"
)

// indexVMIName indexes migrations by spec.vmiName.
const indexVMIName = "evacuation.spec.vmiName"

// Options configure the evacuation controller; the zero value is usable.
type Options struct {
	// DefaultStrategy is the cluster's default eviction strategy ("" is None).
	DefaultStrategy v1alpha1.EvictionStrategy
	// Migration holds the limits on parallel migrations, read at each reconcile (they may
	// change while the controller runs); nil means migration.DefaultSettings().
	Migration *migration.SettingsValue
	// RetryBackoff and MaxRetryBackoff: the delay after a failed evacuation migration; zero
	// means the defaults.
	RetryBackoff, MaxRetryBackoff time.Duration
	// MaxConcurrentReconciles is the number of VMIs reconciled at once; 0 means 1.
	MaxConcurrentReconciles int
	// SkipNameValidation lets several managers in one process register the controller (tests).
	SkipNameValidation bool
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

type reconciler struct {
	client   client.Client
	recorder recorder.EventRecorder
	opts     Options
	settings *migration.SettingsValue
}

// SetupWithManager registers the evacuation controller with mgr: it watches VMIs, their
// migrations and the PodDisruptionBudgets it made.
func SetupWithManager(mgr ctrl.Manager, opts Options) error {
	if _, err := ParseStrategy(string(opts.DefaultStrategy)); err != nil {
		return err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.VirtualMachineInstanceMigration{}, indexVMIName,
		func(o client.Object) []string {
			return []string{o.(*v1alpha1.VirtualMachineInstanceMigration).Spec.VMIName}
		}); err != nil {
		return fmt.Errorf("index migrations by VMI name: %w", err)
	}
	r := &reconciler{client: mgr.GetClient(), recorder: mgr.GetEventRecorder(ControllerName), opts: opts, settings: opts.Migration}
	copts := controller.Options{MaxConcurrentReconciles: max(opts.MaxConcurrentReconciles, 1)}
	if opts.SkipNameValidation {
		copts.SkipNameValidation = &opts.SkipNameValidation
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&v1alpha1.VirtualMachineInstance{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Watches(&v1alpha1.VirtualMachineInstanceMigration{}, handler.EnqueueRequestsFromMapFunc(
			func(_ context.Context, o client.Object) []reconcile.Request {
				m := o.(*v1alpha1.VirtualMachineInstanceMigration)
				return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.VMIName}}}
			})).
		WithOptions(copts).
		Complete(r)
}

// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances,verbs=get;list;watch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances/status,verbs=patch
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstancemigrations,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile observes one VMI, decides (Decide) and acts.
func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := r.client.Get(ctx, req.NamespacedName, vmi); err != nil {
		// A deleted VMI's budget goes with it (owner reference).
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	obs, pdb, err := r.observe(ctx, vmi)
	if err != nil {
		return ctrl.Result{}, err
	}
	d := Decide(obs)
	if err := r.act(ctx, vmi, pdb, d); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: d.Wait}, nil
}

func (r *reconciler) observe(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (Observation, *policyv1.PodDisruptionBudget, error) {
	settings := r.settings.Load()
	obs := Observation{
		VMI: vmi, DefaultStrategy: r.opts.DefaultStrategy, Now: r.opts.Now(),
		PerCluster: settings.ParallelMigrationsPerCluster, PerNode: settings.ParallelOutboundMigrationsPerNode,
		RetryBackoff: r.opts.RetryBackoff, MaxRetryBackoff: r.opts.MaxRetryBackoff,
	}
	pdb := &policyv1.PodDisruptionBudget{}
	switch err := r.client.Get(ctx, client.ObjectKey{Namespace: vmi.Namespace, Name: PDBName(vmi)}, pdb); {
	case apierrors.IsNotFound(err):
		pdb = nil
	case err != nil:
		return obs, nil, fmt.Errorf("get PodDisruptionBudget: %w", err)
	case !metav1.IsControlledBy(pdb, vmi):
		// Someone else's budget of that name (or an earlier VMI's of the same name, which the
		// garbage collector removes): not ours to keep or delete.
		pdb = nil
	}
	obs.PDBExists = pdb != nil
	if pdb != nil && pdb.Spec.MinAvailable != nil {
		obs.PDBMinAvailable = pdb.Spec.MinAvailable.IntValue()
	}
	var mine v1alpha1.VirtualMachineInstanceMigrationList
	if err := r.client.List(ctx, &mine, client.InNamespace(vmi.Namespace), client.MatchingFields{indexVMIName: vmi.Name}); err != nil {
		return obs, pdb, fmt.Errorf("list migrations of the VMI: %w", err)
	}
	obs.Migrations = mine.Items
	if vmi.Status.EvacuationNodeName == "" {
		return obs, pdb, nil
	}
	var all v1alpha1.VirtualMachineInstanceMigrationList
	if err := r.client.List(ctx, &all); err != nil {
		return obs, pdb, fmt.Errorf("list migrations: %w", err)
	}
	for i := range all.Items {
		m := &all.Items[i]
		if !Unfinished(m) {
			continue
		}
		obs.Unfinished++
		if r.sourceNode(ctx, m) == vmi.Status.EvacuationNodeName {
			obs.UnfinishedFromNode++
		}
	}
	return obs, pdb, nil
}

// sourceNode is the node migration m moves its VMI off: as its state says once handed to the
// nodes, else where the VMI runs.
func (r *reconciler) sourceNode(ctx context.Context, m *v1alpha1.VirtualMachineInstanceMigration) string {
	if s := m.Status.MigrationState; s != nil && s.SourceNode != "" {
		return s.SourceNode
	}
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.VMIName}, vmi); err != nil {
		return ""
	}
	return vmi.Status.NodeName
}

func (r *reconciler) act(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, pdb *policyv1.PodDisruptionBudget, d Decision) error {
	log := ctrl.LoggerFrom(ctx)
	if d.EnsurePDB {
		budget := NewPDB(vmi, d.PDBMinAvailable)
		switch err := r.client.Create(ctx, budget); {
		case apierrors.IsAlreadyExists(err):
		case err != nil:
			return fmt.Errorf("create PodDisruptionBudget: %w", err)
		default:
			r.recorder.Eventf(vmi, budget, corev1.EventTypeNormal, ReasonDisruptionBudgetCreated, "CreatePodDisruptionBudget",
				"created PodDisruptionBudget %s (evictionStrategy %s)", budget.Name, Strategy(vmi, r.opts.DefaultStrategy))
		}
	}
	if d.UpdatePDB && pdb != nil {
		base := pdb.DeepCopy()
		minAvailable := intstr.FromInt(d.PDBMinAvailable)
		pdb.Spec.MinAvailable = &minAvailable
		if err := r.client.Patch(ctx, pdb, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("set minAvailable %d on PodDisruptionBudget %s: %w", d.PDBMinAvailable, pdb.Name, err)
		}
		log.V(1).Info("PodDisruptionBudget updated", "vmi", client.ObjectKeyFromObject(vmi), "minAvailable", d.PDBMinAvailable)
	}
	if d.DeletePDB && pdb != nil {
		uid := pdb.UID
		if err := r.client.Delete(ctx, pdb, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete PodDisruptionBudget: %w", err)
		}
		r.recorder.Eventf(vmi, pdb, corev1.EventTypeNormal, ReasonDisruptionBudgetDeleted, "DeletePodDisruptionBudget",
			"deleted PodDisruptionBudget %s", pdb.Name)
	}
	node := vmi.Status.EvacuationNodeName
	if d.ClearMark {
		if err := ClearMark(ctx, r.client, vmi); err != nil {
			return err
		}
		r.recorder.Eventf(vmi, nil, corev1.EventTypeNormal, ReasonEvacuated, "Unmark", "VMI no longer runs on node %s (now %q, %s)",
			node, vmi.Status.NodeName, phaseWord(vmi.Status.Phase))
	}
	if d.Wait > 0 && d.WaitReason != "" {
		log.V(1).Info("evacuation waits", "vmi", client.ObjectKeyFromObject(vmi), "reason", d.WaitReason)
	}
	if d.CreateMigration {
		m := NewMigration(vmi, node)
		if err := r.client.Create(ctx, m); err != nil {
			r.recorder.Eventf(vmi, nil, corev1.EventTypeWarning, ReasonEvacuationFailed, "CreateMigration", "create migration off node %s: %v", node, err)
			return fmt.Errorf("create evacuation migration: %w", err)
		}
		r.recorder.Eventf(vmi, m, corev1.EventTypeNormal, ReasonEvacuationMigrationCreated, "CreateMigration",
			"created migration %s to move the VMI off node %s (eviction of its launcher pod)", m.Name, node)
	}
	return nil
}

// Mark writes node into vmi's status.evacuationNodeName, by server-side apply under
// v1alpha1.EvacuationFieldManager.
func Mark(ctx context.Context, c client.Client, vmi *v1alpha1.VirtualMachineInstance, node string) error {
	return applyMark(ctx, c, vmi, node)
}

// ClearMark removes vmi's status.evacuationNodeName (an apply under
// v1alpha1.EvacuationFieldManager that leaves it out).
func ClearMark(ctx context.Context, c client.Client, vmi *v1alpha1.VirtualMachineInstance) error {
	return applyMark(ctx, c, vmi, "")
}

func applyMark(ctx context.Context, c client.Client, vmi *v1alpha1.VirtualMachineInstance, node string) error {
	body, err := v1alpha1.StatusApply(vmi, &v1alpha1.VirtualMachineInstanceStatus{EvacuationNodeName: node}, "")
	if err != nil {
		return err
	}
	if err := c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(body),
		client.FieldOwner(v1alpha1.EvacuationFieldManager)); err != nil {
		return fmt.Errorf("write evacuationNodeName of VMI %s/%s: %w", vmi.Namespace, vmi.Name, err)
	}
	return nil
}

// NewPDB builds vmi's PodDisruptionBudget: minAvailable over the pods labelled created-by the
// VMI's UID (its launcher pod, and a migration's target pod, which carries the same label),
// controlled by the VMI; minAvailable is PDBMinAvailable's (2 during a migration, so that
// neither of its pods can be evicted: a drain waits for the migration to end, and its retried
// eviction of the source pod then finds the pod deleted). Deletions, which the migration and VMI
// controllers use, ignore budgets.
func NewPDB(vmi *v1alpha1.VirtualMachineInstance, minAvailable int) *policyv1.PodDisruptionBudget {
	minAvail := intstr.FromInt(minAvailable)
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{
			Name:            PDBName(vmi),
			Namespace:       vmi.Namespace,
			Labels:          map[string]string{v1alpha1.CreatedByLabel: string(vmi.UID)},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(vmi, v1alpha1.VirtualMachineInstanceGroupVersionKind)},
		},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: &minAvail,
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.CreatedByLabel: string(vmi.UID)}},
		},
	}
}

// NewMigration builds the migration that moves vmi off node: generateName "<vmi>-evacuation-",
// labelled EvacuationLabel with the node's name.
func NewMigration(vmi *v1alpha1.VirtualMachineInstance, node string) *v1alpha1.VirtualMachineInstanceMigration {
	return &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: vmi.Name + "-evacuation-",
			Namespace:    vmi.Namespace,
			Labels:       map[string]string{v1alpha1.EvacuationLabel: labelValue(node)},
		},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi.Name},
	}
}

// labelValue is s when it is a valid label value, else a hash of it.
func labelValue(s string) string {
	if len(validation.IsValidLabelValue(s)) == 0 {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:16])
}
