package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Median returns the middle value of xs (the mean of the two middle ones for an even count),
// rounded toward zero, or the zero value for none. xs is not changed.
func Median[T ~int64 | ~uint64](xs []T) T {
	if len(xs) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(xs)
	slices.SortFunc(s, cmp.Compare[T])
	mid := len(s) / 2
	if len(s)%2 == 1 {
		return s[mid]
	}
	// Halve before adding: no overflow for large values.
	return s[mid-1]/2 + s[mid]/2 + (s[mid-1]%2+s[mid]%2)/2
}

// tailSize is how much recent output a MarkerWatcher keeps for messages.
const tailSize = 2048

// MarkerWatcher is an io.Writer that watches a byte stream (a serial console) for a marker,
// which may arrive split across any number of writes, and records when it first saw it. It is
// safe for concurrent use.
type MarkerWatcher struct {
	marker []byte
	now    func() time.Time

	mu    sync.Mutex
	carry []byte // the last len(marker)-1 bytes, for a marker split across writes
	tail  []byte // the last tailSize bytes, for messages
	seen  time.Time
	found chan struct{}
}

// NewMarkerWatcher returns a watcher of marker, which must not be empty.
func NewMarkerWatcher(marker string) *MarkerWatcher {
	if marker == "" {
		panic("bench: empty marker")
	}
	return &MarkerWatcher{marker: []byte(marker), now: time.Now, found: make(chan struct{})}
}

// Write implements io.Writer. It never fails.
func (w *MarkerWatcher) Write(p []byte) (int, error) {
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tail = appendKeep(w.tail, p, tailSize)
	if !w.seen.IsZero() {
		return len(p), nil
	}
	buf := make([]byte, 0, len(w.carry)+len(p))
	buf = append(append(buf, w.carry...), p...)
	if bytes.Contains(buf, w.marker) {
		w.seen = now
		w.carry = nil
		close(w.found)
		return len(p), nil
	}
	w.carry = appendKeep(w.carry[:0], buf, len(w.marker)-1)
	return len(p), nil
}

// appendKeep appends p to b and returns at most the last keep bytes, in a buffer of its own.
func appendKeep(b, p []byte, keep int) []byte {
	if len(p) >= keep {
		return append(b[:0], p[len(p)-keep:]...)
	}
	b = append(b, p...)
	if over := len(b) - keep; over > 0 {
		b = append(b[:0], b[over:]...)
	}
	return b
}

// Found is closed once the marker was seen.
func (w *MarkerWatcher) Found() <-chan struct{} { return w.found }

// SeenAt is when the write that completed the marker arrived; zero before.
func (w *MarkerWatcher) SeenAt() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}

// Tail returns the last output (up to 2 KiB), for a message.
func (w *MarkerWatcher) Tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.tail)
}

// ParseVmRSS returns the resident set size in bytes from the text of /proc/PID/status.
func ParseVmRSS(status []byte) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		val, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		fields := strings.Fields(val)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("VmRSS: unexpected value %q", strings.TrimSpace(val))
		}
		kb, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("VmRSS: %w", err)
		}
		return kb << 10, nil
	}
	// Kernel threads and zombies have no VmRSS line.
	return 0, errors.New("no VmRSS line (a kernel thread, or a process that has exited)")
}

// MemUsage is a process's resident memory in bytes, in three accountings.
type MemUsage struct {
	// RSS counts every resident page the process maps, shared or not (VmRSS).
	RSS uint64
	// PSS divides each resident page by the number of processes that map it: N launchers
	// running the same binary each count a 1/N share of its text. Summed over processes, PSS
	// is the memory they take together.
	PSS uint64
	// Anon is anonymous memory (heap, stacks): the process's own, never shared with a file.
	Anon uint64
}

// Add returns the field-wise sum.
func (m MemUsage) Add(o MemUsage) MemUsage {
	return MemUsage{RSS: m.RSS + o.RSS, PSS: m.PSS + o.PSS, Anon: m.Anon + o.Anon}
}

// ParseSmapsRollup reads Rss, Pss and Anonymous from the text of /proc/PID/smaps_rollup.
func ParseSmapsRollup(raw []byte) (MemUsage, error) {
	var m MemUsage
	fields := map[string]*uint64{"Rss:": &m.RSS, "Pss:": &m.PSS, "Anonymous:": &m.Anon}
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		dst, ok := fields[f[0]]
		if !ok {
			continue
		}
		if len(f) != 3 || f[2] != "kB" {
			return MemUsage{}, fmt.Errorf("%s unexpected value %q", f[0], strings.Join(f[1:], " "))
		}
		kb, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return MemUsage{}, fmt.Errorf("%s %w", f[0], err)
		}
		*dst = kb << 10
		seen++
	}
	if seen != len(fields) {
		// Kernel threads and exited processes have an empty rollup.
		return MemUsage{}, errors.New("no Rss, Pss and Anonymous lines (a kernel thread, or a process that has exited)")
	}
	return m, nil
}

// mib formats a byte count in MiB.
func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

// secs formats a duration in seconds with millisecond precision.
func secs(d time.Duration) string { return fmt.Sprintf("%.3f s", d.Seconds()) }

// table writes rows of cells, the first left-aligned and the others right-aligned in columns
// of the given widths, counted in runes (the headers have arrows).
type table struct {
	w      io.Writer
	widths []int
}

func (t table) row(cells ...string) {
	var b strings.Builder
	for i, c := range cells {
		pad := ""
		if i < len(t.widths) {
			pad = strings.Repeat(" ", max(t.widths[i]-utf8.RuneCountInString(c), 0))
		}
		if i > 0 {
			b.WriteString("  ")
		}
		if i == 0 {
			b.WriteString(c + pad)
		} else {
			b.WriteString(pad + c)
		}
	}
	fmt.Fprintln(t.w, strings.TrimRight(b.String(), " "))
}
