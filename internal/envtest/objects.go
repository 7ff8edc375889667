package envtest

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// Update reads the stored version of obj, applies mutate to it and writes it back, starting over
// on a conflict. obj itself is left as it is. It fails the test when the object cannot be read or
// written.
func Update[T client.Object](t testing.TB, c client.Client, obj T, mutate func(T)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		// A new object, not a copy of obj: decoding into a copy would keep fields the stored
		// version no longer has.
		cur := reflect.New(reflect.TypeOf(obj).Elem()).Interface().(T)
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), cur); err != nil {
			return err
		}
		mutate(cur)
		return c.Update(context.Background(), cur)
	})
	if err != nil {
		t.Fatalf("update %T %s: %v", obj, client.ObjectKeyFromObject(obj), err)
	}
}

// SetVMIPhase plays the VMI controller and the node handler: it writes the VMI's status.phase
// and a Ready condition (True when ready) through the status subresource, starting over on a
// conflict. It fails the test when the VMI was replaced by another of the same name.
func SetVMIPhase(t testing.TB, c client.Client, vmi *v1alpha1.VirtualMachineInstance, phase v1alpha1.VirtualMachineInstancePhase, ready bool) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &v1alpha1.VirtualMachineInstance{}
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(vmi), cur); err != nil {
			return err
		}
		if cur.UID != vmi.UID {
			return fmt.Errorf("VMI %s was replaced", vmi.Name)
		}
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		cur.Status.Phase = phase
		cur.Status.Conditions = []v1alpha1.VirtualMachineInstanceCondition{{
			Type: v1alpha1.VirtualMachineInstanceReady, Status: status, Reason: "Test", LastTransitionTime: metav1.Now(),
		}}
		return c.Status().Update(context.Background(), cur)
	})
	if err != nil {
		t.Fatalf("set VMI %s phase %s: %v", vmi.Name, phase, err)
	}
}
