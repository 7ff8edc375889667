package libvirt

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	golibvirt "libvirt.org/go/libvirt"

	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/core/driver/launcher"
	launcherv1 "github.com/kubevisor/kubevisor/core/driver/launcher/v1"
	"github.com/kubevisor/kubevisor/core/driver/serial"
	"github.com/kubevisor/kubevisor/drivers/qmp"
	"github.com/kubevisor/kubevisor/internal/procfs"
)

// Timeouts of the driver's own waits.
// daemonTimeout bounds a new daemon's coming up (its first start probes QEMU: ~3 s); a
// variable for tests.
var daemonTimeout = 30 * time.Second

const (
	// powerdownRepeat is the longest interval between two presses of the power button.
	powerdownRepeat = 10 * time.Second
	// stopTimeout bounds waiting for a destroyed domain's stop event.
	stopTimeout = 15 * time.Second
	logTail     = 2048
	// firmwareReset is how soon after a reset another is taken for the firmware's own: after a
	// warm reset SeaBIOS resets the machine once more, and libvirt reports both.
	firmwareReset = time.Second
)

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// record is the driver's record of a VM, in the Handle and in <state dir>/vms/<id>.json (kept
// current), so that Recover finds the VM's daemon with the handle alone.
type record struct {
	ID        string          `json:"id"`
	RunDir    string          `json:"runDir"`
	OwnRunDir bool            `json:"ownRunDir,omitempty"`
	User      vmUser          `json:"user"`
	Accel     qmp.Accel       `json:"accel"`
	Boots     uint32          `json:"boots"`
	DaemonPID int             `json:"daemonPid,omitempty"`
	StartedAt time.Time       `json:"startedAt,omitzero"`
	Spec      json.RawMessage `json:"spec"`
	// Migration is the VM's current or last migration (migrate.go).
	Migration *migrationRecord `json:"migration,omitempty"`
}

// vm is one VM the driver knows.
type vm struct {
	id   string
	spec *domainv1.DomainSpec
	dmn  daemon
	op   sync.Mutex // serialises lifecycle operations

	mu      sync.Mutex
	rec     record
	state   hypervisorv1.State
	reason  string
	message string
	conn    *golibvirt.Connect // the daemon, nil while none runs
	proc    *process           // the daemon's process, when this driver started or found it
	cbs     []int              // event callback ids on conn
	con     *serial.Console    // the serial port while the domain runs
	pid     int                // QEMU's pid while the domain runs
	hostOp  string             // the reason of a stop the host asked for (Kill, Shutdown)
	// startResume: Start started the domain paused to attach the serial port before the guest
	// runs, and resumes it then; the SUSPENDED and RESUMED events of that start are not a pause
	// of the guest's.
	startResume bool
	reset       time.Time // when the last counted reset was reported
	changed     chan struct{}

	// softReboot: a soft reboot is pending; softRebooting: the guest powered off for it
	// (softreboot.go).
	softReboot, softRebooting bool

	// mig is the VM's current or last migration (migrate.go).
	mig *migration
	// in serves the disks a migration target receives, until it released them
	// (migratedisks.go).
	in *incomingDisks
}

func (v *vm) signalLocked() {
	close(v.changed)
	v.changed = make(chan struct{})
}

// waitFor waits until cond (under v.mu) holds, up to timeout or ctx.
func (v *vm) waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		v.mu.Lock()
		ok, ch := cond(), v.changed
		v.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-t.C:
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

// serialSocket is the serial port's socket: the spec's, else serial.sock in the run dir (the
// driver owns the port either way, driver.Consoler).
func (v *vm) serialSocket() string {
	if p := v.spec.GetSerial().GetSocketPath(); p != "" {
		return p
	}
	return filepath.Join(v.rec.RunDir, "serial.sock")
}

func (d *Driver) get(id string) (*vm, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.vms[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "vm %q not found", id)
	}
	return v, nil
}

func (d *Driver) env(host *qmp.HostInfo, accel qmp.Accel, v *vm) Env {
	d.mu.Lock()
	ovmf := qmp.DefaultOVMF
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
	env := Env{Accel: accel, Emulator: host.QEMU, OVMF: ovmf, NVRAM: filepath.Join(v.rec.RunDir, "efi-vars.fd"), Serial: v.serialSocket(),
		AgentSocket: agentSocket(v.rec.RunDir)}
	if v.spec.GetTpm() != nil {
		env.SWTPMProblem = d.swtpmProblem(context.Background())
	}
	return env
}

