package webhook

import (
	"context"
	"fmt"
	"sort"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/featuregate"
)

// The webhook configurations and webhooks, as controller-gen writes them into manifests/webhook.
// Paths are the ones controller-runtime's builder derives from the kinds.
//
// +kubebuilder:webhookconfiguration:mutating=true,name=kubevisor-mutating
// +kubebuilder:webhookconfiguration:mutating=false,name=kubevisor-validating
//
// +kubebuilder:webhook:path=/mutate-kubevisor-io-v1alpha1-virtualmachineinstance,mutating=true,failurePolicy=fail,sideEffects=None,groups=kubevisor.io,resources=virtualmachineinstances,verbs=create,versions=v1alpha1,name=mvirtualmachineinstance.kubevisor.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/mutate-kubevisor-io-v1alpha1-virtualmachine,mutating=true,failurePolicy=fail,sideEffects=None,groups=kubevisor.io,resources=virtualmachines,verbs=create;update,versions=v1alpha1,name=mvirtualmachine.kubevisor.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/mutate-kubevisor-io-v1alpha1-virtualmachineinstancereplicaset,mutating=true,failurePolicy=fail,sideEffects=None,groups=kubevisor.io,resources=virtualmachineinstancereplicasets,verbs=create;update,versions=v1alpha1,name=mvirtualmachineinstancereplicaset.kubevisor.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-kubevisor-io-v1alpha1-virtualmachineinstance,mutating=false,failurePolicy=fail,sideEffects=None,groups=kubevisor.io,resources=virtualmachineinstances,verbs=create;update,versions=v1alpha1,name=vvirtualmachineinstance.kubevisor.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-kubevisor-io-v1alpha1-virtualmachine,mutating=false,failurePolicy=fail,sideEffects=None,groups=kubevisor.io,resources=virtualmachines,verbs=create;update,versions=v1alpha1,name=vvirtualmachine.kubevisor.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-kubevisor-io-v1alpha1-virtualmachineinstancereplicaset,mutating=false,failurePolicy=fail,sideEffects=None,groups=kubevisor.io,resources=virtualmachineinstancereplicasets,verbs=create;update,versions=v1alpha1,name=vvirtualmachineinstancereplicaset.kubevisor.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-kubevisor-io-v1alpha1-virtualmachineinstancemigration,mutating=false,failurePolicy=fail,sideEffects=None,groups=kubevisor.io,resources=virtualmachineinstancemigrations,verbs=create;update,versions=v1alpha1,name=vvirtualmachineinstancemigration.kubevisor.io,admissionReviewVersions=v1

// What kubevisor-api needs from the API server: HypervisorClasses to find the default one, and
// the webhook configurations to inject the CA bundle into (package certs).
//
// +kubebuilder:rbac:groups=kubevisor.io,resources=hypervisorclasses,verbs=get;list
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations;validatingwebhookconfigurations,verbs=get;patch

// Admission holds what the admission handlers need besides the object: a reader for
// HypervisorClasses and the defaulting options that do not depend on the cluster.
type Admission struct {
	// Reader lists HypervisorClasses to find the default one. Nil leaves hypervisorClassName
	// alone.
	Reader client.Reader
	// MachineType replaces DefaultMachineType when set.
	MachineType string
	// CheckPodSecurity refuses what its namespace's Pod Security level would not run
	// (podsecurity.go).
	CheckPodSecurity bool
	// FeatureGates are the enabled feature gates, read at each request (the live
	// configuration swaps them while the process runs); nil enables no gated feature.
	FeatureGates *featuregate.Live
}

