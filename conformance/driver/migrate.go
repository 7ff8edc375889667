package conformance

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// The migration checks (Migrate/...) move a running guest from the hypervisor driver under test
// to a second instance of it (WithMigrationPeer): another driver process with its own state
// directory, as on another node, on the same host. Every VM keeps its own launcher and run
// directory; the target's disks are the source's own images (one host: shared storage), and the
// migration stream goes from the source straight to the target's socket, where in a cluster the
// node handlers' proxy carries it (WithMigrationRelay puts such a relay in between).

// Timings of the migration checks.
const (
	// migrationPollEvery is how often the checks sample MigrationStatus.
	migrationPollEvery = 200 * time.Millisecond
	// targetStopWithin is how soon a target must stop after its migration failed.
	targetStopWithin = 30 * time.Second
	// slowBandwidth keeps a migration of the test guest going for minutes (Migrate/Cancel).
	slowBandwidth = 1 << 20
	// progressBandwidth makes a migration of the test guest take seconds (Migrate/Progress).
	progressBandwidth = 16 << 20
	// migrationSocketName is the target's incoming socket in its run directory.
	migrationSocketName = "migration.sock"
)

// requireMigration skips a check unless the driver declares FEATURE_HYPERVISOR_MIGRATE and the
// kit has a peer to migrate to; it returns the peer, configured.
func (s *vmSuite) requireMigration(t T) driver.Hypervisor {
	t.Helper()
	_, caps := s.hypervisor(t)
	requireFeature(t, caps, basev1.Feature_FEATURE_HYPERVISOR_MIGRATE)
	if s.opts.MigrationPeer == nil {
		t.Skipf("no second instance of the driver to migrate to (WithMigrationPeer)")
	}
	peer := s.opts.MigrationPeer(t)
	if peer == nil {
		t.Fatalf("the migration peer factory returned no driver")
	}
	req := s.configureRequest(s.opts.Config)
	req.StateDir = s.opts.MigrationPeerStateDir
	if err := peer.Configure(s.ctx(t), req); err != nil {
		t.Fatalf("Configure of the migration peer: %s", describe(err))
	}
	caps, err := peer.Capabilities(s.ctx(t))
	if err != nil {
		t.Fatalf("Capabilities of the migration peer: %s", describe(err))
	}
	requireFeature(t, caps, basev1.Feature_FEATURE_HYPERVISOR_MIGRATE)
	return peer
}

// migrationEvents records the events of one VM from one driver until the check ends.
type migrationEvents struct {
	mu     sync.Mutex
	events []*hypervisorv1.Event
}

func recordMigrationEvents(t T, d driver.Hypervisor, id string) *migrationEvents {
	l := &migrationEvents{}
	ctx, cancel := context.WithCancel(t.Context())
	ready := make(chan struct{})
	go func() {
		once := sync.Once{}
		// The stream is registered once the call is made; a short wait below covers the rest.
		time.AfterFunc(200*time.Millisecond, func() { once.Do(func() { close(ready) }) })
		_ = d.Events(ctx, id, func(e *hypervisorv1.Event) error {
			l.mu.Lock()
			l.events = append(l.events, e)
			l.mu.Unlock()
			return nil
		})
		once.Do(func() { close(ready) })
	}()
	t.Cleanup(cancel)
	<-ready
	return l
}

// find returns the first event that match says, or nil.
func (l *migrationEvents) find(match func(*hypervisorv1.Event) bool) *hypervisorv1.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if match(e) {
			return e
		}
	}
	return nil
}

