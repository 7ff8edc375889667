package evacuation

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

func testVMI(strategy v1alpha1.EvictionStrategy, migratable corev1.ConditionStatus) *v1alpha1.VirtualMachineInstance {
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "u1"},
		Status: v1alpha1.VirtualMachineInstanceStatus{
			Phase: v1alpha1.Running, NodeName: "node-1", LauncherPodName: "launcher-vm1",
		},
	}
	if strategy != "" {
		vmi.Spec.EvictionStrategy = ptr.To(strategy)
	}
	if migratable != "" {
		c := v1alpha1.VirtualMachineInstanceCondition{Type: v1alpha1.VirtualMachineInstanceIsMigratable, Status: migratable}
		if migratable != corev1.ConditionTrue {
			c.Reason, c.Message = v1alpha1.ReasonDisksNotLiveMigratable, "hostDisk volume disk0 is not shared"
		}
		vmi.Status.Conditions = append(vmi.Status.Conditions, c)
	}
	return vmi
}

func testPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}, Spec: corev1.PodSpec{NodeName: "node-1"}}
}

func TestStrategy(t *testing.T) {
	if got := Strategy(testVMI("", ""), ""); got != v1alpha1.EvictionStrategyNone {
		t.Errorf("unset, no default = %s", got)
	}
	if got := Strategy(testVMI("", ""), v1alpha1.EvictionStrategyLiveMigrate); got != v1alpha1.EvictionStrategyLiveMigrate {
		t.Errorf("unset, default LiveMigrate = %s", got)
	}
	if got := Strategy(testVMI(v1alpha1.EvictionStrategyNone, ""), v1alpha1.EvictionStrategyLiveMigrate); got != v1alpha1.EvictionStrategyNone {
		t.Errorf("None over default LiveMigrate = %s", got)
	}
	for _, s := range []string{"", "None", "LiveMigrate", "LiveMigrateIfPossible", "External"} {
		if _, err := ParseStrategy(s); err != nil {
			t.Errorf("ParseStrategy(%q): %v", s, err)
		}
	}
	if _, err := ParseStrategy("livemigrate"); err == nil {
		t.Error("ParseStrategy accepted livemigrate")
	}
}

