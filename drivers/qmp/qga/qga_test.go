package qga

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeAgent is a guest agent on a unix socket, as QEMU's socket chardev presents one: it reads
// commands (0xFF resets its parser, as qemu-ga's does) and answers them from replies.
type fakeAgent struct {
	path string
	// before is written on every connection before anything is read: what a previous client
	// left in the channel (stale replies, noise).
	before []byte
	// silent agents read and never answer.
	silent bool
	// replies are the return values by command; a command without one is CommandNotFound.
	replies map[string]any
	// handle, when set, answers the commands it knows (ok) from their arguments before replies.
	handle func(cmd string, args json.RawMessage) (ret any, ok bool)
	// seen are the commands received, in order.
	seen chan string
}

func startFake(t *testing.T, a *fakeAgent) *fakeAgent {
	t.Helper()
	a.path = filepath.Join(t.TempDir(), "qga.sock")
	a.seen = make(chan string, 100)
	l, err := net.Listen("unix", a.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go a.serve(c)
		}
	}()
	return a
}

func (a *fakeAgent) serve(c net.Conn) {
	defer c.Close()
	c.Write(a.before)
	r := bufio.NewReader(c)
	var buf []byte
	for {
		b, err := r.ReadByte()
		if err != nil {
			return
		}
		switch {
		case b == 0xFF:
			buf = buf[:0]
			continue
		case b != '\n':
			buf = append(buf, b)
			continue
		}
		var cmd struct {
			Execute   string          `json:"execute"`
			Arguments json.RawMessage `json:"arguments"`
		}
		var sync struct {
			ID int64 `json:"id"`
		}
		err = json.Unmarshal(buf, &cmd)
		if err == nil && cmd.Execute == "guest-sync-delimited" {
			err = json.Unmarshal(cmd.Arguments, &sync)
		}
		if err != nil {
			c.Write([]byte(`{"error": {"class": "GenericError", "desc": "JSON parse error"}}` + "\n"))
			buf = buf[:0]
			continue
		}
		buf = buf[:0]
		a.seen <- cmd.Execute
		if a.silent {
			continue
		}
		var reply any
		ret, ok := a.replies[cmd.Execute]
		if a.handle != nil {
			if r, handled := a.handle(cmd.Execute, cmd.Arguments); handled {
				ret, ok = r, true
			}
		}
		switch {
		case cmd.Execute == "guest-sync-delimited":
			c.Write([]byte{0xFF})
			reply = map[string]any{"return": sync.ID}
		case ok:
			reply = map[string]any{"return": ret}
		default:
			reply = map[string]any{"error": map[string]string{"class": "CommandNotFound", "desc": "The command " + cmd.Execute + " has not been found"}}
		}
		out, _ := json.Marshal(reply)
		c.Write(append(out, '\n'))
	}
}

var debian = map[string]any{
	"guest-ping": map[string]any{},
	"guest-info": map[string]any{"version": "7.2.15", "supported_commands": []any{}},
	"guest-get-osinfo": map[string]any{
		"kernel-release": "6.1.0-31-cloud-amd64", "kernel-version": "#1 SMP PREEMPT_DYNAMIC Debian 6.1.128-1",
		"machine": "x86_64", "id": "debian", "name": "Debian GNU/Linux", "pretty-name": "Debian GNU/Linux 12 (bookworm)",
		"version": "12 (bookworm)", "version-id": "12",
	},
	"guest-get-host-name": map[string]any{"host-name": "kubevisor-guest"},
	"guest-get-timezone":  map[string]any{"zone": "UTC", "offset": 0},
}