func (l *migrationEvents) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var parts []string
	for _, e := range l.events {
		p := fmt.Sprintf("%s(%s, %s)", strings.TrimPrefix(e.GetType().String(), "EVENT_TYPE_"), strings.TrimPrefix(e.GetState().String(), "STATE_"), e.GetReason())
		if m := e.GetMigration(); m != nil {
			p += "[" + strings.TrimPrefix(m.GetPhase().String(), "MIGRATION_PHASE_") + "]"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}

// migrationTarget is a VM a check created on the peer to receive a migration.
type migrationTarget struct {
	*guestVM
	socket string
	events *migrationEvents
}

// prepareTarget creates and starts, on the peer, the target of a migration of vm: the same
// spec, in a run directory and a launcher of its own, receiving on a socket in that directory.
// It checks what the contract says of a target that waits.
func (s *vmSuite) prepareTarget(t T, peer driver.Hypervisor, vm *guestVM, allowPostCopy bool) *migrationTarget {
	t.Helper()
	return s.prepareTargetWith(t, peer, vm, func(spec *domainv1.DomainSpec) { spec.IncomingMigration.AllowPostCopy = allowPostCopy })
}

// prepareTargetWith is prepareTarget with edit applied to the target's spec before Create.
func (s *vmSuite) prepareTargetWith(t T, peer driver.Hypervisor, vm *guestVM, edit func(*domainv1.DomainSpec)) *migrationTarget {
	t.Helper()
	tgt := &migrationTarget{guestVM: &guestVM{id: vm.id, token: vm.token, d: peer}}
	tgt.launcher = s.startLauncher(t, vm.id)
	runDir := shortTempDir(t)
	spec := proto.CloneOf(vm.spec)
	spec.RunDir = runDir
	spec.Serial = &domainv1.Serial{SocketPath: filepath.Join(runDir, serialSocket)}
	if spec.GetVnc() != nil {
		spec.Vnc = &domainv1.VNC{SocketPath: filepath.Join(runDir, "vnc.sock")}
	}
	spec.Sandbox = tgt.launcher.sandbox
	tgt.socket = filepath.Join(runDir, migrationSocketName)
	spec.IncomingMigration = &domainv1.IncomingMigration{SocketPath: tgt.socket}
	if edit != nil {
		edit(spec)
	}
	tgt.spec = spec
	tgt.events = recordMigrationEvents(t, peer, vm.id)
	handle, err := peer.Create(s.ctx(t), spec)
	if err != nil {
		t.Fatalf("Create of the migration target (incomingMigration set) on the peer: %s", describe(err))
	}
	tgt.handle = handle
	t.Cleanup(func() { (&hvSuite{suite: s.suite}).remove(t, &testVM{id: vm.id, d: peer}) })
	if err := peer.Start(s.ctx(t), vm.id); err != nil {
		t.Fatalf("Start of the migration target: %s", describe(err))
	}
	st := s.status(t, tgt.guestVM)
	if st.GetState() != hypervisorv1.State_STATE_PAUSED || st.GetReason() != driver.ReasonIncomingMigration {
		t.Errorf("a started migration target is %s (reason %q, message %q), want PAUSED with reason %s", st.GetState(), st.GetReason(), st.GetMessage(), driver.ReasonIncomingMigration)
	}
	if st.GetBoots() != 0 {
		t.Errorf("a migration target that waits reports %d boots, want 0: its guest did not boot", st.GetBoots())
	}
	if e := tgt.events.find(func(e *hypervisorv1.Event) bool { return e.GetType() == hypervisorv1.EventType_EVENT_TYPE_STARTED }); e != nil {
		t.Errorf("the migration target reported STARTED before it ran the VM: %s", tgt.events)
	}
	m := optional[driver.Migrator](t, peer, basev1.Feature_FEATURE_HYPERVISOR_MIGRATE)
	info, err := m.MigrationStatus(s.ctx(t), vm.id)
	switch {
	case err != nil:
		t.Fatalf("MigrationStatus of the target: %s", describe(err))
	case info.GetRole() != hypervisorv1.MigrationRole_MIGRATION_ROLE_TARGET || info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_SETUP:
		t.Errorf("MigrationStatus of a target that waits: role %s phase %s, want TARGET SETUP", info.GetRole(), info.GetPhase())
	}
	return tgt
}

// migrationPath is where the source of a migration of vm to tgt connects: the target's socket,
// or the relay's socket (WithMigrationRelay).
func (s *vmSuite) migrationPath(t T, vm *guestVM, tgt *migrationTarget) string {
	t.Helper()
	return s.migrationPaths(t, vm, tgt)[ChannelMemory]
}

// migrationPaths is migrationPath of each channel of the migration: ChannelMemory, and
// ChannelDisks when the target serves disks (incoming_migration.disks_socket_path).
func (s *vmSuite) migrationPaths(t T, vm *guestVM, tgt *migrationTarget) map[string]string {
	t.Helper()
	targets := map[string]string{ChannelMemory: tgt.socket}
	if p := tgt.spec.GetIncomingMigration().GetDisksSocketPath(); p != "" {
		targets[ChannelDisks] = p
	}
	if s.opts.MigrationRelay == nil {
		return targets
	}
	// Each migration has an identifier of its own, as a VirtualMachineInstanceMigration's UID.
	paths := s.opts.MigrationRelay(t, newID(), vm.spec.GetRunDir(), targets)
	for ch := range targets {
		if paths[ch] == "" {
			t.Fatalf("the migration relay gave no socket for the channel %q", ch)
		}
	}
	return paths
}

// waitMigration polls MigrationStatus of VM id until until says so (or the migration ended),
// and returns the last answer.
func (s *vmSuite) waitMigration(t T, m driver.Migrator, id string, until func(*hypervisorv1.MigrationInfo) bool) *hypervisorv1.MigrationInfo {
	t.Helper()
	var last *hypervisorv1.MigrationInfo
	ctx := s.ctx(t)
	for {
		info, err := m.MigrationStatus(ctx, id)
		if err != nil {
			t.Fatalf("MigrationStatus: %s", describe(err))
		}
		last = info
		if migrationEnded(info) || (until != nil && until(info)) {
			return info
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the migration did not get there before the check's timeout; last MigrationStatus: %v", last)
		case <-time.After(migrationPollEvery):
		}
	}
}

func migrationEnded(info *hypervisorv1.MigrationInfo) bool {
	return driver.MigrationEnded(info.GetPhase())
}

// waitState waits for a VM to reach want (up to within), and returns its last status.
func (s *vmSuite) waitState(t T, vm *guestVM, want hypervisorv1.State, within time.Duration) *hypervisorv1.VMStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx(t), within)
	defer cancel()
	var st *hypervisorv1.VMStatus
	poll(ctx, func() bool {
		var err error
		st, err = vm.d.Status(ctx, vm.id)
		return err == nil && st.GetState() == want
	})
	return st
}