func TestEvict(t *testing.T) {
	marked := testVMI(v1alpha1.EvictionStrategyLiveMigrate, corev1.ConditionTrue)
	marked.Status.EvacuationNodeName = "node-1"
	markedElsewhere := testVMI(v1alpha1.EvictionStrategyLiveMigrate, corev1.ConditionTrue)
	markedElsewhere.Status.EvacuationNodeName = "node-0"
	scheduled := testVMI(v1alpha1.EvictionStrategyLiveMigrate, corev1.ConditionTrue)
	scheduled.Status.Phase = v1alpha1.Scheduled
	done := testVMI(v1alpha1.EvictionStrategyLiveMigrate, corev1.ConditionTrue)
	done.Status.Phase = v1alpha1.Succeeded
	deleting := testVMI(v1alpha1.EvictionStrategyLiveMigrate, corev1.ConditionTrue)
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	cases := []struct {
		name  string
		pod   *corev1.Pod
		vmi   *v1alpha1.VirtualMachineInstance
		def   v1alpha1.EvictionStrategy
		allow bool
		mark  string
		msg   []string
	}{
		{name: "no VMI", pod: testPod("launcher-vm1"), allow: true},
		{name: "strategy unset, no default", pod: testPod("launcher-vm1"), vmi: testVMI("", corev1.ConditionTrue), allow: true},
		{name: "strategy None", pod: testPod("launcher-vm1"), vmi: testVMI(v1alpha1.EvictionStrategyNone, corev1.ConditionTrue), def: v1alpha1.EvictionStrategyLiveMigrate, allow: true},
		{name: "LiveMigrate marks and refuses", pod: testPod("launcher-vm1"), vmi: testVMI(v1alpha1.EvictionStrategyLiveMigrate, corev1.ConditionTrue),
			mark: "node-1", msg: []string{"ns/vm1", "being live-migrated", "node-1", "launcher-vm1"}},
		{name: "default LiveMigrate marks", pod: testPod("launcher-vm1"), vmi: testVMI("", corev1.ConditionTrue), def: v1alpha1.EvictionStrategyLiveMigrate,
			mark: "node-1", msg: []string{"being live-migrated"}},
		{name: "already marked: refused, no write", pod: testPod("launcher-vm1"), vmi: marked, msg: []string{"being live-migrated"}},
		{name: "marked for another node: marked again", pod: testPod("launcher-vm1"), vmi: markedElsewhere, mark: "node-1", msg: []string{"node-1"}},
		{name: "not LiveMigratable: refused with the reason", pod: testPod("launcher-vm1"), vmi: testVMI(v1alpha1.EvictionStrategyLiveMigrate, corev1.ConditionFalse),
			msg: []string{"cannot be migrated", v1alpha1.ReasonDisksNotLiveMigratable, "hostDisk volume disk0"}},
		{name: "no LiveMigratable condition: refused", pod: testPod("launcher-vm1"), vmi: testVMI(v1alpha1.EvictionStrategyLiveMigrate, ""),
			msg: []string{"no LiveMigratable condition"}},
		{name: "not Running yet: refused, no mark", pod: testPod("launcher-vm1"), vmi: scheduled, msg: []string{"Scheduled, not Running"}},
		{name: "finished VMI", pod: testPod("launcher-vm1"), vmi: done, allow: true},
		{name: "VMI being deleted", pod: testPod("launcher-vm1"), vmi: deleting, allow: true},
		{name: "target pod of a migration", pod: testPod("launcher-vm1-target"), vmi: testVMI(v1alpha1.EvictionStrategyLiveMigrate, corev1.ConditionTrue), allow: true},
		{name: "IfPossible, migratable", pod: testPod("launcher-vm1"), vmi: testVMI(v1alpha1.EvictionStrategyLiveMigrateIfPossible, corev1.ConditionTrue), mark: "node-1"},
		{name: "IfPossible, not migratable", pod: testPod("launcher-vm1"), vmi: testVMI(v1alpha1.EvictionStrategyLiveMigrateIfPossible, corev1.ConditionFalse), allow: true},
		{name: "External marks and refuses, even not migratable", pod: testPod("launcher-vm1"), vmi: testVMI(v1alpha1.EvictionStrategyExternal, corev1.ConditionFalse),
			mark: "node-1", msg: []string{"External"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := Evict(c.pod, c.vmi, c.def)
			if v.Allow != c.allow || v.Mark != c.mark {
				t.Fatalf("Evict = %+v, want allow %v mark %q", v, c.allow, c.mark)
			}
			if !c.allow && v.Message == "" {
				t.Error("refused without a message")
			}
			for _, m := range c.msg {
				if !strings.Contains(v.Message, m) {
					t.Errorf("message %q lacks %q", v.Message, m)
				}
			}
		})
	}
}

func mig(name string, phase v1alpha1.VirtualMachineInstanceMigrationPhase, created time.Time, evacuation bool) v1alpha1.VirtualMachineInstanceMigration {
	m := v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
		Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"},
		Status:     v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: phase},
	}
	if evacuation {
		m.Labels = map[string]string{v1alpha1.EvacuationLabel: "node-1"}
	}
	if phase == v1alpha1.MigrationFailed || phase == v1alpha1.MigrationSucceeded {
		m.Status.PhaseTransitionTimestamps = []v1alpha1.VirtualMachineInstanceMigrationPhaseTransitionTimestamp{
			{Phase: phase, PhaseTransitionTimestamp: metav1.NewTime(created.Add(time.Second))},
		}
	}
	return m
}

