package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kubevisor/kubevisor/core/backoff"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

func TestStartConfiguresAndServes(t *testing.T) {
	h := newTestHost(t, HostConfig{NodeName: "node-7"})
	m := testManifest(t, "alpha")
	m.Config = json.RawMessage(`{"accel":"tcg"}`)
	h.start(t, m)
	ctx := context.Background()

	hv := h.hv(t, "alpha")
	if _, err := hv.Create(ctx, &domainv1.DomainSpec{Id: "vm-1"}); err != nil {
		t.Fatal(err)
	}
	st, err := hv.Status(ctx, "vm-1")
	if err != nil || st.GetState() != hypervisorv1.State_STATE_CREATED {
		t.Fatalf("status = %v, %v", st, err)
	}
	// A driver's own error keeps its code and names the driver.
	_, err = hv.Status(ctx, "nope")
	wantStatus(t, err, codes.NotFound, `driver "alpha"`, `vm "nope" not found`)

	attrs := fingerprint(t, hv)
	want := map[string]string{
		"node":             "node-7",
		"state-dir":        filepath.Join(h.dir, "drivers", "alpha"),
		"protocol-version": strconv.Itoa(driver.ProtocolVersion),
		"config":           `{"accel":"tcg"}`,
		"configures":       "1",
	}
	for k, v := range want {
		if attrs[k] != v {
			t.Errorf("Configure got %s = %q, want %q", k, attrs[k], v)
		}
	}
	ps := h.Status("alpha")
	if !ps.Running || ps.Kind != "hypervisor" || ps.Restarts != 0 || ps.Reattached || strconv.Itoa(ps.Pid) != attrs["pid"] {
		t.Errorf("status = %+v, plugin pid %s", ps, attrs["pid"])
	}

	// The reattach record and the socket are root-only.
	rec, err := h.readRecord("alpha")
	if err != nil || rec == nil {
		t.Fatalf("record: %v, %v", rec, err)
	}
	if rec.Pid != ps.Pid || rec.SHA256 != m.SHA256 || rec.Protocol != "grpc" || rec.ProtocolVersion != driver.ProtocolVersion || rec.Network != "unix" {
		t.Errorf("record = %+v", rec)
	}
	if filepath.Dir(rec.Addr) != filepath.Join(h.dir, "sockets") {
		t.Errorf("socket %s is not in the state dir's sockets", rec.Addr)
	}
	for path, want := range map[string]os.FileMode{
		filepath.Join(h.dir, "plugins", "alpha.json"): 0o600,
		filepath.Join(h.dir, "plugins"):               0o700 | os.ModeDir,
		filepath.Join(h.dir, "sockets"):               0o700 | os.ModeDir,
		filepath.Join(h.dir, "drivers", "alpha"):      0o700 | os.ModeDir,
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %s, want %s", path, fi.Mode(), want)
		}
	}

	// The plugin's JSON log lines reach the host's log under the driver's name.
	eventually(t, 5*time.Second, func() error {
		for _, line := range strings.Split(h.log.String(), "\n") {
			if strings.Contains(line, "host.alpha.") && strings.Contains(line, "testdriver serving") {
				return nil
			}
		}
		return errors.New("no \"testdriver serving\" line under host.alpha in the host log")
	})

	// The plugin runs with the minimal environment, not the host's.
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", ps.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range strings.Split(string(environ), "\x00") {
		k, _, _ := strings.Cut(kv, "=")
		if k == "" || k == "PLUGIN_UNIX_SOCKET_DIR" || k == driver.Handshake.MagicCookieKey || strings.HasPrefix(k, "PLUGIN_") {
			continue
		}
		found := false
		for _, p := range envPassed {
			found = found || p == k
		}
		if !found {
			t.Errorf("plugin inherited %s from the host", k)
		}
	}

	if _, err := h.Network("alpha"); err == nil || !strings.Contains(err.Error(), `driver "alpha" is a hypervisor driver, not a network driver`) {
		t.Errorf("Network(alpha) = %v", err)
	}
	if err := h.Start(ctx, m); err == nil || !strings.Contains(err.Error(), `driver "alpha": already started`) {
		t.Errorf("second Start = %v", err)
	}
}