// Create implements driver.Hypervisor: it checks the spec by building its domain XML; it starts
// nothing.
func (d *Driver) Create(ctx context.Context, spec *domainv1.DomainSpec) (*hypervisorv1.Handle, error) {
	if err := domain.Validate(spec); err != nil {
		return nil, err
	}
	if !idRE.MatchString(spec.GetId()) {
		return nil, domain.ValidationError{{Field: "id", Detail: fmt.Sprintf("%q is not usable as a domain name ([A-Za-z0-9._-], at most 128)", spec.GetId())}}
	}
	host, err := d.hostInfo(ctx)
	if err != nil {
		return nil, err
	}
	if host.Problem != "" {
		return nil, status.Errorf(codes.FailedPrecondition, "qemu is not usable on this node: %s", host.Problem)
	}
	u, err := d.vmUser()
	if err != nil {
		return nil, err
	}
	spec = proto.Clone(spec).(*domainv1.DomainSpec)
	accel, err := pickAccel(spec.GetAcceleration(), host)
	if err != nil {
		return nil, err
	}
	if _, err := qmp.IncomingDisks(spec); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	runDir, own := d.runDirFor(spec)
	if len(runDir) > maxRunDir {
		return nil, domain.ValidationError{{Field: "run_dir", Detail: fmt.Sprintf("%q is %d bytes: the libvirt daemon's QEMU monitor socket below it (%s) would not fit in a unix socket path, which allows run dirs of %d bytes", runDir, len(runDir), monitorSuffix, maxRunDir)}}
	}
	v := &vm{id: spec.GetId(), spec: spec, changed: make(chan struct{}),
		state: hypervisorv1.State_STATE_CREATED, reason: driver.ReasonCreated}
	v.rec = record{ID: v.id, RunDir: runDir, OwnRunDir: own, User: u, Accel: accel}
	if _, err := BuildDomain(spec, d.env(host, accel, v)); err != nil {
		return nil, err
	}
	if v.rec.Spec, err = protojson.Marshal(spec); err != nil {
		return nil, status.Errorf(codes.Internal, "encode spec: %v", err)
	}
	v.dmn = newDaemon(runDir, u, d.config().Libvirtd)
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

// pickAccel is the accelerator of a VM asking for acc on host.
func pickAccel(acc domainv1.Acceleration, host *qmp.HostInfo) (qmp.Accel, error) {
	switch {
	case acc == domainv1.Acceleration_ACCELERATION_REQUIRED && !host.KVM:
		return "", status.Errorf(codes.FailedPrecondition, "acceleration: hardware acceleration is required but KVM is not usable on this node (%s)", host.KVMReason)
	case acc != domainv1.Acceleration_ACCELERATION_EMULATED && host.KVM:
		return qmp.AccelKVM, nil
	case !host.TCG:
		return "", status.Errorf(codes.FailedPrecondition, "acceleration: emulation (TCG) does not work on this node (%s)", host.TCGReason)
	}
	return qmp.AccelTCG, nil
}

func (d *Driver) runDirFor(spec *domainv1.DomainSpec) (string, bool) {
	if spec.GetRunDir() != "" {
		return spec.GetRunDir(), false
	}
	d.mu.Lock()
	base := d.stateDir
	d.mu.Unlock()
	if base == "" {
		base = filepath.Join(os.TempDir(), "kubevisor-libvirt")
	}
	return filepath.Join(base, "run", spec.GetId()), true
}

func (d *Driver) recordPath(id string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stateDir == "" {
		return ""
	}
	return filepath.Join(d.stateDir, "vms", id+".json")
}

// persistLocked writes v's record to the state dir (nothing without one).
func (d *Driver) persistLocked(v *vm) {
	p := d.recordPath(v.id)
	if p == "" {
		return
	}
	raw, _ := json.Marshal(v.rec)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err == nil {
		_ = os.Rename(tmp, p)
	}
}

// Start implements driver.Hypervisor: the VM's daemon first (when it does not run), then the
// domain, created transient from the spec.
func (d *Driver) Start(ctx context.Context, id string) error {
	v, err := d.get(id)
	if err != nil {
		return err
	}
	v.op.Lock()
	defer v.op.Unlock()
	v.mu.Lock()
	st := v.state
	v.mu.Unlock()
	switch {
	case st == hypervisorv1.State_STATE_SHUTTING_DOWN:
		return status.Errorf(codes.FailedPrecondition, "vm %q is shutting down", id)
	case active(st):
		return nil
	}
	host, err := d.hostInfo(ctx)
	if err != nil {
		return err
	}
	if _, err := pickAccel(map[bool]domainv1.Acceleration{true: domainv1.Acceleration_ACCELERATION_REQUIRED, false: domainv1.Acceleration_ACCELERATION_EMULATED}[v.rec.Accel == qmp.AccelKVM], host); err != nil {
		return err
	}
	env := d.env(host, v.rec.Accel, v)
	wrap, err := qemuMayOutliveLauncher(ctx, v.spec.GetSandbox().GetLauncherSocket())
	if err != nil {
		return err
	}
	if wrap {
		env.Emulator = v.dmn.emulator()
	}
	x, org, err := BuildDomainOrigins(v.spec, env)
	if err != nil {
		return err
	}
	if err := d.prepareFiles(v); err != nil {
		return err
	}
	if err := d.preparePersistent(v); err != nil {
		return err
	}
	// A migration target that receives disks serves them with QEMU's storage daemon, a
	// companion of its libvirtd (migratedisks.go).
	sdaemon, in, err := d.storageDaemon(v, host.QEMU, v.spec.GetSandbox().GetLauncherSocket() != "")
	if err != nil {
		return err
	}
	conn, started, err := d.ensureDaemon(ctx, v, sdaemon)
	if err != nil {
		return err
	}
	// A Start that fails after it started the VM's daemon stops the daemon again: nothing of a
	// failed start runs on (a daemon that ran before stays, as the VM's until Delete).
	undo := func(err error) error {
		if started {
			d.stopDaemon(v)
		}
		return err
	}
	if err := d.grantDevices(v); err != nil {
		return undo(err)
	}
	if wrap {
		if err := v.dmn.writeEmulator(d.config().Setpriv, host.QEMU); err != nil {
			return undo(status.Errorf(codes.FailedPrecondition, "the emulator script in the VM's libvirtd directory: %v", err))
		}
	}
	xml, err := x.Marshal()
	if err != nil {
		return undo(status.Errorf(codes.Internal, "domain xml: %v", err))
	}
	for _, stale := range []string{v.serialSocket(), v.spec.GetVnc().GetSocketPath(), agentSocket(v.rec.RunDir)} {
		if stale != "" {
			_ = os.Remove(stale)
		}
	}
	if v.spec.GetIncomingMigration() != nil {
		// A migration target: the domain comes with the migration (migrate.go).
		if in != nil {
			if err := in.serve(ctx, v.spec.GetIncomingMigration().GetDisksSocketPath()); err != nil {
				return undo(status.Errorf(codes.FailedPrecondition, "incomingMigration.disks: %v; its log ends: %s", err,
					tailLog(filepath.Join(v.rec.RunDir, storageDaemonLog), 0)))
			}
			v.mu.Lock()
			v.in = in
			v.mu.Unlock()
		}
		if err := d.listenIncoming(v, conn, xml); err != nil {
			v.releaseIncomingDisks()
			return undo(err)
		}
		return nil
	}
	// libvirt starts QEMU with its vCPUs stopped and leaves them so: the serial port is attached
	// before the guest prints anything (QEMU drops what a socket port's guest writes while no
	// client is connected: a guest that ran at once could print its first lines before the
	// driver connects, on a loaded node). A spec that starts paused stays so (its SUSPENDED
	// event finds the VM PAUSED already, below, or not yet started); another is resumed here.
	resume := !v.spec.GetStartPaused()
	v.mu.Lock()
	v.startResume = resume
	v.mu.Unlock()
	undoStart := func(err error) error {
		v.mu.Lock()
		v.startResume = false
		v.mu.Unlock()
		return undo(err)
	}
	dom, err := conn.DomainCreateXML(xml, golibvirt.DOMAIN_START_PAUSED)
	if err != nil {
		// A transient domain that failed to start is not defined: the daemon has none.
		return undoStart(startError(err, org, v.dmn.qemuLog()))
	}
	defer dom.Free()
	con, err := attachSerial(ctx, v.serialSocket())
	if err != nil {
		_ = dom.Destroy()
		return undoStart(status.Errorf(codes.Internal, "serial console: %v", err))
	}
	if resume {
		if err := dom.Resume(); err != nil {
			_ = dom.Destroy()
			if con != nil {
				con.Close()
			}
			return undoStart(status.Errorf(codes.Internal, "resume the guest once its serial port is attached: %v", err))
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.con = con
	v.pid = qemuPID(v.dmn, v.rec.DaemonPID)
	v.state, v.reason, v.message, v.hostOp = hypervisorv1.State_STATE_RUNNING, driver.ReasonStarted, "", ""
	if v.spec.GetStartPaused() {
		v.state, v.message = hypervisorv1.State_STATE_PAUSED, "started paused: the guest runs once resumed"
	}
	v.rec.Boots++
	v.rec.StartedAt = time.Now()
	d.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_STARTED)
	d.persistLocked(v)
	v.signalLocked()
	d.log.Info("started vm", "id", v.id, "qemu_pid", v.pid, "accel", v.rec.Accel)
	return nil
}

// libvirtMessage is a libvirt error's message (err's text when it holds none).
func libvirtMessage(err error) string {
	var lerr golibvirt.Error
	if errors.As(err, &lerr) {
		return lerr.Message
	}
	return err.Error()
}

// errorLogRE finds the log file a libvirt error names ("Check error log '...' for details").
var errorLogRE = regexp.MustCompile(`[Cc]heck error log '([^']+)'`)

// startError is libvirt's refusal of a domain start in the spec's terms (Origins.Explain: the
// fields it is about, libvirt's message whole, the code), with what QEMU wrote in its log at
// that start, if libvirt's message does not hold it already.
func startError(err error, org *Origins, qemuLog string) error {
	num, msg := golibvirt.ErrorNumber(0), err.Error()
	var lerr golibvirt.Error
	if errors.As(err, &lerr) {
		num, msg = lerr.Code, lerr.Message
	}
	said := qemuSaid(qemuLog, msg)
	r := org.Explain(num, msg)
	if len(r.Fields) == 0 && said != "" {
		// libvirt can lose the race with QEMU's exit and report only that it could not reach
		// the monitor ("failed to connect to monitor socket"): QEMU's own words, in its log,
		// then say what it refused.
		if q := org.Explain(num, said); len(q.Fields) > 0 {
			q.Message = msg
			r = q
		}
	}
	out := r.Error()
	// A helper's log that libvirt points to (swtpm_setup's) is in the run dir, which is gone
	// by the time a user reads the error: its last lines come with it.
	if m := errorLogRE.FindStringSubmatch(msg); m != nil {
		if t := tailLog(m[1], max(fileSize(m[1])-logTail, 0)); t != "" {
			out += "; " + filepath.Base(m[1]) + ": " + t
		}
	}
	if said != "" {
		out += "; qemu: " + said
	}
	return status.Error(r.Code, out)
}

// prepareFiles makes what the VM's unprivileged daemon and QEMU open reachable by the VM's user
// (access.go): the user may use the run dir (its sockets, the daemon's directory); the taps the
// network driver made get the user as their owner; writable disk images become the user's, and
// read-only disks, their qcow2 backing files, kernels and the sockets' directories get ACL
// entries for the user. Each file is then opened as that user, so that an error names the file
// it could not reach.
func (d *Driver) prepareFiles(v *vm) error {
	u := v.rec.User
	if err := os.MkdirAll(v.rec.RunDir, 0o700); err != nil {
		return status.Errorf(codes.FailedPrecondition, "run dir: %v", err)
	}
	// The run dir stays root's (the launcher, root without CAP_DAC_OVERRIDE in a launcher pod,
	// writes the daemon's log there); the user gets its own entry (grantDir).
	dirs := map[string]string{"run dir": v.rec.RunDir}
	if p := v.spec.GetSerial().GetSocketPath(); p != "" {
		dirs["serial.socketPath"] = filepath.Dir(p)
	}
	if p := v.spec.GetVnc().GetSocketPath(); p != "" {
		dirs["vnc.socketPath"] = filepath.Dir(p)
	}
	for field, dir := range dirs {
		if err := grantDir(u, dir); err != nil {
			return status.Errorf(codes.FailedPrecondition, "%s: %v", field, err)
		}
	}
	for i, n := range v.spec.GetNics() {
		if err := giveTap(v.spec.GetSandbox().GetNetnsPath(), n.GetTapName(), n.GetQueues() > 1, u); err != nil {
			return status.Errorf(codes.FailedPrecondition, "nics[%d].tapName: %v", i, err)
		}
	}
	for i, disk := range v.spec.GetDisks() {
		ro := disk.GetReadOnly() || disk.GetDevice() == domainv1.DiskDevice_DISK_DEVICE_CDROM
		p := disk.GetPath()
		if !ro && !isBlockDevice(p) {
			if err := os.Chown(p, u.UID, u.GID); err != nil {
				return status.Errorf(codes.FailedPrecondition, "disks[%d].path: %v", i, err)
			}
		}
		if err := reachable(u, p, !ro); err != nil {
			return status.Errorf(codes.FailedPrecondition, "disks[%d].path: %v", i, err)
		}
		// QEMU opens a qcow2 image's backing chain read-only, by the names in the images.
		seen := map[string]bool{p: true}
		for b := qcow2Backing(p); b != "" && !seen[b]; b = qcow2Backing(b) {
			seen[b] = true
			if err := reachable(u, b, false); err != nil {
				return status.Errorf(codes.FailedPrecondition, "disks[%d].path: backing file: %v", i, err)
			}
		}
	}
	if k := v.spec.GetFirmware().GetKernel(); k != nil {
		for field, p := range map[string]string{"firmware.kernel.kernelPath": k.GetKernelPath(), "firmware.kernel.initrdPath": k.GetInitrdPath()} {
			if p == "" {
				continue
			}
			if err := reachable(u, p, false); err != nil {
				return status.Errorf(codes.FailedPrecondition, "%s: %v", field, err)
			}
		}
	}
	return nil
}

// grantDevices gives the VM's user the device nodes libvirt and QEMU open in the sandbox:
// /dev/net/tun for the NICs' taps, /dev/kvm under KVM (grantSandboxDevice).
func (d *Driver) grantDevices(v *vm) error {
	v.mu.Lock()
	pid, u := v.rec.DaemonPID, v.rec.User
	v.mu.Unlock()
	devs := map[string]string{}
	if len(v.spec.GetNics()) > 0 {
		devs["nics"] = "dev/net/tun"
	}
	if v.rec.Accel == qmp.AccelKVM {
		devs["acceleration"] = "dev/kvm"
	}
	for field, dev := range devs {
		if err := grantSandboxDevice(u, pid, dev); err != nil {
			return status.Errorf(codes.FailedPrecondition, "%s: the VM's user %s cannot be given %v", field, u.Name, err)
		}
	}
	return nil
}

// qemuMayOutliveLauncher reports whether the QEMU of a VM whose launcher serves sock could
// outlive a launcher that dies, and so must run through the daemon's emulator script
// (daemon.emulator): there is a launcher, and it is not the init of its pid namespace. A
// launcher pod's launcher is (its compute container's first process, in a pid namespace of its
// own), and when a pid namespace's init dies the kernel kills every process in it; the
// conformance kit's and standalone mode's launchers are processes of the node's namespace.
func qemuMayOutliveLauncher(ctx context.Context, sock string) (bool, error) {
	if sock == "" {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, launcher.DefaultDialTimeout)
	defer cancel()
	c, err := launcher.Dial(ctx, sock)
	if err != nil {
		return false, status.Errorf(codes.Unavailable, "the VM's launcher: %v", err)
	}
	defer c.Close()
	info, err := c.Info(ctx)
	if err != nil {
		return false, status.Errorf(codes.Unavailable, "the VM's launcher: %v", err)
	}
	return info.GetPid() != 1, nil
}

// ensureDaemon returns the connection to v's daemon, starting the daemon when none runs
// (started). A daemon that fails to come up is killed if it still runs, and its runtime
// directory (sockets, pid files) removed; the error names libvirtd with its log's last lines.
func (d *Driver) ensureDaemon(ctx context.Context, v *vm, companion *launcher.Companion) (conn *golibvirt.Connect, started bool, err error) {
	v.mu.Lock()
	conn = v.conn
	v.mu.Unlock()
	if conn != nil {
		if ok, err := conn.IsAlive(); err == nil && ok {
			if companion != nil {
				return nil, false, status.Errorf(codes.FailedPrecondition, "the VM's libvirtd runs already: %s, which starts with it, cannot start", companion.Name)
			}
			return conn, false, nil
		}
		// A connection that is not alive has a daemon that is dead or hung: it goes, with its
		// callbacks, before another starts (its close callback could otherwise take the new
		// daemon's sockets for its own).
		d.stopDaemon(v)
	}
	if err := v.dmn.prepare(); err != nil {
		return nil, false, status.Errorf(codes.FailedPrecondition, "libvirtd directory: %v", err)
	}
	starter := d.local
	sock := v.spec.GetSandbox().GetLauncherSocket()
	if sock != "" {
		// v has no daemon of this driver process: one the launcher runs was started by an
		// earlier process of the driver, SIGKILLed before it recorded it (or one a Recover could
		// not reach). The launcher runs one process at a time, so it goes, and the QEMU it may
		// have started with it, before this Start's daemon.
		starter = &launcher.SocketStarter{Socket: sock, KillLeftover: true, Leftover: func(p *launcherv1.Process) {
			msg := "killed a libvirtd an earlier driver process left in the launcher"
			if qemu := qemuPID(v.dmn, 0); killQEMUOf(qemu, v.dmn) { // the driver's pid namespace only
				msg += ", and its QEMU"
			}
			v.dmn.removeRuntime()
			d.log.Warn(msg, "id", v.id, "name", p.GetName(), "pid", p.GetPid())
		}}
	}
	cmd := v.dmn.command(d.config().Setpriv, sock != "")
	cmd.NetNS = v.spec.GetSandbox().GetNetnsPath()
	if companion != nil {
		cmd.Companions = []*launcher.Companion{companion}
	}
	logFrom := fileSize(v.dmn.logPath())
	// failed kills the daemon if it runs, removes its sockets, and says what happened with the
	// last lines of its log (in the run dir, which is gone by the time a user reads this).
	failed := func(proc *process, what string) error {
		if proc != nil {
			_ = proc.kill()
			proc.exited(10 * time.Second)
			proc.close()
		}
		v.dmn.removeRuntime()
		log := strings.TrimSuffix(tailLog(v.dmn.logPath(), logFrom), " |")
		if log == "" {
			log = "(empty)"
		}
		return status.Errorf(codes.Internal, "the VM's libvirtd (%s) %s; its log ends: %s", v.dmn.path, what, log)
	}
	pid, err := starter.Start(ctx, cmd)
	if err != nil {
		return nil, false, failed(nil, fmt.Sprintf("could not be started: %v", err))
	}
	proc, err := openProcess(pid)
	if err != nil {
		return nil, false, failed(nil, fmt.Sprintf("exited at once (pid %d)", pid))
	}
	conn, err = connect(ctx, v.dmn.uri(), daemonTimeout, func() bool { return !proc.exited(0) })
	switch {
	case err != nil && ctx.Err() != nil:
		_ = failed(proc, "")
		return nil, false, status.FromContextError(ctx.Err()).Err()
	case err != nil && proc.exited(0):
		return nil, false, failed(proc, fmt.Sprintf("exited before it served the VM (pid %d)", pid))
	case err != nil:
		return nil, false, failed(proc, fmt.Sprintf("did not serve the VM within %s (pid %d), and was killed (%s)", daemonTimeout, pid, libvirtMessage(err)))
	}
	if err := d.watch(v, conn); err != nil {
		_, _ = conn.Close()
		return nil, false, failed(proc, fmt.Sprintf("took no event callbacks (pid %d), and was killed: %s", pid, libvirtMessage(err)))
	}
	v.mu.Lock()
	v.conn, v.proc = conn, proc
	v.rec.DaemonPID = pid
	d.persistLocked(v)
	v.mu.Unlock()
	d.log.Info("started libvirtd", "id", v.id, "pid", pid, "user", v.rec.User.Name)
	return conn, true, nil
}

// stopDaemon stops v's daemon, if one runs, and removes its runtime directory (its sockets
// and pid files); the rest of its directory (configuration, caches, the QEMU log, a TPM's
// state) stays until Delete.
func (d *Driver) stopDaemon(v *vm) {
	v.mu.Lock()
	conn, proc, cbs := v.conn, v.proc, v.cbs
	v.conn, v.proc, v.cbs = nil, nil, nil
	pid := v.rec.DaemonPID
	v.rec.DaemonPID = 0
	d.persistLocked(v)
	v.mu.Unlock()
	if conn != nil {
		for _, cb := range cbs {
			_ = conn.DomainEventDeregister(cb)
		}
		_ = conn.UnregisterCloseCallback()
		_, _ = conn.Close()
	}
	if proc == nil && pid > 0 && isDaemonOf(pid, v.dmn) {
		proc, _ = openProcess(pid)
	}
	if proc != nil {
		_ = proc.kill()
		proc.exited(10 * time.Second)
		proc.close()
	}
	v.releaseIncomingDisks()
	v.dmn.removeRuntime()
}

// watch registers v's lifecycle, reboot and connection-close callbacks on conn.
func (d *Driver) watch(v *vm, conn *golibvirt.Connect) error {
	life, err := conn.DomainEventLifecycleRegister(nil, func(_ *golibvirt.Connect, dom *golibvirt.Domain, ev *golibvirt.DomainEventLifecycle) {
		if name, _ := dom.GetName(); name == DomainName {
			d.lifecycle(v, conn, ev)
		}
	})
	if err != nil {
		return err
	}
	reboot, err := conn.DomainEventRebootRegister(nil, func(_ *golibvirt.Connect, dom *golibvirt.Domain) {
		if name, _ := dom.GetName(); name == DomainName {
			d.rebooted(v)
		}
	})
	if err != nil {
		_ = conn.DomainEventDeregister(life)
		return err
	}
	// A migration's final figures (migrate.go).
	job, err := conn.DomainEventJobCompletedRegister(nil, func(_ *golibvirt.Connect, dom *golibvirt.Domain, ev *golibvirt.DomainEventJobCompleted) {
		if name, _ := dom.GetName(); name == DomainName {
			d.jobCompleted(v, &ev.Info)
		}
	})
	if err != nil {
		_ = conn.DomainEventDeregister(life)
		_ = conn.DomainEventDeregister(reboot)
		return err
	}
	// The callback's Connect is a wrapper of its own: v's connection is known by conn.
	if err := conn.RegisterCloseCallback(func(_ *golibvirt.Connect, reason golibvirt.ConnectCloseReason) {
		d.daemonLost(v, conn, reason)
	}); err != nil {
		_ = conn.DomainEventDeregister(life)
		_ = conn.DomainEventDeregister(reboot)
		_ = conn.DomainEventDeregister(job)
		return err
	}
	v.mu.Lock()
	v.cbs = []int{life, reboot, job}
	v.mu.Unlock()
	return nil
}

// lifecycle applies a libvirt lifecycle event to v.
func (d *Driver) lifecycle(v *vm, conn *golibvirt.Connect, ev *golibvirt.DomainEventLifecycle) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.conn != conn {
		return
	}
	if d.migrationEventLocked(v, conn, ev) || d.softRebootEventLocked(v, ev) {
		v.signalLocked()
		return
	}
	if v.startResume {
		switch ev.Event {
		case golibvirt.DOMAIN_EVENT_SUSPENDED:
			return // Start's paused start
		case golibvirt.DOMAIN_EVENT_RESUMED:
			v.startResume = false // Start's resume
			return
		case golibvirt.DOMAIN_EVENT_STOPPED, golibvirt.DOMAIN_EVENT_CRASHED:
			v.startResume = false
		}
	}
	switch ev.Event {
	case golibvirt.DOMAIN_EVENT_SUSPENDED:
		if v.state == hypervisorv1.State_STATE_RUNNING {
			v.state, v.reason, v.message = hypervisorv1.State_STATE_PAUSED, driver.ReasonPaused, ""
			d.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_PAUSED)
		}
	case golibvirt.DOMAIN_EVENT_RESUMED:
		if v.state == hypervisorv1.State_STATE_PAUSED {
			v.state, v.reason, v.message = hypervisorv1.State_STATE_RUNNING, driver.ReasonResumed, ""
			d.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_RESUMED)
		}
	case golibvirt.DOMAIN_EVENT_SHUTDOWN:
		if v.state == hypervisorv1.State_STATE_RUNNING || v.state == hypervisorv1.State_STATE_SHUTTING_DOWN {
			v.state, v.reason = hypervisorv1.State_STATE_SHUTTING_DOWN, cmp.Or(v.hostOp, driver.ReasonGuestShutdown)
			d.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_SHUTDOWN)
		}
	case golibvirt.DOMAIN_EVENT_STOPPED, golibvirt.DOMAIN_EVENT_CRASHED:
		if !active(v.state) {
			break
		}
		detail := golibvirt.DomainEventStoppedDetailType(ev.Detail)
		typ, state, reason := hypervisorv1.EventType_EVENT_TYPE_STOPPED, hypervisorv1.State_STATE_STOPPED, driver.ReasonGuestShutdown
		switch {
		case v.hostOp != "":
			reason = v.hostOp
		case ev.Event == golibvirt.DOMAIN_EVENT_CRASHED:
			typ, state, reason = hypervisorv1.EventType_EVENT_TYPE_CRASHED, hypervisorv1.State_STATE_CRASHED, driver.ReasonGuestPanicked
		case detail == golibvirt.DOMAIN_EVENT_STOPPED_SHUTDOWN:
		default: // destroyed by nobody here, crashed, failed: QEMU ended unasked
			typ, state, reason = hypervisorv1.EventType_EVENT_TYPE_CRASHED, hypervisorv1.State_STATE_CRASHED, driver.ReasonProcessExited
			v.message = tailLog(v.dmn.qemuLog(), max(fileSize(v.dmn.qemuLog())-logTail, 0))
		}
		d.endRunLocked(v, typ, state, reason)
	}
	v.signalLocked()
}