// checkMigrateKeepsGuestState: a running guest moves to the peer and goes on from where it was:
// what it wrote to its memory (a shell variable, a file in its RAM file system) is there, it did
// not boot again, the source is STOPPED (Migrated) with its process gone, the target RUNNING
// (Migrated) under its own launcher, and the migrated guest still powers off by itself.
func (s *vmSuite) checkMigrateKeepsGuestState(t T) {
	peer := s.requireMigration(t)
	vm := s.boot(t, "")
	ctx := s.ctx(t)
	if err := vm.console.typeUntil(ctx, fmt.Sprintf("KVMIG=%s; echo $KVMIG > /tmp/kv-migration; echo kv-written-$((6*7))", vm.token), "kv-written-42", commandWithin); err != nil {
		t.Fatalf("write state in the guest: %v", err)
	}
	srcPid := s.status(t, vm).GetPid()
	srcEvents := recordMigrationEvents(t, vm.d, vm.id)
	tgt := s.prepareTarget(t, peer, vm, false)
	m := optional[driver.Migrator](t, vm.d, basev1.Feature_FEATURE_HYPERVISOR_MIGRATE)

	start := time.Now()
	if err := m.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: vm.id, TargetSocketPath: s.migrationPath(t, vm, tgt), CompletionTimeout: durationpb.New(s.opts.Timeout)}); err != nil {
		t.Fatalf("Migrate to the target's socket: %s", describe(err))
	}
	info := s.waitMigration(t, m, vm.id, nil)
	took := time.Since(start)
	if info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED {
		t.Fatalf("the migration ended %s: %q; source events: %s; target events: %s", info.GetPhase(), info.GetMessage(), srcEvents, tgt.events)
	}
	t.Logf("migrated in %s: the driver reports total time %s, downtime %s, %d bytes of %d sent in %d passes",
		took.Round(time.Millisecond), info.GetTotalTime().AsDuration(), info.GetDowntime().AsDuration(), info.GetTransferredBytes(), info.GetTotalBytes(), info.GetIterations())
	if info.GetRole() != hypervisorv1.MigrationRole_MIGRATION_ROLE_SOURCE || info.GetDowntime() == nil || info.GetTotalTime() == nil {
		t.Errorf("a completed migration at the source reports role %s, downtime %v, total time %v: want SOURCE with both", info.GetRole(), info.GetDowntime(), info.GetTotalTime())
	}

	st := s.waitState(t, vm, hypervisorv1.State_STATE_STOPPED, targetStopWithin)
	if st.GetState() != hypervisorv1.State_STATE_STOPPED || st.GetReason() != driver.ReasonMigrated {
		t.Errorf("after a completed migration the source is %s (reason %q), want STOPPED with reason %s", st.GetState(), st.GetReason(), driver.ReasonMigrated)
	}
	if st.GetPid() != 0 {
		t.Errorf("the migrated source reports pid %d, want none", st.GetPid())
	}
	if srcPid != 0 && processChecks {
		gctx, cancel := context.WithTimeout(ctx, goneWithin)
		if !poll(gctx, func() bool { return !processRunning(int(srcPid)) }) {
			t.Errorf("the source's VM process (pid %d) still runs after the migration completed", srcPid)
		}
		cancel()
	}
	if e := srcEvents.find(func(e *hypervisorv1.Event) bool {
		return e.GetType() == hypervisorv1.EventType_EVENT_TYPE_STOPPED && e.GetReason() == driver.ReasonMigrated
	}); e == nil {
		t.Errorf("the source reported no STOPPED event with reason %s: %s", driver.ReasonMigrated, srcEvents)
	}
	if e := srcEvents.find(func(e *hypervisorv1.Event) bool {
		return e.GetType() == hypervisorv1.EventType_EVENT_TYPE_MIGRATION && e.GetMigration().GetRole() == hypervisorv1.MigrationRole_MIGRATION_ROLE_SOURCE
	}); e == nil {
		t.Errorf("the source reported no MIGRATION event: %s", srcEvents)
	}
	if e := srcEvents.find(func(e *hypervisorv1.Event) bool { return e.GetType() == hypervisorv1.EventType_EVENT_TYPE_PAUSED }); e != nil {
		t.Errorf("the source reported PAUSED during its migration (the switch-over is downtime, not a pause): %s", srcEvents)
	}

	tst := s.waitState(t, tgt.guestVM, hypervisorv1.State_STATE_RUNNING, targetStopWithin)
	if tst.GetState() != hypervisorv1.State_STATE_RUNNING || tst.GetReason() != driver.ReasonMigrated {
		t.Fatalf("after a completed migration the target is %s (reason %q, message %q), want RUNNING with reason %s; its events: %s", tst.GetState(), tst.GetReason(), tst.GetMessage(), driver.ReasonMigrated, tgt.events)
	}
	if e := tgt.events.find(func(e *hypervisorv1.Event) bool {
		return e.GetType() == hypervisorv1.EventType_EVENT_TYPE_STARTED && e.GetReason() == driver.ReasonMigrated
	}); e == nil {
		t.Errorf("the target reported no STARTED event with reason %s: %s", driver.ReasonMigrated, tgt.events)
	}
	tm := optional[driver.Migrator](t, peer, basev1.Feature_FEATURE_HYPERVISOR_MIGRATE)
	if ti, err := tm.MigrationStatus(ctx, vm.id); err != nil || ti.GetRole() != hypervisorv1.MigrationRole_MIGRATION_ROLE_TARGET || ti.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED {
		t.Errorf("MigrationStatus of the target that runs = %v, %s; want role TARGET, phase COMPLETED", ti, describe(err))
	}
	s.checkUnderLauncher(t, tgt.guestVM)

	c := optional[driver.Consoler](t, peer, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE)
	tgt.console = attachConsole(t, c, vm.id)
	if err := tgt.console.typeUntil(ctx, "echo kv-var-$KVMIG", "kv-var-"+vm.token, commandWithin); err != nil {
		t.Errorf("the shell variable set before the migration: %v", err)
	}
	if err := tgt.console.typeUntil(ctx, "cat /tmp/kv-migration", vm.token, commandWithin); err != nil {
		t.Errorf("the file written before the migration: %v", err)
	}
	if strings.Contains(tgt.console.out.String(), s.guest.ReadyMarker) {
		t.Errorf("the migrated guest booted again (its ready marker is on the target's console): %s", tgt.console.out.Tail())
	}
	graceful, err := peer.Shutdown(ctx, vm.id, s.opts.ShutdownTimeout)
	if err != nil {
		t.Fatalf("Shutdown of the migrated VM: %s", describe(err))
	}
	if !graceful {
		t.Errorf("Shutdown of the migrated VM returned graceful=false: the guest must power off by itself")
	}
}

