package driver_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// echoHypervisor is the least a hypervisor must be, plus a console that echoes input upper-cased;
// it counts calls so tests can tell whether a call reached the driver.
type echoHypervisor struct {
	features []basev1.Feature
	calls    atomic.Int32
}

func (h *echoHypervisor) Info(context.Context) (*basev1.InfoResponse, error) {
	return &basev1.InfoResponse{Name: "echo", Version: "0.1.0"}, nil
}
func (h *echoHypervisor) Capabilities(context.Context) (*basev1.Capabilities, error) {
	return &basev1.Capabilities{Features: h.features}, nil
}
func (h *echoHypervisor) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	if err := send(&basev1.FingerprintResponse{Health: basev1.Health_HEALTH_HEALTHY}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
func (h *echoHypervisor) Configure(context.Context, *basev1.ConfigureRequest) error { return nil }
func (h *echoHypervisor) Create(_ context.Context, s *domainv1.DomainSpec) (*hypervisorv1.Handle, error) {
	h.calls.Add(1)
	return &hypervisorv1.Handle{Id: s.GetId()}, nil
}
func (h *echoHypervisor) Start(context.Context, string) error { h.calls.Add(1); return nil }
func (h *echoHypervisor) Shutdown(context.Context, string, time.Duration) (bool, error) {
	return true, nil
}
func (h *echoHypervisor) Kill(context.Context, string) error   { return nil }
func (h *echoHypervisor) Delete(context.Context, string) error { return nil }
func (h *echoHypervisor) Status(_ context.Context, id string) (*hypervisorv1.VMStatus, error) {
	return nil, status.Errorf(codes.NotFound, "vm %q not found", id)
}
func (h *echoHypervisor) Events(ctx context.Context, id string, send func(*hypervisorv1.Event) error) error {
	for _, t := range []hypervisorv1.EventType{hypervisorv1.EventType_EVENT_TYPE_STARTED, hypervisorv1.EventType_EVENT_TYPE_STOPPED} {
		if err := send(&hypervisorv1.Event{Id: id, Type: t}); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return nil
}

// pausingHypervisor adds Pauser; consoleHypervisor adds Consoler.
type pausingHypervisor struct{ echoHypervisor }

func (h *pausingHypervisor) Pause(context.Context, string) error  { h.calls.Add(1); return nil }
func (h *pausingHypervisor) Resume(context.Context, string) error { h.calls.Add(1); return nil }

type consoleHypervisor struct{ pausingHypervisor }

func (h *consoleHypervisor) Console(_ context.Context, _ string, in io.Reader, out io.Writer) error {
	buf := make([]byte, 64)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			if _, werr := out.Write(bytes.ToUpper(buf[:n])); werr != nil {
				return werr
			}
		}
		if err != nil {
			return nil
		}
	}
}

func inProcess(t *testing.T, impl driver.Driver) *driver.HypervisorClient {
	t.Helper()
	c, stop, err := driver.InProcess(basev1.Kind_KIND_HYPERVISOR, impl)
	if err != nil {
		t.Fatalf("InProcess: %v", err)
	}
	t.Cleanup(stop)
	return c.(*driver.HypervisorClient)
}

func TestServableRejectsDeclaredButMissingFeature(t *testing.T) {
	impl := &echoHypervisor{features: []basev1.Feature{basev1.Feature_FEATURE_HYPERVISOR_PAUSE}}
	err := driver.Servable(basev1.Kind_KIND_HYPERVISOR, impl)
	if err == nil || !strings.Contains(err.Error(), "driver.Pauser") {
		t.Fatalf("Servable = %v, want an error naming driver.Pauser", err)
	}
	if _, _, err := driver.InProcess(basev1.Kind_KIND_HYPERVISOR, impl); err == nil {
		t.Fatal("InProcess served a driver that declares a feature it does not implement")
	}
}

func TestServableRejectsFeatureOfAnotherKind(t *testing.T) {
	impl := &echoHypervisor{features: []basev1.Feature{basev1.Feature_FEATURE_NETWORK_CHECK}}
	if err := driver.Servable(basev1.Kind_KIND_HYPERVISOR, impl); err == nil || !strings.Contains(err.Error(), "not a feature of a hypervisor driver") {
		t.Fatalf("Servable = %v, want a kind mismatch error", err)
	}
}

func TestServableRejectsWrongKind(t *testing.T) {
	if err := driver.Servable(basev1.Kind_KIND_NETWORK, &echoHypervisor{}); err == nil || !strings.Contains(err.Error(), "driver.Network") {
		t.Fatalf("Servable = %v, want an error naming driver.Network", err)
	}
}