// endRunLocked accounts for the end of v's domain.
func (d *Driver) endRunLocked(v *vm, typ hypervisorv1.EventType, state hypervisorv1.State, reason string) {
	v.state, v.reason, v.hostOp, v.pid = state, reason, "", 0
	if v.con != nil {
		v.con.Close()
		v.con = nil
	}
	d.emitLocked(v, typ)
	d.persistLocked(v)
}

// rebooted counts a guest reset (libvirt's reboot event: the guest, or Reboot, reset it).
func (d *Driver) rebooted(v *vm) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.state != hypervisorv1.State_STATE_RUNNING {
		return
	}
	if time.Since(v.reset) < firmwareReset {
		d.log.Debug("second reset of a reboot (the firmware's), not counted", "id", v.id)
		return
	}
	v.reset = time.Now()
	v.rec.Boots++
	reason := driver.ReasonGuestReset
	if v.hostOp == driver.ReasonHostReset {
		reason, v.hostOp = driver.ReasonHostReset, ""
	}
	v.reason = reason
	d.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_RESET)
	d.persistLocked(v)
	v.signalLocked()
}

// daemonLost handles the end of the connection to v's daemon: unless the driver closed it, the
// daemon died (or hung past its keepalive), and its domain with it as far as the driver can tell.
func (d *Driver) daemonLost(v *vm, conn *golibvirt.Connect, reason golibvirt.ConnectCloseReason) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.conn != conn {
		return
	}
	v.conn = nil
	if v.proc != nil {
		// Dead, or hung past its keepalive: either way no daemon of the VM runs on.
		_ = v.proc.kill()
		v.proc.close()
		v.proc = nil
	}
	v.rec.DaemonPID = 0
	if active(v.state) {
		v.message = fmt.Sprintf("the VM's libvirtd went away (close reason %d): %s", reason, tailLog(v.dmn.logPath(), max(fileSize(v.dmn.logPath())-logTail, 0)))
		// Its QEMU may outlive it (libvirt daemonizes QEMU), with nothing left to manage it: a
		// guest the VM's owner is told has crashed must not run on.
		if killQEMUOf(v.pid, v.dmn) {
			v.message += fmt.Sprintf("; its QEMU (pid %d), which nothing manages without the daemon, was killed", v.pid)
		}
		d.endRunLocked(v, hypervisorv1.EventType_EVENT_TYPE_CRASHED, hypervisorv1.State_STATE_CRASHED, driver.ReasonProcessExited)
	}
	if !v.mig.ended() {
		// The daemon did the migration: it is over, at either end.
		d.endMigrationLocked(v, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, "the VM's libvirtd went away")
		v.removeIncomingLink()
	}
	// The dead daemon's sockets, and those of the QEMU it ran, which nobody serves any more.
	v.removeSockets()
	d.persistLocked(v)
	v.signalLocked()
}

