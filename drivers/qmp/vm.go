package qmp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/core/driver/launcher"
	launcherv1 "github.com/kubevisor/kubevisor/core/driver/launcher/v1"
	"github.com/kubevisor/kubevisor/core/driver/serial"
)

// Timeouts of the driver's own waits.
const (
	// connectTimeout bounds waiting for a new QEMU's QMP and serial sockets.
	connectTimeout = 15 * time.Second
	// quitGrace is how long QEMU gets to exit after `quit` before SIGKILL.
	quitGrace = 5 * time.Second
	// killGrace is how long a process gets to vanish after SIGKILL.
	killGrace = 10 * time.Second
	// drainGrace is how long the driver waits, after QEMU exited, for its last QMP events.
	drainGrace = 2 * time.Second
	// powerdownRepeat is the longest interval between two presses of the power button.
	powerdownRepeat = 10 * time.Second
	// rebootWait bounds waiting for the RESET event after system_reset.
	rebootWait = 10 * time.Second
	// firmwareReset is how soon after a reset a guest reset is taken for the firmware's own:
	// after every warm reset SeaBIOS hard-resets the machine once more, so one reboot makes two
	// RESET events tens of milliseconds apart. No guest boots and reboots that fast.
	firmwareReset = time.Second
	// logTail is how much of qemu.log a crash message quotes.
	logTail = 2048
)

// record is the driver's record of a VM: the Handle's state, and a file in the state dir kept
// current (pid, boots) so that Recover finds the VM with the handle alone.
type record struct {
	ID           string          `json:"id"`
	Name         string          `json:"name,omitempty"`
	PID          int             `json:"pid,omitempty"`
	RunDir       string          `json:"runDir"`
	OwnRunDir    bool            `json:"ownRunDir,omitempty"`
	QMPSocket    string          `json:"qmpSocket"`
	SerialSocket string          `json:"serialSocket"`
	Accel        Accel           `json:"accel"`
	Boots        uint32          `json:"boots"`
	SoftReboot   bool            `json:"softReboot,omitempty"` // pending: softreboot.go
	StartedAt    time.Time       `json:"startedAt,omitzero"`
	Spec         json.RawMessage `json:"spec"`
	// Migration is the VM's current or last migration (migrate.go).
	Migration *migrationRecord `json:"migration,omitempty"`
	// MigratedIn: the VM was a migration target and has run; a later Start boots the guest.
	MigratedIn bool `json:"migratedIn,omitempty"`
	// IncomingSocket is the socket a migration target listens on (Delete removes it).
	IncomingSocket string `json:"incomingSocket,omitempty"`
	// IncomingDisksSocket is the socket a migration target serves its disks on over NBD.
	IncomingDisksSocket string `json:"incomingDisksSocket,omitempty"`
}

// vm is one VM the driver knows.
type vm struct {
	id    string
	spec  *domainv1.DomainSpec
	paths Paths
	op    sync.Mutex // serialises lifecycle operations

	mu      sync.Mutex
	rec     record
	state   hypervisorv1.State
	reason  string
	message string
	sess    *session      // the running QEMU, nil when there is none
	changed chan struct{} // closed and replaced on every change
	reset   time.Time     // when QEMU last reported a reset counted in rec.Boots
	mig     *migration    // the current or last migration (migrate.go)

	// agent serialises the guest agent's exchanges (GuestAgentInfo, GuestAgentPing,
	// GuestAgentExec): QEMU's chardev serves one client at a time. A one-slot semaphore, so that
	// a caller waits for it no longer than its ctx (lockAgent).
	agent chan struct{}
	// execPending are guest-exec pids whose command was still running when its GuestAgentExec
	// gave up; the next exchange reaps those that ended, so that the agent drops their output
	// (under agent).
	execPending []int64
}

// session is one QEMU process of a VM and the driver's connections to it.
type session struct {
	proc    *process
	mon     Monitor
	con     *serial.Console
	logFrom int64

	detach    chan struct{} // closed to let go of QEMU without stopping it
	evDone    chan struct{} // closed when the QMP event stream ended
	watchDone chan struct{} // closed when the exit watcher returned
	done      chan struct{} // closed (under vm.mu) once QEMU's exit is accounted for
	once      sync.Once

	// Under vm.mu: how it is ending.
	shutdownSeen   bool
	guestShutdown  bool
	panicked       bool
	shutdownReason string
	hostStop       string
	softRebooting  bool // the guest powered off for a soft reboot, which is being finished
	// hostStopMessage is the VM's message when the host stopped it (with hostStop).
	hostStopMessage string

	// Under vm.mu: a migration (migrate.go).
	incoming     bool // a migration target that does not run the VM yet
	incomingDone bool // its state arrived: runMigratedIn runs it
	migratedOut  bool // the source of a completed migration: it is being stopped
	postCopyLost bool // a migration failed in post-copy: the VM is lost here
}

func (s *session) detachAndWait() {
	s.once.Do(func() { close(s.detach) })
	_ = s.mon.Close()
	s.con.Close()
	<-s.evDone
	<-s.watchDone
}

func (v *vm) signalLocked() {
	close(v.changed)
	v.changed = make(chan struct{})
}

// waitFor waits until cond (called under v.mu) holds, up to timeout or ctx.
func (v *vm) waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		v.mu.Lock()
		ok, ch := cond(), v.changed
		v.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

func active(st hypervisorv1.State) bool {
	switch st {
	case hypervisorv1.State_STATE_RUNNING, hypervisorv1.State_STATE_PAUSED, hypervisorv1.State_STATE_SHUTTING_DOWN:
		return true
	}
	return false
}

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func (d *Driver) get(id string) (*vm, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.vms[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "vm %q not found", id)
	}
	return v, nil
}

