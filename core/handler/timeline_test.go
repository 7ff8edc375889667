package handler

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestTimelineNoteRoundTrip(t *testing.T) {
	start := time.Date(2026, 12, 2, 3, 0, 0, 250_000_000, time.UTC)
	tl := Timeline{Start: start}
	at := start
	for _, s := range []struct {
		name string
		took time.Duration
	}{{timelineChecks, 12 * time.Millisecond}, {stepStorage, 301 * time.Millisecond}, {stepStart, 1500 * time.Millisecond}} {
		at = at.Add(s.took)
		tl.mark(s.name, at)
	}
	note := tl.Note()
	if want := "VM started: sync took 1813ms (began 2026-12-02T03:00:00.250Z): checks 12ms, storage 301ms, start 1500ms"; note != want {
		t.Fatalf("Note = %q, want %q", note, want)
	}
	back, err := ParseTimelineNote(note)
	if err != nil {
		t.Fatal(err)
	}
	if back.Took() != tl.Took() || !back.Start.Equal(start) || !slices.Equal(back.Steps, tl.Steps) {
		t.Errorf("ParseTimelineNote = %+v, want the start and steps of %+v", back, tl)
	}
	// A note without its start (a timeline never started) reads back with a zero Start.
	old, err := ParseTimelineNote("VM started: sync took 12ms: checks 12ms")
	if err != nil || !old.Start.IsZero() || old.Took() != 12*time.Millisecond {
		t.Errorf("note without a start: %+v, %v", old, err)
	}
	for _, bad := range []string{"", "Started the VM", timelinePrefix + "12ms", timelinePrefix + "12ms (began yesterday): checks 12ms",
		timelinePrefix + "12ms (began 2026-12-02T03:00:00.250Z: checks 12ms", timelinePrefix + "12ms: storage", timelinePrefix + "x: storage 1ms", timelinePrefix + "1ms: storage 1s"} {
		if _, err := ParseTimelineNote(bad); err == nil {
			t.Errorf("ParseTimelineNote(%q) succeeded", bad)
		}
	}
}

// TestSyncTimeline: a sync that starts a VM leaves its timeline, every step in order, taken
// once.
func TestSyncTimeline(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	h := e.start()
	vmi := testVMI("demo", "uid-timeline", e.disk)
	before := time.Now()
	mustRun(t, h, vmi)
	tl, ok := h.TakeTimeline(vmi.UID)
	if !ok {
		t.Fatal("no timeline after a sync that started the VM")
	}
	var names []string
	var sum time.Duration
	for _, s := range tl.Steps {
		names = append(names, s.Name)
		sum += s.Took
	}
	if want := []string{timelineChecks, stepStorage, stepNetwork, stepDomain, stepHypervisor, stepStart}; !slices.Equal(names, want) {
		t.Errorf("timeline steps %v, want %v", names, want)
	}
	if tl.Start.Before(before) || sum != tl.Took() || tl.Took() <= 0 {
		t.Errorf("timeline %+v: steps sum to %s, want its whole %s, started after %s", tl, sum, tl.Took(), before)
	}
	if !strings.HasPrefix(tl.Note(), timelinePrefix) {
		t.Errorf("note %q", tl.Note())
	}
	if _, again := h.TakeTimeline(vmi.UID); again {
		t.Error("the timeline was taken twice")
	}
	mustRun(t, h, vmi) // a sync of a running VMI starts nothing
	if _, again := h.TakeTimeline(vmi.UID); again {
		t.Error("a sync of a running VMI made a timeline")
	}
}