// SetupWithManager registers the mutating and validating webhooks of VirtualMachineInstance,
// VirtualMachine, VirtualMachineInstanceReplicaSet and (validating only)
// VirtualMachineInstanceMigration with mgr's webhook server.
func (a *Admission) SetupWithManager(mgr manager.Manager) error {
	if err := builder.WebhookManagedBy(mgr, &v1alpha1.VirtualMachineInstance{}).
		WithDefaulter(vmiDefaulter{a}).WithValidator(vmiValidator{a}).Complete(); err != nil {
		return fmt.Errorf("virtualmachineinstance webhooks: %w", err)
	}
	if err := builder.WebhookManagedBy(mgr, &v1alpha1.VirtualMachine{}).
		WithDefaulter(vmDefaulter{a}).WithValidator(vmValidator{a}).Complete(); err != nil {
		return fmt.Errorf("virtualmachine webhooks: %w", err)
	}
	if err := builder.WebhookManagedBy(mgr, &v1alpha1.VirtualMachineInstanceReplicaSet{}).
		WithDefaulter(vmirsDefaulter{a}).WithValidator(vmirsValidator{a}).Complete(); err != nil {
		return fmt.Errorf("virtualmachineinstancereplicaset webhooks: %w", err)
	}
	if err := builder.WebhookManagedBy(mgr, &v1alpha1.VirtualMachineInstanceMigration{}).
		WithValidator(vmimValidator{}).Complete(); err != nil {
		return fmt.Errorf("virtualmachineinstancemigration webhook: %w", err)
	}
	return nil
}

// options resolves the cluster-dependent defaults for one request.
func (a *Admission) options(ctx context.Context, spec *v1alpha1.VirtualMachineInstanceSpec) (DefaultOptions, error) {
	opts := DefaultOptions{MachineType: a.MachineType}
	if spec.HypervisorClassName != "" || a.Reader == nil {
		return opts, nil
	}
	name, err := DefaultHypervisorClass(ctx, a.Reader)
	if err != nil {
		return opts, err
	}
	opts.HypervisorClassName = name
	return opts, nil
}

// DefaultHypervisorClass returns the name of the HypervisorClass annotated
// hypervisorclass.kubevisor.io/is-default-class: "true", or "" when none or more than one is
// (the VMI controller then reports HypervisorClassNotFound or MultipleDefaultHypervisorClasses
// on the VMI, which tells the user more than a rejection would).
func DefaultHypervisorClass(ctx context.Context, r client.Reader) (string, error) {
	var list v1alpha1.HypervisorClassList
	if err := r.List(ctx, &list); err != nil {
		return "", fmt.Errorf("list hypervisor classes: %w", err)
	}
	var defaults []string
	for _, c := range list.Items {
		if c.Annotations[v1alpha1.IsDefaultHypervisorClassAnnotation] == "true" {
			defaults = append(defaults, c.Name)
		}
	}
	sort.Strings(defaults)
	if len(defaults) != 1 {
		return "", nil
	}
	return defaults[0], nil
}

// invalid turns field errors into the API error the API server passes on to the client, field
// paths included.
func invalid(kind string, name string, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(v1alpha1.GroupVersion.WithKind(kind).GroupKind(), name, errs)
}

type vmiDefaulter struct{ a *Admission }

// Default defaults the VMI's spec and, on create, adds the teardown finalizer (as KubeVirt's VMI
// mutator adds its own), which the VMI controller would otherwise add with a patch of its own
// before it creates the launcher pod.
func (d vmiDefaulter) Default(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) error {
	if err := refuseUnknownFields(ctx, vmiKind, vmi.Name); err != nil {
		return err
	}
	opts, err := d.a.options(ctx, &vmi.Spec)
	if err != nil {
		return err
	}
	Default(&vmi.Spec, opts)
	if req, err := admission.RequestFromContext(ctx); err == nil && req.Operation == admissionv1.Create && vmi.DeletionTimestamp == nil {
		controllerutil.AddFinalizer(vmi, v1alpha1.TeardownFinalizer)
	}
	return nil
}

type vmDefaulter struct{ a *Admission }

