package driver

import (
	"context"
	"sync"

	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// Broadcaster fans a hypervisor driver's VM events out to its Events streams, as the contract
// asks: publishing never blocks, each stream has its own queue, and a stream that stopped
// reading loses its oldest events rather than holding up a VM or the other streams. The zero
// value is ready to use.
type Broadcaster struct {
	mu   sync.Mutex
	subs map[*eventSub]struct{}
}

type eventSub struct {
	id     string // "" for all VMs
	mu     sync.Mutex
	queue  []*hypervisorv1.Event
	notify chan struct{}
}

// maxEventQueue bounds a subscriber that stopped reading; the oldest events go first.
const maxEventQueue = 4096

func (b *Broadcaster) subscribe(id string) *eventSub {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.subs == nil {
		b.subs = map[*eventSub]struct{}{}
	}
	s := &eventSub{id: id, notify: make(chan struct{}, 1)}
	b.subs[s] = struct{}{}
	return s
}

func (b *Broadcaster) unsubscribe(s *eventSub) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.subs, s)
}

// Publish queues ev for every stream of all VMs or of ev's.
func (b *Broadcaster) Publish(ev *hypervisorv1.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		if s.id != "" && s.id != ev.GetId() {
			continue
		}
		s.mu.Lock()
		s.queue = append(s.queue, ev)
		if len(s.queue) > maxEventQueue {
			s.queue = s.queue[len(s.queue)-maxEventQueue:]
		}
		s.mu.Unlock()
		select {
		case s.notify <- struct{}{}:
		default:
		}
	}
}

func (s *eventSub) take() []*hypervisorv1.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue
	s.queue = nil
	return q
}

// Serve is Hypervisor.Events on b: the events of the VM id ("" for every VM) published from now
// on, sent in order until ctx is done (nil) or send fails.
func (b *Broadcaster) Serve(ctx context.Context, id string, send func(*hypervisorv1.Event) error) error {
	sub := b.subscribe(id)
	defer b.unsubscribe(sub)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sub.notify:
			for _, ev := range sub.take() {
				if err := send(ev); err != nil {
					return err
				}
			}
		}
	}
}