// removeSockets removes the sockets of v's daemon and domain that a daemon or QEMU that was
// killed leaves behind: the daemon's runtime directory, the sockets of its directory (QEMU's
// monitor) and the VM's serial, VNC and agent sockets. v.mu is held.
func (v *vm) removeSockets() {
	v.dmn.removeRuntime()
	_ = filepath.WalkDir(v.dmn.dir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type()&fs.ModeSocket != 0 {
			_ = os.Remove(p)
		}
		return nil
	})
	for _, p := range []string{v.serialSocket(), v.spec.GetVnc().GetSocketPath(), agentSocket(v.rec.RunDir)} {
		if fi, err := os.Lstat(p); p != "" && err == nil && fi.Mode()&fs.ModeSocket != 0 {
			_ = os.Remove(p)
		}
	}
}

// domain looks v's domain up on its daemon.
func (v *vm) domain() (*golibvirt.Domain, error) {
	v.mu.Lock()
	conn := v.conn
	v.mu.Unlock()
	if conn == nil {
		return nil, errNoDaemon
	}
	return conn.LookupDomainByName(DomainName)
}

// Shutdown implements driver.Hypervisor: ACPI power button presses until the guest powers off
// or timeout, then destroy.
func (d *Driver) Shutdown(ctx context.Context, id string, timeout time.Duration) (bool, error) {
	v, err := d.get(id)
	if err != nil {
		return false, err
	}
	v.op.Lock()
	defer v.op.Unlock()
	v.mu.Lock()
	st := v.state
	if v.waitingIncomingLocked() {
		d.stopIncomingLocked(v, driver.ReasonForcedShutdown)
		v.mu.Unlock()
		return false, nil
	}
	v.mu.Unlock()
	if !active(st) {
		return false, nil
	}
	dom, err := v.domain()
	if err != nil {
		return false, status.Errorf(codes.Unavailable, "vm %q: %v", id, err)
	}
	defer dom.Free()
	if timeout > 0 {
		if st == hypervisorv1.State_STATE_PAUSED {
			if err := dom.Resume(); err != nil {
				return false, status.Errorf(codes.Internal, "resume: %v", err)
			}
			v.waitFor(ctx, 5*time.Second, func() bool { return v.state != hypervisorv1.State_STATE_PAUSED })
		}
		v.mu.Lock()
		if v.state == hypervisorv1.State_STATE_RUNNING {
			v.state, v.reason = hypervisorv1.State_STATE_SHUTTING_DOWN, driver.ReasonPowerdownRequested
			d.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_POWERDOWN_REQUESTED)
			v.signalLocked()
		}
		v.mu.Unlock()
		deadline := time.Now().Add(timeout)
		for time.Now().Before(deadline) {
			if err := dom.ShutdownFlags(golibvirt.DOMAIN_SHUTDOWN_ACPI_POWER_BTN); err != nil && !stoppedErr(err) {
				d.log.Warn("power button", "id", id, "error", err)
			}
			wait := min(time.Until(deadline), powerdownRepeat)
			if v.waitFor(ctx, wait, func() bool { return !active(v.state) }) {
				return true, nil
			}
			if ctx.Err() != nil {
				return false, status.FromContextError(ctx.Err()).Err()
			}
		}
	}
	return false, d.destroy(ctx, v, dom, driver.ReasonForcedShutdown)
}

