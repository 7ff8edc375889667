package bench

import (
	"bytes"
	"sync"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
)

// KernelWatcher is an io.Writer that takes a guest's serial console and keeps the lines in which
// the guest's kernel reports that something went wrong (an oops, a BUG, a bad page, a panic).
// A migration that the hypervisor calls completed can still have handed the target a guest whose
// memory is not the source's: heartbeats may go on for a while, and the kernel's own checks are
// what notices first. It is safe for concurrent use.
type KernelWatcher struct {
	mu    sync.Mutex
	line  lineBuffer
	found []string
}

// maxKernelLines bounds what a watcher keeps.
const maxKernelLines = 20

// Write implements io.Writer. It never fails.
func (w *KernelWatcher) Write(p []byte) (int, error) {
	n := len(p)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.line.feed(p, func(line []byte) {
		if conformance.GuestKernelTrouble.Match(line) && len(w.found) < maxKernelLines {
			w.found = append(w.found, string(bytes.TrimSpace(line)))
		}
	})
	return n, nil
}

// Trouble returns the kernel's trouble lines seen so far, nil when none.
func (w *KernelWatcher) Trouble() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.found) == 0 {
		return nil
	}
	return append([]string(nil), w.found...)
}