// wantAccel is the accelerator a VM asking for acc gets on host (before checking it works).
func wantAccel(acc domainv1.Acceleration, host *HostInfo) Accel {
	switch acc {
	case domainv1.Acceleration_ACCELERATION_REQUIRED:
		return AccelKVM
	case domainv1.Acceleration_ACCELERATION_EMULATED:
		return AccelTCG
	}
	if host.KVM {
		return AccelKVM
	}
	return AccelTCG
}

// checkAccel says whether accel can run on host.
func checkAccel(accel Accel, host *HostInfo) error {
	switch {
	case host.Problem != "":
		return status.Errorf(codes.FailedPrecondition, "%v: %s", errNoQEMU, host.Problem)
	case accel == AccelKVM && !host.KVM:
		return status.Errorf(codes.FailedPrecondition, "acceleration: hardware acceleration is required but KVM is not usable on this node (%s)", host.KVMReason)
	case accel == AccelTCG && !host.TCG:
		return status.Errorf(codes.FailedPrecondition, "acceleration: emulation (TCG) does not work on this node (%s)", host.TCGReason)
	}
	return nil
}

func (d *Driver) runDirFor(spec *domainv1.DomainSpec) (string, bool) {
	if spec.GetRunDir() != "" {
		return spec.GetRunDir(), false
	}
	d.mu.Lock()
	base := d.stateDir
	d.mu.Unlock()
	if base == "" {
		base = filepath.Join(os.TempDir(), "kubevisor-qmp")
	}
	return filepath.Join(base, "run", spec.GetId()), true
}

// hostEnv is what BuildArgs needs for spec on this node.
func (d *Driver) hostEnv(host *HostInfo, accel Accel, runDir string, spec *domainv1.DomainSpec) HostEnv {
	d.mu.Lock()
	ovmf := DefaultOVMF
	if d.cfg.OVMF != nil {
		ovmf = *d.cfg.OVMF
	}
	d.mu.Unlock()
	exists := func(p string) bool { _, err := os.Stat(p); return p != "" && err == nil }
	if !exists(ovmf.Code) || !exists(ovmf.Vars) {
		ovmf.Code, ovmf.Vars = "", ""
	}
	if !exists(ovmf.SecureCode) || !exists(ovmf.SecureVars) {
		ovmf.SecureCode, ovmf.SecureVars = "", ""
	}
	swtpm := d.swtpm(context.Background())
	blk := map[string]bool{}
	for _, disk := range spec.GetDisks() {
		if fi, err := os.Stat(disk.GetPath()); err == nil && fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0 {
			blk[disk.GetPath()] = true
		}
	}
	sgio := map[string]string{}
	for _, disk := range spec.GetDisks() {
		if disk.GetDevice() == domainv1.DiskDevice_DISK_DEVICE_LUN {
			sgio[disk.GetPath()] = sgioProblem(disk.GetPath())
		}
	}
	return HostEnv{
		Accel: accel, RunDir: runDir, OVMF: ovmf, VhostNet: host.VhostNet,
		CPUModels: host.CPUModels, MachineTypes: host.MachineTypes, CPUFlags: host.CPUFlags, BlockDevices: blk, SGIO: sgio,
		SEV: host.SEV, SEVReason: host.SEVReason, SWTPM: swtpm.Path, SWTPMReason: swtpm.Problem,
		TCGTranslationCacheMiB: cmp.Or(d.cfg.TCGTranslationCacheMiB, DefaultTCGTranslationCacheMiB),
	}
}

// Create implements driver.Hypervisor. It checks the spec by building its command line; it
// starts nothing.
func (d *Driver) Create(ctx context.Context, spec *domainv1.DomainSpec) (*hypervisorv1.Handle, error) {
	if err := domain.Validate(spec); err != nil {
		return nil, err
	}
	if !idRE.MatchString(spec.GetId()) {
		return nil, domain.ValidationError{{Field: "id", Detail: fmt.Sprintf("%q is not usable as a file name ([A-Za-z0-9._-], at most 128)", spec.GetId())}}
	}
	host, err := d.hostInfo(ctx)
	if err != nil {
		return nil, err
	}
	spec = proto.Clone(spec).(*domainv1.DomainSpec)
	accel := wantAccel(spec.GetAcceleration(), host)
	runDir, own := d.runDirFor(spec)
	if _, err := BuildArgs(spec, d.hostEnv(host, accel, runDir, spec)); err != nil {
		return nil, err
	}
	if err := checkAccel(accel, host); err != nil {
		return nil, err
	}
	specJSON, err := protojson.Marshal(spec)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode spec: %v", err)
	}
	paths := RunPaths(spec, runDir)
	v := &vm{
		id: spec.GetId(), spec: spec, paths: paths, changed: make(chan struct{}), agent: make(chan struct{}, 1),
		state: hypervisorv1.State_STATE_CREATED, reason: driver.ReasonCreated,
		rec: record{
			ID: spec.GetId(), Name: spec.GetName(), RunDir: runDir, OwnRunDir: own,
			QMPSocket: paths.QMP, SerialSocket: paths.Serial, Accel: accel, Spec: specJSON,
			IncomingSocket: spec.GetIncomingMigration().GetSocketPath(), IncomingDisksSocket: spec.GetIncomingMigration().GetDisksSocketPath(),
		},
	}
	d.mu.Lock()
	if _, ok := d.vms[v.id]; ok {
		d.mu.Unlock()
		return nil, status.Errorf(codes.AlreadyExists, "vm %q already exists", v.id)
	}
	d.vms[v.id] = v
	d.mu.Unlock()
	v.mu.Lock()
	d.persistLocked(v)
	state, _ := json.Marshal(v.rec)
	v.mu.Unlock()
	d.log.Info("created vm", "id", v.id, "accel", accel, "run_dir", runDir)
	return &hypervisorv1.Handle{Id: v.id, Driver: Name, State: state}, nil
}