// checkMigrateProgress: a migration limited to progressBandwidth reports its progress while it
// runs (total, transferred and remaining bytes, remaining going down, passes, the limit), keeps
// to the limit, and completes.
func (s *vmSuite) checkMigrateProgress(t T) {
	peer := s.requireMigration(t)
	vm := s.boot(t, "")
	tgt := s.prepareTarget(t, peer, vm, false)
	m := optional[driver.Migrator](t, vm.d, basev1.Feature_FEATURE_HYPERVISOR_MIGRATE)
	ctx := s.ctx(t)
	if err := m.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: vm.id, TargetSocketPath: s.migrationPath(t, vm, tgt), BandwidthBytesPerSecond: progressBandwidth}); err != nil {
		t.Fatalf("Migrate with a bandwidth limit: %s", describe(err))
	}
	var samples []*hypervisorv1.MigrationInfo
	final := s.waitMigration(t, m, vm.id, func(info *hypervisorv1.MigrationInfo) bool {
		if info.GetPhase() == hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE && info.GetTotalBytes() > 0 {
			samples = append(samples, info)
		}
		return false
	})
	if final.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED {
		t.Fatalf("the migration ended %s: %q", final.GetPhase(), final.GetMessage())
	}
	if len(samples) < 2 {
		t.Fatalf("MigrationStatus reported %d samples of an ACTIVE migration with its total bytes at %s: want progress while it runs", len(samples), fmtRate(progressBandwidth))
	}
	first, last := samples[0], samples[len(samples)-1]
	t.Logf("%d samples: remaining %d -> %d bytes of %d, transferred %d -> %d, passes %d, throughput %s, dirty rate %s; completed in %s, downtime %s",
		len(samples), first.GetRemainingBytes(), last.GetRemainingBytes(), last.GetTotalBytes(), first.GetTransferredBytes(), last.GetTransferredBytes(),
		last.GetIterations(), fmtRate(last.GetThroughputBytesPerSecond()), fmtRate(last.GetDirtyRateBytesPerSecond()), final.GetTotalTime().AsDuration(), final.GetDowntime().AsDuration())
	if first.GetRemainingBytes() == 0 {
		t.Errorf("the first sample of the running migration reports no remaining bytes")
	}
	if last.GetTransferredBytes() <= first.GetTransferredBytes() || last.GetRemainingBytes() >= first.GetRemainingBytes() {
		t.Errorf("no progress between the first and the last sample: transferred %d -> %d, remaining %d -> %d",
			first.GetTransferredBytes(), last.GetTransferredBytes(), first.GetRemainingBytes(), last.GetRemainingBytes())
	}
	if last.GetIterations() < 1 {
		t.Errorf("the running migration reports %d passes, want at least 1", last.GetIterations())
	}
	if got := last.GetBandwidthLimitBytesPerSecond(); got != progressBandwidth {
		t.Errorf("MigrationStatus reports a bandwidth limit of %d, want %d", got, progressBandwidth)
	}
	// The limit holds over the whole migration (a second's burst aside).
	if tt := final.GetTotalTime().AsDuration(); tt > 0 {
		if rate := float64(final.GetTransferredBytes()) / (tt.Seconds() + 1); rate > 1.25*progressBandwidth {
			t.Errorf("the migration sent %d bytes in %s: %s, above its limit of %s", final.GetTransferredBytes(), tt, fmtRate(uint64(rate)), fmtRate(progressBandwidth))
		}
	}
	if st := s.waitState(t, tgt.guestVM, hypervisorv1.State_STATE_RUNNING, targetStopWithin); st.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Errorf("after the migration completed the target is %s (reason %q)", st.GetState(), st.GetReason())
	}
}