// TestBadInputs starts a bad plugin next to a healthy one: the error names the driver and the
// cause, and the healthy plugin goes on answering.
func TestBadInputs(t *testing.T) {
	h := newTestHost(t, HostConfig{StartTimeout: 2 * time.Second})
	h.start(t, testManifest(t, "healthy"))
	healthy := h.hv(t, "healthy")
	ctx := context.Background()
	if _, err := healthy.Create(ctx, &domainv1.DomainSpec{Id: "vm-1"}); err != nil {
		t.Fatal(err)
	}
	healthyPid := h.Status("healthy").Pid
	notPlugin := filepath.Join(t.TempDir(), "not-a-plugin")
	if err := os.WriteFile(notPlugin, []byte("#!/bin/sh\necho hello\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	notPluginManifest, err := ManifestFor(notPlugin, driver.KindHypervisor, "bad")
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name   string
		mutate func(*Manifest)
		want   []string
	}{{
		name:   "missing binary",
		mutate: func(m *Manifest) { m.Binary = "/nonexistent/kubevisor-driver-x" },
		want:   []string{`driver "bad": binary /nonexistent/kubevisor-driver-x: no such file`},
	}, {
		name:   "wrong checksum",
		mutate: func(m *Manifest) { m.SHA256 = strings.Repeat("ab", 32) },
		want:   []string{`driver "bad": binary ` + testdriverBin + `: sha256 mismatch: manifest says ` + strings.Repeat("ab", 32) + `, file has `},
	}, {
		name:   "wrong handshake cookie",
		mutate: func(m *Manifest) { m.Args = append(m.Args, "wrong-cookie") },
		want:   []string{`driver "bad": handshake failed`, "magic cookie KUBEVISOR_DRIVER_PLUGIN"},
	}, {
		name:   "incompatible protocol version",
		mutate: func(m *Manifest) { m.Args = append(m.Args, "version=99") },
		want:   []string{`driver "bad": incompatible protocol version: plugin offers [99], host speaks [1]`},
	}, {
		name:   "exits during start",
		mutate: func(m *Manifest) { m.Args = append(m.Args, "exit-at-start") },
		want:   []string{`driver "bad": start: exited during start (exit status 3): testdriver: exit-at-start: giving up before serving, as asked`},
	}, {
		name:   "not a plugin",
		mutate: func(m *Manifest) { m.Binary, m.SHA256 = notPluginManifest.Binary, notPluginManifest.SHA256 },
		want:   []string{`driver "bad": start: Unrecognized remote plugin message: hello`},
	}, {
		name:   "slow start",
		mutate: func(m *Manifest) { m.Args = append(m.Args, "slow-start=1m") },
		want:   []string{`driver "bad": start: no handshake within the start timeout (2s)`},
	}, {
		name:   "panics in Configure",
		mutate: func(m *Manifest) { m.Args = append(m.Args, "panic-on=Configure") },
		want:   []string{`driver "bad": configure: exited (exit status 2): panic: fakehv: Configure panics as asked`},
	}, {
		name:   "reports another name",
		mutate: func(m *Manifest) { m.Args = append(m.Args, "name=other") },
		want:   []string{`driver "bad": info: plugin reports name "other", manifest says "bad"`},
	}, {
		name:   "reports another kind",
		mutate: func(m *Manifest) { m.Kind = driver.KindNetwork },
		want:   []string{`driver "bad": info: plugin is a hypervisor driver, manifest says network`},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := testManifest(t, "bad")
			tt.mutate(&m)
			err := h.Start(ctx, m)
			wantErr(t, err, tt.want...)
			t.Log(err)
			if st := h.Status("bad"); st.Running {
				t.Errorf("bad plugin status = %+v", st)
			}
			if _, err := h.Conn("bad"); err == nil {
				t.Error("Conn of a driver that failed to start: no error")
			}
			eventually(t, 5*time.Second, func() error {
				if n := countProcs(t, markerOf(t, "bad")); n != 0 {
					return fmt.Errorf("%d bad plugin processes left", n)
				}
				return nil
			})
			if _, err := os.Stat(h.recordPath("bad")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("reattach record of a failed start: %v", err)
			}
			if st, err := healthy.Status(ctx, "vm-1"); err != nil || st.GetId() != "vm-1" {
				t.Errorf("healthy plugin: %v, %v", st, err)
			}
			if st := h.Status("healthy"); !st.Running || st.Pid != healthyPid || st.Restarts != 0 {
				t.Errorf("healthy plugin status = %+v", st)
			}
		})
	}
}

