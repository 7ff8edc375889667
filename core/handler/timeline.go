package handler

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Timeline is where the time of a VMI's successful sync went: the checks before any driver is
// called (drivers loaded, spec consistent, sandbox reachable), then each step of syncSteps that
// ran, in order. The cluster agent puts it in the VMI's Started event (Note), which
// `kubectl describe vmi` shows and `kubevisor-bench start` reads (ParseTimelineNote).
type Timeline struct {
	// Start is when the sync began, End when its last step returned.
	Start, End time.Time
	// Steps are the stages, in order, each with how long it took.
	Steps []TimelineStep
}

// TimelineStep is one stage of a Timeline.
type TimelineStep struct {
	// Name is timelineChecks or a step's name (stepStorage, ...).
	Name string
	Took time.Duration
}

// timelineChecks names the checks before the steps (newSyncRun) in a Timeline.
const timelineChecks = "checks"

// mark ends the stage name now: it took the time since the previous stage ended.
func (t *Timeline) mark(name string, now time.Time) {
	last := t.Start
	if t.End.After(last) {
		last = t.End
	}
	t.Steps = append(t.Steps, TimelineStep{Name: name, Took: now.Sub(last)})
	t.End = now
}

// Took is the whole sync.
func (t Timeline) Took() time.Duration { return t.End.Sub(t.Start) }

// timelinePrefix starts a Timeline's note.
const timelinePrefix = "VM started: sync took "

// timelineBegan is the layout of a Note's start time, the node's clock in UTC.
const timelineBegan = "2006-01-02T15:04:05.000Z"

// Note is the Timeline as one line, in milliseconds, with the sync's start (the node's clock,
// UTC, to the millisecond), e.g.
//
//	VM started: sync took 812ms (began 2026-12-02T05:43:06.638Z): checks 10ms, storage 300ms, network 250ms, domain 2ms, hypervisor 50ms, start 200ms
func (t Timeline) Note() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s%dms", timelinePrefix, t.Took().Milliseconds())
	if !t.Start.IsZero() {
		fmt.Fprintf(&b, " (began %s)", t.Start.UTC().Format(timelineBegan))
	}
	b.WriteByte(':')
	for i, s := range t.Steps {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, " %s %dms", s.Name, s.Took.Milliseconds())
	}
	return b.String()
}

// ParseTimelineNote reads a Note back: the steps, the start (zero when the note has none) and
// the whole sync (End is Start plus it). It fails on text that is not a Note.
func ParseTimelineNote(note string) (Timeline, error) {
	rest, ok := strings.CutPrefix(note, timelinePrefix)
	if !ok {
		return Timeline{}, fmt.Errorf("not a timeline note: %q", note)
	}
	var t Timeline
	if took, began, ok := strings.Cut(rest, " (began "); ok {
		at, after, ok := strings.Cut(began, ")")
		start, err := time.Parse(timelineBegan, at)
		if !ok || err != nil {
			return Timeline{}, fmt.Errorf("timeline note %q: start %q is not a time", note, at)
		}
		rest, t.Start = took+after, start
	}
	total, steps, ok := strings.Cut(rest, ":")
	if !ok {
		return Timeline{}, fmt.Errorf("timeline note %q: no steps", note)
	}
	whole, err := parseMillis(total)
	if err != nil {
		return Timeline{}, fmt.Errorf("timeline note %q: %w", note, err)
	}
	for _, part := range strings.Split(steps, ",") {
		name, took, ok := strings.Cut(strings.TrimSpace(part), " ")
		if !ok {
			return Timeline{}, fmt.Errorf("timeline note %q: step %q has no duration", note, part)
		}
		d, err := parseMillis(took)
		if err != nil {
			return Timeline{}, fmt.Errorf("timeline note %q: step %s: %w", note, name, err)
		}
		t.Steps = append(t.Steps, TimelineStep{Name: name, Took: d})
	}
	t.End = t.Start.Add(whole)
	return t, nil
}

func parseMillis(s string) (time.Duration, error) {
	n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(s), "ms"), 10, 64)
	if err != nil || !strings.HasSuffix(strings.TrimSpace(s), "ms") {
		return 0, fmt.Errorf("%q is not a duration in ms", s)
	}
	return time.Duration(n) * time.Millisecond, nil
}

// TakeTimeline returns the Timeline of the sync that started VMI uid, once: a second call, or
// one for a VMI this handler did not start, reports false. The cluster agent calls it after a
// Sync that left the VMI running.
func (h *Handler) TakeTimeline(uid types.UID) (Timeline, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.vmis[uid]
	if !ok || e.timeline == nil {
		return Timeline{}, false
	}
	t := *e.timeline
	e.timeline = nil
	return t, true
}
