package liveconfig

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
)

// The watcher reads only the one ConfigMap, by name: get, list and watch limited to that name
// (a list or watch with the field selector metadata.name=<name> is authorized against
// resourceNames).
//
// +kubebuilder:rbac:groups="",namespace=kubevisor-system,resources=configmaps,resourceNames=kubevisor-config,verbs=get;list;watch

// ReasonRefused is the reason of the Warning Event on a refused live configuration.
const ReasonRefused = "LiveConfigRefused"

// Applier takes one valid configuration. It is called from one goroutine, in order; a field the
// configuration leaves nil means the component's base (its flag). It must not block for long.
type Applier func(Config)

// Watcher watches the ConfigMap Namespace/Name and calls every applier with each valid version
// of it, and with New() (every field the flags') when it is absent or deleted.
//
// Limits: a version that does not parse or validate is refused (an error log line naming the
// ConfigMap's resourceVersion and each bad field's path, and a Warning Event on the ConfigMap
// when Recorder is set) and the last good configuration stays applied; no condition is
// written anywhere. Appliers are called again on every change of the ConfigMap, even one that
// keeps the document.
type Watcher struct {
	// Client reads the ConfigMap.
	Client kubernetes.Interface
	// Namespace and Name of the ConfigMap; empty means the package's.
	Namespace, Name string
	// Appliers take each configuration, in order.
	Appliers []Applier
	// Log receives a line per applied or refused version.
	Log logr.Logger
	// Recorder, when set, writes a Warning Event ReasonRefused on the ConfigMap for each
	// refused version (one component should: each one that refuses writes its own).
	Recorder recorder.EventRecorder

	mu      sync.Mutex
	current Config
	applied bool
	synced  bool
}

// ErrNotRead is Ready's answer until the watcher has read the ConfigMap once.
var ErrNotRead = errors.New("the live configuration has not been read yet")

// Ready is a readiness check (healthz.Checker): nil once the first list of the ConfigMap is
// done and what it found is applied (or refused, or, when there is none, the flags), so that a
// component that acts on the live configuration (kubevisor-api's feature gates) does not serve
// on its flags alone for the moment after it starts.
func (w *Watcher) Ready(*http.Request) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.synced {
		return ErrNotRead
	}
	return nil
}

// NeedLeaderElection is false: every replica of a component takes the configuration (a
// controller-runtime manager then starts the watcher on every replica, not only the leader).
func (w *Watcher) NeedLeaderElection() bool { return false }

// Current is the configuration last applied (New() before the first).
func (w *Watcher) Current() Config {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.applied {
		return New()
	}
	return w.current
}

// Start watches until ctx ends; it returns nil. It applies New() first when the ConfigMap does not exist once
// the first list is done, so that the flags hold until a configuration arrives.
func (w *Watcher) Start(ctx context.Context) error {
	ns, name := or(w.Namespace, Namespace), or(w.Name, Name)
	lw := cache.NewListWatchFromClient(w.Client.CoreV1().RESTClient(), "configmaps", ns, fields.OneTermEqualSelector("metadata.name", name))
	store, ctl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.ConfigMap{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { w.observe(o) },
			UpdateFunc: func(_, o any) { w.observe(o) },
			DeleteFunc: func(any) {
				w.Log.Info("live configuration deleted: the flags apply", "configMap", ns+"/"+name)
				w.apply(New())
			},
		},
	})
	// Start returns only once the informer stopped: no applier runs after it.
	var running sync.WaitGroup
	running.Go(func() { ctl.Run(ctx.Done()) })
	defer running.Wait()
	if !cache.WaitForCacheSync(ctx.Done(), ctl.HasSynced) {
		return nil // ctx ended
	}
	if len(store.List()) == 0 {
		w.Log.Info("no live configuration: the flags apply", "configMap", ns+"/"+name)
		w.apply(New())
	}
	w.mu.Lock()
	w.synced = true
	w.mu.Unlock()
	<-ctx.Done()
	return nil
}

// observe applies the ConfigMap o holds when it is valid, and refuses it otherwise.
func (w *Watcher) observe(o any) {
	cm, ok := o.(*corev1.ConfigMap)
	if !ok {
		return
	}
	c, err := Parse(cm.Data)
	if err != nil {
		w.Log.Error(err, "live configuration refused: the last good one stays applied",
			"configMap", cm.Namespace+"/"+cm.Name, "resourceVersion", cm.ResourceVersion)
		if w.Recorder != nil {
			w.Recorder.Eventf(cm, nil, corev1.EventTypeWarning, ReasonRefused, "Apply",
				"refused, the configuration before it stays applied: %v", err)
		}
		return
	}
	w.Log.Info("live configuration applied", "configMap", cm.Namespace+"/"+cm.Name, "resourceVersion", cm.ResourceVersion,
		"config", fmt.Sprintf("%+v", cm.Data[Key]))
	w.apply(c)
}

func (w *Watcher) apply(c Config) {
	w.mu.Lock()
	w.current, w.applied = c, true
	w.mu.Unlock()
	for _, a := range w.Appliers {
		a(c)
	}
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
