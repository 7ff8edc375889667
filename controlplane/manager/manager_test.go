package manager_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/controlplane/launcherpod"
	"github.com/kubevisor/kubevisor/controlplane/manager"
	"github.com/kubevisor/kubevisor/controlplane/metrics"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

const timeout = 90 * time.Second

type replica struct {
	mgr            ctrl.Manager
	metrics, probe string
	cancel         context.CancelFunc
	done           chan error
}

func (r *replica) leads() bool {
	select {
	case <-r.mgr.Elected():
		return true
	default:
		return false
	}
}

func (r *replica) stop(t *testing.T) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	if err := <-r.done; err != nil {
		t.Errorf("manager: %v", err)
	}
}

func startReplica(t *testing.T, env *envtest.Env) *replica {
	t.Helper()
	r := &replica{metrics: envtest.FreeAddr(t), probe: envtest.FreeAddr(t), done: make(chan error, 1)}
	mgr, err := manager.New(manager.Config{
		RestConfig:              env.Config,
		LeaderElection:          true,
		LeaderElectionNamespace: "default",
		LeaseDuration:           4 * time.Second,
		RenewDeadline:           3 * time.Second,
		RetryPeriod:             500 * time.Millisecond,
		MetricsAddr:             r.metrics,
		HealthProbeAddr:         r.probe,
		Pod:                     launcherpod.Config{LauncherImage: "kubevisor-launcher:test"},
		SkipNameValidation:      true,
	})
	if err != nil {
		t.Fatal(err)
	}
	r.mgr = mgr
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- mgr.Start(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func get(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok && err == nil, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v (last error: %v)", what, err, last)
	}
}

var phaseCount = regexp.MustCompile(`(?m)^kubevisor_vmi_phase_count\{phase="(\w+)"\} (\d+)$`)

// vmiPhaseTotal sums kubevisor_vmi_phase_count over the phases; -1 when the metric is absent.
func vmiPhaseTotal(body string) int {
	ms := phaseCount.FindAllStringSubmatch(body, -1)
	if len(ms) == 0 {
		return -1
	}
	total := 0
	for _, m := range ms {
		n, _ := strconv.Atoi(m[2])
		total += n
	}
	return total
}

func TestTwoReplicas(t *testing.T) {
	ctrl.SetLogger(funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{}))
	env := envtest.Start(t, envtest.Options{})
	a, b := startReplica(t, env), startReplica(t, env)

	eventually(t, "a leader", func() (bool, error) { return a.leads() || b.leads(), nil })
	leader, follower := a, b
	if b.leads() {
		leader, follower = b, a
	}
	if follower.leads() {
		t.Fatal("both replicas lead")
	}
	var lease coordinationv1.Lease
	if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: manager.DefaultLeaderElectionID}, &lease); err != nil {
		t.Fatalf("leader election lease: %v", err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Fatalf("lease %s has no holder", lease.Name)
	}

	for _, r := range []*replica{leader, follower} {
		for _, path := range []string{"/healthz", "/readyz"} {
			url := "http://" + r.probe + path
			eventually(t, url+" answering 200", func() (bool, error) {
				code, _, err := get(url)
				return code == http.StatusOK, err
			})
		}
	}

	// /metrics is HTTPS for a token allowed get on /metrics (core/metricsauth): a scraper's.
	if code, _, err := envtest.GetMetrics(leader.metrics, "", nil); err != nil || code != http.StatusUnauthorized {
		t.Fatalf("/metrics without a token: %d %v, want 401", code, err)
	}
	token := env.MetricsReaderToken(t, "monitoring", "prometheus")
	_, body, err := envtest.GetMetrics(leader.metrics, token, nil)
	if err != nil {
		t.Fatal(err)
	}
	runningBefore := runningCount(body)

	// A VMI that the handler reports Running, and a migration of it (refused: the VMI is not
	// LiveMigratable), give the controllers something to reconcile and the metrics something to count.
	ctx := context.Background()
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "default"}}
	if err := env.Client.Create(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), vmi); err != nil {
			return err
		}
		vmi.Status.Phase, vmi.Status.NodeName = v1alpha1.Running, "node-a"
		return env.Client.Status().Update(ctx, vmi)
	}); err != nil {
		t.Fatal(err)
	}
	mig := &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "mig1", Namespace: "default"},
		Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"},
	}
	if err := env.Client.Create(ctx, mig); err != nil {
		t.Fatal(err)
	}

	want := []string{
		`controller_runtime_reconcile_total{controller="vmi",result="success"}`,
		`controller_runtime_reconcile_total{controller="vm",result="success"}`,
		`controller_runtime_reconcile_total{controller="vmirs",result="success"}`,
		`controller_runtime_reconcile_total{controller="migration",result="success"}`,
		`controller_runtime_reconcile_errors_total{controller="vmi"}`,
		`controller_runtime_reconcile_errors_total{controller="migration"}`,
	}
	eventually(t, "the Kubevisor metrics and the reconcile counters on /metrics", func() (bool, error) {
		var err error
		_, body, err = envtest.GetMetrics(leader.metrics, token, nil)
		if err != nil {
			return false, err
		}
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false, fmt.Errorf("no %s", w)
			}
		}
		// The histogram is process-wide: with -count=N it holds earlier runs' VMIs too.
		if n := runningCount(body); n <= runningBefore {
			return false, fmt.Errorf("%s_count is %d, want more than %d", metrics.CreationToRunningName, n, runningBefore)
		}
		if n := vmiPhaseTotal(body); n != 1 {
			return false, fmt.Errorf("kubevisor_vmi_phase_count sums to %d, want 1", n)
		}
		for _, c := range []string{"vmi", "migration"} {
			if !regexp.MustCompile(`(?m)^controller_runtime_reconcile_total\{controller="` + c + `",result="\w+"\} [1-9]`).MatchString(body) {
				return false, fmt.Errorf("no %s reconcile counted:\n%s", c, grep(body, "controller_runtime_reconcile_total"))
			}
		}
		return true, nil
	})
	eventually(t, "the migration refused", func() (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(mig), mig)
		return mig.Status.Phase == v1alpha1.MigrationFailed, err
	})

	// The leader steps down; the follower takes over and reports the VMIs.
	leader.stop(t)
	eventually(t, "the follower leading", func() (bool, error) { return follower.leads(), nil })
	eventually(t, "the new leader's VMI count", func() (bool, error) {
		_, body, err := envtest.GetMetrics(follower.metrics, token, nil)
		return vmiPhaseTotal(body) == 1, err
	})
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, _, err := get("http://" + follower.probe + path); err != nil || code != http.StatusOK {
			t.Errorf("%s on the new leader: %d %v", path, code, err)
		}
	}
}

var runningCountLine = regexp.MustCompile(`(?m)^` + metrics.CreationToRunningName + `_count (\d+)$`)

// runningCount is the creation-to-running histogram's count; -1 when it is absent.
func runningCount(body string) int {
	m := runningCountLine.FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func grep(body, prefix string) string {
	var out []string
	for l := range strings.SplitSeq(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