func fmtRate(bps uint64) string { return fmt.Sprintf("%.1f MiB/s", float64(bps)/(1<<20)) }

// checkMigrateCancel: Migrate refuses a target that is not there (the VM running on), and a
// migration too slow to finish is cancelled: the source runs on (its guest still printing), the
// target stops.
func (s *vmSuite) checkMigrateCancel(t T) {
	peer := s.requireMigration(t)
	vm := s.boot(t, "")
	m := optional[driver.Migrator](t, vm.d, basev1.Feature_FEATURE_HYPERVISOR_MIGRATE)
	ctx := s.ctx(t)
	if info, err := m.MigrationStatus(ctx, vm.id); err != nil || info != nil {
		t.Errorf("MigrationStatus of a VM that never migrated = %v, %s; want none, no error", info, describe(err))
	}
	expectCode(t, m.CancelMigration(ctx, vm.id), codes.OK, "CancelMigration of a VM that does not migrate")
	expectCode(t, m.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: vm.id, TargetSocketPath: filepath.Join(t.TempDir(), "none.sock")}),
		codes.FailedPrecondition, "Migrate to a path where no socket is")
	expectCode(t, m.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: vm.id, TargetSocketPath: "migration.sock"}),
		codes.InvalidArgument, "Migrate to a relative socket path")
	s.expectState(t, vm, hypervisorv1.State_STATE_RUNNING, "refused migrations")

	if err := vm.console.typeUntil(ctx, tickCommand, tickText, commandWithin); err != nil {
		t.Fatalf("make the guest print a line five times a second: %v", err)
	}
	tgt := s.prepareTarget(t, peer, vm, false)
	path := s.migrationPath(t, vm, tgt)
	if err := m.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: vm.id, TargetSocketPath: path, BandwidthBytesPerSecond: slowBandwidth}); err != nil {
		t.Fatalf("Migrate with a bandwidth limit of %s: %s", fmtRate(slowBandwidth), describe(err))
	}
	info := s.waitMigration(t, m, vm.id, func(info *hypervisorv1.MigrationInfo) bool {
		return info.GetPhase() == hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE && info.GetTransferredBytes() > 0
	})
	if migrationEnded(info) {
		t.Fatalf("a migration limited to %s ended before it could be cancelled: %s %q", fmtRate(slowBandwidth), info.GetPhase(), info.GetMessage())
	}
	expectCode(t, m.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: vm.id, TargetSocketPath: path}), codes.FailedPrecondition, "a second Migrate while one runs")
	if _, caps := s.hypervisor(t); hasFeature(caps, basev1.Feature_FEATURE_HYPERVISOR_PAUSE) {
		p := optional[driver.Pauser](t, vm.d, basev1.Feature_FEATURE_HYPERVISOR_PAUSE)
		expectCode(t, p.Pause(ctx, vm.id), codes.FailedPrecondition, "Pause of a VM that migrates")
	}
	ticks := vm.console.out.Count(tickText)
	if err := m.CancelMigration(ctx, vm.id); err != nil {
		t.Fatalf("CancelMigration: %s", describe(err))
	}
	info, err := m.MigrationStatus(ctx, vm.id)
	if err != nil || info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED {
		t.Errorf("MigrationStatus after CancelMigration returned = %v, %s; want phase CANCELLED", info, describe(err))
	}
	s.expectState(t, vm, hypervisorv1.State_STATE_RUNNING, "CancelMigration")
	if err := vm.console.out.WaitFor(ctx, tickText, ticks+3, commandWithin); err != nil {
		t.Errorf("the guest does not go on printing at the source after the cancelled migration: %v", err)
	}
	st := s.waitState(t, tgt.guestVM, hypervisorv1.State_STATE_STOPPED, targetStopWithin)
	if st.GetState() != hypervisorv1.State_STATE_STOPPED || st.GetReason() != driver.ReasonMigrationFailed {
		t.Errorf("the target of the cancelled migration is %s (reason %q, message %q), want STOPPED with reason %s within %s",
			st.GetState(), st.GetReason(), st.GetMessage(), driver.ReasonMigrationFailed, targetStopWithin)
	}
	expectCode(t, m.CancelMigration(ctx, vm.id), codes.OK, "CancelMigration again")
}

// hasFeature says whether caps declares f.
func hasFeature(caps *basev1.Capabilities, f basev1.Feature) bool {
	for _, g := range caps.GetFeatures() {
		if g == f {
			return true
		}
	}
	return false
}
