package driver_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/internal/domainseed"
)

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// declaring returns capabilities that declare everything spec asks for.
func declaring(spec *domainv1.DomainSpec) *basev1.Capabilities {
	caps := &basev1.Capabilities{
		Firmware: []string{"bios", "efi", "kernel"}, SecureBoot: true, PersistentState: true,
		Vnc: true, HostDevices: true, TapFd: true, Launcher: true, MigrationDisks: true,
		Features: []basev1.Feature{basev1.Feature_FEATURE_HYPERVISOR_MIGRATE},
	}
	if t := spec.GetMachine().GetType(); t != "" {
		caps.MachineTypes = []string{t}
	}
	for _, d := range spec.GetDisks() {
		caps.DiskBuses = append(caps.DiskBuses, driver.BusName(d.GetBus()))
	}
	for _, n := range spec.GetNics() {
		caps.NicModels = append(caps.NicModels, n.GetModel())
	}
	for _, d := range driver.OptionalDevices {
		caps.Devices = append(caps.Devices, d.Name)
	}
	return caps
}

// fields returns the fields a CheckDomain or domain.Validate refusal names, checking that it is a
// ValidationError (InvalidArgument) whose every entry names one.
func fields(t *testing.T, what string, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var ve domain.ValidationError
	if !errors.As(err, &ve) || len(ve) == 0 || status.Code(err) != codes.InvalidArgument {
		t.Fatalf("%s: %v (%T), not a ValidationError", what, err, err)
	}
	var out []string
	for _, fe := range ve {
		if fe.Field == "" || fe.Detail == "" {
			t.Fatalf("%s: %q names no field", what, fe)
		}
		out = append(out, fe.Field)
	}
	return out
}

// checkDomain checks domain.Validate and CheckDomain on spec and caps: refusals are
// ValidationErrors naming a field each; CheckDomain refuses nothing that capabilities declaring
// everything the spec asks for declare, refuses with caps only what it refuses with no
// capabilities at all, and says the same twice.
func checkDomain(t *testing.T, spec *domainv1.DomainSpec, caps *basev1.Capabilities) {
	fields(t, "domain.Validate", domain.Validate(spec))
	err := driver.CheckDomain(caps, spec)
	got := fields(t, "CheckDomain", err)
	if again := driver.CheckDomain(caps, spec); fmt.Sprint(again) != fmt.Sprint(err) {
		t.Fatalf("CheckDomain said %v, then %v", err, again)
	}
	all := fields(t, "CheckDomain with no capabilities", driver.CheckDomain(&basev1.Capabilities{}, spec))
	for _, f := range got {
		if !slices.Contains(all, f) {
			t.Fatalf("CheckDomain refuses %s with %v but not with no capabilities (%v)", f, caps, all)
		}
	}
	if err := driver.CheckDomain(declaring(spec), spec); err != nil {
		t.Fatalf("CheckDomain with every capability the spec asks for: %v", err)
	}
}

// FuzzCheckDomain feeds the host's check of a domain spec against a driver's capabilities
// (CheckDomain, with domain.Validate) proto-marshalled specs and capabilities. The seeds are the
// specs the handler assembles from the KubeVirt examples (domainseed) and TestCheckDomain's, against the
// capabilities of TestCheckDomain, of none, and of the qmp driver.
func FuzzCheckDomain(f *testing.F) {
	var specs [][]byte
	for _, s := range domainseed.Specs(f) {
		specs = append(specs, must(proto.Marshal(s)))
	}
	specs = append(specs,
		must(proto.Marshal(&domainv1.DomainSpec{Id: "vm"})),
		must(proto.Marshal(&domainv1.DomainSpec{
			Id: "vm", Machine: &domainv1.Machine{Type: "pc-q35-7.2"},
			Firmware:           &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{SecureBoot: true, Persistent: true}}},
			PersistentStateDir: "/state",
			Disks:              []*domainv1.Disk{{Name: "a", Bus: domainv1.DiskBus_DISK_BUS_VIRTIO}, {Name: "b", Device: domainv1.DiskDevice_DISK_DEVICE_LUN, Io: "native"}},
			Nics:               []*domainv1.NIC{{Name: "n", TapFdPath: "/proc/self/fd/3", Model: "virtio", Queues: 4}, {Name: "m", LinkDown: true}},
			Vnc:                &domainv1.VNC{}, HostDevices: []*domainv1.HostDevice{{Name: "gpu", PciAddress: "0000:01:00.0"}},
			Sandbox: &domainv1.Sandbox{LauncherSocket: "/s"}, Rng: &domainv1.RNG{}, Chassis: &domainv1.Chassis{Serial: "c"},
			IncomingMigration: &domainv1.IncomingMigration{SocketPath: "/run/vm/migration.sock", Disks: []string{"a"}},
		})),
		[]byte{0x0a, 0x02, 'v'}, // truncated
	)
	capsSeeds := [][]byte{
		nil,
		must(proto.Marshal(&basev1.Capabilities{
			Firmware: []string{"bios", "efi", "kernel"}, DiskBuses: []string{"virtio"}, NicModels: []string{"virtio"},
			MachineTypes: []string{"q35", "pc-q35-*"}, SecureBoot: true, Vnc: true, HostDevices: true, TapFd: true, Launcher: true,
			Devices: []string{driver.DeviceRNG, driver.DeviceChassis}, PersistentState: true,
			Features: []basev1.Feature{basev1.Feature_FEATURE_HYPERVISOR_MIGRATE},
		})),
		must(proto.Marshal(&basev1.Capabilities{
			Firmware: []string{"bios", "efi"}, DiskBuses: []string{"virtio", "sata", "scsi", "usb"}, NicModels: []string{"virtio", "e1000e"},
			MachineTypes: []string{"q35", "pc-q35-*", "pc", "pc-i440fx-*"}, Vnc: true, Launcher: true, TapFd: true,
			Devices: []string{driver.DeviceBalloon, driver.DeviceFeatures, driver.DeviceClock},
		})),
	}
	for i, s := range specs {
		f.Add(s, capsSeeds[i%len(capsSeeds)])
	}
	f.Fuzz(func(t *testing.T, specBytes, capsBytes []byte) {
		var spec domainv1.DomainSpec
		var caps basev1.Capabilities
		if proto.Unmarshal(specBytes, &spec) != nil || proto.Unmarshal(capsBytes, &caps) != nil {
			return
		}
		checkDomain(t, &spec, &caps)
	})
}
