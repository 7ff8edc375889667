package subresources

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/kubevisor/kubevisor/controlplane/webhook"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

func testVM(strategy v1alpha1.VirtualMachineRunStrategy) *v1alpha1.VirtualMachine {
	return &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "vm-uid"},
		Spec:       v1alpha1.VirtualMachineSpec{RunStrategy: ptr.To(strategy)},
	}
}

func testVMI(phase v1alpha1.VirtualMachineInstancePhase) *v1alpha1.VirtualMachineInstance {
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "vmi-uid"},
		Status:     v1alpha1.VirtualMachineInstanceStatus{Phase: phase, NodeName: "n1"},
	}
	vmi.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachine", Name: "vm1", UID: "vm-uid", Controller: ptr.To(true)}}
	return vmi
}

func newActions(objs ...client.Object) (*vmActions, client.Client) {
	c := fake.NewClientBuilder().WithScheme(webhook.Scheme()).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.VirtualMachine{}, &v1alpha1.VirtualMachineInstance{}).Build()
	return &vmActions{reader: c, writer: c}, c
}

func getVM(t *testing.T, c client.Client) *v1alpha1.VirtualMachine {
	t.Helper()
	m := &v1alpha1.VirtualMachine{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "vm1"}, m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestStart(t *testing.T) {
	cases := []struct {
		name     string
		strategy v1alpha1.VirtualMachineRunStrategy
		vmi      *v1alpha1.VirtualMachineInstance
		conflict bool
		want     v1alpha1.VirtualMachineRunStrategy
		request  bool
	}{
		{name: "halted becomes always", strategy: v1alpha1.RunStrategyHalted, want: v1alpha1.RunStrategyAlways},
		{name: "halted with a finished VMI", strategy: v1alpha1.RunStrategyHalted, vmi: testVMI(v1alpha1.Succeeded), want: v1alpha1.RunStrategyAlways},
		{name: "running is a conflict", strategy: v1alpha1.RunStrategyAlways, vmi: testVMI(v1alpha1.Running), conflict: true},
		{name: "manual gets a start request", strategy: v1alpha1.RunStrategyManual, want: v1alpha1.RunStrategyManual, request: true},
		{name: "once does not take requests", strategy: v1alpha1.RunStrategyOnce, conflict: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := []client.Object{testVM(tc.strategy)}
			if tc.vmi != nil {
				objs = append(objs, tc.vmi)
			}
			a, c := newActions(objs...)
			_, err := a.start(context.Background(), "ns", "vm1", nil)
			if tc.conflict {
				if !apierrors.IsConflict(err) {
					t.Fatalf("err %v, want a conflict", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			m := getVM(t, c)
			if *m.Spec.RunStrategy != tc.want {
				t.Errorf("runStrategy %s, want %s", *m.Spec.RunStrategy, tc.want)
			}
			if got := len(m.Status.StateChangeRequests) == 1 && m.Status.StateChangeRequests[0].Action == v1alpha1.StartRequest; got != tc.request {
				t.Errorf("requests %+v, want a start request %v", m.Status.StateChangeRequests, tc.request)
			}
		})
	}
	t.Run("absent VM is 404", func(t *testing.T) {
		a, _ := newActions()
		if _, err := a.start(context.Background(), "ns", "vm1", nil); !apierrors.IsNotFound(err) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("legacy running:false becomes runStrategy Always, running dropped", func(t *testing.T) {
		m := testVM("")
		m.Spec.RunStrategy, m.Spec.Running = nil, ptr.To(false)
		a, c := newActions(m)
		if _, err := a.start(context.Background(), "ns", "vm1", nil); err != nil {
			t.Fatal(err)
		}
		got := getVM(t, c)
		if got.Spec.Running != nil || *got.Spec.RunStrategy != v1alpha1.RunStrategyAlways {
			t.Fatalf("spec %+v", got.Spec)
		}
	})
}

func TestStop(t *testing.T) {
	t.Run("always becomes halted and force sets the VMI's grace period to 0", func(t *testing.T) {
		a, c := newActions(testVM(v1alpha1.RunStrategyAlways), testVMI(v1alpha1.Running))
		if _, err := a.stop(context.Background(), "ns", "vm1", []byte(`{"force":true,"gracePeriodSeconds":30}`)); err != nil {
			t.Fatal(err)
		}
		if s := *getVM(t, c).Spec.RunStrategy; s != v1alpha1.RunStrategyHalted {
			t.Errorf("runStrategy %s", s)
		}
		vmi := &v1alpha1.VirtualMachineInstance{}
		_ = c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "vm1"}, vmi)
		if g := vmi.Spec.TerminationGracePeriodSeconds; g == nil || *g != 0 {
			t.Errorf("grace %v, want 0", g)
		}
	})
	t.Run("manual gets a stop request naming the VMI", func(t *testing.T) {
		a, c := newActions(testVM(v1alpha1.RunStrategyManual), testVMI(v1alpha1.Running))
		if _, err := a.stop(context.Background(), "ns", "vm1", nil); err != nil {
			t.Fatal(err)
		}
		rs := getVM(t, c).Status.StateChangeRequests
		if len(rs) != 1 || rs[0].Action != v1alpha1.StopRequest || rs[0].UID == nil || *rs[0].UID != "vmi-uid" {
			t.Fatalf("requests %+v", rs)
		}
	})
	t.Run("halted without a VMI is a conflict", func(t *testing.T) {
		a, _ := newActions(testVM(v1alpha1.RunStrategyHalted))
		if _, err := a.stop(context.Background(), "ns", "vm1", nil); !apierrors.IsConflict(err) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("negative grace period is a bad request", func(t *testing.T) {
		a, _ := newActions(testVM(v1alpha1.RunStrategyAlways))
		if _, err := a.stop(context.Background(), "ns", "vm1", []byte(`{"gracePeriodSeconds":-1}`)); !apierrors.IsBadRequest(err) {
			t.Fatalf("err %v", err)
		}
	})
}

func TestRestart(t *testing.T) {
	t.Run("deletes the running VMI", func(t *testing.T) {
		a, c := newActions(testVM(v1alpha1.RunStrategyAlways), testVMI(v1alpha1.Running))
		if _, err := a.restart(context.Background(), "ns", "vm1", nil); err != nil {
			t.Fatal(err)
		}
		err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "vm1"}, &v1alpha1.VirtualMachineInstance{})
		if !apierrors.IsNotFound(err) {
			t.Fatalf("VMI still there: %v", err)
		}
	})
	t.Run("without a VMI is a conflict", func(t *testing.T) {
		a, _ := newActions(testVM(v1alpha1.RunStrategyAlways))
		if _, err := a.restart(context.Background(), "ns", "vm1", nil); !apierrors.IsConflict(err) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("a VMI the VM does not control is not its own", func(t *testing.T) {
		vmi := testVMI(v1alpha1.Running)
		vmi.OwnerReferences = nil
		a, _ := newActions(testVM(v1alpha1.RunStrategyAlways), vmi)
		if _, err := a.restart(context.Background(), "ns", "vm1", nil); !apierrors.IsConflict(err) {
			t.Fatalf("err %v", err)
		}
	})
}

func TestMigrateAndCancel(t *testing.T) {
	ctx := context.Background()
	a, c := newActions(testVM(v1alpha1.RunStrategyAlways), testVMI(v1alpha1.Running))
	if _, err := a.cancelMigration(ctx, "ns", "vm1", nil); !apierrors.IsNotFound(err) {
		t.Fatalf("cancel without migration: %v, want 404", err)
	}
	if _, err := a.migrate(ctx, "ns", "vm1", []byte(`{"dryRun":["Some"]}`)); !apierrors.IsBadRequest(err) {
		t.Fatalf("bad dryRun: %v", err)
	}
	if _, err := a.migrate(ctx, "ns", "vm1", nil); err != nil {
		t.Fatal(err)
	}
	var list v1alpha1.VirtualMachineInstanceMigrationList
	if err := c.List(ctx, &list); err != nil || len(list.Items) != 1 || list.Items[0].Spec.VMIName != "vm1" {
		t.Fatalf("migrations %+v %v", list.Items, err)
	}
	if _, err := a.migrate(ctx, "ns", "vm1", nil); !apierrors.IsConflict(err) {
		t.Fatalf("second migrate: %v, want a conflict", err)
	}
	if _, err := a.cancelMigration(ctx, "ns", "vm1", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.List(ctx, &list); err != nil || len(list.Items) != 0 {
		t.Fatalf("after cancel %+v %v", list.Items, err)
	}
	t.Run("a VM that is not running cannot migrate", func(t *testing.T) {
		a, _ := newActions(testVM(v1alpha1.RunStrategyAlways), testVMI(v1alpha1.Scheduled))
		if _, err := a.migrate(ctx, "ns", "vm1", nil); !apierrors.IsConflict(err) {
			t.Fatalf("err %v", err)
		}
	})
}
