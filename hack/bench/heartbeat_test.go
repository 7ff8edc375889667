package bench

import (
	"strings"
	"testing"
	"time"
)

func TestBeatRecorder(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	now := t0
	r := NewBeatRecorder("s")
	r.now = func() time.Time { return now }
	// The shell's echo of the typed command is no beat; lines split anywhere; CRLF.
	for _, chunk := range []string{"/ # while :; do read -r up idle </proc/uptime; echo HB-$up; sleep 0.1; done &\r\n", "HB-12.", "34\r"} {
		_, _ = r.Write([]byte(chunk))
		now = now.Add(time.Second)
	}
	_, _ = r.Write([]byte("\nHB-13.45\r\nnoise HB-x\r\n/ # HB-14\r\n"))
	got := r.Beats()
	want := []Beat{{12.34, t0.Add(2 * time.Second), "s"}, {13.45, t0.Add(3 * time.Second), "s"}, {14, t0.Add(3 * time.Second), "s"}}
	if len(got) != len(want) {
		t.Fatalf("beats %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("beat %d: %v, want %v", i, got[i], want[i])
		}
	}
}

func TestHeartbeatGap(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// The source prints every 100 ms up to uptime 10.3 (host 300 ms), then the guest pauses
	// for the switch-over; the target's console is attached late and replays 10.4..10.8 at
	// once at 2800 ms, then the beats come live, though a little late themselves.
	beats := []Beat{
		{10.0, at(0), "src"}, {10.1, at(100), "src"}, {10.2, at(200), "src"}, {10.3, at(300), "src"},
		{10.4, at(2800), "dst"}, {10.5, at(2800), "dst"}, {10.6, at(2800), "dst"}, {10.7, at(2800), "dst"}, {10.8, at(2800), "dst"},
		{10.9, at(2810), "dst"}, {11.0, at(2900), "dst"}, {11.1, at(3000), "dst"},
	}
	// A replayed duplicate of a source line, later, counts once.
	beats = append(beats, Beat{10.2, at(5000), "src"})
	g, err := HeartbeatGap(beats)
	if err != nil {
		t.Fatal(err)
	}
	if g.Beats != 12 {
		t.Errorf("beats %d, want 12", g.Beats)
	}
	if g.Arrival != 2500*time.Millisecond {
		t.Errorf("arrival gap %v, want 2.5s (10.3 at 300 ms, 10.4 at 2800 ms)", g.Arrival)
	}
	// 10.4 is dated by 11.1's arrival (3000 ms) less 0.7 s of uptime: 2300 ms, the earliest
	// the target's console proves it was printed.
	if g.Guest != 2000*time.Millisecond || g.From != 10.3 || g.To != 10.4 {
		t.Errorf("guest gap %v between %v and %v, want 2s between 10.3 and 10.4", g.Guest, g.From, g.To)
	}

	// Live throughout: the dating changes nothing.
	live := []Beat{{1.0, at(0), "a"}, {1.1, at(100), "a"}, {1.2, at(650), "b"}, {1.3, at(750), "b"}}
	if g, err := HeartbeatGap(live); err != nil || g.Guest != 550*time.Millisecond || g.Arrival != 550*time.Millisecond {
		t.Errorf("live: %+v, %v; want both gaps 550ms", g, err)
	}
	// The same beats through a second stream, one of them late in a replay: each beat counts
	// once, at its earliest arrival and dating.
	both := append(append([]Beat{}, live...), Beat{1.1, at(90), "c"}, Beat{1.2, at(2000), "c"}, Beat{1.3, at(2100), "c"})
	if g, err := HeartbeatGap(both); err != nil || g.Beats != 4 || g.Guest != 560*time.Millisecond || g.Arrival != 560*time.Millisecond {
		t.Errorf("two streams: %+v, %v; want 4 beats, both gaps 560ms", g, err)
	}
	if _, err := HeartbeatGap(live[:1]); err == nil {
		t.Error("one beat: no error")
	}
}

func TestParseMigratedNote(t *testing.T) {
	note := "migration 3f1c-9a from node kv-node to node kv-node2: total 1.234s, downtime 56ms, memory 134217728 bytes, disks 1048576 bytes, mode PreCopy (the hypervisor's figures)"
	n, err := ParseMigratedNote(note)
	if err != nil {
		t.Fatal(err)
	}
	want := MigratedNote{UID: "3f1c-9a", From: "kv-node", To: "kv-node2", Total: 1234 * time.Millisecond, Downtime: 56 * time.Millisecond,
		MemoryBytes: 128 << 20, DiskBytes: 1 << 20, Mode: "PreCopy"}
	if n != want {
		t.Errorf("%+v, want %+v", n, want)
	}
	for _, bad := range []string{
		"",
		strings.Replace(note, "total 1.234s", "total soon", 1),
		strings.Replace(note, " (the hypervisor's figures)", "", 1),
		strings.Replace(note, "memory 134217728", "memory -1", 1),
	} {
		if _, err := ParseMigratedNote(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
