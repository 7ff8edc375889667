package liveconfig_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/textlogger"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/liveconfig"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// logLines collects the watcher's log lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// TestWatcher runs the watcher as a user granted only its +kubebuilder:rbac marker (get, list,
// watch of the one ConfigMap by resourceNames) and follows the ConfigMap through its life: absent
// (the flag's verbosity), created (its verbosity and migrations), made invalid (refused, the last
// good one kept), changed again, deleted (the flag's again).
func TestWatcher(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	ctx := context.Background()
	cfg := env.ImpersonateWithMarkers(t, "liveconfig-watcher", "watcher.go")
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The rights are the one ConfigMap's: another is out of reach.
	if _, err := cs.CoreV1().ConfigMaps(liveconfig.Namespace).Get(ctx, "someone-elses", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("get another ConfigMap: %v, want forbidden", err)
	}
	if _, err := cs.CoreV1().ConfigMaps(liveconfig.Namespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list every ConfigMap: %v, want forbidden", err)
	}

	logCfg := textlogger.NewConfig(textlogger.Verbosity(2))
	// Read through a LockedValue: klog's String is not atomic against the watcher's Set.
	verbosity := &liveconfig.LockedValue{Value: logCfg.Verbosity()}
	var (
		mu   sync.Mutex
		last liveconfig.Config
		n    int
	)
	logs := &logLines{}
	w := &liveconfig.Watcher{Client: cs, Log: funcr.New(func(prefix, args string) {
		logs.mu.Lock()
		logs.lines = append(logs.lines, prefix+" "+args)
		logs.mu.Unlock()
		t.Log(prefix, args)
	}, funcr.Options{}), Appliers: []liveconfig.Applier{
		liveconfig.Verbosity(verbosity, liveconfig.ControllerVerbosity, funcr.New(func(p, a string) { t.Log(p, a) }, funcr.Options{})),
		func(c liveconfig.Config) { mu.Lock(); last, n = c, n+1; mu.Unlock() },
	}}
	if err := w.Ready(nil); err != liveconfig.ErrNotRead {
		t.Errorf("Ready before Start: %v, want ErrNotRead", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Start(wctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	applied := func() (liveconfig.Config, int) { mu.Lock(); defer mu.Unlock(); return last, n }
	eventually := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("waiting for %s: %v (verbosity %s, applied %+v)", what, err, verbosity.String(), w.Current())
		}
	}

	eventually("the flags applied without a ConfigMap", func() bool { _, n := applied(); return n == 1 })
	eventually("ready once the first list is applied", func() bool { return w.Ready(nil) == nil })
	if verbosity.String() != "2" {
		t.Errorf("without a ConfigMap: verbosity %s, want the flag's 2", verbosity)
	}

	doc := func(body string) map[string]string {
		return map[string]string{liveconfig.Key: "apiVersion: " + liveconfig.APIVersion + "\nkind: " + liveconfig.Kind + "\n" + body}
	}
	cms := env.Client
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: liveconfig.Namespace, Name: liveconfig.Name},
		Data: doc("migrations:\n  parallelMigrationsPerCluster: 3\nlogVerbosity:\n  controller: 5\n")}
	if err := cms.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually("verbosity 5", func() bool { return verbosity.String() == "5" })
	if c, _ := applied(); c.Migrations == nil || ptr.Deref(c.Migrations.ParallelMigrationsPerCluster, 0) != 3 {
		t.Errorf("applied %+v, want parallelMigrationsPerCluster 3", c)
	}

	// A bad version is refused, with the field's path, and the last good one stays.
	_, before := applied()
	cm.Data = doc("migrations:\n  parallelMigrationsPerCluster: 0\nlogVerbosity:\n  controller: 9\n")
	if err := cms.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually("the refusal logged", func() bool {
		return logs.has("live configuration refused") && logs.has("data[config.yaml].migrations.parallelMigrationsPerCluster: Invalid value: 0")
	})
	if _, after := applied(); after != before || verbosity.String() != "5" {
		t.Errorf("after a bad version: %d applies (was %d), verbosity %s: want nothing applied, 5 kept", after, before, verbosity)
	}
	if c := w.Current(); ptr.Deref(c.Migrations.ParallelMigrationsPerCluster, 0) != 3 {
		t.Errorf("Current %+v after a bad version, want the last good one", c)
	}

	cm.Data = doc("logVerbosity:\n  controller: 7\n")
	if err := cms.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually("verbosity 7", func() bool { return verbosity.String() == "7" })
	if c, _ := applied(); c.Migrations != nil {
		t.Errorf("applied %+v: the migrations left the document", c)
	}

	if err := cms.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually("the flag's verbosity again", func() bool { return verbosity.String() == "2" })
	if c, _ := applied(); c.LogVerbosity != nil || c.Migrations != nil {
		t.Errorf("after the deletion: applied %+v, want every field the flags'", c)
	}
}
