package plugin

import (
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"sync"
)

const (
	// tailLines is how many stderr lines of a plugin process are kept for the crash report.
	tailLines = 20
	// summaryLines is how many of those go into an error message.
	summaryLines = 3
	// maxLineLen cuts very long lines (a JSON log line with a large value) in the tail.
	maxLineLen = 512
)

// tail keeps the last stderr lines of one plugin process, and the first line of a Go panic or
// fatal error, which a long stack trace would otherwise push out of the window. It is the
// ClientConfig.Stderr of the process, which go-plugin writes line by line.
type tail struct {
	mu      sync.Mutex
	partial []byte
	lines   []string // ring, oldest first once full
	next    int
	panic   string
}

var _ io.Writer = (*tail)(nil)

// Write implements io.Writer.
func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(t.partial) < maxLineLen {
				t.partial = append(t.partial, p[:min(len(p), maxLineLen-len(t.partial))]...)
			}
			break
		}
		if len(t.partial) < maxLineLen {
			t.partial = append(t.partial, p[:min(i, maxLineLen-len(t.partial))]...)
		}
		t.add(string(t.partial))
		t.partial = t.partial[:0]
		p = p[i+1:]
	}
	return n, nil
}

func (t *tail) add(line string) {
	line = strings.TrimRight(line, "\r")
	if strings.TrimSpace(line) == "" {
		return
	}
	if t.panic == "" && (strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ")) {
		t.panic = line
	}
	if len(t.lines) < tailLines {
		t.lines = append(t.lines, line)
		return
	}
	t.lines[t.next] = line
	t.next = (t.next + 1) % tailLines
}

// Lines returns the kept lines, oldest first.
func (t *tail) Lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.lines)+1)
	out = append(out, t.lines[t.next:]...)
	out = append(out, t.lines[:t.next]...)
	if len(t.partial) > 0 {
		out = append(out, string(t.partial))
	}
	return out
}

// Summary is what an error message says about the process's last words: the panic line if it
// panicked, else its last few lines worth showing (plain text, or JSON log lines at warn and
// above, as their message), joined with " | ". It is "" when there is nothing to show.
func (t *tail) Summary() string {
	lines := t.Lines()
	t.mu.Lock()
	p := t.panic
	t.mu.Unlock()
	if p != "" {
		return p
	}
	var keep []string
	for i := len(lines) - 1; i >= 0 && len(keep) < summaryLines; i-- {
		if s := summarizeLine(lines[i]); s != "" {
			keep = append(keep, s)
		}
	}
	slices.Reverse(keep)
	return strings.Join(keep, " | ")
}

// summarizeLine returns a plain line as it is, a JSON log line at warn or above as
// "message: error", and "" for other JSON log lines (they are in the host's log already).
func summarizeLine(line string) string {
	if !strings.HasPrefix(line, "{") {
		return line
	}
	var e map[string]any
	if json.Unmarshal([]byte(line), &e) != nil {
		return line
	}
	level, _ := e["@level"].(string)
	if level != "warn" && level != "error" {
		return ""
	}
	msg, _ := e["@message"].(string)
	if errText, ok := e["error"].(string); ok && errText != "" {
		msg += ": " + errText
	}
	return msg
}
