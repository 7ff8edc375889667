package liveconfig

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// HostDevicesDriver is the device driver Config.PermittedHostDevices configures: drivers/hostdev,
// the in-tree driver whose configuration has permittedHostDevices.
const HostDevicesDriver = "hostdev"

// MergeHostDevices is the hostdev driver configuration base (a JSON object, or empty for the
// driver's defaults) with permitted in place of its permittedHostDevices; with permitted nil,
// base as it is. The result is what the node's processes reconfigure their running driver with.
func MergeHostDevices(base json.RawMessage, permitted *v1alpha1.PermittedHostDevices) (json.RawMessage, error) {
	if permitted == nil {
		return base, nil
	}
	obj := map[string]json.RawMessage{}
	if b := bytes.TrimSpace(base); len(b) > 0 && !bytes.Equal(b, []byte("null")) {
		if err := json.Unmarshal(b, &obj); err != nil {
			return nil, fmt.Errorf("driverConfig.%s: not a JSON object: %w", HostDevicesDriver, err)
		}
	}
	p, err := json.Marshal(permitted)
	if err != nil {
		return nil, err
	}
	obj["permittedHostDevices"] = p
	return json.Marshal(obj)
}

// hostDevicesRetry is how long HostDevices retries a driver that is not running (Unavailable:
// its plugin is being restarted), in total.
var hostDevicesRetry = 10 * time.Second

// HostDevices returns an Applier that hands each configuration's PermittedHostDevices (nil: the
// node's own) to set, when it differs from what set last took. set gives them to the node's
// running hostdev driver (MergeHostDevices over the node's driverConfig.hostdev, then
// plugin.Host.Reconfigure) and makes its process follow the driver's resources: the handler
// (core/handler) and kubevisor-deviceplugins (package deviceplugins) each have one. A driver
// that is not running (Unavailable) is asked again for a while; a change the driver refuses,
// which set must leave without effect, is logged with the driver's error (which names the
// field: config.permittedHostDevices.pciHostDevices[0].resourceName) and the configuration
// before it stays, until the next version of the ConfigMap. ctx bounds every call of set.
func HostDevices(ctx context.Context, set func(context.Context, *v1alpha1.PermittedHostDevices) error, log logr.Logger) Applier {
	var (
		last    *v1alpha1.PermittedHostDevices
		applied bool
	)
	return func(c Config) {
		p := c.PermittedHostDevices
		if applied && equality.Semantic.DeepEqual(p, last) {
			return
		}
		deadline := time.Now().Add(hostDevicesRetry)
		wait := 100 * time.Millisecond
		var err error
		for {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = set(cctx, p)
			cancel()
			if status.Code(err) != codes.Unavailable || time.Now().Add(wait).After(deadline) || ctx.Err() != nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			wait *= 2
		}
		if err != nil {
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				return
			}
			log.Error(err, "permitted host devices refused: the configuration before stays", "permittedHostDevices", describeHostDevices(p))
			return
		}
		last, applied = p.DeepCopy(), true
		log.Info("permitted host devices applied", "permittedHostDevices", describeHostDevices(p))
	}
}

// describeHostDevices is p for a log line: "the node's" when nil.
func describeHostDevices(p *v1alpha1.PermittedHostDevices) string {
	if p == nil {
		return "the node's (driverConfig." + HostDevicesDriver + ")"
	}
	b, _ := json.Marshal(p)
	return string(b)
}
