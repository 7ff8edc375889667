// Package storage is the "local" storage driver: it turns every KubeVirt volume type into a
// disk on the node's file system (qcow2 overlays over container and ephemeral disks, qcow2
// empty disks, host disks and PVCs in place, cloud-init ISO images), with qemu-img behind the
// ImageTool interface.
package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/core/keyedmutex"
)

// DriverName is the driver's name, as in its plugin manifest and in Info.
const DriverName = "local"

// Version is the driver's own release version.
const Version = "0.1.0"

// Volume types, as in Capabilities.volume_types.
const (
	TypeContainerDisk         = "containerDisk"
	TypeEmptyDisk             = "emptyDisk"
	TypeHostDisk              = "hostDisk"
	TypeEphemeral             = "ephemeral"
	TypeCloudInitNoCloud      = "cloudInitNoCloud"
	TypeCloudInitConfigDrive  = "cloudInitConfigDrive"
	TypePersistentVolumeClaim = "persistentVolumeClaim"
)

// VolumeTypes are all the volume types the driver prepares.
var VolumeTypes = []string{
	TypeContainerDisk, TypeEmptyDisk, TypeHostDisk, TypeEphemeral,
	TypeCloudInitNoCloud, TypeCloudInitConfigDrive, TypePersistentVolumeClaim,
}

// fingerprintInterval is how often Fingerprint looks at qemu-img again, to notice that it was
// installed or removed.
const fingerprintInterval = time.Minute

// Logger is the part of the SDK's logger (driver.NewLogger) the driver uses.
type Logger interface {
	Info(msg string, args ...any)
	Warn(msg string, args ...any)
}

// Config is the driver's configuration, the JSON the host passes to Configure.
type Config struct {
	// QemuImg is the qemu-img binary: an absolute path, or a name looked up in PATH. Empty
	// means "qemu-img".
	QemuImg string `json:"qemuImg,omitempty"`
}

// Option changes how New builds the driver.
type Option func(*Local)

// WithImageTool replaces qemu-img: newTool is called with the configured qemu-img path (""
// for the default) whenever the driver is configured. Tests pass a fake.
func WithImageTool(newTool func(path string) ImageTool) Option {
	return func(l *Local) { l.newTool = newTool }
}

// Local is the local storage driver. Prepare and Release of different work directories run
// in parallel; of the same one, one at a time.
type Local struct {
	log     Logger
	newTool func(string) ImageTool
	locks   keyedmutex.Mutex

	mu   sync.RWMutex
	cfg  Config
	tool ImageTool
	// reconfigured is closed and replaced by Configure, so that Fingerprint looks again.
	reconfigured chan struct{}
}

var _ driver.Storage = (*Local)(nil)

// New returns the driver, running qemu-img from PATH until Configure says otherwise. log may
// be nil.
func New(log Logger, opts ...Option) *Local {
	if log == nil {
		log = nopLogger{}
	}
	l := &Local{log: log, newTool: NewQemuImg, reconfigured: make(chan struct{})}
	for _, o := range opts {
		o(l)
	}
	l.tool = l.newTool("")
	return l
}

// Info implements driver.Driver.
func (l *Local) Info(context.Context) (*basev1.InfoResponse, error) {
	return &basev1.InfoResponse{
		Name:        DriverName,
		Kind:        basev1.Kind_KIND_STORAGE,
		Version:     Version,
		Description: "local disks: qcow2 overlays over container and ephemeral disks, empty disks, host disks and PVCs in place, cloud-init ISOs",
	}, nil
}

// Capabilities implements driver.Driver: every volume type, no optional feature.
func (l *Local) Capabilities(context.Context) (*basev1.Capabilities, error) {
	return &basev1.Capabilities{VolumeTypes: append([]string(nil), VolumeTypes...)}, nil
}

// Configure implements driver.Driver. Unknown fields are rejected, so that a typo in a
// manifest does not go unnoticed. Whether qemu-img runs is Fingerprint's to report.
func (l *Local) Configure(_ context.Context, req *basev1.ConfigureRequest) error {
	var cfg Config
	if raw := bytes.TrimSpace(req.GetConfig()); len(raw) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return status.Errorf(codes.InvalidArgument, "config: %v", err)
		}
	}
	l.mu.Lock()
	l.cfg = cfg
	l.tool = l.newTool(cfg.QemuImg)
	close(l.reconfigured)
	l.reconfigured = make(chan struct{})
	l.mu.Unlock()
	l.log.Info("configured", "qemuImg", cfg.QemuImg, "node", req.GetNodeName())
	return nil
}

// Fingerprint implements driver.Driver: HEALTHY with the qemu-img version as an attribute
// when qemu-img runs, UNHEALTHY saying why otherwise. It looks again after Configure and every
// minute, and sends when the answer changes.
func (l *Local) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	return driver.WatchFingerprint(ctx, fingerprintInterval, func(ctx context.Context) (*basev1.FingerprintResponse, <-chan struct{}) {
		l.mu.RLock()
		tool, reconfigured := l.tool, l.reconfigured
		l.mu.RUnlock()
		return fingerprint(ctx, tool), reconfigured
	}, send)
}

func fingerprint(ctx context.Context, tool ImageTool) *basev1.FingerprintResponse {
	v, err := tool.Version(ctx)
	if err != nil {
		return &basev1.FingerprintResponse{
			Health:            basev1.Health_HEALTH_UNHEALTHY,
			HealthDescription: fmt.Sprintf("qemu-img does not run (install qemu-utils or configure qemuImg): %v", err),
		}
	}
	return &basev1.FingerprintResponse{
		Health:            basev1.Health_HEALTH_HEALTHY,
		HealthDescription: "qemu-img " + v,
		// A node label value: "7.2", not a path or "7.2.22 (Debian ...)".
		Attributes: map[string]string{"qemu-img": labelVersion(v)},
	}
}

// imageTool is the tool Prepare uses, as last configured.
func (l *Local) imageTool() ImageTool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.tool
}

type nopLogger struct{}

func (nopLogger) Info(string, ...any) {}
func (nopLogger) Warn(string, ...any) {}