func TestInfoCarriesKindAndProtocolVersion(t *testing.T) {
	c := inProcess(t, &echoHypervisor{})
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.GetName() != "echo" || info.GetKind() != basev1.Kind_KIND_HYPERVISOR {
		t.Errorf("Info = %v, want name echo, kind hypervisor", info)
	}
	if got := info.GetProtocolVersions(); len(got) != 1 || got[0] != driver.ProtocolVersion {
		t.Errorf("protocol versions = %v, want [%d]", got, driver.ProtocolVersion)
	}
}

func TestUndeclaredFeatureNeverReachesDriver(t *testing.T) {
	// The driver implements Pauser but does not declare it: the host's client does not offer it.
	impl := &pausingHypervisor{}
	c := inProcess(t, impl)
	if _, ok := any(c).(driver.Pauser); ok {
		t.Fatal("a HypervisorClient is a driver.Pauser: a type assertion on a client must not claim a feature")
	}
	if _, ok := driver.Optional[driver.Pauser](context.Background(), c); ok {
		t.Fatal("Optional[Pauser] of a client whose driver does not declare PAUSE is ok")
	}
	if _, ok := driver.Optional[driver.Pauser](context.Background(), impl); ok {
		t.Fatal("Optional[Pauser] of an implementation that does not declare PAUSE is ok")
	}
	if n := impl.calls.Load(); n != 0 {
		t.Fatalf("driver saw %d calls, want 0", n)
	}
}

func TestDeclaredFeatureReachesDriver(t *testing.T) {
	impl := &pausingHypervisor{echoHypervisor{features: []basev1.Feature{basev1.Feature_FEATURE_HYPERVISOR_PAUSE}}}
	c := inProcess(t, impl)
	p, ok := driver.Optional[driver.Pauser](context.Background(), c)
	if !ok {
		t.Fatal("Optional[Pauser] of a client whose driver declares PAUSE is not ok")
	}
	if _, ok := driver.Optional[driver.Rebooter](context.Background(), c); ok {
		t.Fatal("Optional[Rebooter] of a client whose driver declares only PAUSE is ok")
	}
	if err := p.Pause(context.Background(), "vm"); err != nil {
		t.Fatal(err)
	}
	if err := p.Resume(context.Background(), "vm"); err != nil {
		t.Fatal(err)
	}
	if n := impl.calls.Load(); n != 2 {
		t.Fatalf("driver saw %d calls, want 2", n)
	}
	if ip, ok := driver.Optional[driver.Pauser](context.Background(), impl); !ok || ip != driver.Pauser(impl) {
		t.Fatalf("Optional[Pauser] of an implementation that declares and implements it = %v, %v", ip, ok)
	}
}

func TestOptionalOfOtherTypes(t *testing.T) {
	impl := &echoHypervisor{features: []basev1.Feature{basev1.Feature_FEATURE_HYPERVISOR_PAUSE}}
	if _, ok := driver.Optional[io.Reader](context.Background(), impl); ok {
		t.Error("Optional of a type that is no optional interface is ok")
	}
	if _, ok := driver.Optional[driver.Pauser](context.Background(), nil); ok {
		t.Error("Optional of a nil driver is ok")
	}
}

func TestCreateRefusesWhatIsNotDeclared(t *testing.T) {
	impl := &echoHypervisor{}
	c := inProcess(t, impl)
	spec := &domainv1.DomainSpec{
		Id: "vm", Memory: &domainv1.Memory{GuestBytes: 1 << 20},
		Firmware: &domainv1.Firmware{Boot: &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{KernelPath: "/k"}}},
		Sandbox:  &domainv1.Sandbox{LauncherSocket: "/run/vmi/launcher.sock"},
		Vnc:      &domainv1.VNC{SocketPath: "/run/vmi/vnc.sock"},
	}
	_, err := c.Create(context.Background(), spec)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Create = %v, want InvalidArgument", err)
	}
	for _, field := range []string{"firmware.kernel", "sandbox.launcherSocket", "vnc"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("Create error %q does not name %s", err, field)
		}
	}
	if n := impl.calls.Load(); n != 0 {
		t.Fatalf("driver saw %d calls, want 0", n)
	}
}

