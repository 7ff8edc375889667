// Package qga is a client of the QEMU guest agent (qemu-ga) over the host side of its
// virtio-serial channel: the JSON protocol of QEMU's qga/qapi-schema.json, one command and one
// reply at a time, resynchronised with guest-sync-delimited.
//
// It is written here rather than taken from github.com/digitalocean/go-qemu, which the qmp driver
// uses for QMP: go-qemu has no guest agent client (its qmp package speaks QMP's greeting and
// capabilities negotiation, which the agent does not have, and it cannot resynchronise), and
// the agent's protocol is small.
//
// The protocol, as this client uses it:
//
//   - the channel is a byte stream with no framing but JSON's own: a command is one JSON object
//     {"execute": NAME, "arguments": {...}}, a reply {"return": VALUE} or {"error": {"class",
//     "desc"}}, each followed by a newline;
//   - the agent keeps no session: a reply to a command of an earlier connection (one that timed
//     out) may still arrive, and a half-written command of an earlier client may be in the
//     agent's parser. guest-sync-delimited resynchronises: the client sends 0xFF (which is never
//     part of JSON text, so the agent's parser resets on it) and the command with a random id;
//     the agent writes 0xFF before its reply. The client discards everything up to that 0xFF,
//     and replies whose id is not its own;
//   - a guest without a running agent never answers: every exchange has a deadline.
package qga

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"
)