// destroy stops v's domain at once and waits for its stop event.
func (d *Driver) destroy(ctx context.Context, v *vm, dom *golibvirt.Domain, reason string) error {
	v.mu.Lock()
	if !active(v.state) {
		v.mu.Unlock()
		return nil
	}
	if v.waitingIncomingLocked() {
		// A migration target with no QEMU yet: nothing runs to destroy.
		d.stopIncomingLocked(v, reason)
		v.mu.Unlock()
		return nil
	}
	v.hostOp = reason
	v.mu.Unlock()
	if err := dom.Destroy(); err != nil && !stoppedErr(err) {
		return status.Errorf(codes.Internal, "destroy: %v", err)
	}
	if !v.waitFor(ctx, stopTimeout, func() bool { return !active(v.state) }) {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		// The event never came (the daemon went away first): account for the stop here.
		v.mu.Lock()
		if active(v.state) {
			d.endRunLocked(v, hypervisorv1.EventType_EVENT_TYPE_STOPPED, hypervisorv1.State_STATE_STOPPED, reason)
			v.signalLocked()
		}
		v.mu.Unlock()
	}
	return nil
}

// stoppedErr says a libvirt error is about a domain that is not running (any more).
func stoppedErr(err error) bool {
	var lerr golibvirt.Error
	return errors.As(err, &lerr) && (lerr.Code == golibvirt.ERR_OPERATION_INVALID || lerr.Code == golibvirt.ERR_NO_DOMAIN)
}