// Start implements driver.Hypervisor.
func (d *Driver) Start(ctx context.Context, id string) error {
	v, err := d.get(id)
	if err != nil {
		return err
	}
	v.op.Lock()
	defer v.op.Unlock()
	v.mu.Lock()
	st, s := v.state, v.sess
	v.mu.Unlock()
	switch {
	case st == hypervisorv1.State_STATE_SHUTTING_DOWN:
		return status.Errorf(codes.FailedPrecondition, "vm %q is shutting down", id)
	case active(st):
		return nil
	case s != nil:
		// CRASHED by a guest panic, with QEMU not gone yet: end it before a new one.
		if err := d.stop(ctx, v, s, driver.ReasonKilled); err != nil {
			return err
		}
	}
	host, err := d.hostInfo(ctx)
	if err != nil {
		return err
	}
	if err := checkAccel(v.rec.Accel, host); err != nil {
		return err
	}
	return d.launch(ctx, v, host)
}

// launch starts QEMU for v, attaches to it and lets the guest run.
func (d *Driver) launch(ctx context.Context, v *vm, host *HostInfo) error {
	cl, err := BuildArgs(v.spec, d.hostEnv(host, v.rec.Accel, v.rec.RunDir, v.spec))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(v.rec.RunDir, 0o700); err != nil {
		return status.Errorf(codes.FailedPrecondition, "run dir: %v", err)
	}
	if v.rec.MigratedIn && v.spec.GetIncomingMigration() != nil {
		// The VM arrived and ran: from now on it boots as any VM.
		v.spec = proto.CloneOf(v.spec)
		v.spec.IncomingMigration = nil
	}
	incoming := v.spec.GetIncomingMigration()
	for _, stale := range []string{v.paths.QMP, v.paths.Serial, v.paths.PID, v.spec.GetVnc().GetSocketPath(), incoming.GetSocketPath()} {
		if stale != "" {
			_ = os.Remove(stale)
		}
	}
	if cl.VarsTemplate != "" {
		if err := prepareVars(v.spec, cl.VarsTemplate, v.paths.Vars); err != nil {
			return err
		}
	}
	var files []*os.File
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	for _, p := range cl.ExtraFiles {
		f, err := openPassed(p)
		if err != nil {
			return status.Errorf(codes.FailedPrecondition, "open %s: %v", p, err)
		}
		files = append(files, f)
	}
	var companions []*launcher.Companion
	var socketpair []*os.File // the TPM's: closed here once the processes have theirs
	if cl.TPM != nil {
		comp, qemuEnd, err := d.tpmCompanion(ctx, v, cl.TPM)
		if err != nil {
			return err
		}
		socketpair = []*os.File{qemuEnd, comp.ExtraFiles[0]}
		defer closeFiles(socketpair)
		if cl.TPM.FD != 3+len(files) {
			return status.Errorf(codes.Internal, "tpm: chardev fd %d, but QEMU's end of the socketpair would be fd %d", cl.TPM.FD, 3+len(files))
		}
		files = append(files, qemuEnd)
		companions = append(companions, comp)
	}
	var logFrom, swtpmFrom int64
	if fi, err := os.Stat(v.paths.Log); err == nil {
		logFrom = fi.Size()
	}
	if fi, err := os.Stat(v.paths.SWTPMLog); err == nil {
		swtpmFrom = fi.Size()
	}
	// logs is what QEMU (and swtpm, its companion) wrote since this start, for errors.
	logs := func() string {
		s := tailLog(v.paths.Log, logFrom)
		if cl.TPM != nil {
			s += "; swtpm: " + tailOf("swtpm", v.paths.SWTPMLog, swtpmFrom)
		}
		return s
	}
	starter := d.local
	if sock := v.spec.GetSandbox().GetLauncherSocket(); sock != "" {
		// v has no QEMU of this driver process: one the launcher runs was started by an
		// earlier process of the driver, SIGKILLed before it recorded it.
		starter = &launcher.SocketStarter{Socket: sock, KillLeftover: true, Leftover: func(p *launcherv1.Process) {
			d.log.Warn("killed a process an interrupted start left in the launcher", "id", v.id, "name", p.GetName(), "pid", p.GetPid())
		}}
	}
	pid, err := starter.Start(ctx, &launcher.Command{
		Path: host.QEMU, Args: cl.Args, LogPath: v.paths.Log,
		NetNS: v.spec.GetSandbox().GetNetnsPath(), ExtraFiles: files, Companions: companions,
	})
	// Each side must see the other's end close when that process dies (a QEMU waiting for a
	// dead swtpm would hang otherwise): ours go now.
	closeFiles(socketpair)
	if err != nil {
		return status.Errorf(codes.Internal, "start qemu: %v", err)
	}
	proc, err := openProcess(pid)
	if err != nil {
		return status.Errorf(codes.Internal, "qemu exited at once: %s", logs())
	}
	d.log.Info("started qemu", "id", v.id, "pid", pid, "accel", v.rec.Accel)
	mon, con, err := d.attach(ctx, v, proc)
	if err != nil {
		_ = proc.kill()
		proc.exited(killGrace)
		proc.close()
		return status.Errorf(codes.Internal, "qemu (pid %d): %v: %s", pid, err, logs())
	}
	s := d.adopt(v, proc, mon, con, logFrom)
	if err := setLinksDown(ctx, mon, v.spec); err != nil {
		_ = d.stop(ctx, v, s, driver.ReasonStartFailed)
		return status.Errorf(codes.Internal, "qemu (pid %d): %v", pid, err)
	}
	// The guest has not run yet (-S): its threads go where cpu.pinning says first.
	if p := v.spec.GetCpu().GetPinning(); p != nil {
		if err := pinThreads(ctx, mon, pid, p); err != nil {
			_ = d.stop(ctx, v, s, driver.ReasonStartFailed)
			return status.Errorf(codes.FailedPrecondition, "qemu (pid %d): %v", pid, err)
		}
	}
	if incoming != nil {
		return d.listenIncoming(ctx, v, s, pid, logs)
	}
	// A VM that starts paused keeps its vCPUs stopped (-S) until Resume's cont.
	startPaused := v.spec.GetStartPaused()
	if !startPaused {
		if _, err := mon.Run(ctx, "cont", nil); err != nil {
			_ = d.stop(ctx, v, s, driver.ReasonStartFailed)
			return status.Errorf(codes.Internal, "qemu (pid %d): %v: %s", pid, err, logs())
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-s.done:
		return status.Errorf(codes.Internal, "qemu (pid %d) exited: %s", pid, v.message)
	default:
	}
	v.state, v.reason, v.message = hypervisorv1.State_STATE_RUNNING, driver.ReasonStarted, ""
	if startPaused {
		v.state, v.message = hypervisorv1.State_STATE_PAUSED, "started paused: the guest runs once resumed"
	}
	v.rec.Boots++
	v.rec.PID = pid
	v.rec.StartedAt = time.Now()
	d.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_STARTED)
	d.persistLocked(v)
	v.signalLocked()
	return nil
}