func (d vmDefaulter) Default(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	if err := refuseUnknownFields(ctx, vmKind, vm.Name); err != nil {
		return err
	}
	if vm.Spec.Template == nil {
		return nil
	}
	opts, err := d.a.options(ctx, &vm.Spec.Template.Spec)
	if err != nil {
		return err
	}
	Default(&vm.Spec.Template.Spec, opts)
	return nil
}

type vmirsDefaulter struct{ a *Admission }

func (d vmirsDefaulter) Default(ctx context.Context, rs *v1alpha1.VirtualMachineInstanceReplicaSet) error {
	if err := refuseUnknownFields(ctx, vmirsKind, rs.Name); err != nil {
		return err
	}
	if rs.Spec.Template == nil {
		return nil
	}
	opts, err := d.a.options(ctx, &rs.Spec.Template.Spec)
	if err != nil {
		return err
	}
	Default(&rs.Spec.Template.Spec, opts)
	return nil
}

var specPath = field.NewPath("spec")

// The kinds whose specs carry a VirtualMachineInstanceSpec.
const (
	vmiKind   = "VirtualMachineInstance"
	vmKind    = "VirtualMachine"
	vmirsKind = "VirtualMachineInstanceReplicaSet"
)

// validated is the answer of a validating webhook: the object's unknown fields (which the
// defaulting webhook has refused already where it runs; a VMI's update has none) and errs, the
// errors of its typed validation, as one Invalid error.
func validated(ctx context.Context, kind, name string, errs field.ErrorList) error {
	unknown, err := unknownFields(ctx, kind)
	if err != nil {
		return err
	}
	return invalid(kind, name, append(unknown, errs...))
}

// validatedRunnable is validated, and when errs is empty, the Pod Security check of spec (the
// VMI's, or the template's that the object makes VMIs of; nil: none) in the object's namespace.
func (a *Admission) validatedRunnable(ctx context.Context, kind string, meta metav1.ObjectMeta, spec *v1alpha1.VirtualMachineInstanceSpec, errs field.ErrorList) error {
	if len(errs) == 0 && spec != nil {
		ns := meta.Namespace
		if req, err := admission.RequestFromContext(ctx); ns == "" && err == nil {
			ns = req.Namespace
		}
		path := specPath
		if kind != vmiKind {
			path = specPath.Child("template", "spec")
		}
		ps, err := a.podSecurity(ctx, ns, meta.Name, spec, path)
		if err != nil {
			return err
		}
		errs = ps
	}
	return validated(ctx, kind, meta.Name, errs)
}

// gated refuses each field of spec (found at path) whose feature gate is not enabled now
// (featuregate.Check); old is the spec before an update, whose gated fields stay admissible
// (nil on create).
func (a *Admission) gated(spec, old *v1alpha1.VirtualMachineInstanceSpec, path *field.Path) field.ErrorList {
	return featuregate.Check(spec, old, path, a.FeatureGates.Load())
}

var templateSpecPath = specPath.Child("template", "spec")

// templateSpec is the VMI spec of a template, nil when there is none.
func templateSpec(t *v1alpha1.VirtualMachineInstanceTemplateSpec) *v1alpha1.VirtualMachineInstanceSpec {
	if t == nil {
		return nil
	}
	return &t.Spec
}

type vmiValidator struct{ a *Admission }