func query(t *testing.T, path string, timeout time.Duration) (*Info, error) {
	t.Helper()
	ctx := context.Background()
	c, err := Dial(ctx, path, timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Query(ctx)
}

func TestQuery(t *testing.T) {
	a := startFake(t, &fakeAgent{replies: debian})
	info, err := query(t, a.path, 0)
	if err != nil {
		t.Fatalf("Query: %v", err)
	}
	want := OSInfo{KernelRelease: "6.1.0-31-cloud-amd64", KernelVersion: "#1 SMP PREEMPT_DYNAMIC Debian 6.1.128-1",
		Machine: "x86_64", ID: "debian", Name: "Debian GNU/Linux", PrettyName: "Debian GNU/Linux 12 (bookworm)",
		Version: "12 (bookworm)", VersionID: "12"}
	if info.OS != want || info.Version != "7.2.15" || info.HostName != "kubevisor-guest" || info.Timezone != (Timezone{Zone: "UTC"}) || len(info.Errors) != 0 {
		t.Errorf("Query = %+v", info)
	}
	var got []string
	for len(a.seen) > 0 {
		got = append(got, <-a.seen)
	}
	if strings.Join(got, " ") != "guest-sync-delimited guest-ping guest-info guest-get-osinfo guest-get-host-name guest-get-timezone" {
		t.Errorf("commands = %v", got)
	}
}

// TestSyncSkipsGarbage: stale replies, noise, a half line and the delimited reply to an
// earlier client's sync, all before the agent's delimiter, are not taken for answers.
func TestSyncSkipsGarbage(t *testing.T) {
	stale := []byte("{\"return\": {\"host-name\": \"stale\"}}\n\x00\x01 noise {\"ret")
	stale = append(stale, 0xFF)
	stale = append(stale, []byte("{\"return\": 12345}\nnot json\n{\"return\": {}}\n{\"half")...)
	a := startFake(t, &fakeAgent{replies: debian, before: stale})
	info, err := query(t, a.path, 0)
	if err != nil {
		t.Fatalf("Query: %v", err)
	}
	if info.HostName != "kubevisor-guest" || info.OS.ID != "debian" {
		t.Errorf("Query = %+v, want the fresh answers", info)
	}
}

// TestSilentAgent: an agent that never answers (a guest without one) fails the dial's sync
// with ErrNoAnswer, at the timeout.
func TestSilentAgent(t *testing.T) {
	a := startFake(t, &fakeAgent{silent: true})
	begin := time.Now()
	_, err := query(t, a.path, 300*time.Millisecond)
	if !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("Query of a silent agent = %v, want ErrNoAnswer", err)
	}
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("took %s, want about the 300ms timeout", took)
	}
}

// TestContextDeadline: ctx's deadline, earlier than the timeout, ends the exchange.
func TestContextDeadline(t *testing.T) {
	a := startFake(t, &fakeAgent{silent: true})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	begin := time.Now()
	_, err := Dial(ctx, a.path, time.Minute)
	if err == nil || time.Since(begin) > 2*time.Second {
		t.Fatalf("Dial = %v after %s, want an error at ctx's deadline", err, time.Since(begin))
	}
}

// TestNoChannel: no socket is an error, not a hang.
func TestNoChannel(t *testing.T) {
	if _, err := Dial(context.Background(), filepath.Join(t.TempDir(), "none.sock"), time.Second); err == nil {
		t.Fatal("Dial of a missing socket succeeded")
	}
}

// TestQueryErrors: a query the agent refuses leaves its fields empty and is reported; a ping it
// refuses fails Query.
func TestQueryErrors(t *testing.T) {
	replies := map[string]any{}
	for k, v := range debian {
		if k != "guest-get-timezone" {
			replies[k] = v
		}
	}
	a := startFake(t, &fakeAgent{replies: replies})
	info, err := query(t, a.path, 0)
	if err != nil {
		t.Fatalf("Query: %v", err)
	}
	var qe *Error
	if len(info.Errors) != 1 || !errors.As(info.Errors[0], &qe) || qe.Class != "CommandNotFound" || qe.Command != "guest-get-timezone" {
		t.Errorf("Errors = %v, want guest-get-timezone CommandNotFound", info.Errors)
	}
	if info.OS.ID != "debian" || info.Timezone.Zone != "" {
		t.Errorf("Query = %+v", info)
	}

	b := startFake(t, &fakeAgent{replies: map[string]any{}})
	if _, err := query(t, b.path, 0); !errors.As(err, &qe) || qe.Command != "guest-ping" {
		t.Errorf("Query without guest-ping = %v, want its CommandNotFound", err)
	}
}