func TestCheckDomain(t *testing.T) {
	all := &basev1.Capabilities{
		Firmware: []string{"bios", "efi", "kernel"}, DiskBuses: []string{"virtio"}, NicModels: []string{"virtio"},
		MachineTypes: []string{"q35", "pc-q35-*"}, SecureBoot: true, Vnc: true, HostDevices: true, TapFd: true, Launcher: true,
		Devices: []string{driver.DeviceRNG, driver.DeviceChassis}, PersistentState: true,
		Features: []basev1.Feature{basev1.Feature_FEATURE_HYPERVISOR_MIGRATE},
	}
	spec := func() *domainv1.DomainSpec {
		return &domainv1.DomainSpec{
			Id:                 "vm",
			Machine:            &domainv1.Machine{Type: "pc-q35-7.2"},
			Firmware:           &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{SecureBoot: true, Persistent: true}}},
			PersistentStateDir: "/state",
			Disks: []*domainv1.Disk{
				{Name: "a", Bus: domainv1.DiskBus_DISK_BUS_VIRTIO},
				{Name: "b"}, // the driver's default bus
			},
			Nics:        []*domainv1.NIC{{Name: "n", TapFdPath: "/proc/self/fd/3", Model: "virtio"}, {Name: "m"}},
			Vnc:         &domainv1.VNC{},
			HostDevices: []*domainv1.HostDevice{{Name: "gpu", PciAddress: "0000:01:00.0"}},
			Sandbox:     &domainv1.Sandbox{LauncherSocket: "/s"},
			Rng:         &domainv1.RNG{},
			Chassis:     &domainv1.Chassis{Serial: "c"},
			// A migration target goes to a driver that declares migration only.
			IncomingMigration: &domainv1.IncomingMigration{SocketPath: "/run/vm/migration.sock"},
		}
	}
	if err := driver.CheckDomain(all, spec()); err != nil {
		t.Fatalf("CheckDomain with every capability = %v", err)
	}
	if err := driver.CheckDomain(&basev1.Capabilities{}, &domainv1.DomainSpec{Id: "vm"}); err != nil {
		t.Fatalf("CheckDomain of the least spec (the driver's default firmware) = %v", err)
	}
	bios := &domainv1.DomainSpec{Id: "vm", Firmware: &domainv1.Firmware{Boot: &domainv1.Firmware_Bios{Bios: &domainv1.BIOS{}}}}
	if err := driver.CheckDomain(&basev1.Capabilities{Firmware: []string{"kernel"}}, bios); !strings.Contains(fmt.Sprint(err), "firmware.bios: ") {
		t.Fatalf("CheckDomain of bios without it declared = %v, want an error naming firmware.bios", err)
	}
	err := driver.CheckDomain(&basev1.Capabilities{Firmware: []string{"efi"}, DiskBuses: []string{"sata"}, MachineTypes: []string{"pc"}}, spec())
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("CheckDomain = %v, want InvalidArgument", err)
	}
	for _, field := range []string{"firmware.efi.secureBoot", "machine.type", "disks[0].bus", "nics[0].model", "nics[0].tapFdPath", "vnc", "hostDevices", "sandbox.launcherSocket", "rng", "chassis", "persistentStateDir", "incomingMigration"} {
		if !strings.Contains(err.Error(), field+": ") {
			t.Errorf("CheckDomain error %q does not name %s", err, field)
		}
	}
	for _, field := range []string{"disks[1]", "nics[1]"} {
		if strings.Contains(err.Error(), field) {
			t.Errorf("CheckDomain error %q names %s, which asks for the driver's default", err, field)
		}
	}
	// A target that is to receive its disks needs Capabilities.migration_disks as well.
	withDisks := spec()
	withDisks.IncomingMigration.DisksSocketPath, withDisks.IncomingMigration.Disks = "/run/vm/disks.sock", []string{"a"}
	if err := driver.CheckDomain(all, withDisks); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "incomingMigration.disks: ") {
		t.Errorf("CheckDomain of a target with disks to receive, migration_disks not declared = %v, want InvalidArgument naming incomingMigration.disks", err)
	}
	all.MigrationDisks = true
	if err := driver.CheckDomain(all, withDisks); err != nil {
		t.Errorf("CheckDomain of a target with disks to receive, migration_disks declared = %v", err)
	}
}

func TestStatusCodesCrossTheBoundary(t *testing.T) {
	c := inProcess(t, &echoHypervisor{})
	_, err := c.Status(context.Background(), "missing")
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), `"missing"`) {
		t.Fatalf("Status = %v, want NotFound naming the vm", err)
	}
	if _, err := (c.Create(context.Background(), nil)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Create(nil) = %v, want InvalidArgument", err)
	}
}