// TestPanicMidCall: a plugin that panics in a call fails that call with Unavailable naming the
// driver and the panic, is restarted after the backoff, and answers again; its neighbour is
// untouched.
func TestPanicMidCall(t *testing.T) {
	h := newTestHost(t, HostConfig{MinBackoff: 300 * time.Millisecond})
	h.start(t, testManifest(t, "healthy"))
	h.start(t, testManifest(t, "crashy", "panic-on=Status"))
	ctx := context.Background()
	healthy, crashy := h.hv(t, "healthy"), h.hv(t, "crashy")
	healthyPid, crashyPid := h.Status("healthy").Pid, h.Status("crashy").Pid
	if _, err := crashy.Create(ctx, &domainv1.DomainSpec{Id: "vm-1"}); err != nil {
		t.Fatal(err)
	}

	_, err := crashy.Status(ctx, "vm-1")
	wantStatus(t, err, codes.Unavailable, `driver "crashy"`, "panic: fakehv: Status panics as asked")

	// While it is down, calls fail at once, saying why.
	sawDown := false
	eventually(t, 10*time.Second, func() error {
		_, err := crashy.Create(ctx, &domainv1.DomainSpec{Id: "vm-2"})
		if err != nil && strings.Contains(err.Error(), `driver "crashy" is not running: exited (exit status 2): panic: fakehv: Status panics as asked`) {
			sawDown = true
		}
		return err
	})
	if !sawDown {
		t.Error(`no call failed with "driver \"crashy\" is not running" while it was down`)
	}
	st := h.Status("crashy")
	if !st.Running || st.Restarts != 1 || st.Pid == crashyPid || !strings.Contains(st.LastError, "panic: fakehv: Status panics as asked") {
		t.Errorf("crashy status = %+v (old pid %d)", st, crashyPid)
	}
	if got := fingerprint(t, crashy)["configures"]; got != "1" {
		t.Errorf("restarted plugin configured %s times, want 1", got)
	}
	if !strings.Contains(h.log.String(), "plugin exited unexpectedly") || !strings.Contains(h.log.String(), "panic: fakehv: Status panics as asked") {
		t.Error("the crash is not in the host log")
	}
	if _, err := healthy.Create(ctx, &domainv1.DomainSpec{Id: "vm-1"}); err != nil {
		t.Errorf("healthy plugin: %v", err)
	}
	if st := h.Status("healthy"); !st.Running || st.Pid != healthyPid || st.Restarts != 0 || st.LastError != "" {
		t.Errorf("healthy status = %+v", st)
	}
	rec, err := h.readRecord("crashy")
	if err != nil || rec == nil || rec.Pid != st.Pid {
		t.Errorf("record after restart = %+v, %v", rec, err)
	}
}

// TestKilledPluginRestarts: a plugin killed from outside breaks its open streams with an error
// naming the driver, and comes back.
func TestKilledPluginRestarts(t *testing.T) {
	h := newTestHost(t, HostConfig{})
	h.start(t, testManifest(t, "alpha"))
	hv := h.hv(t, "alpha")
	pid := h.Status("alpha").Pid

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- hv.Fingerprint(ctx, func(*basev1.FingerprintResponse) error { close(got); return nil })
	}()
	<-got
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := <-errc
	wantStatus(t, err, codes.Unavailable, `driver "alpha" exited during the call: exited (signal: killed)`)

	eventually(t, 10*time.Second, func() error {
		_, err := hv.Info(context.Background())
		return err
	})
	st := h.Status("alpha")
	if !st.Running || st.Restarts != 1 || st.Pid == pid || !strings.Contains(st.LastError, "signal: killed") {
		t.Errorf("status = %+v", st)
	}
}