// TestExecuteArguments: arguments are sent as the command's "arguments".
func TestExecuteArguments(t *testing.T) {
	srv, cli := net.Pipe()
	defer srv.Close()
	c := &Client{conn: cli, r: bufio.NewReader(cli), timeout: time.Second}
	go func() {
		line, _ := bufio.NewReader(srv).ReadBytes('\n')
		if !bytes.Contains(line, []byte(`"arguments":{"x":1}`)) {
			srv.Write([]byte(`{"error": {"class": "GenericError", "desc": "no arguments"}}` + "\n"))
			return
		}
		srv.Write([]byte(`{"return": {"ok": true}}` + "\n"))
	}()
	var out struct{ OK bool }
	if err := c.Execute(context.Background(), "x", map[string]int{"x": 1}, &out); err != nil || !out.OK {
		t.Fatalf("Execute = %v, %+v", err, out)
	}
}

// TestExec: Exec sends guest-exec with the program as path, the rest as arg and output capture;
// ExecStatus decodes guest-exec-status's reply, base64 outputs included, and the agent's error
// for an unknown pid.
func TestExec(t *testing.T) {
	var gotArgs string
	polls := 0
	a := startFake(t, &fakeAgent{replies: debian, handle: func(cmd string, args json.RawMessage) (any, bool) {
		switch cmd {
		case "guest-exec":
			gotArgs = string(args)
			return map[string]any{"pid": 4242}, true
		case "guest-exec-status":
			var a struct{ PID int64 }
			json.Unmarshal(args, &a)
			if a.PID != 4242 {
				return nil, false // CommandNotFound stands in for the agent's "Invalid parameter 'pid'"
			}
			if polls++; polls == 1 {
				return map[string]any{"exited": false}, true
			}
			return map[string]any{"exited": true, "exitcode": 3, "out-data": "aGkK", "err-data": "b29wcwo=", "out-truncated": true}, true
		}
		return nil, false
	}})
	ctx := context.Background()
	c, err := Dial(ctx, a.path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pid, err := c.Exec(ctx, []string{"sh", "-c", "echo hi; exit 3"})
	if err != nil || pid != 4242 {
		t.Fatalf("Exec = %d, %v", pid, err)
	}
	if want := `{"arg":["-c","echo hi; exit 3"],"capture-output":true,"path":"sh"}`; gotArgs != want {
		t.Errorf("guest-exec arguments %s, want %s", gotArgs, want)
	}
	if st, err := c.ExecStatus(ctx, pid); err != nil || st.Exited {
		t.Fatalf("first ExecStatus = %+v, %v; want not exited", st, err)
	}
	st, err := c.ExecStatus(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Exited || st.ExitCode != 3 || string(st.Stdout) != "hi\n" || string(st.Stderr) != "oops\n" || !st.OutTruncated || st.ErrTruncated {
		t.Errorf("ExecStatus = %+v", st)
	}
	var qe *Error
	if _, err := c.ExecStatus(ctx, 1); !errors.As(err, &qe) {
		t.Errorf("ExecStatus of an unknown pid = %v, want the agent's error", err)
	}
	if _, err := c.Exec(ctx, nil); err == nil {
		t.Error("Exec of no command succeeded")
	}
	if _, err := c.Exec(ctx, []string{"true"}); err != nil || !strings.Contains(gotArgs, `"arg":[]`) {
		t.Errorf("Exec(true) = %v, arguments %s", err, gotArgs)
	}
}