// Error is an error the agent replied with.
type Error struct {
	Command string
	Class   string `json:"class"`
	Desc    string `json:"desc"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("guest agent: %s: %s: %s", e.Command, e.Class, e.Desc)
}

// ErrNoAnswer is the cause of an exchange that hit its deadline: the guest has no agent
// running, or the agent did not answer in time.
var ErrNoAnswer = errors.New("the guest agent did not answer")

// Client is one connection to a guest agent. It is not safe for concurrent use: the agent answers
// one command at a time, in order.
type Client struct {
	conn net.Conn
	r    *bufio.Reader
	// timeout bounds every exchange whose ctx has no earlier deadline.
	timeout time.Duration
}

// DefaultTimeout bounds one exchange with the agent when ctx has no deadline.
const DefaultTimeout = 3 * time.Second

// Dial connects to the host side of the agent's channel at path (a unix socket; QEMU's socket
// chardev serves one client at a time, so a second Dial waits until the first closes) and
// resynchronises with the agent. The Client's exchanges end at ctx's deadline or after timeout
// each (DefaultTimeout when 0).
func Dial(ctx context.Context, path string, timeout time.Duration) (*Client, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := d.DialContext(dctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("guest agent channel: %w", err)
	}
	c := &Client{conn: conn, r: bufio.NewReader(conn), timeout: timeout}
	if err := c.Sync(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// deadline sets the connection's deadline for one exchange and returns a function that stops
// watching ctx.
func (c *Client) deadline(ctx context.Context) func() {
	dl := time.Now().Add(c.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	_ = c.conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = c.conn.SetDeadline(time.Unix(1, 0)) })
	return func() { stop() }
}

// noAnswer turns a timeout (the exchange's or ctx's deadline) into ErrNoAnswer, and a cancelled
// ctx into its error.
func noAnswer(ctx context.Context, what string, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("guest agent: %s: %w", what, ctx.Err())
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, ErrNoAnswer)
	}
	return fmt.Errorf("guest agent: %s: %w", what, err)
}

// maxSkip bounds what Sync discards before the agent's 0xFF: stale replies of earlier clients.
const maxSkip = 1 << 20

// Sync resynchronises with the agent (guest-sync-delimited): what the agent sent before its
// delimiter and replies to other ids are discarded.
func (c *Client) Sync(ctx context.Context) error {
	defer c.deadline(ctx)()
	id := rand.Int64N(1 << 53) // exact in the agent's JSON numbers
	cmd, _ := json.Marshal(map[string]any{"execute": "guest-sync-delimited", "arguments": map[string]any{"id": id}})
	if _, err := c.conn.Write(append(append([]byte{0xFF}, cmd...), '\n')); err != nil {
		return noAnswer(ctx, "guest-sync-delimited", err)
	}
	// The agent writes 0xFF just before its reply, so the reply is what follows the last 0xFF of
	// its line; lines before it are stale output of earlier clients (replies, a sync of another
	// id, a half line), dropped.
	skipped := 0
	for {
		line, err := c.r.ReadBytes('\n')
		if err != nil {
			return noAnswer(ctx, "guest-sync-delimited", err)
		}
		if i := bytes.LastIndexByte(line, 0xFF); i >= 0 {
			var got struct {
				Return *int64 `json:"return"`
			}
			if json.Unmarshal(line[i+1:], &got) == nil && got.Return != nil && *got.Return == id {
				return nil
			}
		}
		if skipped += len(line); skipped > maxSkip {
			return fmt.Errorf("guest agent: guest-sync-delimited: no reply in %d bytes", maxSkip)
		}
	}
}

// protocolError is a line from the agent that is not a JSON object.
type protocolError struct{ line []byte }

func (e *protocolError) Error() string { return fmt.Sprintf("not a JSON reply: %q", e.line) }

// readReply reads the next reply, one line, skipping empty lines.
func (c *Client) readReply(ctx context.Context, what string) (json.RawMessage, error) {
	for {
		line, err := c.r.ReadBytes('\n')
		if err != nil {
			return nil, noAnswer(ctx, what, err)
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if !json.Valid(line) || line[0] != '{' {
			return nil, &protocolError{line: line}
		}
		return line, nil
	}
}

// Execute runs one command with args (nil for none) and decodes its reply's return value into
// out (nil to drop it). An error reply is an *Error; no reply within the deadline ErrNoAnswer.
func (c *Client) Execute(ctx context.Context, command string, args any, out any) error {
	defer c.deadline(ctx)()
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	cmd, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("guest agent: %s: %w", command, err)
	}
	if _, err := c.conn.Write(append(cmd, '\n')); err != nil {
		return noAnswer(ctx, command, err)
	}
	raw, err := c.readReply(ctx, command)
	if err != nil {
		var perr *protocolError
		if errors.As(err, &perr) {
			return fmt.Errorf("guest agent: %s: %w", command, err)
		}
		return err
	}
	var reply struct {
		Return json.RawMessage `json:"return"`
		Error  *Error          `json:"error"`
	}
	if err := json.Unmarshal(raw, &reply); err != nil {
		return fmt.Errorf("guest agent: %s: %w", command, err)
	}
	if reply.Error != nil {
		reply.Error.Command = command
		return reply.Error
	}
	if reply.Return == nil {
		return fmt.Errorf("guest agent: %s: reply without return: %s", command, raw)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(reply.Return, out); err != nil {
		return fmt.Errorf("guest agent: %s: %w", command, err)
	}
	return nil
}

// Ping runs guest-ping.
func (c *Client) Ping(ctx context.Context) error {
	return c.Execute(ctx, "guest-ping", nil, nil)
}

// OSInfo is guest-get-osinfo's reply (os-release and uname, as the agent reads them).
type OSInfo struct {
	KernelRelease string `json:"kernel-release"`
	KernelVersion string `json:"kernel-version"`
	Machine       string `json:"machine"`
	ID            string `json:"id"`
	Name          string `json:"name"`
	PrettyName    string `json:"pretty-name"`
	Version       string `json:"version"`
	VersionID     string `json:"version-id"`
	Variant       string `json:"variant"`
	VariantID     string `json:"variant-id"`
}

// Timezone is guest-get-timezone's reply.
type Timezone struct {
	Zone   string `json:"zone"`
	Offset int    `json:"offset"` // seconds east of UTC
}

// Info is what Query gathers.
type Info struct {
	// Version is guest-info's version of the agent.
	Version string
	OS      OSInfo
	// HostName is guest-get-host-name's.
	HostName string
	Timezone Timezone
	// Errors are the queries after guest-ping that failed, whose fields are empty.
	Errors []error
}

// Query pings the agent and asks for its version (guest-info), the guest's OS
// (guest-get-osinfo), host name (guest-get-host-name) and time zone (guest-get-timezone). An
// error means the agent is not reachable (the dial, the sync or the ping failed); the failures of
// the later queries are in Info.Errors, unless the agent stopped answering (ErrNoAnswer), which
// fails Query too.
func (c *Client) Query(ctx context.Context) (*Info, error) {
	if err := c.Ping(ctx); err != nil {
		return nil, err
	}
	info := &Info{}
	var version struct {
		Version string `json:"version"`
	}
	var host struct {
		HostName string `json:"host-name"`
	}
	for _, q := range []struct {
		cmd string
		out any
	}{
		{"guest-info", &version},
		{"guest-get-osinfo", &info.OS},
		{"guest-get-host-name", &host},
		{"guest-get-timezone", &info.Timezone},
	} {
		if err := c.Execute(ctx, q.cmd, nil, q.out); err != nil {
			if errors.Is(err, ErrNoAnswer) || ctx.Err() != nil {
				return nil, err
			}
			info.Errors = append(info.Errors, err)
		}
	}
	info.Version, info.HostName = version.Version, host.HostName
	return info, nil
}

// ExecStatus is guest-exec-status's reply: whether the command ended, how, and what it wrote
// (captured when it was started with output capture; the agent keeps at most 16 MiB of each).
type ExecStatus struct {
	Exited bool `json:"exited"`
	// ExitCode is the command's exit status, when it exited by itself.
	ExitCode int `json:"exitcode"`
	// Signal is the signal that killed the command, 0 when it exited by itself.
	Signal       int    `json:"signal"`
	Stdout       []byte `json:"out-data"` // base64 in JSON, as the agent sends it
	Stderr       []byte `json:"err-data"`
	OutTruncated bool   `json:"out-truncated"`
	ErrTruncated bool   `json:"err-truncated"`
}

// Exec starts command (a program, which the agent looks up in the guest's PATH, and its
// arguments) in the guest with guest-exec, its output captured, and returns its pid in the
// agent's table. The agent does not wait for the command: ExecStatus does.
func (c *Client) Exec(ctx context.Context, command []string) (int64, error) {
	if len(command) == 0 {
		return 0, errors.New("guest agent: guest-exec: no command")
	}
	args := map[string]any{"path": command[0], "arg": command[1:], "capture-output": true}
	if len(command) == 1 {
		args["arg"] = []string{}
	}
	var out struct {
		PID *int64 `json:"pid"`
	}
	if err := c.Execute(ctx, "guest-exec", args, &out); err != nil {
		return 0, err
	}
	if out.PID == nil {
		return 0, errors.New("guest agent: guest-exec: reply without pid")
	}
	return *out.PID, nil
}

// ExecStatus asks about a command Exec started (guest-exec-status). Once it reported the command
// exited the agent forgets it: a later ExecStatus of the pid is an *Error.
func (c *Client) ExecStatus(ctx context.Context, pid int64) (*ExecStatus, error) {
	var st ExecStatus
	if err := c.Execute(ctx, "guest-exec-status", map[string]any{"pid": pid}, &st); err != nil {
		return nil, err
	}
	return &st, nil
}
