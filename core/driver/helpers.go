package driver

import (
	"context"
	"time"

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