func TestStopAndClose(t *testing.T) {
	h := newTestHost(t, HostConfig{})
	h.start(t, testManifest(t, "alpha"))
	h.start(t, testManifest(t, "beta"))
	conn, err := h.Conn("alpha")
	if err != nil {
		t.Fatal(err)
	}
	hv := driver.NewHypervisorClient(conn)
	ctx := context.Background()
	alphaPid, betaPid := h.Status("alpha").Pid, h.Status("beta").Pid
	sock := mustRecord(t, h, "alpha").Addr

	if err := h.Stop("alpha"); err != nil {
		t.Fatal(err)
	}
	if pidAlive(alphaPid) {
		t.Error("alpha still runs after Stop")
	}
	if _, err := os.Stat(h.recordPath("alpha")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("alpha's record after Stop: %v", err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("alpha's socket after Stop: %v", err)
	}
	_, err = hv.Info(ctx)
	wantStatus(t, err, codes.Unavailable, `driver "alpha" is not running: stopped`)
	if st := h.Status("alpha"); st.Running {
		t.Errorf("alpha status after Stop = %+v", st)
	}
	if err := h.Stop("alpha"); err == nil {
		t.Error("second Stop: no error")
	}

	// The name can be started again; a Conn taken before works again.
	h.start(t, testManifest(t, "alpha"))
	if _, err := hv.Info(ctx); err != nil {
		t.Errorf("old Conn after Stop and Start: %v", err)
	}
	alphaPid = h.Status("alpha").Pid

	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{alphaPid, betaPid} {
		if pidAlive(pid) {
			t.Errorf("pid %d still runs after Close", pid)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(h.dir, "plugins"))
	if len(entries) != 0 {
		t.Errorf("records left after Close: %v", entries)
	}
	_, err = hv.Info(ctx)
	wantStatus(t, err, codes.Unavailable, `driver "alpha" is not running: host closed`)
	if err := h.Start(ctx, testManifest(t, "gamma")); err == nil || !strings.Contains(err.Error(), "host closed") {
		t.Errorf("Start after Close = %v", err)
	}
	// Stop and Close are no crash: nothing was restarted.
	time.Sleep(200 * time.Millisecond)
	for _, name := range []string{"alpha", "beta"} {
		if n := countProcs(t, markerOf(t, name)); n != 0 {
			t.Errorf("%d %s processes after Close", n, name)
		}
	}
}

func mustRecord(t *testing.T, h *testHost, name string) *record {
	t.Helper()
	rec, err := h.readRecord(name)
	if err != nil || rec == nil {
		t.Fatalf("record of %s: %v, %v", name, rec, err)
	}
	return rec
}

func TestNewHost(t *testing.T) {
	if _, err := NewHost(HostConfig{}); err == nil || !strings.Contains(err.Error(), "StateDir is required") {
		t.Errorf("no StateDir: %v", err)
	}
	long := filepath.Join(stateDir(t), strings.Repeat("x", 100))
	if _, err := NewHost(HostConfig{StateDir: long}); err == nil || !strings.Contains(err.Error(), "too long for unix socket paths") {
		t.Errorf("long StateDir: %v", err)
	}
	if _, err := NewHost(HostConfig{StateDir: stateDir(t), MinBackoff: time.Second, MaxBackoff: time.Millisecond}); err == nil {
		t.Error("MaxBackoff < MinBackoff: no error")
	}
	dir := stateDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	h := newTestHost(t, HostConfig{StateDir: dir})
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode: %v, %v", fi.Mode(), err)
	}
	if _, err := NewHost(HostConfig{StateDir: dir}); err == nil || !strings.Contains(err.Error(), "in use by another host") {
		t.Errorf("second host on one state dir: %v", err)
	}
	if err := h.Detach(); err != nil {
		t.Fatal(err)
	}
	h2, err := NewHost(HostConfig{StateDir: dir})
	if err != nil {
		t.Fatalf("host after Detach: %v", err)
	}
	h2.Close()
}

func TestBackoff(t *testing.T) {
	b := backoff.NewRetry(backoff.Exponential{Initial: 200 * time.Millisecond, Max: time.Second})
	var got []time.Duration
	for range 5 {
		got = append(got, restartDelay(b, time.Second))
	}
	want := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("delays %v, want %v", got, want)
	}
	if d := restartDelay(b, time.Minute); d != 200*time.Millisecond {
		t.Errorf("after a minute up: %v, want the minimum", d)
	}
	if d := restartDelay(b, 0); d != 400*time.Millisecond {
		t.Errorf("next: %v", d)
	}
}

