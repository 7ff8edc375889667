package bench

import (
	"bytes"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Beat is one heartbeat line of the guest ("HB-<uptime>", the guest's /proc/uptime when it
// printed it) as it reached the host: when, and through which stream (a node's console log, a
// QEMU's serial socket).
type Beat struct {
	Uptime  float64 // seconds, the guest's clock
	Arrival time.Time
	Stream  string
}

// BeatRecorder is an io.Writer that takes a serial console's bytes, which may split lines
// anywhere, and records each heartbeat line with the time its end arrived. It is safe for
// concurrent use.
type BeatRecorder struct {
	stream string
	now    func() time.Time

	mu    sync.Mutex
	line  lineBuffer
	beats []Beat
}

// NewBeatRecorder returns a recorder of the stream named stream.
func NewBeatRecorder(stream string) *BeatRecorder {
	return &BeatRecorder{stream: stream, now: time.Now}
}

// Write implements io.Writer. It never fails.
func (r *BeatRecorder) Write(p []byte) (int, error) {
	n, now := len(p), r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.line.feed(p, func(line []byte) {
		if up, ok := parseBeat(line); ok {
			r.beats = append(r.beats, Beat{Uptime: up, Arrival: now, Stream: r.stream})
		}
	})
	return n, nil
}

// lineBuffer splits a console's bytes, which may split lines anywhere, into lines ended by CR
// or LF. A line longer than 4 KiB keeps its last 1 KiB: no line the bench looks for is that long.
type lineBuffer struct{ partial []byte }

// feed calls each with every line p completes, without its end.
func (b *lineBuffer) feed(p []byte, each func(line []byte)) {
	for len(p) > 0 {
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			b.partial = append(b.partial, p...)
			if len(b.partial) > 4096 {
				b.partial = append(b.partial[:0], b.partial[len(b.partial)-1024:]...)
			}
			return
		}
		b.partial = append(b.partial, p[:i]...)
		each(b.partial)
		b.partial = b.partial[:0]
		p = p[i+1:]
	}
}

// Beats returns the beats recorded so far.
func (r *BeatRecorder) Beats() []Beat {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.beats)
}

// beatRE is a heartbeat line; what the shell's echo of the command typed may leave before it
// (a prompt) is allowed, the command itself ("echo HB-$up") is not a beat.
var beatRE = regexp.MustCompile(`HB-([0-9]+(?:\.[0-9]+)?)\s*$`)

func parseBeat(line []byte) (float64, bool) {
	m := beatRE.FindSubmatch(line)
	if m == nil {
		return 0, false
	}
	up, err := strconv.ParseFloat(string(m[1]), 64)
	return up, err == nil
}

// Gap is the longest interruption of a guest's heartbeat seen from the host.
type Gap struct {
	// Arrival is the longest interval between the arrival times of two beats in a row (in
	// the guest's uptime order): what someone following the console saw.
	Arrival time.Duration
	// Guest is the same with each beat dated at the earliest its own stream can prove it was
	// printed: a beat that came late, behind beats printed after it (a console attached after
	// the guest resumed replays what it printed meanwhile), is dated by the arrival of a
	// later beat of the same stream less the guest's uptime between the two. As the guest's
	// clock runs at most as fast as the host's (it stops while the guest is paused), this
	// never dates a beat before it was printed; it takes the console's delivery delay out
	// and leaves the guest's own interruption (plus one heartbeat period).
	Guest time.Duration
	// Beats is how many distinct beats there were.
	Beats int
	// From and To are the uptimes of the beats around the longest Guest interval.
	From, To float64
}