func TestDecide(t *testing.T) {
	now := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	live := func() *v1alpha1.VirtualMachineInstance {
		vmi := testVMI(v1alpha1.EvictionStrategyLiveMigrate, corev1.ConditionTrue)
		vmi.Status.EvacuationNodeName = "node-1"
		return vmi
	}
	obs := func(mut func(*Observation)) Observation {
		o := Observation{VMI: live(), Now: now, PerCluster: 5, PerNode: 2, PDBExists: true, PDBMinAvailable: 1}
		if mut != nil {
			mut(&o)
		}
		return o
	}
	cases := []struct {
		name string
		obs  Observation
		want Decision
		wait bool
	}{
		{name: "marked, nothing running: create", obs: obs(nil), want: Decision{CreateMigration: true}},
		{name: "one unfinished: none, the budget raised to 2", obs: obs(func(o *Observation) {
			o.Migrations = []v1alpha1.VirtualMachineInstanceMigration{mig("a", v1alpha1.MigrationRunning, now.Add(-time.Minute), true)}
		}), want: Decision{UpdatePDB: true, PDBMinAvailable: 2}},
		{name: "one unfinished, budget at 2 already: none", obs: obs(func(o *Observation) {
			o.Migrations = []v1alpha1.VirtualMachineInstanceMigration{mig("a", v1alpha1.MigrationRunning, now.Add(-time.Minute), true)}
			o.PDBMinAvailable = 2
		}), want: Decision{}},
		{name: "a user's unfinished migration counts too", obs: obs(func(o *Observation) {
			o.Migrations = []v1alpha1.VirtualMachineInstanceMigration{mig("a", v1alpha1.MigrationPhaseUnset, now, false)}
		}), want: Decision{UpdatePDB: true, PDBMinAvailable: 2}},
		{name: "not marked, a user's migration running: budget raised to 2", obs: obs(func(o *Observation) {
			o.VMI.Status.EvacuationNodeName = ""
			o.Migrations = []v1alpha1.VirtualMachineInstanceMigration{mig("a", v1alpha1.MigrationScheduling, now, false)}
		}), want: Decision{UpdatePDB: true, PDBMinAvailable: 2}},
		{name: "not marked, the migration over: budget back to 1", obs: obs(func(o *Observation) {
			o.VMI.Status.EvacuationNodeName = ""
			o.PDBMinAvailable = 2
			o.Migrations = []v1alpha1.VirtualMachineInstanceMigration{mig("a", v1alpha1.MigrationSucceeded, now, false)}
		}), want: Decision{UpdatePDB: true, PDBMinAvailable: 1}},
		{name: "no budget, a migration running: created at 2", obs: obs(func(o *Observation) {
			o.VMI.Status.EvacuationNodeName = ""
			o.PDBExists, o.PDBMinAvailable = false, 0
			o.Migrations = []v1alpha1.VirtualMachineInstanceMigration{mig("a", v1alpha1.MigrationRunning, now, false)}
		}), want: Decision{EnsurePDB: true, PDBMinAvailable: 2}},
		{name: "earlier succeeded: create", obs: obs(func(o *Observation) {
			o.Migrations = []v1alpha1.VirtualMachineInstanceMigration{mig("a", v1alpha1.MigrationSucceeded, now.Add(-time.Hour), true)}
		}), want: Decision{CreateMigration: true}},
		{name: "earlier succeeded onto the node: create", obs: obs(func(o *Observation) {
			m := mig("a", v1alpha1.MigrationSucceeded, now.Add(-time.Hour), false)
			m.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: "node-0", TargetNode: "node-1", Completed: true}
			o.Migrations = []v1alpha1.VirtualMachineInstanceMigration{m}
		}), want: Decision{CreateMigration: true}},
		{name: "succeeded off the node, the VMI's status not there yet: wait", obs: obs(func(o *Observation) {
			m := mig("a", v1alpha1.MigrationSucceeded, now.Add(-time.Minute), true)
			m.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: "node-1", TargetNode: "node-2", Completed: true}
			o.Migrations = []v1alpha1.VirtualMachineInstanceMigration{mig("b", v1alpha1.MigrationFailed, now.Add(-2*time.Minute), true), m}
		}), want: Decision{}, wait: true},
		{name: "failed 5s ago: wait out the backoff", obs: obs(func(o *Observation) {
			o.Migrations = []v1alpha1.VirtualMachineInstanceMigration{mig("a", v1alpha1.MigrationFailed, now.Add(-6*time.Second), true)}
		}), wait: true},
		{name: "failed 20s ago: create", obs: obs(func(o *Observation) {
			o.Migrations = []v1alpha1.VirtualMachineInstanceMigration{mig("a", v1alpha1.MigrationFailed, now.Add(-21*time.Second), true)}
		}), want: Decision{CreateMigration: true}},
		{name: "failed three times, last 30s ago: 40s backoff", obs: obs(func(o *Observation) {
			o.Migrations = []v1alpha1.VirtualMachineInstanceMigration{
				mig("a", v1alpha1.MigrationFailed, now.Add(-3*time.Minute), true),
				mig("b", v1alpha1.MigrationFailed, now.Add(-2*time.Minute), true),
				mig("c", v1alpha1.MigrationFailed, now.Add(-31*time.Second), true),
			}
		}), wait: true},
		{name: "a user's failed migration is no evacuation failure", obs: obs(func(o *Observation) {
			o.Migrations = []v1alpha1.VirtualMachineInstanceMigration{mig("a", v1alpha1.MigrationFailed, now.Add(-2*time.Second), false)}
		}), want: Decision{CreateMigration: true}},
		{name: "cluster limit reached", obs: obs(func(o *Observation) { o.Unfinished = 5 }), wait: true},
		{name: "node limit reached", obs: obs(func(o *Observation) { o.Unfinished, o.UnfinishedFromNode = 2, 2 }), wait: true},
		{name: "completed, the VMI not moved yet: none", obs: obs(func(o *Observation) {
			o.Migrations = []v1alpha1.VirtualMachineInstanceMigration{mig("a", v1alpha1.MigrationSucceeded, now.Add(-time.Second), true)}
			o.VMI.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: "a", SourceNode: "node-1", TargetNode: "node-2", Completed: true}
		}), want: Decision{}},
		{name: "moved: unmark", obs: obs(func(o *Observation) { o.VMI.Status.NodeName = "node-2" }), want: Decision{ClearMark: true}},
		{name: "finished: unmark, budget removed", obs: obs(func(o *Observation) { o.VMI.Status.Phase = v1alpha1.Failed }),
			want: Decision{ClearMark: true, DeletePDB: true}},
		{name: "External: marked, no migration", obs: obs(func(o *Observation) {
			o.VMI.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyExternal)
		}), want: Decision{}},
		{name: "LiveMigrate without budget: create it", obs: obs(func(o *Observation) {
			o.PDBExists = false
			o.VMI.Status.EvacuationNodeName = ""
		}), want: Decision{EnsurePDB: true, PDBMinAvailable: 1}},
		{name: "strategy None with budget: delete it", obs: obs(func(o *Observation) {
			o.VMI.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyNone)
			o.VMI.Status.EvacuationNodeName = ""
		}), want: Decision{DeletePDB: true}},
		{name: "unset strategy, default LiveMigrate: budget", obs: obs(func(o *Observation) {
			o.VMI.Spec.EvictionStrategy = nil
			o.DefaultStrategy = v1alpha1.EvictionStrategyLiveMigrate
			o.PDBExists = false
			o.VMI.Status.EvacuationNodeName = ""
		}), want: Decision{EnsurePDB: true, PDBMinAvailable: 1}},
		{name: "IfPossible, not migratable: no budget", obs: obs(func(o *Observation) {
			o.VMI = testVMI(v1alpha1.EvictionStrategyLiveMigrateIfPossible, corev1.ConditionFalse)
		}), want: Decision{DeletePDB: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Decide(c.obs)
			if c.wait {
				if d.CreateMigration || d.Wait <= 0 || d.WaitReason == "" {
					t.Fatalf("Decide = %+v, want a wait and no migration", d)
				}
				return
			}
			if d != c.want {
				t.Fatalf("Decide = %+v, want %+v", d, c.want)
			}
		})
	}
	// The backoff doubles per failure in a row: three failures wait 40s after the last.
	i := slices.IndexFunc(cases, func(c struct {
		name string
		obs  Observation
		want Decision
		wait bool
	}) bool {
		return strings.HasPrefix(c.name, "failed three times")
	})
	d := Decide(cases[i].obs)
	if want := 40*time.Second - 30*time.Second; d.Wait != want {
		t.Errorf("three failures: wait %s, want %s", d.Wait, want)
	}
}

func TestPDBAndMigration(t *testing.T) {
	vmi := testVMI(v1alpha1.EvictionStrategyLiveMigrate, corev1.ConditionTrue)
	pdb := NewPDB(vmi, 2)
	if pdb.Name != "kubevisor-eviction-vm1" || pdb.Spec.MinAvailable.IntValue() != 2 ||
		pdb.Spec.Selector.MatchLabels[v1alpha1.CreatedByLabel] != "u1" || !metav1.IsControlledBy(pdb, vmi) {
		t.Errorf("NewPDB = %+v", pdb)
	}
	long := vmi.DeepCopy()
	long.Name = strings.Repeat("a", 250)
	if n := PDBName(long); len(n) > 253 {
		t.Errorf("PDBName of a long name is %d long", len(n))
	}
	m := NewMigration(vmi, "node-1")
	if m.GenerateName != "vm1-evacuation-" || m.Spec.VMIName != "vm1" || m.Labels[v1alpha1.EvacuationLabel] != "node-1" {
		t.Errorf("NewMigration = %+v", m)
	}
	if v := labelValue(strings.Repeat("n", 100)); len(v) > 63 {
		t.Errorf("labelValue of a long node name: %q", v)
	}
}
