package cmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kubevisor/kubevisor/cli/vmctl/client"
	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/backoff"
	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// EscapeKey ends a console session: Ctrl-] (0x1d), as telnet has it.
const EscapeKey = 0x1d

// followBackoff paces console --follow's reconnection attempts.
var followBackoff = backoff.Exponential{Initial: 500 * time.Millisecond, Max: 5 * time.Second}

func newConsoleCommand(o *options) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "console NAME",
		Short: "Attach to a VMI's serial console (Ctrl-] ends the session)",
		Long: "Attach to a VMI's serial console. When stdin is a terminal it is put in raw mode; Ctrl-] ends\n" +
			"the session. Without a terminal (scripts), stdin is sent as it is and the session lasts until\n" +
			"the stream ends or Ctrl-] is read.",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: o.completeNames(subv1.VirtualMachineInstances),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, name, err := parseTarget(args[0])
			if err != nil {
				return err
			}
			c, err := o.Client()
			if err != nil {
				return err
			}
			ctx := cmdContext(cmd)
			dial := func(ctx context.Context) (net.Conn, error) {
				conn, err := c.Dial(ctx, name, subv1.SubresourceConsole)
				if err != nil {
					return nil, c.Explain(ctx, err, o.action(c, "open the console of", subv1.VirtualMachineInstances, name))
				}
				return conn, nil
			}
			// Connect before the terminal goes raw, so that a refusal prints normally.
			first, err := dial(ctx)
			if err != nil {
				return err
			}
			nl := "\n"
			if f, ok := o.streams.In.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
				state, err := term.MakeRaw(int(f.Fd()))
				if err != nil {
					first.Close()
					return fmt.Errorf("raw terminal: %w", err)
				}
				defer func() { _ = term.Restore(int(f.Fd()), state) }()
				nl = "\r\n"
			}
			notify := func(msg string) { fmt.Fprint(o.streams.ErrOut, msg+nl) }
			notify(fmt.Sprintf("Connected to the console of VMI %s. Press Ctrl-] to end the session.", name))
			return runConsole(ctx, consoleSession{
				first: first, dial: dial, in: o.streams.In, out: o.streams.Out, follow: follow, notify: notify, name: name,
			})
		},
	}
	cmd.Flags().BoolVar(&follow, "follow", false, "When the stream ends (the VMI stopped, restarted or the connection dropped), wait for the VMI to run and reconnect")
	return cmd
}

// consoleSession is what runConsole needs: the first stream and a way to open the next.
type consoleSession struct {
	name   string
	first  net.Conn
	dial   func(context.Context) (net.Conn, error)
	in     io.Reader
	out    io.Writer
	follow bool
	notify func(string)
}

// runConsole copies in to the stream and the stream to out until the escape key is read, the
// stream ends (without follow) or ctx is done. With follow it reopens the stream, waiting with
// backoff while the VMI is not running.
func runConsole(ctx context.Context, s consoleSession) error {
	input := make(chan []byte)
	escaped := make(chan struct{})
	go readInput(s.in, input, escaped)

	conn := s.first
	for {
		ended := make(chan error, 1)
		tail := &tailWriter{w: s.out, n: len(nodeapi.ConsoleTakenOver)}
		go func(conn net.Conn) {
			_, err := io.Copy(tail, conn)
			ended <- err
		}(conn)
		why, err := pump(ctx, conn, input, escaped, ended)
		conn.Close()
		switch why {
		case stopEscape:
			s.notify(fmt.Sprintf("Console session of VMI %s ended (Ctrl-]).", s.name))
			return nil
		case stopContext:
			return ctx.Err()
		}
		if tail.endsWith(nodeapi.ConsoleTakenOver) {
			// Another session has the console now; following would take it back, and the two
			// would take it from each other for ever.
			s.notify(fmt.Sprintf("Another session took over the console of VMI %s.", s.name))
			return nil
		}
		if !s.follow {
			if err != nil && !errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("console of VMI %s: %w", s.name, err)
			}
			s.notify(fmt.Sprintf("The console stream of VMI %s ended.", s.name))
			return nil
		}
		s.notify(fmt.Sprintf("The console stream of VMI %s ended; waiting for it to run again.", s.name))
		if conn, why = reconnect(ctx, s, input, escaped); conn == nil {
			if why == stopEscape {
				s.notify(fmt.Sprintf("Console session of VMI %s ended (Ctrl-]).", s.name))
				return nil
			}
			return ctx.Err()
		}
		s.notify(fmt.Sprintf("Reconnected to the console of VMI %s.", s.name))
	}
}

type stopReason int

const (
	stopStreamEnded stopReason = iota
	stopEscape
	stopContext
)

// pump writes input to conn until the stream ends, the escape key comes, or ctx is done.
func pump(ctx context.Context, conn net.Conn, input <-chan []byte, escaped <-chan struct{}, ended <-chan error) (stopReason, error) {
	for {
		select {
		case b := <-input:
			if _, err := conn.Write(b); err != nil {
				return stopStreamEnded, err
			}
		case <-escaped:
			return stopEscape, nil
		case err := <-ended:
			return stopStreamEnded, err
		case <-ctx.Done():
			return stopContext, nil
		}
	}
}

// reconnect dials until a stream opens, the escape key comes or ctx is done; input read
// meanwhile is dropped. A refusal other than "not running" is printed once per kind.
func reconnect(ctx context.Context, s consoleSession, input <-chan []byte, escaped <-chan struct{}) (net.Conn, stopReason) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	defer func() { cancel(); <-done }()
	go func() {
		defer close(done)
		for {
			select {
			case <-input:
			case <-escaped:
				cancel()
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	retry := backoff.NewRetry(followBackoff)
	last := ""
	for {
		conn, err := s.dial(ctx)
		if err == nil {
			return conn, stopStreamEnded
		}
		if msg := err.Error(); !client.IsNotRunning(err) && msg != last && ctx.Err() == nil {
			s.notify("still waiting: " + msg)
			last = msg
		}
		if !retry.Wait(ctx) {
			select {
			case <-escaped:
				return nil, stopEscape
			default:
				return nil, stopContext
			}
		}
	}
}

// readInput sends what it reads from in, up to the escape key, and closes escaped when it sees
// the key. At the end of in it stops reading and the session goes on.
func readInput(in io.Reader, input chan<- []byte, escaped chan<- struct{}) {
	buf := make([]byte, 4096)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			chunk := append([]byte(nil), buf[:n]...)
			i := bytes.IndexByte(chunk, EscapeKey)
			if i >= 0 {
				chunk = chunk[:i]
			}
			if len(chunk) > 0 {
				input <- chunk
			}
			if i >= 0 {
				close(escaped)
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// tailWriter writes to w and keeps the last n bytes written, for a look at how a stream ended.
type tailWriter struct {
	w    io.Writer
	n    int
	mu   sync.Mutex
	tail []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	t.tail = append(t.tail, p...)
	if len(t.tail) > t.n {
		t.tail = t.tail[len(t.tail)-t.n:]
	}
	t.mu.Unlock()
	return t.w.Write(p)
}

func (t *tailWriter) endsWith(s string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.HasSuffix(string(t.tail), s)
}
