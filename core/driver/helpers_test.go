package driver_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

func TestWatchFingerprintSendsChangesOnly(t *testing.T) {
	var mu sync.Mutex
	health := basev1.Health_HEALTH_HEALTHY
	changed := make(chan struct{})
	probes := 0
	probe := func(context.Context) (*basev1.FingerprintResponse, <-chan struct{}) {
		mu.Lock()
		defer mu.Unlock()
		probes++
		return &basev1.FingerprintResponse{Health: health}, changed
	}
	ctx, cancel := context.WithCancel(context.Background())
	sent := make(chan basev1.Health, 10)
	done := make(chan error, 1)
	go func() {
		done <- driver.WatchFingerprint(ctx, time.Millisecond, probe, func(fp *basev1.FingerprintResponse) error {
			sent <- fp.GetHealth()
			return nil
		})
	}()
	if got := <-sent; got != basev1.Health_HEALTH_HEALTHY {
		t.Fatalf("first fingerprint %v, want healthy", got)
	}
	// Many ticks with the same answer send nothing more.
	for {
		mu.Lock()
		n := probes
		mu.Unlock()
		if n > 20 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case got := <-sent:
		t.Fatalf("an unchanged fingerprint was sent again: %v", got)
	default:
	}
	// A change (signalled, as Configure would) is sent.
	mu.Lock()
	health = basev1.Health_HEALTH_UNHEALTHY
	old := changed
	changed = make(chan struct{})
	mu.Unlock()
	close(old)
	if got := <-sent; got != basev1.Health_HEALTH_UNHEALTHY {
		t.Fatalf("after the change %v, want unhealthy", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("WatchFingerprint after cancel = %v, want nil", err)
	}
}

func TestStateWord(t *testing.T) {
	if got := driver.StateWord(hypervisorv1.State_STATE_SHUTTING_DOWN); got != "shutting down" {
		t.Errorf("StateWord(SHUTTING_DOWN) = %q", got)
	}
	if got := driver.StateWord(hypervisorv1.State(99)); got != "in an unknown state" {
		t.Errorf("StateWord(99) = %q", got)
	}
}

func TestChangedDevices(t *testing.T) {
	var sent [][]*devicev1.HostDevice
	send := driver.ChangedDevices(func(d []*devicev1.HostDevice) error { sent = append(sent, d); return nil })
	a := []*devicev1.HostDevice{{Id: "a", Health: basev1.Health_HEALTH_HEALTHY}}
	sick := []*devicev1.HostDevice{{Id: "a", Health: basev1.Health_HEALTH_UNHEALTHY}}
	for _, l := range [][]*devicev1.HostDevice{nil, nil, a, a, sick, sick, nil} {
		if err := send(l); err != nil {
			t.Fatal(err)
		}
	}
	// The first (empty) list, then each change: a appears, falls sick, goes.
	if len(sent) != 4 || len(sent[0]) != 0 || sent[1][0].GetHealth() != basev1.Health_HEALTH_HEALTHY ||
		sent[2][0].GetHealth() != basev1.Health_HEALTH_UNHEALTHY || len(sent[3]) != 0 {
		t.Errorf("sent %v", sent)
	}
}

func TestMigrationSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "m.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		req        *hypervisorv1.MigrateRequest
		code       codes.Code
		field      string
		wantSocket string
	}{
		{&hypervisorv1.MigrateRequest{TargetSocketPath: sock}, codes.OK, "", sock},
		{&hypervisorv1.MigrateRequest{TargetUri: "unix:" + sock}, codes.OK, "", sock},
		{&hypervisorv1.MigrateRequest{TargetUri: "tcp:10.0.0.1:4444"}, codes.InvalidArgument, "the test driver migrates over unix sockets only", ""},
		{&hypervisorv1.MigrateRequest{TargetSocketPath: "m.sock"}, codes.InvalidArgument, "targetSocketPath", ""},
		{&hypervisorv1.MigrateRequest{}, codes.InvalidArgument, "targetSocketPath", ""},
		{&hypervisorv1.MigrateRequest{TargetSocketPath: filepath.Join(dir, "none")}, codes.FailedPrecondition, "targetSocketPath", ""},
		{&hypervisorv1.MigrateRequest{TargetSocketPath: file}, codes.FailedPrecondition, "not a socket", ""},
	} {
		got, err := driver.MigrationSocket("test", tc.req)
		if status.Code(err) != tc.code || got != tc.wantSocket || (tc.field != "" && !strings.Contains(status.Convert(err).Message(), tc.field)) {
			t.Errorf("MigrationSocket(%v) = %q, %v; want %q, %s naming %q", tc.req, got, err, tc.wantSocket, tc.code, tc.field)
		}
	}
}

func TestMigrationEnded(t *testing.T) {
	for p, want := range map[hypervisorv1.MigrationPhase]bool{
		hypervisorv1.MigrationPhase_MIGRATION_PHASE_UNSPECIFIED: false, hypervisorv1.MigrationPhase_MIGRATION_PHASE_SETUP: false,
		hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE: false, hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED: true,
		hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED: true, hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED: true,
	} {
		if got := driver.MigrationEnded(p); got != want {
			t.Errorf("MigrationEnded(%s) = %v, want %v", p, got, want)
		}
	}
}