// Kill implements driver.Hypervisor.
func (d *Driver) Kill(ctx context.Context, id string) error {
	v, err := d.get(id)
	if err != nil {
		return err
	}
	v.mu.Lock()
	st := v.state
	v.mu.Unlock()
	if !active(st) {
		return nil
	}
	dom, err := v.domain()
	if err != nil {
		return status.Errorf(codes.Unavailable, "vm %q: %v", id, err)
	}
	defer dom.Free()
	return d.destroy(ctx, v, dom, driver.ReasonKilled)
}

// Delete implements driver.Hypervisor: the domain is gone already; the VM's daemon is stopped,
// and its directory and record removed.
func (d *Driver) Delete(_ context.Context, id string) error {
	v, err := d.get(id)
	if status.Code(err) == codes.NotFound {
		return nil
	}
	v.op.Lock()
	defer v.op.Unlock()
	v.mu.Lock()
	st := v.state
	v.mu.Unlock()
	if active(st) {
		return status.Errorf(codes.FailedPrecondition, "vm %q is %s: stop it first", id, st)
	}
	d.stopDaemon(v)
	v.removeIncomingLink()
	v.dmn.remove()
	if v.rec.OwnRunDir {
		_ = os.RemoveAll(v.rec.RunDir)
	}
	if p := d.recordPath(id); p != "" {
		_ = os.Remove(p)
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
		Id: v.id, State: v.state, Reason: v.reason, Message: v.message, Boots: v.rec.Boots,
		Accelerated: v.rec.Accel == qmp.AccelKVM,
	}
	if active(v.state) {
		st.Pid = int64(v.pid)
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

// Pause implements driver.Pauser.
func (d *Driver) Pause(ctx context.Context, id string) error {
	return d.pauseResume(ctx, id, true)
}

// Resume implements driver.Pauser.
func (d *Driver) Resume(ctx context.Context, id string) error {
	return d.pauseResume(ctx, id, false)
}

func (d *Driver) pauseResume(ctx context.Context, id string, pause bool) error {
	v, err := d.get(id)
	if err != nil {
		return err
	}
	v.op.Lock()
	defer v.op.Unlock()
	v.mu.Lock()
	st, busy := v.state, v.migrationBusyLocked()
	v.mu.Unlock()
	if busy != nil {
		return busy
	}
	want := hypervisorv1.State_STATE_RUNNING
	if pause {
		want = hypervisorv1.State_STATE_PAUSED
	}
	switch {
	case st == want:
		return nil
	case st != hypervisorv1.State_STATE_RUNNING && st != hypervisorv1.State_STATE_PAUSED:
		return status.Errorf(codes.FailedPrecondition, "vm %q is %s", id, st)
	}
	dom, err := v.domain()
	if err != nil {
		return status.Errorf(codes.Unavailable, "vm %q: %v", id, err)
	}
	defer dom.Free()
	if pause {
		err = dom.Suspend()
	} else {
		err = dom.Resume()
	}
	if err != nil {
		return status.Errorf(codes.Internal, "libvirt: %v", err)
	}
	if !v.waitFor(ctx, 10*time.Second, func() bool { return v.state == want }) {
		return status.Errorf(codes.Internal, "vm %q: libvirt reported no %s", id, want)
	}
	return nil
}

// Reboot implements driver.Rebooter: a hard reset of the running guest.
func (d *Driver) Reboot(ctx context.Context, id string) error {
	v, err := d.get(id)
	if err != nil {
		return err
	}
	v.op.Lock()
	defer v.op.Unlock()
	v.mu.Lock()
	st, boots, busy := v.state, v.rec.Boots, v.migrationBusyLocked()
	v.mu.Unlock()
	if busy != nil {
		return busy
	}
	if st != hypervisorv1.State_STATE_RUNNING {
		return status.Errorf(codes.FailedPrecondition, "vm %q is %s", id, st)
	}
	dom, err := v.domain()
	if err != nil {
		return status.Errorf(codes.Unavailable, "vm %q: %v", id, err)
	}
	defer dom.Free()
	v.mu.Lock()
	v.hostOp = driver.ReasonHostReset
	v.mu.Unlock()
	if err := dom.Reset(0); err != nil {
		return status.Errorf(codes.Internal, "libvirt: %v", err)
	}
	if !v.waitFor(ctx, 10*time.Second, func() bool { return v.rec.Boots > boots || !active(v.state) }) {
		return status.Errorf(codes.Internal, "vm %q: no reset reported", id)
	}
	return nil
}

// Console implements driver.Consoler.
func (d *Driver) Console(ctx context.Context, id string, in io.Reader, out io.Writer) error {
	v, err := d.get(id)
	if err != nil {
		return err
	}
	v.mu.Lock()
	con, st := v.con, v.state
	v.mu.Unlock()
	if !active(st) || con == nil {
		return status.Errorf(codes.FailedPrecondition, "vm %q is %s: no console", id, st)
	}
	return con.Serve(ctx, in, out)
}

// attachSerial connects to the domain's serial socket (libvirt made it before QEMU runs).
func attachSerial(ctx context.Context, path string) (*serial.Console, error) {
	if path == "" {
		return nil, nil // no serial port: Console says so
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		c, err := net.DialTimeout("unix", path, 2*time.Second)
		if err == nil {
			return serial.New(c), nil
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// detach lets go of v without stopping anything.
func (v *vm) detach() {
	v.mu.Lock()
	conn, proc, cbs, con, in := v.conn, v.proc, v.cbs, v.con, v.in
	v.conn, v.proc, v.con, v.in = nil, nil, nil, nil
	v.mu.Unlock()
	if in != nil {
		in.abandon()
	}
	if conn != nil {
		for _, cb := range cbs {
			_ = conn.DomainEventDeregister(cb)
		}
		_ = conn.UnregisterCloseCallback()
		_, _ = conn.Close()
	}
	if proc != nil {
		proc.close()
	}
	if con != nil {
		con.Close()
	}
}

// qemuPID is the pid, in the driver's pid namespace, of the domain's QEMU, which the session
// daemon writes to its pid file as its own pid namespace numbers it: the same pid where the two
// share a namespace, else (a launcher pod's) the child of the daemon's parent, the launcher,
// which adopted QEMU, with that innermost pid. 0 when neither is a QEMU of dm's daemon.
func qemuPID(dm daemon, daemonPID int) int {
	p := readPIDFile(dm.qemuPIDFile())
	if p <= 0 || isQEMUOf(p, dm) {
		return p
	}
	if daemonPID <= 0 {
		return 0
	}
	lp, err := procfs.ParentPid(daemonPID)
	if err != nil {
		return 0
	}
	for _, c := range procfs.Children(lp) {
		if in, err := procfs.InnermostPid(c); err == nil && in == p && isQEMUOf(c, dm) {
			return c
		}
	}
	return 0
}

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// qemuSaid is what QEMU wrote in the log at path at its last start (from libvirt's last
// "starting up" line on), without the command line libvirt writes first (its lines end in a
// backslash, but for the last argument's), without the lines msg holds already and libvirt's
// own "shutting down" line: at most logTail bytes, on one line.
func qemuSaid(path, msg string) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	s := string(raw)
	if i := strings.LastIndex(s, ": starting up "); i >= 0 {
		s = s[i:]
		if j := strings.IndexByte(s, '\n'); j >= 0 {
			s = s[j+1:]
		} else {
			s = ""
		}
	}
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasSuffix(lines[i], "\\") {
			lines = lines[min(i+2, len(lines)):]
			break
		}
	}
	var kept []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l != "" && !strings.Contains(msg, l) && !strings.Contains(msg, qemuLine(l)) && !strings.Contains(l, ": shutting down, reason=") {
			kept = append(kept, l)
		}
	}
	out := strings.Join(kept, " | ")
	if len(out) > logTail {
		out = out[len(out)-logTail:]
	}
	return out
}

// qemuLine is a line of QEMU's log without its timestamp ("2026-12-06T03:24:04.215330Z ").
func qemuLine(l string) string {
	if i := strings.IndexByte(l, ' '); i > 0 && strings.HasSuffix(l[:i], "Z") {
		return l[i+1:]
	}
	return l
}

// tailLog is what a log got since offset from, at most logTail bytes, on one line.
func tailLog(path string, from int64) string {
	raw, err := os.ReadFile(path)
	if err != nil || int64(len(raw)) <= from {
		return ""
	}
	raw = raw[from:]
	if len(raw) > logTail {
		raw = raw[len(raw)-logTail:]
	}
	return strings.Join(strings.Fields(strings.ReplaceAll(string(raw), "\n", " | ")), " ")
}
