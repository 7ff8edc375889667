package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-plugin"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
)

// envPassed are the host's environment variables a plugin inherits. Plugins run with
// go-plugin's SkipHostEnv: a third-party binary gets neither the host's credentials (service
// account, KUBECONFIG, ...) nor anything that changes between host versions, so a reattached
// plugin runs in the environment a fresh one would get.
var envPassed = []string{"PATH", "TMPDIR", "TZ", "LANG", "LC_ALL", "GOTRACEBACK", "GODEBUG", "GOMEMLIMIT", "GORACE", "GOCOVERDIR"}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// pluginEnv is the whole environment of a plugin, before go-plugin adds its handshake
// variables. go-plugin v1.8 honours UnixSocketConfig.TempDir only with a RunnerFunc, so the
// socket directory is passed to the plugin's go-plugin server directly.
func pluginEnv(socketDir string) []string {
	env := []string{plugin.EnvUnixSocketDir + "=" + socketDir}
	if _, ok := os.LookupEnv("PATH"); !ok {
		env = append(env, "PATH="+defaultPath)
	}
	for _, k := range envPassed {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// startFirst reattaches to the process an earlier host left running, when there is a usable
// one, and otherwise launches a new process.
func (mp *managed) startFirst(ctx context.Context) (*instance, error) {
	rec, err := mp.h.readRecord(mp.m.Name)
	if err != nil {
		mp.log.Warn("ignoring unreadable reattach record", "error", err)
		mp.h.removeRecord(mp.m.Name, nil)
	}
	if rec != nil {
		inst, err := mp.reattach(ctx, rec)
		if err == nil {
			mp.log.Info("reattached to running plugin", "pid", inst.pid, "addr", rec.Addr)
			return inst, nil
		}
		mp.log.Info("not reattaching: starting a new plugin process", "pid", rec.Pid, "reason", err)
		mp.h.removeRecord(mp.m.Name, rec)
	}
	return mp.launch(ctx)
}

// deadline is when the current start must be done by.
func (mp *managed) deadline(ctx context.Context) time.Time {
	d := time.Now().Add(mp.h.cfg.StartTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	return d
}

func (mp *managed) stateDir() (string, error) {
	dir := filepath.Join(mp.h.driverDir, mp.m.Name)
	if err := privateDir(dir); err != nil {
		return "", fmt.Errorf("driver %q: state dir: %w", mp.m.Name, err)
	}
	return dir, nil
}

// clientConfig fills in what every go-plugin client of this driver shares.
func (mp *managed) clientConfig(c *plugin.ClientConfig) *plugin.ClientConfig {
	c.HandshakeConfig = driver.Handshake
	c.AllowedProtocols = []plugin.Protocol{plugin.ProtocolGRPC}
	c.Logger = mp.log
	// What the plugin writes to os.Stdout/os.Stderr after Serve comes through go-plugin's
	// stdio stream; without these it would be dropped.
	c.SyncStdout = &lineLogger{log: mp.log, stream: "stdout"}
	c.SyncStderr = &lineLogger{log: mp.log, stream: "stderr"}
	return c
}

// launch starts a new plugin process and makes it ready: handshake, Info, Configure, record.
func (mp *managed) launch(ctx context.Context) (*instance, error) {
	m := mp.m
	fi, err := os.Stat(m.Binary)
	if err != nil {
		return nil, fmt.Errorf("driver %q: binary %s: %w", m.Name, m.Binary, describeFileErr(err))
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("driver %q: binary %s: not a regular file", m.Name, m.Binary)
	}
	sum, err := hex.DecodeString(m.SHA256)
	if err != nil {
		return nil, fmt.Errorf("driver %q: sha256: %w", m.Name, err)
	}
	stateDir, err := mp.stateDir()
	if err != nil {
		return nil, err
	}
	deadline := mp.deadline(ctx)
	timeout := max(time.Until(deadline), time.Millisecond)

	cmd := exec.Command(m.Binary, m.Args...)
	cmd.Env = pluginEnv(mp.h.socketDir)
	cmd.Dir = stateDir
	cmd.SysProcAttr = sysProcAttr()
	stderr := &tail{}
	client := plugin.NewClient(mp.clientConfig(&plugin.ClientConfig{
		VersionedPlugins: driver.HostPlugins(),
		Cmd:              cmd,
		// go-plugin hashes the binary right before it runs it; on a mismatch startError
		// hashes it again to say what the file holds.
		SecureConfig:     &plugin.SecureConfig{Checksum: sum, Hash: sha256.New()},
		Stderr:           stderr,
		StartTimeout:     timeout,
		SkipHostEnv:      true,
		UnixSocketConfig: &plugin.UnixSocketConfig{TempDir: mp.h.socketDir},
	}))
	rpc, err := client.Client()
	if err != nil {
		return nil, mp.startError(client, cmd, stderr, timeout, err)
	}
	gc, ok := rpc.(*plugin.GRPCClient)
	if !ok { // AllowedProtocols admits gRPC only
		client.Kill()
		return nil, fmt.Errorf("driver %q: plugin speaks %T, not gRPC", m.Name, rpc)
	}
	inst := &instance{
		client:  client,
		rpc:     gc,
		cmd:     cmd,
		pid:     cmd.Process.Pid,
		stderr:  stderr,
		started: time.Now(),
		exited:  make(chan struct{}),
	}
	version := client.NegotiatedVersion()
	if err := mp.ready(ctx, inst, version, deadline); err != nil {
		return nil, err
	}
	rc := client.ReattachConfig()
	if rc == nil || rc.Addr == nil {
		mp.kill(inst)
		return nil, fmt.Errorf("driver %q: no reattach config for the plugin", m.Name)
	}
	_, start, _ := procStat(inst.pid) // 0 where /proc is not there: never reattached then
	rec := &record{
		Name:            m.Name,
		Binary:          m.Binary,
		SHA256:          m.SHA256,
		Args:            m.Args,
		Protocol:        string(rc.Protocol),
		ProtocolVersion: version,
		Network:         rc.Addr.Network(),
		Addr:            rc.Addr.String(),
		Pid:             inst.pid,
		StartTime:       start,
		BootID:          bootID(),
		StartedAt:       inst.started.UTC(),
	}
	if err := mp.h.writeRecord(rec); err != nil {
		mp.kill(inst)
		return nil, fmt.Errorf("driver %q: %w", m.Name, err)
	}
	inst.rec = rec
	mp.log.Info("plugin started", "pid", inst.pid, "protocol_version", version)
	return inst, nil
}

var pluginVersionRE = regexp.MustCompile(`Plugin version: (\d+)`)

// startError turns go-plugin's start failure into an error that names the driver and says
// what happened, with the process's exit status and last stderr lines when it ran.
func (mp *managed) startError(client *plugin.Client, cmd *exec.Cmd, stderr *tail, timeout time.Duration, err error) error {
	m := mp.m
	if errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
		has, herr := fileSHA256(m.Binary)
		if herr != nil {
			has = "unreadable (" + herr.Error() + ")"
		}
		return fmt.Errorf("driver %q: binary %s: sha256 mismatch: manifest says %s, file has %s", m.Name, m.Binary, m.SHA256, has)
	}
	exit := ""
	if cmd.Process != nil { // it ran: wait for go-plugin to collect it and its stderr
		if waitUntil(drainTimeout, client.Exited) && cmd.ProcessState != nil {
			exit = cmd.ProcessState.String()
		}
	}
	last := stderr.Summary()
	msg, _, _ := strings.Cut(err.Error(), "\n")
	var detail string
	switch {
	case strings.Contains(last, "This binary is a plugin"):
		// go-plugin's Serve says so, and exits, when the cookie it finds is not its own.
		return fmt.Errorf("driver %q: handshake failed: the plugin did not accept the host's magic cookie %s=%s (is it a Kubevisor driver served with core/driver?)",
			m.Name, driver.Handshake.MagicCookieKey, driver.Handshake.MagicCookieValue)
	case strings.Contains(msg, "incompatible API version"):
		pv := "?"
		if sm := pluginVersionRE.FindStringSubmatch(msg); sm != nil {
			pv = sm[1]
		}
		return fmt.Errorf("driver %q: incompatible protocol version: plugin offers [%s], host speaks %v", m.Name, pv, hostVersions())
	case strings.Contains(msg, "timeout while waiting for plugin to start"):
		detail = fmt.Sprintf("no handshake within the start timeout (%s)", timeout.Round(time.Millisecond))
	case exit != "" && strings.Contains(msg, "plugin exited before we could connect"), exit != "" && strings.Contains(msg, "Unrecognized remote plugin message: ") && strings.HasSuffix(msg, ": "):
		detail = "exited during start (" + exit + ")" // without a word on stdout
	case exit != "":
		detail = msg + " (" + exit + ")"
	default:
		detail = msg
	}
	if last != "" {
		detail += ": " + last
	}
	return fmt.Errorf("driver %q: start: %s", m.Name, detail)
}

func hostVersions() []int {
	return slices.Sorted(maps.Keys(driver.HostPlugins()))
}

// ready watches a connected plugin process, checks its Info against the manifest and configures
// it. On failure it kills the process.
func (mp *managed) ready(ctx context.Context, inst *instance, version int, deadline time.Time) error {
	m := mp.m
	if inst.proc == nil { // a launched process; reattach comes with the handle it checked
		p, err := openProc(inst.pid)
		if err != nil && !errors.Is(err, errProcessGone) {
			inst.client.Kill()
			return fmt.Errorf("driver %q: watch plugin process: %w", m.Name, err)
		}
		inst.proc = p // nil if gone already: watch then reports the exit at once
	}
	go inst.watch()

	fail := func(what string, err error) error {
		err = inst.explain(err)
		mp.kill(inst)
		return fmt.Errorf("driver %q: %s: %w", m.Name, what, err)
	}
	raw, err := inst.rpc.Dispense(driver.KindName(mp.kind))
	if err != nil {
		return fail("dispense", err)
	}
	drv, ok := raw.(driver.Driver)
	if !ok {
		return fail("dispense", fmt.Errorf("got %T", raw))
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	info, err := drv.Info(ctx)
	if err != nil {
		return fail("info", err)
	}
	if info.GetName() != m.Name {
		return fail("info", fmt.Errorf("plugin reports name %q, manifest says %q", info.GetName(), m.Name))
	}
	if info.GetKind() != mp.kind {
		return fail("info", fmt.Errorf("plugin is a %s driver, manifest says %s", kindText(info.GetKind()), m.Kind))
	}
	inst.version = version
	req, err := mp.configureRequest(nil, version)
	if err != nil {
		return fail("configure", err)
	}
	// Not while a Reconfigure is under way: this process gets the configuration it settles on.
	mp.configuring.Lock()
	req.Config = mp.configuration()
	err = drv.Configure(ctx, req)
	mp.configuring.Unlock()
	if err != nil {
		return fail("configure", err)
	}
	return nil
}

// configureRequest is the ConfigureRequest of the driver with config.
func (mp *managed) configureRequest(config json.RawMessage, version int) (*basev1.ConfigureRequest, error) {
	stateDir, err := mp.stateDir()
	if err != nil {
		return nil, err
	}
	return &basev1.ConfigureRequest{
		Config:          config,
		NodeName:        mp.h.cfg.NodeName,
		StateDir:        stateDir,
		ProtocolVersion: uint32(version),
	}, nil
}

func kindText(k basev1.Kind) string {
	if s := driver.KindName(k); s != "" {
		return s
	}
	return k.String()
}

// reattach connects to the plugin process rec describes, if it is still the process an earlier
// host started from the manifest's binary. When that process is there but unusable, reattach
// kills it (it is ours) so the caller can launch a new one.
func (mp *managed) reattach(ctx context.Context, rec *record) (*instance, error) {
	m := mp.m
	if rec.BootID == "" || rec.BootID != bootID() {
		return nil, errors.New("recorded before the last reboot")
	}
	p, err := openProc(rec.Pid)
	if err != nil {
		return nil, fmt.Errorf("process %d is gone", rec.Pid)
	}
	// Only with the pidfd open does the start time prove the pidfd names our process.
	if _, start, err := procStat(rec.Pid); err != nil || start != rec.StartTime {
		p.close()
		return nil, fmt.Errorf("pid %d now belongs to another process", rec.Pid)
	}
	killOld := func(why error) error {
		mp.log.Warn("killing the plugin process left by the previous host", "pid", rec.Pid, "reason", why)
		killProc(p)
		return why
	}
	if rec.SHA256 != m.SHA256 {
		return nil, killOld(fmt.Errorf("it runs the binary with sha256 %s, the manifest now says %s", rec.SHA256, m.SHA256))
	}
	if !slices.Equal(rec.Args, m.Args) {
		return nil, killOld(fmt.Errorf("it was started with args %q, the manifest now says %q", rec.Args, m.Args))
	}
	if sum, err := exeSHA256(rec.Pid); err != nil || sum != m.SHA256 {
		if err != nil {
			return nil, killOld(fmt.Errorf("cannot hash its executable: %w", err))
		}
		return nil, killOld(fmt.Errorf("its executable has sha256 %s, the manifest says %s", sum, m.SHA256))
	}
	plugins, ok := driver.HostPlugins()[rec.ProtocolVersion]
	if !ok || rec.Protocol != string(plugin.ProtocolGRPC) {
		return nil, killOld(fmt.Errorf("it speaks %s protocol version %d, which this host does not", rec.Protocol, rec.ProtocolVersion))
	}
	rc, err := rec.reattachConfig()
	if err != nil {
		return nil, killOld(err)
	}
	deadline := mp.deadline(ctx)
	client := plugin.NewClient(mp.clientConfig(&plugin.ClientConfig{
		Plugins:      plugins, // go-plugin sets this from the handshake, which a reattach skips
		Reattach:     rc,
		StartTimeout: max(time.Until(deadline), time.Millisecond),
	}))
	rpc, err := client.Client()
	if err != nil {
		return nil, killOld(fmt.Errorf("reattach: %w", err))
	}
	gc, ok := rpc.(*plugin.GRPCClient)
	if !ok {
		return nil, killOld(fmt.Errorf("reattach: plugin speaks %T, not gRPC", rpc))
	}
	inst := &instance{
		client:     client,
		rpc:        gc,
		pid:        rec.Pid,
		reattached: true,
		stderr:     &tail{}, // its stderr went to the host that started it
		started:    time.Now(),
		rec:        rec,
		proc:       p, // from now on owned by the watcher
		exited:     make(chan struct{}),
	}
	if err := mp.ready(ctx, inst, rec.ProtocolVersion, deadline); err != nil {
		return nil, err // ready killed it
	}
	return inst, nil
}

// killProc kills a process we hold a handle on and waits (bounded) until it is gone.
func killProc(p *proc) {
	defer p.close()
	_ = p.kill()
	done := make(chan struct{})
	go func() { p.wait(); close(done) }()
	select {
	case <-done:
		p.reap()
	case <-time.After(killTimeout):
	}
}
