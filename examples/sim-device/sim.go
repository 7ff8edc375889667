package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
)

const (
	// DriverName is the driver's name, as in its plugin manifest and in Info.
	DriverName = "sim"
	// Version is the driver's version, reported by Info.
	Version = "0.1.0"
	// Resource is the one resource the driver offers: devices.kubevisor.io/example-sim on a node.
	Resource = "example-sim"
	// EnvDevices is the environment variable Allocate sets in the container: the allocated
	// device ids, comma-separated, in the order asked for.
	EnvDevices = "KUBEVISOR_EXAMPLE_SIM_DEVICES"
	// DefaultCount is how many devices the driver offers when its configuration says nothing.
	DefaultCount = 3
	// maxCount bounds Config.Count: the devices are simulated, the kubelet lists each of them.
	maxCount = 64
)

// Config is the driver's JSON configuration (the manifest's config, passed to Configure):
//
//	{"count": 3, "unhealthy": ["sim-2"]}
type Config struct {
	// Count is how many devices to offer, sim-0 … sim-<count-1>. Default DefaultCount.
	Count int `json:"count,omitempty"`
	// Unhealthy are device ids reported unhealthy (an unhealthy device is not allocated).
	Unhealthy []string `json:"unhealthy,omitempty"`
}

var idRE = regexp.MustCompile(`^sim-[0-9]+$`)

// Logger is what the driver logs with (driver.NewLogger gives one that the host shows in its
// own log under the driver's name).
type Logger interface {
	Info(msg string, args ...any)
}

type nopLogger struct{}

func (nopLogger) Info(string, ...any) {}

// Sim is the driver: a fixed set of simulated devices, configured by Configure.
type Sim struct {
	log Logger

	mu      sync.Mutex
	cfg     Config
	changed chan struct{} // closed and replaced when the device list changes (Configure)
}

// New returns the driver with DefaultCount healthy devices. log may be nil.
func New(log Logger) *Sim {
	if log == nil {
		log = nopLogger{}
	}
	return &Sim{log: log, cfg: Config{Count: DefaultCount}, changed: make(chan struct{})}
}

// Info implements driver.Driver.
func (s *Sim) Info(context.Context) (*basev1.InfoResponse, error) {
	return &basev1.InfoResponse{
		Name:        DriverName,
		Kind:        basev1.Kind_KIND_DEVICE,
		Version:     Version,
		Description: "example device driver: simulated " + Resource + " devices, handed to a container as an environment variable",
	}, nil
}

// Capabilities implements driver.Driver: one resource, and Watch.
func (s *Sim) Capabilities(context.Context) (*basev1.Capabilities, error) {
	return &basev1.Capabilities{
		Resources: []string{Resource},
		Features:  []basev1.Feature{basev1.Feature_FEATURE_DEVICE_WATCH},
	}, nil
}

// Fingerprint implements driver.Driver: healthy, once, with an attribute that becomes a node
// label.
func (s *Sim) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	if err := send(&basev1.FingerprintResponse{
		Health:            basev1.Health_HEALTH_HEALTHY,
		HealthDescription: "simulated devices ready",
		Attributes:        map[string]string{"example-sim": "true"},
	}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// Configure implements driver.Driver. An empty config keeps the defaults; an unknown field, a
// count out of range or an unhealthy id that names no device is InvalidArgument.
func (s *Sim) Configure(_ context.Context, req *basev1.ConfigureRequest) error {
	cfg := Config{Count: DefaultCount}
	if raw := bytes.TrimSpace(req.GetConfig()); len(raw) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return status.Errorf(codes.InvalidArgument, "config: %v", err)
		}
		if cfg.Count == 0 {
			cfg.Count = DefaultCount
		}
	}
	if cfg.Count < 1 || cfg.Count > maxCount {
		return status.Errorf(codes.InvalidArgument, "config.count: %d is not between 1 and %d", cfg.Count, maxCount)
	}
	for _, id := range cfg.Unhealthy {
		if !slices.Contains(ids(cfg.Count), id) {
			return status.Errorf(codes.InvalidArgument, "config.unhealthy: %q is not one of the devices sim-0 … sim-%d", id, cfg.Count-1)
		}
	}
	s.mu.Lock()
	s.cfg = cfg
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	s.log.Info("configured", "devices", cfg.Count, "unhealthy", strings.Join(cfg.Unhealthy, ","), "node", req.GetNodeName())
	return nil
}

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("sim-%d", i)
	}
	return out
}

// devices returns the device list of resource ("" for all) and a channel closed when it changes.
func (s *Sim) devices(resource string) ([]*devicev1.HostDevice, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if resource != "" && resource != Resource {
		return nil, s.changed
	}
	var out []*devicev1.HostDevice
	for _, id := range ids(s.cfg.Count) {
		health := basev1.Health_HEALTH_HEALTHY
		if slices.Contains(s.cfg.Unhealthy, id) {
			health = basev1.Health_HEALTH_UNHEALTHY
		}
		out = append(out, &devicev1.HostDevice{Id: id, Resource: Resource, Health: health, NumaNode: -1})
	}
	return out, s.changed
}

// List implements driver.Device. A resource the driver does not offer has no devices.
func (s *Sim) List(_ context.Context, resource string) ([]*devicev1.HostDevice, error) {
	devs, _ := s.devices(resource)
	return devs, nil
}

// Watch implements driver.DeviceWatcher: the list at once, and again after every Configure.
func (s *Sim) Watch(ctx context.Context, resource string, send func([]*devicev1.HostDevice) error) error {
	for {
		devs, changed := s.devices(resource)
		if err := send(devs); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// Allocate implements driver.Device: the container gets EnvDevices naming the devices. An id
// that is not a device of Resource is NotFound, an unhealthy one FailedPrecondition, no id
// InvalidArgument.
func (s *Sim) Allocate(_ context.Context, req *devicev1.AllocateRequest) (*devicev1.AllocateResponse, error) {
	if r := req.GetResource(); r != Resource {
		return nil, status.Errorf(codes.NotFound, "resource %q: this driver offers only %q", r, Resource)
	}
	if len(req.GetDeviceIds()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "device_ids: no device to allocate")
	}
	devs, _ := s.devices(Resource)
	for _, id := range req.GetDeviceIds() {
		i := slices.IndexFunc(devs, func(d *devicev1.HostDevice) bool { return d.GetId() == id })
		switch {
		case !idRE.MatchString(id) || i < 0:
			return nil, status.Errorf(codes.NotFound, "device %q: no such %s device", id, Resource)
		case devs[i].GetHealth() != basev1.Health_HEALTH_HEALTHY:
			return nil, status.Errorf(codes.FailedPrecondition, "device %q: unhealthy", id)
		}
	}
	s.log.Info("allocated", "devices", strings.Join(req.GetDeviceIds(), ","))
	return &devicev1.AllocateResponse{Env: map[string]string{EnvDevices: strings.Join(req.GetDeviceIds(), ",")}}, nil
}
