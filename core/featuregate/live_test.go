package featuregate

import (
	"sync"
	"testing"
)

func TestLive(t *testing.T) {
	var none *Live
	if none.Load().Enabled(HostDisk) {
		t.Error("a nil Live enables HostDisk")
	}
	on, _ := NewSet(HostDisk)
	l := NewLive(Set{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				_ = l.Load().Enabled(HostDisk)
			}
		})
	}
	for i := range 100 {
		if i%2 == 0 {
			l.Store(on)
		} else {
			l.Store(Set{})
		}
	}
	wg.Wait()
	l.Store(on)
	if !l.Load().Enabled(HostDisk) {
		t.Error("Store(on) not seen by Load")
	}
}
