package vmi

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/mcs"
)

// podListPage is how many launcher pods one request of levels' rebuild lists.
const podListPage = 500

// levels are the VMIs' SELinux MCS levels (package core/mcs): one per VMI, none held by two
// VMIs while both have launcher pods. The allocator is built at its first use, after the
// controller started (or became the leader), from the levels on every launcher pod the API
// server has: the pods are the record, so a restart loses nothing, and a pod another replica
// created just before it stepped down counts (the API server is asked, not the cache). A level
// is released once its VMI has no launcher pod left.
type levels struct {
	// reader lists the launcher pods for the rebuild.
	reader client.Reader
	// categories is the allocator's range (mcs.NewAllocator); 0 is the full one.
	categories int

	mu    sync.Mutex
	alloc *mcs.Allocator // nil until the first use
}

// allocator returns the allocator, built from the launcher pods at the first call.
func (l *levels) allocator(ctx context.Context) (*mcs.Allocator, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.alloc != nil {
		return l.alloc, nil
	}
	a, err := mcs.NewAllocator(l.categories)
	if err != nil {
		return nil, err
	}
	n, err := rebuild(ctx, a, l.reader)
	if err != nil {
		return nil, err
	}
	log.FromContext(ctx).Info("SELinux levels rebuilt from the launcher pods", "levels", a.Len(), "pods", n)
	l.alloc = a
	return a, nil
}

// rebuild reserves in a, for each VMI, the level of its launcher pods that reader lists, and
// returns how many pods it read. A pod whose level cannot be read, or that shares its level with
// another VMI's, is logged: it keeps the level it runs at.
func rebuild(ctx context.Context, a *mcs.Allocator, reader client.Reader) (int, error) {
	logger := log.FromContext(ctx)
	n := 0
	opts := []client.ListOption{client.HasLabels{v1alpha1.CreatedByLabel}, client.Limit(podListPage)}
	for {
		var list corev1.PodList
		if err := reader.List(ctx, &list, opts...); err != nil {
			return n, fmt.Errorf("list launcher pods for their SELinux levels: %w", err)
		}
		for i := range list.Items {
			pod := &list.Items[i]
			n++
			l, ok, err := mcs.PodLevel(pod)
			if err != nil {
				logger.Error(err, "launcher pod's SELinux level not read: it is not reserved", "pod", client.ObjectKeyFromObject(pod))
				continue
			}
			if !ok {
				continue
			}
			owner := pod.Labels[v1alpha1.CreatedByLabel]
			if err := a.Reserve(owner, l); err != nil {
				logger.Error(err, "launcher pod's SELinux level", "pod", client.ObjectKeyFromObject(pod), "vmi", owner, "shared", errors.Is(err, mcs.ErrShared))
			}
		}
		if list.Continue == "" {
			return n, nil
		}
		opts = append(opts[:2:2], client.Continue(list.Continue))
	}
}

// allocate returns the VMI's level, given now if it has none.
func (l *levels) allocate(ctx context.Context, uid types.UID) (mcs.Level, error) {
	a, err := l.allocator(ctx)
	if err != nil {
		return mcs.Level{}, err
	}
	return a.Allocate(string(uid))
}

// holds says whether the VMI holds a level (false before the allocator is built: the rebuild
// finds only levels of pods that exist then).
func (l *levels) holds(uid types.UID) bool {
	l.mu.Lock()
	a := l.alloc
	l.mu.Unlock()
	if a == nil {
		return false
	}
	_, ok := a.Level(string(uid))
	return ok
}

// release gives up the VMI's level. Call it only once the VMI has no launcher pod left.
func (l *levels) release(uid types.UID) {
	l.mu.Lock()
	a := l.alloc
	l.mu.Unlock()
	if a != nil {
		a.Release(string(uid))
	}
}