// HeartbeatGap computes the gap of beats from any number of streams. A beat seen twice (a
// replayed backlog, another stream) counts once, at its first arrival and its earliest dating.
// It needs two beats.
func HeartbeatGap(beats []Beat) (Gap, error) {
	// Per stream: distinct uptimes, first arrival.
	byStream := map[string][]Beat{}
	for _, b := range beats {
		byStream[b.Stream] = append(byStream[b.Stream], b)
	}
	type datedBeat struct {
		up             float64
		arrival, dated time.Time
	}
	var all []datedBeat
	for _, bs := range byStream {
		slices.SortStableFunc(bs, func(a, b Beat) int {
			if c := cmpFloat(a.Uptime, b.Uptime); c != 0 {
				return c
			}
			return a.Arrival.Compare(b.Arrival)
		})
		bs = slices.CompactFunc(bs, func(a, b Beat) bool { return a.Uptime == b.Uptime })
		// dated[i] = min over j >= i of arrival[j] - (uptime[j] - uptime[i]).
		n := len(all)
		for _, b := range bs {
			all = append(all, datedBeat{up: b.Uptime, arrival: b.Arrival, dated: b.Arrival})
		}
		for i := len(all) - 2; i >= n; i-- {
			back := all[i+1].dated.Add(-uptimeDelta(all[i+1].up - all[i].up))
			if back.Before(all[i].dated) {
				all[i].dated = back
			}
		}
	}
	slices.SortStableFunc(all, func(a, b datedBeat) int {
		if c := cmpFloat(a.up, b.up); c != 0 {
			return c
		}
		return a.arrival.Compare(b.arrival)
	})
	// One beat per uptime: the earliest arrival and the earliest dating of any stream.
	merged := all[:0]
	for _, b := range all {
		if n := len(merged); n > 0 && merged[n-1].up == b.up {
			if b.dated.Before(merged[n-1].dated) {
				merged[n-1].dated = b.dated
			}
			continue
		}
		merged = append(merged, b)
	}
	all = merged
	if len(all) < 2 {
		return Gap{}, fmt.Errorf("%d heartbeat(s), want at least 2", len(all))
	}
	g := Gap{Beats: len(all)}
	for i := 1; i < len(all); i++ {
		if d := all[i].arrival.Sub(all[i-1].arrival); d > g.Arrival {
			g.Arrival = d
		}
		if d := all[i].dated.Sub(all[i-1].dated); d > g.Guest {
			g.Guest, g.From, g.To = d, all[i-1].up, all[i].up
		}
	}
	return g, nil
}

// uptimeDelta is an uptime difference in seconds as a duration, to the microsecond (the guest
// prints hundredths; float subtraction leaves a few nanoseconds off).
func uptimeDelta(s float64) time.Duration {
	return time.Duration(math.Round(s*1e6)) * time.Microsecond
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// MigratedNote is what the source node's handler's Migrated event says of a migration: the
// hypervisor's figures.
type MigratedNote struct {
	UID, From, To string
	Total         time.Duration
	Downtime      time.Duration
	MemoryBytes   uint64
	DiskBytes     uint64
	Mode          string
}

var migratedRE = regexp.MustCompile(`^migration (\S+) from node (\S+) to node (\S+): total (\S+), downtime (\S+), memory ([0-9]+) bytes, disks ([0-9]+) bytes, mode (\S+) \(the hypervisor's figures\)$`)

// ParseMigratedNote parses the note of a Migrated event.
func ParseMigratedNote(note string) (MigratedNote, error) {
	m := migratedRE.FindStringSubmatch(note)
	if m == nil {
		return MigratedNote{}, fmt.Errorf("not a Migrated note: %q", note)
	}
	n := MigratedNote{UID: m[1], From: m[2], To: m[3], Mode: m[8]}
	var err error
	if n.Total, err = time.ParseDuration(m[4]); err != nil {
		return MigratedNote{}, fmt.Errorf("total: %w", err)
	}
	if n.Downtime, err = time.ParseDuration(m[5]); err != nil {
		return MigratedNote{}, fmt.Errorf("downtime: %w", err)
	}
	if n.MemoryBytes, err = strconv.ParseUint(m[6], 10, 64); err != nil {
		return MigratedNote{}, fmt.Errorf("memory: %w", err)
	}
	if n.DiskBytes, err = strconv.ParseUint(m[7], 10, 64); err != nil {
		return MigratedNote{}, fmt.Errorf("disks: %w", err)
	}
	return n, nil
}
