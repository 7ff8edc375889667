package qmp

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// sample is a query-migrate answer of an active migration in pass seq with remaining bytes.
func sample(seq, remaining uint64) *queryMigrate {
	q := &queryMigrate{Status: "active"}
	q.RAM = &struct {
		Transferred    uint64  `json:"transferred"`
		Remaining      uint64  `json:"remaining"`
		Total          uint64  `json:"total"`
		DirtyPagesRate uint64  `json:"dirty-pages-rate"`
		Mbps           float64 `json:"mbps"`
		DirtySyncCount uint64  `json:"dirty-sync-count"`
		PageSize       uint64  `json:"page-size"`
	}{Remaining: remaining, Total: 1 << 30, DirtySyncCount: seq, PageSize: 4096, DirtyPagesRate: 10, Mbps: 80}
	return q
}

func newSourceMigration(postCopy bool, timeout time.Duration, started time.Time) *migration {
	return &migration{completionTimeout: timeout, info: &hypervisorv1.MigrationInfo{
		Role: hypervisorv1.MigrationRole_MIGRATION_ROLE_SOURCE, Phase: hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE,
		Mode: hypervisorv1.MigrationMode_MIGRATION_MODE_PRE_COPY, PostCopy: postCopy, StartedAt: timestamppb.New(started),
	}}
}

// TestNextAction: the convergence rule and the completion timeout, sample by sample.
func TestNextAction(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name     string
		postCopy bool
		timeout  time.Duration
		started  time.Time
		samples  []*queryMigrate
		want     []string
	}{
		{"converging pre-copy goes on", true, 0, now,
			[]*queryMigrate{sample(1, 900), sample(2, 500), sample(3, 300), sample(4, 100)}, []string{"", "", "", ""}},
		{"two passes that do not shrink switch to post-copy", true, 0, now,
			[]*queryMigrate{sample(1, 900), sample(2, 500), sample(2, 400), sample(3, 500), sample(4, 600)}, []string{"", "", "", "", "postcopy"}},
		{"a pass that shrinks again resets the rule", true, 0, now,
			[]*queryMigrate{sample(2, 500), sample(3, 500), sample(4, 400), sample(5, 400)}, []string{"", "", "", ""}},
		{"not converging without post-copy goes on", false, 0, now,
			[]*queryMigrate{sample(2, 500), sample(3, 500), sample(4, 600)}, []string{"", "", ""}},
		{"the completion timeout cancels without post-copy", false, time.Minute, now.Add(-2 * time.Minute),
			[]*queryMigrate{sample(1, 900)}, []string{"cancel"}},
		{"the completion timeout switches to post-copy when allowed", true, time.Minute, now.Add(-2 * time.Minute),
			[]*queryMigrate{sample(1, 900)}, []string{"postcopy"}},
		{"within the completion timeout", false, time.Hour, now,
			[]*queryMigrate{sample(1, 900)}, []string{""}},
		{"a migration not active yet", false, time.Minute, now.Add(-2 * time.Minute),
			[]*queryMigrate{{Status: "setup"}}, []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newSourceMigration(tc.postCopy, tc.timeout, tc.started)
			var got []string
			for _, q := range tc.samples {
				a, why := m.nextAction(q)
				if a != "" && why == "" {
					t.Errorf("action %q without a reason", a)
				}
				got = append(got, a)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("actions %q, want %q", got, tc.want)
			}
		})
	}
	// In post-copy, or once cancelled, nothing more is decided.
	m := newSourceMigration(true, time.Minute, now.Add(-time.Hour))
	m.info.Mode = hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY
	if a, _ := m.nextAction(sample(9, 1)); a != "" {
		t.Errorf("post-copy: action %q", a)
	}
	m = newSourceMigration(false, time.Minute, now.Add(-time.Hour))
	m.cancelReason = "cancelled"
	if a, _ := m.nextAction(sample(9, 1)); a != "" {
		t.Errorf("cancelled: action %q", a)
	}
}

func TestApplyQuery(t *testing.T) {
	q := sample(3, 4096)
	q.RAM.Transferred, q.TotalTime, q.Throttle, q.ExpectedDowntime = 1<<20, 1500, 20, 300
	dt := int64(42)
	q.Downtime = &dt
	info := &hypervisorv1.MigrationInfo{}
	applyQuery(info, q)
	if info.GetRemainingBytes() != 4096 || info.GetTotalBytes() != 1<<30 || info.GetTransferredBytes() != 1<<20 || info.GetIterations() != 3 ||
		info.GetDirtyRateBytesPerSecond() != 10*4096 || info.GetThroughputBytesPerSecond() != 10_000_000 || info.GetThrottlePercent() != 20 ||
		info.GetTotalTime().AsDuration() != 1500*time.Millisecond || info.GetDowntime().AsDuration() != 42*time.Millisecond ||
		info.GetExpectedDowntime().AsDuration() != 300*time.Millisecond {
		t.Errorf("applyQuery = %v", info)
	}
	applyQuery(info, &queryMigrate{Status: "postcopy-active"})
	if info.GetMode() != hypervisorv1.MigrationMode_MIGRATION_MODE_POST_COPY {
		t.Errorf("postcopy-active: mode %s", info.GetMode())
	}
}

// TestBuildArgsIncoming: a migration target's QEMU waits for migrate-incoming (-incoming defer),
// with its vCPUs stopped (-S) until the driver runs it.
func TestBuildArgsIncoming(t *testing.T) {
	spec := &domainv1.DomainSpec{Id: "vm", Memory: &domainv1.Memory{GuestBytes: 64 << 20}, RunDir: "/run/vm",
		IncomingMigration: &domainv1.IncomingMigration{SocketPath: "/run/vm/migration.sock"}}
	cl, err := BuildArgs(spec, HostEnv{Accel: AccelTCG, RunDir: "/run/vm"})
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(cl.Args, " ")
	if !strings.Contains(args, " -incoming defer") || !strings.Contains(args, " -S ") {
		t.Errorf("a migration target's arguments lack -incoming defer or -S: %s", args)
	}
	spec.IncomingMigration = nil
	if cl, _ := BuildArgs(spec, HostEnv{Accel: AccelTCG, RunDir: "/run/vm"}); slices.Contains(cl.Args, "-incoming") {
		t.Errorf("a VM that boots waits for a migration: %s", strings.Join(cl.Args, " "))
	}
}

func TestTCGLosesMigrationWrites(t *testing.T) {
	for v, want := range map[string]bool{
		"7.2.22": true, "8.2.1": true, "9.0.0": false, "10.1.2": false,
		"": true, "nine": true, // unreadable: the safe answer
	} {
		if got := TCGLosesMigrationWrites(v); got != want {
			t.Errorf("TCGLosesMigrationWrites(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestPausedDowntime(t *testing.T) {
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	m := &migration{paused: true, pausedAt: at}
	if got := m.pausedDowntime(20*time.Millisecond, at.Add(700*time.Millisecond)); got != 700*time.Millisecond {
		t.Errorf("a paused copy to its end: downtime %s, want 700ms (from the pause, not QEMU's 20ms)", got)
	}
	m.switchedAt = at.Add(150 * time.Millisecond)
	if got := m.pausedDowntime(30*time.Millisecond, at.Add(5*time.Second)); got != 180*time.Millisecond {
		t.Errorf("a paused start switched to post-copy: downtime %s, want 180ms (to the switch, plus QEMU's 30ms)", got)
	}
}