// attach connects to a QEMU's QMP and serial sockets, retrying while it comes up.
func (d *Driver) attach(ctx context.Context, v *vm, proc *process) (Monitor, *serial.Console, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	var mon Monitor
	err := retry(ctx, proc, func() error {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		defer acancel()
		m, err := d.dial(actx, v.paths.QMP)
		mon = m
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("connect qmp: %w", err)
	}
	var conn net.Conn
	err = retry(ctx, proc, func() error {
		c, err := net.DialTimeout("unix", v.paths.Serial, 2*time.Second)
		conn = c
		return err
	})
	if err != nil {
		_ = mon.Close()
		return nil, nil, fmt.Errorf("connect serial console: %w", err)
	}
	return mon, serial.New(conn), nil
}

// retry calls f until it succeeds, ctx is done or the process exits.
func retry(ctx context.Context, proc *process, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		if proc.exited(0) {
			return fmt.Errorf("qemu exited (%w)", err)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// adopt makes a connected QEMU v's session and starts watching its events and its exit.
func (d *Driver) adopt(v *vm, proc *process, mon Monitor, con *serial.Console, logFrom int64) *session {
	s := &session{
		proc: proc, mon: mon, con: con, logFrom: logFrom,
		detach: make(chan struct{}), evDone: make(chan struct{}), watchDone: make(chan struct{}), done: make(chan struct{}),
	}
	v.mu.Lock()
	v.sess = s
	v.mu.Unlock()
	go d.eventLoop(v, s)
	go d.watch(v, s)
	return s
}

func (d *Driver) eventLoop(v *vm, s *session) {
	defer close(s.evDone)
	for e := range s.mon.Events() {
		d.log.Debug("qmp event", "id", v.id, "event", e.Event, "data", e.Data)
		v.mu.Lock()
		if v.sess == s {
			d.applyLocked(v, s, e)
		}
		v.mu.Unlock()
	}
}

// applyLocked applies a QMP event (or the effect of a command that has one) to v.
func (d *Driver) applyLocked(v *vm, s *session, e qmp.Event) {
	if d.migrationEventLocked(v, s, e) {
		return
	}
	e, consumed := d.softRebootEventLocked(v, s, e)
	if consumed {
		return
	}
	guest, _ := e.Data["guest"].(bool)
	switch e.Event {
	case "RESET":
		if guest && time.Since(v.reset) < firmwareReset {
			d.log.Debug("second reset of a reboot (the firmware's), not counted", "id", v.id)
			return
		}
		v.reset = time.Now()
		v.rec.Boots++
		defer d.persistLocked(v)
	case "SHUTDOWN":
		r, _ := e.Data["reason"].(string)
		s.shutdownSeen, s.shutdownReason = true, shutdownReason(r)
		s.guestShutdown = guest && r == "guest-shutdown"
		if r == "guest-panic" {
			s.panicked = true
		}
	case "GUEST_PANICKED":
		s.panicked = true
	}
	next, typ, reason := transition(v.state, e)
	if typ == hypervisorv1.EventType_EVENT_TYPE_UNSPECIFIED && next == v.state {
		return
	}
	v.state = next
	if typ != hypervisorv1.EventType_EVENT_TYPE_UNSPECIFIED {
		v.reason, v.message = reason, ""
		d.emitLocked(v, typ)
	}
	v.signalLocked()
}

// watch waits for QEMU to exit and records how it ended.
func (d *Driver) watch(v *vm, s *session) {
	defer close(s.watchDone)
	defer s.proc.close()
	if !s.proc.wait(s.detach) {
		return // detached: QEMU goes on without us
	}
	// QEMU's last events (SHUTDOWN) are in the socket: read them before judging the exit.
	select {
	case <-s.evDone:
	case <-time.After(drainGrace):
	}
	_ = s.mon.Close()
	select {
	case <-s.evDone:
	case <-time.After(drainGrace):
	}
	s.con.Close()
	v.mu.Lock()
	defer v.mu.Unlock()
	d.finishLocked(v, s)
}

// finishLocked records that s's QEMU exited.
func (d *Driver) finishLocked(v *vm, s *session) {
	state, typ := hypervisorv1.State_STATE_STOPPED, hypervisorv1.EventType_EVENT_TYPE_STOPPED
	var reason, msg string
	switch {
	case s.postCopyLost:
		state, typ, reason, msg = hypervisorv1.State_STATE_CRASHED, hypervisorv1.EventType_EVENT_TYPE_CRASHED, driver.ReasonMigrationFailed,
			"the migration failed after the switch to post-copy: the guest's memory was split between source and target"
	case s.migratedOut:
		reason, msg = driver.ReasonMigrated, s.hostStopMessage
	case s.incoming:
		// A target that never ran the VM.
		reason = cmp.Or(s.hostStop, driver.ReasonMigrationFailed)
		msg = "the incoming migration did not complete"
		if s.hostStop == "" {
			msg = fmt.Sprintf("the incoming migration failed; end of qemu.log: %s", tailLog(v.paths.Log, s.logFrom))
		}
	case s.panicked:
		state, typ, reason, msg = hypervisorv1.State_STATE_CRASHED, hypervisorv1.EventType_EVENT_TYPE_CRASHED, driver.ReasonGuestPanicked, "the guest panicked"
	case s.guestShutdown:
		reason, msg = driver.ReasonGuestShutdown, "the guest powered off"
	case s.hostStop != "":
		reason, msg = s.hostStop, s.hostStopMessage
	case s.shutdownSeen:
		reason, msg = s.shutdownReason, "QEMU shut down"
	default:
		state, typ, reason = hypervisorv1.State_STATE_CRASHED, hypervisorv1.EventType_EVENT_TYPE_CRASHED, driver.ReasonProcessExited
		msg = fmt.Sprintf("QEMU (pid %d) exited unexpectedly; end of qemu.log: %s", s.proc.pid, tailLog(v.paths.Log, s.logFrom))
	}
	d.log.Info("qemu exited", "id", v.id, "pid", s.proc.pid, "state", state.String(), "reason", reason)
	v.state, v.reason, v.message = state, reason, msg
	if v.sess == s {
		v.sess = nil
	}
	v.rec.PID = 0
	v.rec.SoftReboot = false
	if !v.mig.ended() {
		phase := hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED
		if reason == driver.ReasonMigrationCancelled {
			phase = hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED
		}
		d.endMigrationLocked(v, phase, fmt.Sprintf("the VM process ended (%s)", reason))
	}
	d.emitLocked(v, typ)
	d.persistLocked(v)
	close(s.done)
	v.signalLocked()
}

// stop ends s's QEMU: `quit`, then SIGKILL. reason is the VM's reason unless the guest ends
// first on its own. It returns once the exit is accounted for.
func (d *Driver) stop(ctx context.Context, v *vm, s *session, reason string) error {
	ctx = context.WithoutCancel(ctx)
	v.mu.Lock()
	if s.hostStop == "" {
		s.hostStop = reason
	}
	v.mu.Unlock()
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, _ = s.mon.Run(qctx, "quit", nil)
	cancel()
	if waitClosed(s.done, quitGrace) {
		return nil
	}
	d.log.Warn("qemu did not quit, killing it", "id", v.id, "pid", s.proc.pid)
	if err := s.proc.kill(); err != nil {
		return status.Errorf(codes.Internal, "kill qemu (pid %d): %v", s.proc.pid, err)
	}
	if waitClosed(s.done, killGrace) {
		return nil
	}
	return status.Errorf(codes.Internal, "qemu (pid %d) did not exit after SIGKILL", s.proc.pid)
}

// waitClosed reports whether ch is closed, waiting up to timeout.
func waitClosed(ch <-chan struct{}, timeout time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// running returns v's session, or FailedPrecondition.
func (v *vm) running() (*session, hypervisorv1.State, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.sess == nil {
		return nil, v.state, status.Errorf(codes.FailedPrecondition, "vm %q is not running (%s)", v.id, v.state)
	}
	return v.sess, v.state, nil
}

// Shutdown implements driver.Hypervisor: the ACPI power button (pressed again now and then), then
// `quit` and SIGKILL at the timeout. A paused VM is resumed first, so that its guest can react.
func (d *Driver) Shutdown(ctx context.Context, id string, timeout time.Duration) (bool, error) {
	v, err := d.get(id)
	if err != nil {
		return false, err
	}
	v.op.Lock()
	defer v.op.Unlock()
	s, st, err := v.running()
	if err != nil {
		return false, nil // stopped already
	}
	v.mu.Lock()
	incoming, migrating := s.incoming, !v.mig.ended() && !s.incoming
	v.mu.Unlock()
	if incoming {
		timeout = 0 // no guest to ask yet
	} else if migrating {
		// The guest powers off here: the migration first ends, the VM staying here.
		if err := d.CancelMigration(ctx, id); err != nil {
			d.log.Warn("cancel the migration before shutdown", "id", id, "error", err)
		}
	}
	if st == hypervisorv1.State_STATE_PAUSED {
		if _, err := s.mon.Run(ctx, "cont", nil); err == nil {
			v.mu.Lock()
			d.applyLocked(v, s, qmp.Event{Event: "RESUME"})
			v.mu.Unlock()
		}
	}
	// The guest's power-off must stop the VM now, not restart it.
	d.cancelSoftReboot(ctx, v, s)
	if timeout <= 0 {
		// No grace: stopped at once, as Kill does, without asking the guest.
		if err := d.stop(ctx, v, s, driver.ReasonForcedShutdown); err != nil {
			return false, err
		}
		return false, nil
	}
	v.mu.Lock()
	if v.sess == s && (v.state == hypervisorv1.State_STATE_RUNNING || v.state == hypervisorv1.State_STATE_PAUSED) {
		v.state = hypervisorv1.State_STATE_SHUTTING_DOWN
		v.signalLocked()
	}
	v.mu.Unlock()
	// QEMU drops a press of the power button the guest has not enabled yet (a guest still
	// booting), so press it again now and then: 1 s, 2 s, 4 s, 8 s, then every 10 s.
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
presses:
	for again := time.Second; ; again = min(2*again, powerdownRepeat) {
		if _, err := s.mon.Run(ctx, "system_powerdown", nil); err != nil {
			d.log.Debug("system_powerdown", "id", id, "error", err)
		}
		press := time.NewTimer(again)
		select {
		case <-press.C:
			continue presses
		case <-s.done:
		case <-deadline.C:
		case <-ctx.Done():
		}
		press.Stop()
		break
	}
	if !waitClosed(s.done, 0) {
		d.log.Info("guest did not power off in time, stopping it", "id", id, "timeout", timeout)
		if err := d.stop(ctx, v, s, driver.ReasonForcedShutdown); err != nil {
			return false, err
		}
	}
	if ctx.Err() != nil {
		return false, status.FromContextError(ctx.Err()).Err()
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return s.guestShutdown, nil
}

// Kill implements driver.Hypervisor. It cuts short an operation that waits on a running QEMU (a
// Shutdown waiting for the guest); it waits for one that has no QEMU yet (a Start).
func (d *Driver) Kill(ctx context.Context, id string) error {
	v, err := d.get(id)
	if err != nil {
		return err
	}
	if !v.op.TryLock() {
		if s, _, err := v.running(); err == nil {
			return d.stop(ctx, v, s, driver.ReasonKilled)
		}
		v.op.Lock()
	}
	defer v.op.Unlock()
	s, _, err := v.running()
	if err != nil {
		return nil
	}
	return d.stop(ctx, v, s, driver.ReasonKilled)
}

// Pause implements driver.Pauser.
func (d *Driver) Pause(ctx context.Context, id string) error {
	return d.runState(ctx, id, "stop", "STOP", hypervisorv1.State_STATE_PAUSED)
}

// Resume implements driver.Pauser.
func (d *Driver) Resume(ctx context.Context, id string) error {
	return d.runState(ctx, id, "cont", "RESUME", hypervisorv1.State_STATE_RUNNING)
}

// runState runs command to bring a running or paused VM to want, applying event's effect at
// once (QEMU's own event then changes nothing).
func (d *Driver) runState(ctx context.Context, id, command, event string, want hypervisorv1.State) error {
	v, err := d.get(id)
	if err != nil {
		return err
	}
	v.op.Lock()
	defer v.op.Unlock()
	s, st, err := v.running()
	if err == nil {
		v.mu.Lock()
		err = v.migrationBusyLocked()
		v.mu.Unlock()
	}
	switch {
	case err != nil:
		return err
	case st == want:
		return nil
	case st != hypervisorv1.State_STATE_RUNNING && st != hypervisorv1.State_STATE_PAUSED:
		return status.Errorf(codes.FailedPrecondition, "vm %q is %s", id, driver.StateWord(st))
	}
	if _, err := s.mon.Run(ctx, command, nil); err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.sess == s {
		d.applyLocked(v, s, qmp.Event{Event: event})
	}
	return nil
}

// lockRunning takes the operation lock of VM id, which must be running (not paused, not
// stopping): NotFound or FailedPrecondition otherwise, with the lock released. Call unlock when
// the operation is done.
func (d *Driver) lockRunning(id string) (v *vm, s *session, unlock func(), err error) {
	if v, err = d.get(id); err != nil {
		return nil, nil, nil, err
	}
	v.op.Lock()
	s, st, err := v.running()
	switch {
	case err != nil:
	case st != hypervisorv1.State_STATE_RUNNING:
		err = status.Errorf(codes.FailedPrecondition, "vm %q is %s, not running", id, driver.StateWord(st))
	default:
		v.mu.Lock()
		err = v.migrationBusyLocked()
		v.mu.Unlock()
	}
	if err != nil {
		v.op.Unlock()
		return nil, nil, nil, err
	}
	return v, s, v.op.Unlock, nil
}

// Reboot implements driver.Rebooter: system_reset, returning once QEMU reported the reset.
func (d *Driver) Reboot(ctx context.Context, id string) error {
	v, s, unlock, err := d.lockRunning(id)
	if err != nil {
		return err
	}
	defer unlock()
	v.mu.Lock()
	boots := v.rec.Boots
	v.mu.Unlock()
	if _, err := s.mon.Run(ctx, "system_reset", nil); err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	if !v.waitFor(ctx, rebootWait, func() bool { return v.rec.Boots > boots || v.sess != s }) {
		return status.Errorf(codes.DeadlineExceeded, "vm %q: no RESET event within %s of system_reset", id, rebootWait)
	}
	return nil
}

// Delete implements driver.Hypervisor.
func (d *Driver) Delete(_ context.Context, id string) error {
	d.mu.Lock()
	v, ok := d.vms[id]
	d.mu.Unlock()
	if !ok {
		return nil
	}
	v.op.Lock()
	defer v.op.Unlock()
	v.mu.Lock()
	if v.sess != nil {
		st := v.state
		v.mu.Unlock()
		return status.Errorf(codes.FailedPrecondition, "vm %q is %s: stop it first", id, st)
	}
	v.mu.Unlock()
	made := []string{v.paths.QMP, v.paths.Serial, v.paths.PID, v.paths.Log, v.paths.Agent, v.spec.GetVnc().GetSocketPath(),
		v.rec.IncomingSocket, v.rec.IncomingDisksSocket}
	if !v.spec.GetFirmware().GetEfi().GetPersistent() {
		// A persistent store is the persistent state directory's, which outlives the VM.
		made = append(made, v.paths.Vars)
	}
	for _, p := range made {
		if p != "" {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return status.Errorf(codes.Internal, "delete vm %q: %v", id, err)
			}
		}
	}
	if v.rec.OwnRunDir {
		if err := os.RemoveAll(v.rec.RunDir); err != nil {
			return status.Errorf(codes.Internal, "delete vm %q: %v", id, err)
		}
	}
	if p := d.recordPath(id); p != "" {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return status.Errorf(codes.Internal, "delete vm %q: %v", id, err)
		}
	}
	d.mu.Lock()
	delete(d.vms, id)
	d.mu.Unlock()
	d.log.Info("deleted vm", "id", id)
	return nil
}

// Status implements driver.Hypervisor.
func (d *Driver) Status(_ context.Context, id string) (*hypervisorv1.VMStatus, error) {
	v, err := d.get(id)
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.statusLocked(), nil
}

func (v *vm) statusLocked() *hypervisorv1.VMStatus {
	st := &hypervisorv1.VMStatus{
		Id: v.id, State: v.state, Reason: v.reason, Message: v.message,
		Boots: v.rec.Boots, Accelerated: v.rec.Accel == AccelKVM,
	}
	if v.sess != nil {
		st.Pid = int64(v.sess.proc.pid)
		if !v.rec.StartedAt.IsZero() {
			st.StartedAt = timestamppb.New(v.rec.StartedAt)
		}
	}
	return st
}

// Events implements driver.Hypervisor.
func (d *Driver) Events(ctx context.Context, id string, send func(*hypervisorv1.Event) error) error {
	return d.events.Serve(ctx, id, send)
}

func (d *Driver) emitLocked(v *vm, typ hypervisorv1.EventType) {
	d.events.Publish(&hypervisorv1.Event{
		Id: v.id, Type: typ, Time: timestamppb.Now(), State: v.state, Reason: v.reason, Message: v.message,
	})
}

// Console implements driver.Consoler: the buffered output first, then live output; input goes
// to the serial port.
func (d *Driver) Console(ctx context.Context, id string, in io.Reader, out io.Writer) error {
	v, err := d.get(id)
	if err != nil {
		return err
	}
	s, _, err := v.running()
	if err != nil {
		return err
	}
	return s.con.Serve(ctx, in, out)
}

// Recover implements driver.Recoverer: it re-adopts the VM of a handle from Create. A VM whose
// record in the state dir says it never started is CREATED; a QEMU that is gone, or a VM without
// a record (deleted, or no state dir), leaves the VM STOPPED (reason ProcessGone).
func (d *Driver) Recover(ctx context.Context, h *hypervisorv1.Handle) (*hypervisorv1.VMStatus, error) {
	var rec record
	if err := json.Unmarshal(h.GetState(), &rec); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "handle.state: not a qmp driver record: %v", err)
	}
	if rec.ID == "" || rec.ID != h.GetId() || !idRE.MatchString(rec.ID) {
		return nil, status.Errorf(codes.InvalidArgument, "handle.state: record of %q does not match handle id %q", rec.ID, h.GetId())
	}
	if v, err := d.get(rec.ID); err == nil { // known already: recovering twice changes nothing
		v.mu.Lock()
		defer v.mu.Unlock()
		return v.statusLocked(), nil
	}
	// The state dir has the VM's latest pid and boot count; the handle is from Create.
	recorded := false
	if p := d.recordPath(rec.ID); p != "" {
		if raw, err := os.ReadFile(p); err == nil {
			var stored record
			if json.Unmarshal(raw, &stored) == nil && stored.ID == rec.ID {
				rec, recorded = stored, true
			}
		}
	}
	spec := &domainv1.DomainSpec{}
	if err := protojson.Unmarshal(rec.Spec, spec); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "handle.state: spec: %v", err)
	}
	if rec.MigratedIn {
		spec.IncomingMigration = nil
	}
	paths := RunPaths(spec, rec.RunDir)
	v := &vm{id: rec.ID, spec: spec, paths: paths, rec: rec, changed: make(chan struct{}), agent: make(chan struct{}, 1),
		mig: loadMigration(rec.Migration)}
	pid := rec.PID
	if pid == 0 {
		pid = readPIDFile(paths.PID)
	}
	var proc *process
	if isQEMUOf(pid, paths.PID) {
		if p, err := openProcess(pid); err == nil {
			proc = p
		}
	}
	if proc == nil {
		v.rec.PID = 0
		if !v.mig.ended() {
			v.mig.info.Phase = hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED
			v.mig.info.Message = "the VM process was gone when the driver restarted"
			v.mig.info.EndedAt = timestamppb.Now()
			v.persistMigrationLocked()
		}
		switch {
		case pid == 0 && v.rec.Boots == 0 && recorded:
			// Created and never started (a deleted VM has no record left).
			v.state, v.reason = hypervisorv1.State_STATE_CREATED, driver.ReasonCreated
		default:
			v.state, v.reason = hypervisorv1.State_STATE_STOPPED, driver.ReasonProcessGone
			v.message = "QEMU is not running"
			if pid != 0 {
				v.message = fmt.Sprintf("QEMU (pid %d) is no longer running", pid)
			}
		}
		return d.register(v)
	}
	mon, con, err := d.attach(ctx, v, proc)
	if err != nil {
		proc.close()
		return nil, status.Errorf(codes.Unavailable, "recover vm %q (pid %d): %v", rec.ID, pid, err)
	}
	var qs struct {
		Status  string `json:"status"`
		Running bool   `json:"running"`
	}
	raw, err := mon.Run(ctx, "query-status", nil)
	if err == nil {
		err = json.Unmarshal(raw, &qs)
	}
	if err != nil {
		_ = mon.Close()
		con.Close()
		proc.close()
		return nil, status.Errorf(codes.Unavailable, "recover vm %q: %v", rec.ID, err)
	}
	var logFrom int64
	if fi, err := os.Stat(paths.Log); err == nil {
		logFrom = max(fi.Size()-logTail, 0)
	}
	v.rec.PID = pid
	if v.rec.Boots == 0 && v.spec.GetIncomingMigration() == nil {
		v.rec.Boots = 1
	}
	v.reason = driver.ReasonRecovered
	migState, afterAdopt, migrating := d.recoverMigration(ctx, v, mon, qs.Status)
	switch {
	case migrating:
		v.state = migState
	case qs.Status == "prelaunch" && v.spec.GetStartPaused():
		// Started paused and not resumed since.
		v.state = hypervisorv1.State_STATE_PAUSED
	case qs.Status == "prelaunch":
		// The previous driver died between launch and cont: finish the start.
		err := setLinksDown(ctx, mon, v.spec)
		if err == nil {
			_, err = mon.Run(ctx, "cont", nil)
		}
		if err != nil {
			_ = mon.Close()
			con.Close()
			proc.close()
			return nil, status.Errorf(codes.Unavailable, "recover vm %q: %v", rec.ID, err)
		}
		v.state = hypervisorv1.State_STATE_RUNNING
	case qs.Status == "guest-panicked":
		v.state = hypervisorv1.State_STATE_CRASHED
	case qs.Status == "shutdown" && v.rec.SoftReboot:
		// The previous driver died while the guest powered off for a soft reboot: finished
		// once the VM is adopted.
		v.state = hypervisorv1.State_STATE_RUNNING
	case qs.Running:
		v.state = hypervisorv1.State_STATE_RUNNING
	default:
		v.state = hypervisorv1.State_STATE_PAUSED
	}
	finishReboot := qs.Status == "shutdown" && v.rec.SoftReboot
	s := d.adopt(v, proc, mon, con, logFrom)
	st, err := d.register(v)
	if err != nil {
		s.detachAndWait()
		return nil, err
	}
	if afterAdopt != nil {
		afterAdopt(s)
	}
	if finishReboot {
		v.mu.Lock()
		s.softRebooting = true
		v.mu.Unlock()
		go d.finishSoftReboot(v, s)
	}
	d.log.Info("recovered vm", "id", v.id, "pid", pid, "state", st.GetState().String())
	return st, nil
}

