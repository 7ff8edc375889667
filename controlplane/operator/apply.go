package operator

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// FieldManager is the operator's server-side apply field manager: it owns every field of the
// rendered objects, and forces it over other managers' (an install by hack/install.sh, a hand
// edit), as the install is the operator's to keep.
const FieldManager = "kubevisor-operator"

// owned are the kinds of the objects an install has, which the operator prunes and uninstalls;
// a test checks that every rendered kind is here. The Namespace is not: the operator runs in it.
var owned = []schema.GroupVersionKind{
	{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"},
	{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "MutatingWebhookConfiguration"},
	{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "ValidatingWebhookConfiguration"},
	{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"},
	{Group: "kubevisor.io", Version: "v1alpha1", Kind: "HypervisorClass"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRoleBinding"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "RoleBinding"},
	{Group: "", Version: "v1", Kind: "ServiceAccount"},
	{Group: "", Version: "v1", Kind: "ConfigMap"},
	{Group: "", Version: "v1", Kind: "Service"},
	{Group: "apps", Version: "v1", Kind: "Deployment"},
	{Group: "apps", Version: "v1", Kind: "DaemonSet"},
}

// ownedNamespaces are the namespaces the install's namespaced objects are in: its own, and
// kube-system for the API server's authentication reader binding.
var ownedNamespaces = []string{Namespace, "kube-system"}

// apply applies o with server-side apply, as the operator's field manager, and returns the
// object the API server stored (its generation and status as of the apply).
func (r *Reconciler) apply(ctx context.Context, o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	o = o.DeepCopy()
	if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return nil, fmt.Errorf("apply %s %s: %w", o.GetKind(), objName(o), err)
	}
	return o, nil
}

func objName(o client.Object) string {
	if o.GetNamespace() != "" {
		return o.GetNamespace() + "/" + o.GetName()
	}
	return o.GetName()
}

type objKey struct {
	gvk             schema.GroupVersionKind
	namespace, name string
}

func keyOf(o *unstructured.Unstructured) objKey {
	return objKey{o.GroupVersionKind(), o.GetNamespace(), o.GetName()}
}

// installed lists the objects of kind gvk the operator made (its label), in the install's
// namespaces for a namespaced kind. A kind whose API is not served (a CRD not installed) has
// none.
func (r *Reconciler) installed(ctx context.Context, gvk schema.GroupVersionKind) ([]unstructured.Unstructured, error) {
	namespaced, err := r.Client.IsObjectNamespaced(&unstructured.Unstructured{Object: map[string]any{"apiVersion": gvk.GroupVersion().String(), "kind": gvk.Kind}})
	if err != nil {
		if isNoMatch(err) {
			return nil, nil
		}
		return nil, err
	}
	namespaces := []string{""}
	if namespaced {
		namespaces = ownedNamespaces
	}
	var out []unstructured.Unstructured
	for _, ns := range namespaces {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		opts := []client.ListOption{client.MatchingLabels{ManagedByLabel: ManagedByValue}}
		if ns != "" {
			opts = append(opts, client.InNamespace(ns))
		}
		if err := r.Reader.List(ctx, list, opts...); err != nil {
			if isNoMatch(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("list %s: %w", gvk.Kind, err)
		}
		out = append(out, list.Items...)
	}
	return out, nil
}

func isNoMatch(err error) bool {
	return err != nil && (apierrors.IsNotFound(err) || meta.IsNoMatchError(err))
}

// stale lists the objects the operator made that want does not have: what to prune.
func (r *Reconciler) stale(ctx context.Context, want []*unstructured.Unstructured) ([]unstructured.Unstructured, error) {
	keep := map[objKey]bool{}
	for _, o := range want {
		keep[keyOf(o)] = true
	}
	var out []unstructured.Unstructured
	for _, gvk := range owned {
		have, err := r.installed(ctx, gvk)
		if err != nil {
			return nil, err
		}
		for i := range have {
			have[i].SetGroupVersionKind(gvk)
			if !keep[keyOf(&have[i])] {
				out = append(out, have[i])
			}
		}
	}
	return out, nil
}

// remove deletes objs, workloads first and CRDs last, in the background (their dependents,
// such as a Deployment's pods, are collected by the garbage collector).
func (r *Reconciler) remove(ctx context.Context, objs []unstructured.Unstructured) error {
	objs = slices.Clone(objs)
	slices.SortStableFunc(objs, func(a, b unstructured.Unstructured) int { return removeRank(&a) - removeRank(&b) })
	for i := range objs {
		o := &objs[i]
		if err := r.Client.Delete(ctx, o, client.PropagationPolicy("Background")); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s %s: %w", o.GetKind(), objName(o), err)
		}
		r.log(ctx).Info("deleted", "kind", o.GetKind(), "name", objName(o))
	}
	return nil
}

// removeRank orders deletions: the callers of the components (webhooks, APIService) and the
// workloads first, their configuration and identities next, the CRDs last.
func removeRank(o *unstructured.Unstructured) int {
	switch o.GetKind() {
	case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "APIService":
		return 0
	case "Deployment", "DaemonSet":
		return 1
	case "CustomResourceDefinition":
		return 3
	}
	return 2
}