func TestTail(t *testing.T) {
	var tl tail
	fmt.Fprintf(&tl, "{\"@level\":\"debug\",\"@message\":\"chatter\"}\n")
	fmt.Fprintf(&tl, "{\"@level\":\"error\",\"@message\":\"cannot open\",\"error\":\"no kvm\"}\n")
	fmt.Fprintf(&tl, "plain line\n")
	if got, want := tl.Summary(), "cannot open: no kvm | plain line"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
	fmt.Fprintf(&tl, "panic: boom\n\ngoroutine 1 [running]:\n")
	for i := range 40 {
		fmt.Fprintf(&tl, "main.f%d()\n", i)
	}
	if got := tl.Summary(); got != "panic: boom" {
		t.Errorf("summary after a panic %q", got)
	}
	lines := tl.Lines()
	if len(lines) != tailLines || lines[len(lines)-1] != "main.f39()" {
		t.Errorf("lines = %q", lines)
	}
	tl.Write([]byte("partial"))
	if got := tl.Lines(); got[len(got)-1] != "partial" {
		t.Errorf("partial line: %q", got)
	}
}

// TestReconfigure: Reconfigure configures the running plugin again with another configuration
// (node, state directory and protocol version kept); an accepted one is what a plugin started
// again after a crash is configured with; a refused one, or the same one, changes nothing.
func TestReconfigure(t *testing.T) {
	h := newTestHost(t, HostConfig{NodeName: "node-7"})
	m := testManifest(t, "alpha")
	m.Config = json.RawMessage(`{"accel":"tcg"}`)
	h.start(t, m)
	hv := h.hv(t, "alpha")
	ctx := context.Background()
	pid := h.Status("alpha").Pid
	check := func(what, config, configures string) {
		t.Helper()
		attrs := fingerprint(t, hv)
		for k, v := range map[string]string{
			"config": config, "configures": configures, "node": "node-7",
			"state-dir": filepath.Join(h.dir, "drivers", "alpha"), "protocol-version": strconv.Itoa(driver.ProtocolVersion),
		} {
			if attrs[k] != v {
				t.Errorf("%s: Configure got %s = %q, want %q", what, k, attrs[k], v)
			}
		}
	}

	if err := h.Reconfigure(ctx, "alpha", json.RawMessage(`{"accel":"kvm"}`)); err != nil {
		t.Fatalf("Reconfigure: %v", err)
	}
	check("accepted", `{"accel":"kvm"}`, "2")
	if st := h.Status("alpha"); st.Pid != pid || st.Restarts != 0 {
		t.Errorf("Reconfigure restarted the plugin: %+v (pid was %d)", st, pid)
	}
	// The same configuration is not sent again.
	if err := h.Reconfigure(ctx, "alpha", json.RawMessage(`{"accel":"kvm"}`)); err != nil {
		t.Fatal(err)
	}
	check("the same again", `{"accel":"kvm"}`, "2")
	// Refused by the driver (its code kept, the driver named), or not JSON: nothing changes.
	wantStatus(t, h.Reconfigure(ctx, "alpha", json.RawMessage(`[1]`)), codes.InvalidArgument, `driver "alpha": config:`)
	wantStatus(t, h.Reconfigure(ctx, "alpha", json.RawMessage(`{`)), codes.InvalidArgument, "not valid JSON")
	check("refused", `{"accel":"kvm"}`, "2")
	wantErr(t, h.Reconfigure(ctx, "beta", nil), `driver "beta": not started`)

	// A crash: the new process gets the configuration Reconfigure set, not the manifest's.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() error {
		if st := h.Status("alpha"); !st.Running || st.Pid == pid {
			return fmt.Errorf("not restarted: %+v", st)
		}
		return nil
	})
	check("restarted", `{"accel":"kvm"}`, "1")
}