// register adds a recovered VM (Aborted when a concurrent Recover of the same id won).
func (d *Driver) register(v *vm) (*hypervisorv1.VMStatus, error) {
	d.mu.Lock()
	if _, ok := d.vms[v.id]; ok {
		d.mu.Unlock()
		return nil, status.Errorf(codes.Aborted, "vm %q was recovered concurrently", v.id)
	}
	d.vms[v.id] = v
	d.mu.Unlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	d.persistLocked(v)
	return v.statusLocked(), nil
}

func (d *Driver) recordPath(id string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stateDir == "" {
		return ""
	}
	return filepath.Join(d.stateDir, "vms", id+".json")
}

// persistLocked writes v's record to the state dir (when there is one).
func (d *Driver) persistLocked(v *vm) {
	p := d.recordPath(v.id)
	if p == "" {
		return
	}
	raw, err := json.Marshal(v.rec)
	if err == nil {
		tmp := p + ".tmp"
		if err = os.WriteFile(tmp, raw, 0o600); err == nil {
			err = os.Rename(tmp, p)
		}
	}
	if err != nil {
		d.log.Error("persist vm record", "id", v.id, "error", err)
	}
}

// tailLog is the end of a QEMU log from offset from: the last lines, at most logTail bytes.
func tailLog(path string, from int64) string { return tailOf("qemu", path, from) }

