// Package keyedmutex provides a mutex per key (a VMI id, a work directory), for drivers that
// serve calls for many VMIs at once but must serialise the calls for one.
package keyedmutex

import "sync"

// Mutex is a set of mutexes, one per key, each dropped when nobody holds or waits for it.
// The zero value is ready to use.
type Mutex struct {
	mu    sync.Mutex
	locks map[string]*entry
}

type entry struct {
	mu   sync.Mutex
	refs int
}

// Lock locks key, waiting while another caller holds it, and returns its unlock.
func (m *Mutex) Lock(key string) (unlock func()) {
	m.mu.Lock()
	if m.locks == nil {
		m.locks = map[string]*entry{}
	}
	e := m.locks[key]
	if e == nil {
		e = &entry{}
		m.locks[key] = e
	}
	e.refs++
	m.mu.Unlock()

	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		m.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(m.locks, key)
		}
		m.mu.Unlock()
	}
}

// Len is the number of keys held or waited for; 0 once every unlock has run.
func (m *Mutex) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.locks)
}