func (v vmiValidator) ValidateCreate(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (admission.Warnings, error) {
	errs := append(Validate(&vmi.Spec, specPath), v.a.gated(&vmi.Spec, nil, specPath)...)
	return nil, v.a.validatedRunnable(ctx, vmiKind, vmi.ObjectMeta, &vmi.Spec, errs)
}

// ValidateUpdate needs no feature gate: a VMI's spec is immutable, so an update adds no gated
// field.

func (v vmiValidator) ValidateUpdate(ctx context.Context, oldVMI, vmi *v1alpha1.VirtualMachineInstance) (admission.Warnings, error) {
	return nil, validated(ctx, vmiKind, vmi.Name, ValidateVMISpecUpdate(&vmi.Spec, &oldVMI.Spec, specPath))
}

func (vmiValidator) ValidateDelete(context.Context, *v1alpha1.VirtualMachineInstance) (admission.Warnings, error) {
	return nil, nil
}

type vmValidator struct{ a *Admission }

func (v vmValidator) ValidateCreate(ctx context.Context, vm *v1alpha1.VirtualMachine) (admission.Warnings, error) {
	errs := append(ValidateVirtualMachineSpec(&vm.Spec, specPath), v.a.gated(templateSpec(vm.Spec.Template), nil, templateSpecPath)...)
	return nil, v.a.validatedRunnable(ctx, vmKind, vm.ObjectMeta, templateSpec(vm.Spec.Template), errs)
}

// ValidateUpdate validates the whole spec again: a VM's template may change (the next VMI gets
// it), as in KubeVirt. Feature gates refuse only what the update adds to the template: a VM
// that kept its hostDisk after the gate was turned off can still be stopped, relabelled and
// deleted (KubeVirt refuses any update of it then); its next VMI is refused at its own
// admission.
func (v vmValidator) ValidateUpdate(ctx context.Context, oldVM, vm *v1alpha1.VirtualMachine) (admission.Warnings, error) {
	errs := append(ValidateVirtualMachineSpec(&vm.Spec, specPath),
		v.a.gated(templateSpec(vm.Spec.Template), templateSpec(oldVM.Spec.Template), templateSpecPath)...)
	return nil, v.a.validatedRunnable(ctx, vmKind, vm.ObjectMeta, templateSpec(vm.Spec.Template), errs)
}

func (vmValidator) ValidateDelete(context.Context, *v1alpha1.VirtualMachine) (admission.Warnings, error) {
	return nil, nil
}

type vmirsValidator struct{ a *Admission }

func (v vmirsValidator) ValidateCreate(ctx context.Context, rs *v1alpha1.VirtualMachineInstanceReplicaSet) (admission.Warnings, error) {
	errs := append(ValidateReplicaSetSpec(&rs.Spec, specPath), v.a.gated(templateSpec(rs.Spec.Template), nil, templateSpecPath)...)
	return nil, v.a.validatedRunnable(ctx, vmirsKind, rs.ObjectMeta, templateSpec(rs.Spec.Template), errs)
}

// ValidateUpdate gates what the update adds to the template, as the VM's.
func (v vmirsValidator) ValidateUpdate(ctx context.Context, oldRS, rs *v1alpha1.VirtualMachineInstanceReplicaSet) (admission.Warnings, error) {
	errs := append(ValidateReplicaSetSpec(&rs.Spec, specPath),
		v.a.gated(templateSpec(rs.Spec.Template), templateSpec(oldRS.Spec.Template), templateSpecPath)...)
	return nil, v.a.validatedRunnable(ctx, vmirsKind, rs.ObjectMeta, templateSpec(rs.Spec.Template), errs)
}

func (vmirsValidator) ValidateDelete(context.Context, *v1alpha1.VirtualMachineInstanceReplicaSet) (admission.Warnings, error) {
	return nil, nil
}

type vmimValidator struct{}

func (vmimValidator) ValidateCreate(_ context.Context, m *v1alpha1.VirtualMachineInstanceMigration) (admission.Warnings, error) {
	return nil, invalid("VirtualMachineInstanceMigration", m.Name, ValidateMigrationSpec(&m.Spec, specPath))
}

func (vmimValidator) ValidateUpdate(_ context.Context, oldM, m *v1alpha1.VirtualMachineInstanceMigration) (admission.Warnings, error) {
	return nil, invalid("VirtualMachineInstanceMigration", m.Name, ValidateMigrationSpecUpdate(&m.Spec, &oldM.Spec, specPath))
}

func (vmimValidator) ValidateDelete(context.Context, *v1alpha1.VirtualMachineInstanceMigration) (admission.Warnings, error) {
	return nil, nil
}