// tailOf is tailLog for the log of the process called name.
func tailOf(name, path string, from int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no " + name + " log)"
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "(no " + name + " log)"
	}
	start := max(from, fi.Size()-logTail)
	buf := make([]byte, fi.Size()-start)
	n, _ := f.ReadAt(buf, start)
	text := strings.TrimSpace(string(buf[:n]))
	if start > from {
		if i := strings.IndexByte(text, '\n'); i >= 0 {
			text = text[i+1:]
		}
	}
	if text == "" {
		return "(" + name + " log is empty)"
	}
	return strings.ReplaceAll(text, "\n", " | ")
}

// closeFiles closes files (again: a closed os.File only says so).
func closeFiles(files []*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		_ = os.Remove(to)
		return err
	}
	return out.Close()
}

// setLinksDown takes down the link of each NIC whose spec says so, before the guest runs: QEMU
// has no command-line property for it. The device ids are BuildArgs' (ua-net<i>).
func setLinksDown(ctx context.Context, mon Monitor, spec *domainv1.DomainSpec) error {
	for i, n := range spec.GetNics() {
		if !n.GetLinkDown() {
			continue
		}
		if _, err := mon.Run(ctx, "set_link", map[string]any{"name": fmt.Sprintf("ua-net%d", i), "up": false}); err != nil {
			return fmt.Errorf("set_link nics[%d] down: %w", i, err)
		}
	}
	return nil
}

// ownLikeParent gives path, which the driver just made, to the owner of its directory. The run
// directory and the persistent state directory are the VM process's user's (the node handler
// gives them to an unprivileged launcher's user before Start: core/handler SandboxSpec.Owner),
// so what the driver makes in them at Start for QEMU or swtpm to open (the TPM's state
// directory, the EFI variable store) is that user's too; under root's directories it stays
// root's.
func ownLikeParent(path string) error {
	var dir, st syscall.Stat_t
	if err := syscall.Stat(filepath.Dir(path), &dir); err != nil {
		return err
	}
	if err := syscall.Lstat(path, &st); err != nil {
		return err
	}
	if st.Uid == dir.Uid && st.Gid == dir.Gid {
		return nil
	}
	return os.Lchown(path, int(dir.Uid), int(dir.Gid))
}
