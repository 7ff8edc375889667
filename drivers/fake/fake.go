// Package fake is a simulated driver set: in-memory Hypervisor, Network, Storage and Device
// drivers that behave like real ones per the contracts of core/driver, for unit tests, scale
// tests and trying Kubevisor where no hypervisor runs.
//
// The drivers say they are simulated: Info's description starts with "simulated" and
// Fingerprint reports the attribute simulated=true. No guest, tap device or host device is
// real. Only Storage touches the file system (small sparse files under the work directory), and
// Hypervisor keeps a small record file in a VM's run directory so that a new driver process can
// re-adopt the VM (Recover).
//
// Each driver is configured through Configure with JSON; see HypervisorConfig, NetworkConfig,
// StorageConfig and DeviceConfig. Every driver is safe for concurrent use.
package fake

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
)

// Name is the name every fake driver reports in Info, whatever its kind.
const Name = "fake"

// Version is the fake drivers' release version reported in Info.
var Version = "0.1.0"

// SimulatedAttribute is the Fingerprint attribute (set to "true") by which every fake driver
// says it is simulated.
const SimulatedAttribute = "simulated"

// base is what every fake driver shares: Info, Fingerprint and the bookkeeping of Configure.
type base struct {
	kind        basev1.Kind
	description string

	mu sync.Mutex
	// changed is closed and replaced whenever what Fingerprint or Watch report may have
	// changed.
	changed chan struct{}
}

func newBase(kind basev1.Kind, description string) base {
	return base{kind: kind, description: description, changed: make(chan struct{})}
}

// Info implements driver.Driver.
func (b *base) Info(context.Context) (*basev1.InfoResponse, error) {
	return &basev1.InfoResponse{
		Name:        Name,
		Kind:        b.kind,
		Version:     Version,
		Description: b.description,
	}, nil
}

// fingerprint sends the fingerprint made by fp at once and again after every change, until ctx
// is done.
func (b *base) fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error, fp func() *basev1.FingerprintResponse) error {
	for {
		b.mu.Lock()
		changed := b.changed
		msg := fp()
		b.mu.Unlock()
		if err := send(msg); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// notifyLocked wakes every Fingerprint and Watch stream. b.mu must be held.
func (b *base) notifyLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// healthy is the fingerprint of a fake driver with nothing to report beyond being simulated.
func healthy(description string) *basev1.FingerprintResponse {
	return &basev1.FingerprintResponse{
		Health:            basev1.Health_HEALTH_HEALTHY,
		HealthDescription: description,
		Attributes:        map[string]string{SimulatedAttribute: "true"},
	}
}

// decodeConfig decodes a driver's JSON configuration into v, which holds the defaults. An
// empty configuration keeps them; unknown fields are an error, so that a misspelt knob is not
// silently ignored.
func decodeConfig(raw []byte, v any) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return status.Errorf(codes.InvalidArgument, "config: %v", err)
	}
	if dec.More() {
		return status.Error(codes.InvalidArgument, "config: more than one JSON value")
	}
	return nil
}

// invalid returns an InvalidArgument status error.
func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// alreadyExists returns an AlreadyExists status error.
func alreadyExists(format string, args ...any) error {
	return status.Errorf(codes.AlreadyExists, format, args...)
}

// notFound returns a NotFound status error.
func notFound(format string, args ...any) error {
	return status.Errorf(codes.NotFound, format, args...)
}

// precondition returns a FailedPrecondition status error.
func precondition(format string, args ...any) error {
	return status.Errorf(codes.FailedPrecondition, format, args...)
}

// ctxErr turns the error of a done context into a status error.
func ctxErr(ctx context.Context) error {
	return status.FromContextError(ctx.Err()).Err()
}

// Duration is a time.Duration that reads from and writes to JSON as a Go duration string
// ("250ms", "2s").
type Duration time.Duration

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"250ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("duration %q is negative", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// queue is an unbounded FIFO with one consumer, so that a producer holding a driver's lock never
// blocks on a slow consumer (an Events stream, a console).
type queue[T any] struct {
	mu     sync.Mutex
	items  []T
	closed bool
	notify chan struct{}
}

func newQueue[T any]() *queue[T] {
	return &queue[T]{notify: make(chan struct{}, 1)}
}

// push appends items unless the queue is closed.
func (q *queue[T]) push(items ...T) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.items = append(q.items, items...)
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// close ends the queue: the consumer gets what is queued, then open=false.
func (q *queue[T]) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		select {
		case q.notify <- struct{}{}:
		default:
		}
	}
}

// next waits for items and returns them; open is false once the queue is closed and drained,
// ctx is done, or stop is closed.
func (q *queue[T]) next(ctx context.Context, stop <-chan struct{}) (items []T, open bool) {
	for {
		q.mu.Lock()
		items, q.items = q.items, nil
		closed := q.closed
		q.mu.Unlock()
		if len(items) > 0 {
			return items, true
		}
		if closed {
			return nil, false
		}
		select {
		case <-q.notify:
		case <-ctx.Done():
			return nil, false
		case <-stop:
			return nil, false
		}
	}
}
