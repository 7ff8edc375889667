// Command testdriver serves one of the simulated drivers of drivers/fake under a name of its
// own, failing on demand, for the handler's tests: a plugin host keys drivers by name, and every
// fake driver calls itself "fake".
//
//	testdriver KIND name=NAME [fail=OP:SUBSTRING]... [drop=FEATURE]...
//
// KIND is hypervisor, network, storage or device. fail makes operation OP (Prepare, Setup,
// Create, Start) fail with codes.Internal for every VMI whose id contains SUBSTRING. drop leaves
// an optional feature (FEATURE_HYPERVISOR_CONSOLE, ...) out of the hypervisor's Capabilities,
// which it still implements: the host must not use it.
package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
	"github.com/kubevisor/kubevisor/drivers/fake"
)

// failures maps an operation to the id substrings it fails for.
type failures map[string][]string

func (f failures) check(op, id string) error {
	for _, s := range f[op] {
		if strings.Contains(id, s) {
			return status.Errorf(codes.Internal, "testdriver: %s fails for %q as asked", op, id)
		}
	}
	return nil
}

type named struct{ name string }

func (n named) info(info *basev1.InfoResponse, err error) (*basev1.InfoResponse, error) {
	if info != nil {
		info.Name = n.name
	}
	return info, err
}

type hypervisor struct {
	*fake.Hypervisor
	named
	fail failures
	drop []basev1.Feature
}

func (h *hypervisor) Capabilities(ctx context.Context) (*basev1.Capabilities, error) {
	caps, err := h.Hypervisor.Capabilities(ctx)
	if caps != nil {
		caps.Features = slices.DeleteFunc(caps.Features, func(f basev1.Feature) bool { return slices.Contains(h.drop, f) })
	}
	return caps, err
}

func (h *hypervisor) Info(ctx context.Context) (*basev1.InfoResponse, error) {
	return h.info(h.Hypervisor.Info(ctx))
}

func (h *hypervisor) Create(ctx context.Context, spec *domainv1.DomainSpec) (*hypervisorv1.Handle, error) {
	if err := h.fail.check("Create", spec.GetId()); err != nil {
		return nil, err
	}
	handle, err := h.Hypervisor.Create(ctx, spec)
	if handle != nil {
		handle.Driver = h.name
	}
	return handle, err
}

func (h *hypervisor) Start(ctx context.Context, id string) error {
	if err := h.fail.check("Start", id); err != nil {
		return err
	}
	return h.Hypervisor.Start(ctx, id)
}

type network struct {
	*fake.Network
	named
	fail failures
}

func (n *network) Info(ctx context.Context) (*basev1.InfoResponse, error) {
	return n.info(n.Network.Info(ctx))
}

func (n *network) Setup(ctx context.Context, req *networkv1.SetupRequest) (*networkv1.SetupResponse, error) {
	if err := n.fail.check("Setup", req.GetVmiId()); err != nil {
		return nil, err
	}
	return n.Network.Setup(ctx, req)
}

type storage struct {
	*fake.Storage
	named
	fail failures
}

func (s *storage) Info(ctx context.Context) (*basev1.InfoResponse, error) {
	return s.info(s.Storage.Info(ctx))
}

func (s *storage) Prepare(ctx context.Context, req *storagev1.PrepareRequest) (*storagev1.PrepareResponse, error) {
	if err := s.fail.check("Prepare", req.GetVmiId()); err != nil {
		return nil, err
	}
	return s.Storage.Prepare(ctx, req)
}

type device struct {
	*fake.Device
	named
}

func (d *device) Info(ctx context.Context) (*basev1.InfoResponse, error) {
	return d.info(d.Device.Info(ctx))
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testdriver KIND name=NAME [fail=OP:SUBSTRING]...")
		os.Exit(2)
	}
	kind, n, fail := os.Args[1], named{name: "testdriver"}, failures{}
	var drop []basev1.Feature
	for _, arg := range os.Args[2:] {
		key, val, _ := strings.Cut(arg, "=")
		switch key {
		case "name":
			n.name = val
		case "fail":
			op, sub, _ := strings.Cut(val, ":")
			fail[op] = append(fail[op], sub)
		case "drop":
			f, ok := basev1.Feature_value[val]
			if !ok {
				fmt.Fprintf(os.Stderr, "testdriver: unknown feature %q\n", val)
				os.Exit(2)
			}
			drop = append(drop, basev1.Feature(f))
		default:
			fmt.Fprintf(os.Stderr, "testdriver: unknown argument %q\n", arg)
			os.Exit(2)
		}
	}
	log := driver.NewLogger("testdriver-" + kind)
	switch kind {
	case driver.KindHypervisor:
		driver.ServeHypervisor(&hypervisor{Hypervisor: fake.NewHypervisor(), named: n, fail: fail, drop: drop}, driver.WithLogger(log))
	case driver.KindNetwork:
		driver.ServeNetwork(&network{Network: fake.NewNetwork(), named: n, fail: fail}, driver.WithLogger(log))
	case driver.KindStorage:
		driver.ServeStorage(&storage{Storage: fake.NewStorage(), named: n, fail: fail}, driver.WithLogger(log))
	case driver.KindDevice:
		driver.ServeDevice(&device{Device: fake.NewDevice(), named: n}, driver.WithLogger(log))
	default:
		fmt.Fprintf(os.Stderr, "testdriver: unknown kind %q\n", kind)
		os.Exit(2)
	}
}
