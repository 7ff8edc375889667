package driver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// StateWord is a VM state as a word for messages: "running", "shutting down", ...
func StateWord(s hypervisorv1.State) string {
	switch s {
	case hypervisorv1.State_STATE_CREATED:
		return "created"
	case hypervisorv1.State_STATE_RUNNING:
		return "running"
	case hypervisorv1.State_STATE_PAUSED:
		return "paused"
	case hypervisorv1.State_STATE_SHUTTING_DOWN:
		return "shutting down"
	case hypervisorv1.State_STATE_STOPPED:
		return "stopped"
	case hypervisorv1.State_STATE_CRASHED:
		return "crashed"
	}
	return "in an unknown state"
}

// WatchFingerprint implements the Fingerprint contract for a driver that computes its
// fingerprint on demand: it calls probe at once, again every interval and whenever the channel
// probe returned is closed (close it on Configure), and sends the result whenever it differs
// from the last one sent, until ctx is done.
func WatchFingerprint(ctx context.Context, interval time.Duration,
	probe func(context.Context) (fp *basev1.FingerprintResponse, changed <-chan struct{}),
	send func(*basev1.FingerprintResponse) error) error {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	var last *basev1.FingerprintResponse
	for {
		fp, changed := probe(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if last == nil || !proto.Equal(fp, last) {
			if err := send(fp); err != nil {
				return err
			}
			last = fp
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-changed:
		}
	}
}

// MigrationSocket is the unix socket a MigrateRequest names: target_socket_path, or target_uri as
// "unix:PATH", which must exist and be a socket. Errors are gRPC statuses naming the field:
// InvalidArgument for a target_uri of another scheme ("the <driver> driver migrates over unix
// sockets only") or a path that is empty or relative, FailedPrecondition for no socket there.
func MigrationSocket(driver string, req *hypervisorv1.MigrateRequest) (string, error) {
	field, path := "targetSocketPath", req.GetTargetSocketPath()
	if uri := req.GetTargetUri(); uri != "" {
		p, ok := strings.CutPrefix(uri, "unix:")
		if !ok {
			return "", status.Errorf(codes.InvalidArgument, "targetUri: %q is not unix:PATH (the %s driver migrates over unix sockets only)", uri, driver)
		}
		field, path = "targetUri", p
	}
	switch {
	case path == "":
		return "", status.Errorf(codes.InvalidArgument, "%s: required", field)
	case !filepath.IsAbs(path):
		return "", status.Errorf(codes.InvalidArgument, "%s: %q is not an absolute path", field, path)
	}
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return "", status.Errorf(codes.FailedPrecondition, "%s: no socket at %s: %v", field, path, err)
	case fi.Mode()&os.ModeSocket == 0:
		return "", status.Errorf(codes.FailedPrecondition, "%s: %s is not a socket", field, path)
	}
	return path, nil
}

// MigrationEnded says whether a migration in phase p is over: COMPLETED, FAILED or CANCELLED.
func MigrationEnded(p hypervisorv1.MigrationPhase) bool {
	switch p {
	case hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED,
		hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED:
		return true
	}
	return false
}
