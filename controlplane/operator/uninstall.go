package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// workloadLists are the kinds of user objects that run VMs, owners first: deleting a VM
// deletes its VMI, and the VMI controller, still running, stops the guest and lets it go.
var workloadLists = []client.ObjectList{
	&v1alpha1.VirtualMachineList{},
	&v1alpha1.VirtualMachineInstanceReplicaSetList{},
	&v1alpha1.VirtualMachineInstanceMigrationList{},
	&v1alpha1.VirtualMachineInstanceList{},
}

// uninstall runs while the Kubevisor is being deleted: per its uninstallStrategy it waits for
// the VMs to be gone (reporting which are left) or deletes them, then deletes every object the
// operator made (the CRDs last) and the labels the node handlers put on the nodes, and lets the
// Kubevisor go.
func (r *Reconciler) uninstall(ctx context.Context, kv *v1alpha1.Kubevisor) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(kv, Finalizer) {
		return reconcile.Result{}, nil
	}
	left, err := r.workloads(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	if len(left) > 0 {
		if kv.Spec.UninstallStrategy != v1alpha1.UninstallRemoveWorkloads {
			msg := fmt.Sprintf("uninstallStrategy %s: these exist: %s; delete them, or set uninstallStrategy RemoveWorkloads",
				v1alpha1.UninstallBlockIfWorkloadsExist, strings.Join(firstN(left, 10), ", "))
			setCondition(kv, v1alpha1.KubevisorDegraded, true, ReasonUninstallBlocked, msg)
			setCondition(kv, v1alpha1.KubevisorProgressing, false, ReasonUninstallBlocked, "uninstall waits for the VMs to be deleted")
			return reconcile.Result{RequeueAfter: r.recheck()}, nil
		}
		setCondition(kv, v1alpha1.KubevisorProgressing, true, ReasonUninstalling, "deleting the VMs: "+strings.Join(firstN(left, 10), ", "))
		setCondition(kv, v1alpha1.KubevisorDegraded, false, ReasonUninstalling, "")
		if err := r.deleteWorkloads(ctx); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: waitShort}, nil
	}

	setCondition(kv, v1alpha1.KubevisorAvailable, false, ReasonUninstalling, "uninstalling")
	setCondition(kv, v1alpha1.KubevisorProgressing, true, ReasonUninstalling, "deleting the components")
	made, err := r.stale(ctx, nil)
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := r.remove(ctx, made); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.unlabelNodes(ctx); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.deleteCA(ctx); err != nil {
		return reconcile.Result{}, err
	}
	// Gone when listed again: the CRDs' deletion waits for their objects.
	if made, err = r.stale(ctx, nil); err != nil {
		return reconcile.Result{}, err
	} else if len(made) > 0 {
		var names []string
		for _, o := range made {
			names = append(names, o.GetKind()+" "+objName(&o))
		}
		setCondition(kv, v1alpha1.KubevisorProgressing, true, ReasonUninstalling, "waiting for "+strings.Join(firstN(names, 5), ", ")+" to go")
		return reconcile.Result{RequeueAfter: waitShort}, nil
	}
	r.log(ctx).Info("uninstalled", "kubevisor", kv.Name)
	controllerutil.RemoveFinalizer(kv, Finalizer)
	return reconcile.Result{}, r.Client.Update(ctx, kv)
}

// workloads lists the VMs, VMI replica sets, migrations and VMIs of every namespace, as
// "kind namespace/name"; none when their CRDs are gone.
func (r *Reconciler) workloads(ctx context.Context) ([]string, error) {
	var out []string
	for _, l := range workloadLists {
		list := l.DeepCopyObject().(client.ObjectList)
		if err := r.Reader.List(ctx, list); err != nil {
			if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
				continue
			}
			return nil, err
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return nil, err
		}
		for _, it := range items {
			o := it.(client.Object)
			kind := strings.TrimSuffix(fmt.Sprintf("%T", list), "List")
			kind = kind[strings.LastIndex(kind, ".")+1:]
			out = append(out, kind+" "+o.GetNamespace()+"/"+o.GetName())
		}
	}
	return out, nil
}

// deleteWorkloads deletes every VM, VMI replica set, migration and VMI.
func (r *Reconciler) deleteWorkloads(ctx context.Context) error {
	for _, l := range workloadLists {
		list := l.DeepCopyObject().(client.ObjectList)
		if err := r.Reader.List(ctx, list); err != nil {
			if meta.IsNoMatchError(err) {
				continue
			}
			return err
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return err
		}
		for _, it := range items {
			o := it.(client.Object)
			if o.GetDeletionTimestamp() != nil {
				continue
			}
			if err := r.Client.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("delete %s/%s: %w", o.GetNamespace(), o.GetName(), err)
			}
			r.log(ctx).Info("deleted for the uninstall", "object", fmt.Sprintf("%T", o), "name", objName(o))
		}
	}
	return nil
}

// nodeLabel reports whether a node label is one the node handlers publish: a driver's
// capability, or the node's schedulable, CPU manager and SELinux marks.
func nodeLabel(k string) bool { return v1alpha1.IsHandlerNodeLabel(k) }

// unlabelNodes removes the node handlers' labels from every node.
func (r *Reconciler) unlabelNodes(ctx context.Context) error {
	var nodes corev1.NodeList
	if err := r.Reader.List(ctx, &nodes); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	for _, n := range nodes.Items {
		remove := map[string]any{}
		for k := range n.Labels {
			if nodeLabel(k) {
				remove[k] = nil
			}
		}
		if len(remove) == 0 {
			continue
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": remove}})
		if err := r.Client.Patch(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": n.Name},
		}}, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return fmt.Errorf("remove the handlers' labels from node %s: %w", n.Name, err)
		}
	}
	return nil
}
