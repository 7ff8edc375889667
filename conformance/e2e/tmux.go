package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Tmux is a detached tmux session on a server of its own (tmux -L), in which a command runs
// in a real terminal: specs type into it with SendKeys and read the screen with Capture, as a
// user at a terminal would.
type Tmux struct {
	// Socket names the session's tmux server (tmux -L); Session names the session.
	Socket, Session string
}

// exitedMark starts the line the session's shell prints once the command has exited, with
// its exit status after it.
const exitedMark = "KUBEVISOR-E2E-EXITED:"

// NewTmux starts command (argv) in a new detached session of width × height cells on its own
// tmux server. When the command exits, the pane prints exitedMark and the exit status and
// stays, so that Capture still shows what happened.
func NewTmux(ctx context.Context, socket string, width, height int, argv ...string) (*Tmux, error) {
	t := &Tmux{Socket: socket, Session: "e2e"}
	quoted := make([]string, len(argv))
	for i, a := range argv {
		quoted[i] = shellQuote(a)
	}
	script := strings.Join(quoted, " ") + `; echo "` + exitedMark + `$?"; exec sleep 86400`
	if _, err := t.run(ctx, "new-session", "-d", "-s", t.Session, "-x", fmt.Sprint(width), "-y", fmt.Sprint(height),
		"sh", "-c", script); err != nil {
		return nil, err
	}
	return t, nil
}

// run runs a tmux command against the session's server. TERM is set for the server, which
// otherwise refuses to start without one.
func (t *Tmux) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "tmux", append([]string{"-L", t.Socket}, args...)...)
	cmd.Env = append(os.Environ(), "TERM=xterm-256color")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("tmux %s: %w: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

// SendText types text literally (no key names).
func (t *Tmux) SendText(ctx context.Context, text string) error {
	_, err := t.run(ctx, "send-keys", "-t", t.Session, "-l", text)
	return err
}

// SendKeys presses keys by tmux's names: "Enter", "C-]", "C-c".
func (t *Tmux) SendKeys(ctx context.Context, keys ...string) error {
	_, err := t.run(ctx, append([]string{"send-keys", "-t", t.Session}, keys...)...)
	return err
}

// Capture returns the pane's text with its scrollback (up to 1000 lines), lines joined.
func (t *Tmux) Capture(ctx context.Context) (string, error) {
	return t.run(ctx, "capture-pane", "-p", "-J", "-t", t.Session, "-S", "-1000")
}

// Exited reports whether the command has exited, and its exit status, from the pane.
func Exited(pane string) (status string, exited bool) {
	for _, line := range strings.Split(pane, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), exitedMark); ok {
			return strings.TrimSpace(rest), true
		}
	}
	return "", false
}

// Kill ends the session's tmux server and everything in it.
func (t *Tmux) Kill(ctx context.Context) error {
	_, err := t.run(ctx, "kill-server")
	return err
}

// shellQuote quotes s for sh as one word.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./:,@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