func TestEventsStreamEndsWithContext(t *testing.T) {
	c := inProcess(t, &echoHypervisor{})
	ctx, cancel := context.WithCancel(context.Background())
	var got []hypervisorv1.EventType
	err := c.Events(ctx, "vm", func(e *hypervisorv1.Event) error {
		got = append(got, e.GetType())
		if len(got) == 2 {
			cancel()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Events = %v, want nil after cancel", err)
	}
	if len(got) != 2 || got[1] != hypervisorv1.EventType_EVENT_TYPE_STOPPED {
		t.Fatalf("events = %v", got)
	}
}

func TestConsoleCarriesInputAndOutput(t *testing.T) {
	impl := &consoleHypervisor{}
	impl.features = []basev1.Feature{basev1.Feature_FEATURE_HYPERVISOR_PAUSE, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE}
	c := inProcess(t, impl)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	con, ok := driver.Optional[driver.Consoler](ctx, c)
	if !ok {
		t.Fatal("Optional[Consoler] of a client whose driver declares CONSOLE is not ok")
	}
	// The driver's console returns when input ends, which ends the output stream.
	if err := con.Console(ctx, "vm", strings.NewReader("hello console"), &out); err != nil {
		t.Fatalf("Console = %v", err)
	}
	if out.String() != "HELLO CONSOLE" {
		t.Fatalf("console output = %q, want %q", out.String(), "HELLO CONSOLE")
	}
}

func TestFingerprintStopsOnCancel(t *testing.T) {
	c := inProcess(t, &echoHypervisor{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var health basev1.Health
	go func() {
		done <- c.Fingerprint(ctx, func(f *basev1.FingerprintResponse) error {
			health = f.GetHealth()
			cancel()
			return nil
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Fingerprint = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Fingerprint did not return after cancel")
	}
	if health != basev1.Health_HEALTH_HEALTHY {
		t.Fatalf("health = %v", health)
	}
}

func TestKindNames(t *testing.T) {
	for _, name := range []string{driver.KindHypervisor, driver.KindNetwork, driver.KindStorage, driver.KindDevice} {
		k, err := driver.ParseKind(name)
		if err != nil || driver.KindName(k) != name {
			t.Errorf("ParseKind(%q) = %v, %v", name, k, err)
		}
	}
	if _, err := driver.ParseKind("gpu"); err == nil {
		t.Error("ParseKind(gpu) succeeded")
	}
}

// countingNetwork is the least a network driver must be, declaring interfaceOptions; it counts
// the Setups that reach it.
type countingNetwork struct {
	interfaceOptions []string
	setups           atomic.Int32
}

func (n *countingNetwork) Info(context.Context) (*basev1.InfoResponse, error) {
	return &basev1.InfoResponse{Name: "counting", Version: "0.1.0"}, nil
}
func (n *countingNetwork) Capabilities(context.Context) (*basev1.Capabilities, error) {
	return &basev1.Capabilities{Bindings: []string{"bridge"}, InterfaceOptions: n.interfaceOptions}, nil
}
func (n *countingNetwork) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	if err := send(&basev1.FingerprintResponse{Health: basev1.Health_HEALTH_HEALTHY}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
func (n *countingNetwork) Configure(context.Context, *basev1.ConfigureRequest) error { return nil }
func (n *countingNetwork) Setup(_ context.Context, req *networkv1.SetupRequest) (*networkv1.SetupResponse, error) {
	n.setups.Add(1)
	return &networkv1.SetupResponse{}, nil
}
func (n *countingNetwork) Teardown(context.Context, *networkv1.TeardownRequest) error { return nil }

// TestSetupRefusesWhatIsNotDeclared: the host's network client does not send an interface's
// DHCP options to a driver that does not declare the interface option dhcp-options
// (InvalidArgument naming the field and the interface, without a call), and does to one that
// does; an interface without options reaches either.
func TestSetupRefusesWhatIsNotDeclared(t *testing.T) {
	req := &networkv1.SetupRequest{VmiId: "vmi", NetnsPath: "/run/netns/x", Interfaces: []*networkv1.Interface{
		{Name: "default", Binding: "bridge"},
		{Name: "pxe", Binding: "bridge", NetworkName: "lan", DhcpOptions: &networkv1.DHCPOptions{BootFileName: "boot.ipxe"}},
	}}
	for _, tc := range []struct {
		name     string
		declared []string
		req      *networkv1.SetupRequest
		refused  bool
	}{
		{"NotDeclared", nil, req, true},
		{"OtherOptionDeclared", []string{"something-else"}, req, true},
		{"Declared", []string{driver.InterfaceDHCPOptions}, req, false},
		{"NoOptionsAsked", nil, &networkv1.SetupRequest{VmiId: "vmi", Interfaces: req.Interfaces[:1]}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			impl := &countingNetwork{interfaceOptions: tc.declared}
			c, stop, err := driver.InProcess(basev1.Kind_KIND_NETWORK, impl)
			if err != nil {
				t.Fatalf("InProcess: %v", err)
			}
			t.Cleanup(stop)
			_, err = c.(*driver.NetworkClient).Setup(context.Background(), tc.req)
			if !tc.refused {
				if err != nil || impl.setups.Load() != 1 {
					t.Fatalf("Setup = %v with %d calls of the driver, want success with 1", err, impl.setups.Load())
				}
				return
			}
			want := `interfaces[1].dhcpOptions: interface "pxe": dhcp-options is not declared by the driver`
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), want) {
				t.Fatalf("Setup = %v, want InvalidArgument saying %q", err, want)
			}
			if n := impl.setups.Load(); n != 0 {
				t.Fatalf("driver saw %d Setups, want 0", n)
			}
		})
	}
}
