package bench

import (
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   []time.Duration
		want time.Duration
	}{
		{"none", nil, 0},
		{"one", []time.Duration{5}, 5},
		{"odd, unsorted", []time.Duration{9, 1, 5, 7, 3}, 5},
		{"even: mean of the middle two", []time.Duration{4 * time.Second, 1 * time.Second, 3 * time.Second, 2 * time.Second}, 2500 * time.Millisecond},
		{"even, odd middles: rounded down", []time.Duration{3, 4}, 3},
		{"duplicates", []time.Duration{2, 2, 2, 9}, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := append([]time.Duration(nil), tt.in...)
			if got := Median(tt.in); got != tt.want {
				t.Errorf("Median(%v) = %v, want %v", tt.in, got, tt.want)
			}
			for i := range in {
				if in[i] != tt.in[i] {
					t.Fatalf("Median changed its input: %v, was %v", tt.in, in)
				}
			}
		})
	}
	if got := Median([]uint64{1 << 63, 1<<63 + 2}); got != 1<<63+1 {
		t.Errorf("Median of large uint64s = %d, want %d (no overflow)", got, uint64(1<<63+1))
	}
}

// clock is a fake time source that advances a second per reading.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { c.t = c.t.Add(time.Second); return c.t }

func newTestWatcher(marker string) (*MarkerWatcher, *clock) {
	w := NewMarkerWatcher(marker)
	c := &clock{t: time.Unix(1000, 0)}
	w.now = c.now
	return w, c
}

func found(w *MarkerWatcher) bool {
	select {
	case <-w.Found():
		return true
	default:
		return false
	}
}

func TestMarkerWatcherSplitAnywhere(t *testing.T) {
	const marker = "KUBEVISOR-GUEST-READY"
	stream := "[    3.1] virtio_blk virtio1: [vda] 131072 512-byte logical blocks\r\nKUBEVISOR-IP: none\r\n" + marker + "\r\n/ # "
	at := strings.Index(stream, marker)
	// Every way to cut the stream in three: the marker is found on the write that completes it.
	for i := 0; i <= len(stream); i++ {
		for j := i; j <= len(stream); j++ {
			w, c := newTestWatcher(marker)
			chunks := []string{stream[:i], stream[i:j], stream[j:]}
			var completing time.Time
			sent := 0
			for _, ch := range chunks {
				if n, err := w.Write([]byte(ch)); n != len(ch) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
				sent += len(ch)
				if completing.IsZero() && sent >= at+len(marker) {
					completing = c.t
				}
			}
			if !found(w) {
				t.Fatalf("cut at %d and %d: marker not found", i, j)
			}
			if got := w.SeenAt(); !got.Equal(completing) {
				t.Fatalf("cut at %d and %d: SeenAt %v, want the time of the completing write %v", i, j, got, completing)
			}
		}
	}
}

func TestMarkerWatcherByteByByte(t *testing.T) {
	w, _ := newTestWatcher("READY")
	for _, b := range []byte("xxREADREADYyy") {
		_, _ = w.Write([]byte{b})
	}
	if !found(w) {
		t.Fatal("marker written a byte at a time not found")
	}
	if w.Tail() != "xxREADREADYyy" {
		t.Errorf("Tail = %q", w.Tail())
	}
}

func TestMarkerWatcherNoFalseMatch(t *testing.T) {
	w, _ := newTestWatcher("KUBEVISOR-GUEST-READY")
	for _, ch := range []string{"KUBEVISOR-GUEST-", "REAX", "KUBEVISOR-GUEST-REA", "\nDY", "KUBEVISOR-", "GUEST-READ"} {
		_, _ = w.Write([]byte(ch))
	}
	if found(w) || !w.SeenAt().IsZero() {
		t.Fatal("found a marker that was never written whole")
	}
	_, _ = w.Write([]byte("Y"))
	if !found(w) {
		t.Fatal("marker completed by its last byte not found")
	}
	first := w.SeenAt()
	_, _ = w.Write([]byte("KUBEVISOR-GUEST-READY again"))
	if !w.SeenAt().Equal(first) {
		t.Error("a second marker moved SeenAt")
	}
}

func TestMarkerWatcherTailBounded(t *testing.T) {
	w, _ := newTestWatcher("M")
	big := strings.Repeat("a", 3*tailSize) + "END"
	_, _ = w.Write([]byte(big[:100]))
	_, _ = w.Write([]byte(big[100:]))
	got := w.Tail()
	if len(got) != tailSize || !strings.HasSuffix(got, "END") {
		t.Errorf("Tail has %d bytes ending %q, want %d ending END", len(got), got[len(got)-5:], tailSize)
	}
}

func TestParseVmRSS(t *testing.T) {
	const status = "Name:\tkubevisor-drive\nUmask:\t0022\nState:\tS (sleeping)\nVmPeak:\t 1262016 kB\nVmSize:\t 1262016 kB\nVmHWM:\t   21504 kB\nVmRSS:\t   20992 kB\nRssAnon:\t    9216 kB\nThreads:\t11\n"
	for _, tt := range []struct {
		name, in string
		want     uint64
		wantErr  string
	}{
		{name: "process", in: status, want: 20992 << 10},
		{name: "zero", in: "VmRSS:\t       0 kB\n", want: 0},
		{name: "kernel thread", in: "Name:\tkworker/0:1\nState:\tI (idle)\nThreads:\t1\n", wantErr: "no VmRSS line"},
		{name: "empty", in: "", wantErr: "no VmRSS line"},
		{name: "other unit", in: "VmRSS:\t 12 MB\n", wantErr: "unexpected value"},
		{name: "not a number", in: "VmRSS:\t x kB\n", wantErr: "VmRSS"},
		{name: "no unit", in: "VmRSS:\t 12\n", wantErr: "unexpected value"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseVmRSS([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %d, %v; want an error saying %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}

func TestTableAlignsRunes(t *testing.T) {
	var b strings.Builder
	tab := table{w: &b, widths: []int{3, 11}}
	tab.row("run", "exec→marker")
	tab.row("1", "5.250 s")
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 2 || len([]rune(lines[0])) != len([]rune(lines[1])) {
		t.Errorf("rows of different widths:\n%s", b.String())
	}
	if lines[1] != "1        5.250 s" {
		t.Errorf("row = %q", lines[1])
	}
}
