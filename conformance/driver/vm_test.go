package conformance_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/drivers/fake"
	"github.com/kubevisor/kubevisor/drivers/qmp"
	"github.com/kubevisor/kubevisor/drivers/storage"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// testGuest returns the project's test guest from $KUBEVISOR_GUEST_DIR or <repo>/_output/guest,
// skipping the test when it is not built (failing it under CI=true).
func testGuest(t *testing.T) conformance.Guest {
	t.Helper()
	testenv.Heavy(t, "QEMU and the test guest")
	dir := os.Getenv("KUBEVISOR_GUEST_DIR")
	if dir == "" {
		dir = filepath.Join(repoRoot(t), "_output", "guest")
	}
	g, err := conformance.GuestFromDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		testenv.Missing(t, "test guest not built: run make guest (%v)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: install qemu-system-x86 and qemu-utils (make deps): %v", tool, err)
		}
	}
	return g
}

// repoRoot is the directory of the module's go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

func qmpLogger() hclog.Logger {
	if os.Getenv("KUBEVISOR_TEST_LOG") == "" {
		return hclog.NewNullLogger()
	}
	return hclog.New(&hclog.LoggerOptions{Name: "qmp", Level: hclog.Debug, Output: os.Stderr})
}

// knownFailures are VM checks that fail against the in-tree drivers for a cause outside the
// kit, each with text its failure must show. TestVMRealDrivers fails when one of them passes:
// remove its entry once the cause is fixed.
var knownFailures = map[string]string{}

// vmChecks are the names of every VM check but the Migrate ones: core/handler/migrationproxy's
// TestQMPMigrationThroughTheProxy runs those against the qmp driver's plugin processes through
// the node agent's proxies, and drivers/libvirt's TestMigrationConformancePlugins through
// libvirt's plugins, so TestVMRealDrivers leaves them out.
var vmChecks = []string{
	"Boot/ConsoleMarker", "CloudInit/UserDataReachesGuest", "CloudInit/ConfigDrive",
	"Shutdown/GracefulWithinTimeout", "Kill", "Pause/StopsGuest", "Reboot/SecondBoot", "SoftReboot/BootsAgain", "GuestAgent/PingExec", "Display/RFBSessions",
	"Recover/AfterDriverKilled", "Devices/RNG", "Devices/Chassis", "Devices/Watchdog", "Devices/Balloon", "Devices/Input",
	"Devices/Sound", "Devices/VirtioTransitional", "Devices/TPM", "TPM/Persistent", "Firmware/EFIPersistent", "Clock/Start", "CPU/Features", "CPU/Pinning", "Storage/NotAnImage",
}

// TestVMRealDrivers runs the VM checks against the QEMU driver (drivers/qmp) and the local
// storage driver (drivers/storage), both in-process, with the project's test guest booting its
// kernel. The Recover check's "kill" is qmp's Driver.Close, which lets go of the VMs as the
// death of the driver process does; the CLI's test kills a real plugin process. The Migrate
// checks are left out (vmChecks says where they run); the migration peer stays
// configured, so that the kit is set up as a driver with migration would have it.
func TestVMRealDrivers(t *testing.T) {
	g := testGuest(t)
	var (
		mu  sync.Mutex
		cur = qmp.New(qmp.WithLogger(qmpLogger()))
	)
	peer := qmp.New(qmp.WithLogger(qmpLogger()))
	t.Cleanup(func() { _ = cur.Close(); _ = peer.Close() })
	serve := func(ct conformance.T, hv *qmp.Driver) driver.Hypervisor {
		// Served until the end of the test: a check's cleanup removes its VM through it.
		c, stop, err := driver.InProcess(basev1.Kind_KIND_HYPERVISOR, hv)
		if err != nil {
			ct.Fatalf("serve the driver in-process: %v", err)
		}
		t.Cleanup(stop)
		return c.(driver.Hypervisor)
	}
	rec := record(t, "", "Migrate", func(ct conformance.T) {
		hv := serve(ct, cur)
		peerClient := serve(ct, peer)
		st := conformance.ServeInProcess(ct, basev1.Kind_KIND_STORAGE, storage.New(nil)).(driver.Storage)
		conformance.VM(ct, func(conformance.T) driver.Hypervisor {
			mu.Lock()
			defer mu.Unlock()
			return hv
		}, func(conformance.T) driver.Storage { return st }, g,
			conformance.WithMigrationPeer(func(conformance.T) driver.Hypervisor { return peerClient }, ""),
			conformance.WithDriverKill(func(ct conformance.T) driver.Hypervisor {
				mu.Lock()
				defer mu.Unlock()
				_ = cur.Close()
				cur = qmp.New(qmp.WithLogger(qmpLogger()))
				hv = serve(ct, cur)
				return hv
			}))
	})
	want := map[string]conformance.Status{}
	for _, name := range vmChecks {
		want[name] = conformance.StatusPass
		if _, ok := knownFailures[name]; ok {
			want[name] = conformance.StatusFail
		}
	}
	expectStatus(t, rec, want, knownFailures)
	for name := range knownFailures {
		if res, _ := rec.Result("vm/" + name); res.Status == conformance.StatusPass {
			t.Errorf("%s passes now: remove it from knownFailures", name)
		}
	}
}

// record runs suite, the checks that match run and not skip, with a Recorder, and logs the results.
func record(t *testing.T, run, skip string, suite func(ct conformance.T)) *conformance.Recorder {
	t.Helper()
	rec, err := conformance.NewRecorder(conformance.RecorderConfig{TempDir: t.TempDir(), Run: run, Skip: skip})
	if err != nil {
		t.Fatal(err)
	}
	rec.Run("vm", suite)
	for _, res := range rec.Results() {
		if testing.Verbose() || res.Status == conformance.StatusFail {
			t.Logf("%s %s (%s): %s", res.Status, res.Name, res.Duration.Round(time.Millisecond), strings.Join(res.Output, "\n"))
		}
	}
	return rec
}

// runVM runs the VM checks that match run against hv and st, served in-process, with a
// Recorder.
func runVM(t *testing.T, run string, hv driver.Hypervisor, st driver.Storage, g conformance.Guest, opts ...conformance.Option) *conformance.Recorder {
	t.Helper()
	return record(t, run, "", func(ct conformance.T) {
		hvc := conformance.ServeInProcess(ct, basev1.Kind_KIND_HYPERVISOR, hv).(driver.Hypervisor)
		stc := conformance.ServeInProcess(ct, basev1.Kind_KIND_STORAGE, st).(driver.Storage)
		conformance.VM(ct, func(conformance.T) driver.Hypervisor { return hvc }, func(conformance.T) driver.Storage { return stc }, g, opts...)
	})
}

// expectStatus asserts the status of exactly the checks in want (names below the suite), and
// that the output of a skipped or failed check holds its text in texts.
func expectStatus(t *testing.T, rec *conformance.Recorder, want map[string]conformance.Status, texts map[string]string) {
	t.Helper()
	for name, st := range want {
		res, ok := rec.Result("vm/" + name)
		switch {
		case !ok:
			t.Errorf("%s did not run", name)
		case res.Status != st:
			t.Errorf("%s: %s %q, want %s", name, res.Status, res.Message, st)
		case texts[name] != "" && res.Status != conformance.StatusPass && !strings.Contains(strings.Join(res.Output, "\n"), texts[name]):
			t.Errorf("%s: %s with %q, want a message holding %q", name, res.Status, res.Message, texts[name])
		}
	}
	if p, f, s := rec.Counts(); p+f+s != len(want) {
		t.Errorf("%d checks ran (%s), want %d", p+f+s, rec.Summary(), len(want))
	}
}

// TestVMDiskBoot boots the test guest from its disk image (the BIOS booting the containerDisk
// the storage driver makes over it) rather than its kernel.
func TestVMDiskBoot(t *testing.T) {
	g := testGuest(t)
	if g.Disk == "" {
		testenv.Missing(t, "the test guest has no %s: run make guest", conformance.GuestDiskFile)
	}
	g.Kernel, g.Initrd, g.Cmdline = "", "", ""
	hv := qmp.New(qmp.WithLogger(qmpLogger()))
	t.Cleanup(func() { _ = hv.Close() })
	rec := runVM(t, "Boot|Shutdown", hv, storage.New(nil), g)
	expectStatus(t, rec, map[string]conformance.Status{
		"Boot/ConsoleMarker":             conformance.StatusPass,
		"Shutdown/GracefulWithinTimeout": conformance.StatusPass,
	}, nil)
}

// TestVMWithFakes runs the checks the simulated drivers can pass (their console prints a boot
// log, but no user-data, and runs no command) to test the kit's own plumbing: prepare, build the
// domain, create, start, follow the console, clean up.
func TestVMWithFakes(t *testing.T) {
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(kernel, []byte("not really a kernel"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := conformance.Guest{Kernel: kernel, ReadyMarker: fake.ConsoleMarker, BootTimeout: 10 * time.Second}
	rec := runVM(t, "Boot|Shutdown|Kill|Reboot|Recover", fake.NewHypervisor(), fake.NewStorage(), g,
		conformance.WithTimeout(30*time.Second))
	expectStatus(t, rec, map[string]conformance.Status{
		"Boot/ConsoleMarker":             conformance.StatusPass,
		"Shutdown/GracefulWithinTimeout": conformance.StatusPass,
		"Kill":                           conformance.StatusPass,
		"Reboot/SecondBoot":              conformance.StatusPass,
		"SoftReboot/BootsAgain":          conformance.StatusPass,
		"Recover/AfterDriverKilled":      conformance.StatusSkip,
	}, map[string]string{"Recover/AfterDriverKilled": "WithDriverKill"})
}

// consoleless is a hypervisor that declares no optional feature, and only the virtio bus.
type consoleless struct{ *fake.Hypervisor }

func (consoleless) Capabilities(context.Context) (*basev1.Capabilities, error) {
	return &basev1.Capabilities{Firmware: []string{"kernel"}, DiskBuses: []string{"virtio"}}, nil
}

// scratchOnly is a storage driver that declares emptyDisk only.
type scratchOnly struct{ *fake.Storage }

func (scratchOnly) Capabilities(context.Context) (*basev1.Capabilities, error) {
	return &basev1.Capabilities{VolumeTypes: []string{"emptyDisk"}}, nil
}

// noSCSI is a hypervisor that does not declare the scsi bus, on which the kit puts CD-ROMs.
type noSCSI struct{ *fake.Hypervisor }

func (h noSCSI) Capabilities(ctx context.Context) (*basev1.Capabilities, error) {
	caps, err := h.Hypervisor.Capabilities(ctx)
	if err != nil {
		return nil, err
	}
	caps.DiskBuses = []string{"virtio"}
	return caps, nil
}

// noKernel is a hypervisor that boots only from disks.
type noKernel struct{ *fake.Hypervisor }

func (h noKernel) Capabilities(ctx context.Context) (*basev1.Capabilities, error) {
	caps, err := h.Hypervisor.Capabilities(ctx)
	if err != nil {
		return nil, err
	}
	caps.Firmware = []string{"bios"}
	return caps, nil
}

func TestVMUndeclaredAreSkipped(t *testing.T) {
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(kernel, []byte("not really a kernel"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := conformance.Guest{Kernel: kernel, ReadyMarker: fake.ConsoleMarker, UserDataBegin: "BEGIN", UserDataEnd: "END"}
	const console = "driver does not declare FEATURE_HYPERVISOR_CONSOLE"
	t.Run("no console, scratch storage", func(t *testing.T) {
		rec := runVM(t, "", consoleless{fake.NewHypervisor()}, scratchOnly{fake.NewStorage()}, g)
		expectStatus(t, rec, map[string]conformance.Status{
			"Boot/ConsoleMarker":             conformance.StatusSkip,
			"CloudInit/UserDataReachesGuest": conformance.StatusSkip,
			"CloudInit/ConfigDrive":          conformance.StatusSkip,
			"Shutdown/GracefulWithinTimeout": conformance.StatusSkip,
			"Kill":                           conformance.StatusSkip,
			"Pause/StopsGuest":               conformance.StatusSkip,
			"Reboot/SecondBoot":              conformance.StatusSkip,
			"SoftReboot/BootsAgain":          conformance.StatusSkip,
			"GuestAgent/PingExec":            conformance.StatusSkip,
			"Display/RFBSessions":            conformance.StatusSkip,
			"Recover/AfterDriverKilled":      conformance.StatusSkip,
			"Devices/RNG":                    conformance.StatusSkip,
			"Devices/Chassis":                conformance.StatusSkip,
			"Devices/Watchdog":               conformance.StatusSkip,
			"Devices/Balloon":                conformance.StatusSkip,
			"Devices/Input":                  conformance.StatusSkip,
			"Devices/Sound":                  conformance.StatusSkip,
			"Devices/VirtioTransitional":     conformance.StatusSkip,
			"Devices/TPM":                    conformance.StatusSkip,
			"TPM/Persistent":                 conformance.StatusSkip,
			"Firmware/EFIPersistent":         conformance.StatusSkip,
			"Clock/Start":                    conformance.StatusSkip,
			"CPU/Features":                   conformance.StatusSkip,
			"CPU/Pinning":                    conformance.StatusSkip,
			"Storage/NotAnImage":             conformance.StatusSkip,
			"Migrate/KeepsGuestState":        conformance.StatusSkip,
			"Migrate/Progress":               conformance.StatusSkip,
			"Migrate/Cancel":                 conformance.StatusSkip,
			"Migrate/LocalDisks":             conformance.StatusSkip,
			"Migrate/LocalDisksCancel":       conformance.StatusSkip,
		}, map[string]string{
			"Boot/ConsoleMarker":             console,
			"Migrate/KeepsGuestState":        "FEATURE_HYPERVISOR_MIGRATE",
			"Migrate/Cancel":                 "FEATURE_HYPERVISOR_MIGRATE",
			"Migrate/LocalDisks":             "FEATURE_HYPERVISOR_MIGRATE",
			"CloudInit/UserDataReachesGuest": console,
			"Kill":                           console,
			"Pause/StopsGuest":               "FEATURE_HYPERVISOR_PAUSE",
			"Reboot/SecondBoot":              "FEATURE_HYPERVISOR_REBOOT",
			"SoftReboot/BootsAgain":          "FEATURE_HYPERVISOR_SOFT_REBOOT",
			"GuestAgent/PingExec":            "FEATURE_HYPERVISOR_GUEST_EXEC",
			"Display/RFBSessions":            "FEATURE_HYPERVISOR_DISPLAY",
			"Recover/AfterDriverKilled":      "FEATURE_HYPERVISOR_RECOVER",
			"Devices/RNG":                    `does not declare the device "rng"`,
			"Devices/Chassis":                `does not declare the device "chassis"`,
			"Devices/Watchdog":               `does not declare the device "watchdog"`,
			"Devices/Balloon":                `does not declare the device "balloon"`,
			"Devices/Input":                  `does not declare the device "input"`,
			"Devices/Sound":                  `does not declare the device "sound"`,
			"Devices/VirtioTransitional":     `does not declare the device "balloon"`,
			"Devices/TPM":                    `does not declare the device "tpm"`,
			"TPM/Persistent":                 `does not declare the device "tpm"`,
			"Firmware/EFIPersistent":         "does not declare firmware efi",
			"Clock/Start":                    `does not declare the device "clock"`,
			"CPU/Features":                   `does not declare the device "cpu-features"`,
			"CPU/Pinning":                    `does not declare the device "cpu-pinning"`,
			"Storage/NotAnImage":             "storage driver does not declare volume type containerDisk",
		})
	})
	t.Run("no seed volume type", func(t *testing.T) {
		rec := runVM(t, "CloudInit", fake.NewHypervisor(), scratchOnly{fake.NewStorage()}, g)
		expectStatus(t, rec, map[string]conformance.Status{
			"CloudInit/UserDataReachesGuest": conformance.StatusSkip,
			"CloudInit/ConfigDrive":          conformance.StatusSkip,
		}, map[string]string{
			"CloudInit/UserDataReachesGuest": "storage driver does not declare volume type cloudInitNoCloud",
			"CloudInit/ConfigDrive":          "storage driver does not declare volume type cloudInitConfigDrive",
		})
	})
	t.Run("no user-data markers", func(t *testing.T) {
		g := g
		g.UserDataBegin, g.UserDataEnd = "", ""
		rec := runVM(t, "CloudInit/UserData", fake.NewHypervisor(), fake.NewStorage(), g)
		expectStatus(t, rec, map[string]conformance.Status{"CloudInit/UserDataReachesGuest": conformance.StatusSkip},
			map[string]string{"CloudInit/UserDataReachesGuest": "Guest.UserDataBegin"})
	})
	t.Run("CD-ROM bus not declared", func(t *testing.T) {
		rec := runVM(t, "Boot", noSCSI{fake.NewHypervisor()}, fake.NewStorage(), g)
		expectStatus(t, rec, map[string]conformance.Status{"Boot/ConsoleMarker": conformance.StatusSkip},
			map[string]string{"Boot/ConsoleMarker": "does not declare disk bus scsi"})
	})
	t.Run("kernel boot not declared, no disk", func(t *testing.T) {
		rec := runVM(t, "Boot", noKernel{fake.NewHypervisor()}, fake.NewStorage(), g)
		expectStatus(t, rec, map[string]conformance.Status{"Boot/ConsoleMarker": conformance.StatusSkip},
			map[string]string{"Boot/ConsoleMarker": "does not declare firmware kernel"})
	})
}

func TestVMInvalidGuest(t *testing.T) {
	rec := runVM(t, "", fake.NewHypervisor(), fake.NewStorage(), conformance.Guest{Kernel: "/boot/vmlinuz"})
	res, ok := rec.Result("vm")
	if !ok || res.Status != conformance.StatusFail || !strings.Contains(res.Message, "ReadyMarker is required") {
		t.Errorf("VM with a guest without a ready marker: %+v, want the suite to fail saying so", res)
	}
}

// TestVMTesting: VMTesting serves both drivers in-process and runs the kit's checks as
// subtests of a *testing.T. The kit runs in a child test process (TestVMTestingChild), whose
// verbose output says what ran: with the simulated drivers the checks pass; against a
// hypervisor without a console every check that boots a VM is skipped, naming the feature, as
// is Storage/NotAnImage without containerDisk.
func TestVMTesting(t *testing.T) {
	for _, tc := range []struct {
		drivers, run string
		want         map[string]string // check → PASS or SKIP
		reasons      []string
	}{
		// The simulated drivers pause no guest and take any file for an image: those checks
		// are left out with go test's own -run, as a driver author would.
		{"fakes", "/^(Boot|Shutdown|Kill|Reboot|Recover)$", map[string]string{
			"Boot/ConsoleMarker": "PASS", "Shutdown/GracefulWithinTimeout": "PASS", "Kill": "PASS",
			"Reboot/SecondBoot": "PASS", "Recover/AfterDriverKilled": "SKIP",
		}, []string{"WithDriverKill"}},
		{"consoleless", "", map[string]string{
			"Boot/ConsoleMarker": "SKIP", "CloudInit/UserDataReachesGuest": "SKIP", "CloudInit/ConfigDrive": "SKIP",
			"Shutdown/GracefulWithinTimeout": "SKIP", "Kill": "SKIP", "Pause/StopsGuest": "SKIP",
			"Reboot/SecondBoot": "SKIP", "Recover/AfterDriverKilled": "SKIP", "Storage/NotAnImage": "SKIP",
		}, []string{"driver does not declare FEATURE_HYPERVISOR_CONSOLE", "FEATURE_HYPERVISOR_PAUSE", "FEATURE_HYPERVISOR_REBOOT",
			"storage driver does not declare volume type containerDisk"}},
	} {
		t.Run(tc.drivers, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestVMTestingChild$"+tc.run, "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "KUBEVISOR_VMTESTING_CHILD="+tc.drivers)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child test: %v\n%s", err, out)
			}
			got := map[string]string{}
			for _, line := range strings.Split(string(out), "\n") {
				f := strings.Fields(line)
				if len(f) >= 3 && f[0] == "---" {
					if name, ok := strings.CutPrefix(f[2], "TestVMTestingChild/"); ok {
						got[name] = strings.TrimSuffix(f[1], ":")
					}
				}
			}
			for check, status := range tc.want {
				if got[check] != status {
					t.Errorf("%s: %q, want %s", check, got[check], status)
				}
			}
			for _, r := range tc.reasons {
				if !strings.Contains(string(out), r) {
					t.Errorf("the output does not say %q", r)
				}
			}
			if t.Failed() {
				t.Logf("child output:\n%s", out)
			}
		})
	}
}

// TestVMTestingChild is TestVMTesting's child: it runs only in the process TestVMTesting starts.
func TestVMTestingChild(t *testing.T) {
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(kernel, []byte("not really a kernel"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := conformance.Guest{Kernel: kernel, ReadyMarker: fake.ConsoleMarker, BootTimeout: 10 * time.Second}
	switch os.Getenv("KUBEVISOR_VMTESTING_CHILD") {
	case "fakes":
		conformance.VMTesting(t, fake.NewHypervisor(), fake.NewStorage(), g, conformance.WithTimeout(30*time.Second))
	case "consoleless":
		conformance.VMTesting(t, consoleless{fake.NewHypervisor()}, scratchOnly{fake.NewStorage()}, g)
	default:
		// Run directly (go test ./...): nothing to do; TestVMTesting starts it with a driver set.
	}
}

// devicesDropped is the QEMU driver declaring its optional devices and leaving them out of the
// VMs it makes.
type devicesDropped struct{ *qmp.Driver }

func (h devicesDropped) Create(ctx context.Context, spec *domainv1.DomainSpec) (*hypervisorv1.Handle, error) {
	spec = proto.CloneOf(spec)
	spec.Rng, spec.Chassis, spec.Watchdog, spec.Balloon, spec.Inputs, spec.Clock, spec.Sound, spec.Tpm = nil, nil, nil, nil, nil, nil, nil, nil
	spec.VirtioTransitional = false
	if spec.Cpu != nil {
		spec.Cpu.Features, spec.Cpu.Pinning = nil, nil
	}
	return h.Driver.Create(ctx, spec)
}

// TestVMPersistentTPM runs TPM/Persistent and Firmware/EFIPersistent alone against the QEMU driver (TestVMRealDrivers
// runs it among all the checks), so that it and its controls below run side by side.
func TestVMPersistentTPM(t *testing.T) {
	g := testGuest(t)
	hv := qmp.New(qmp.WithLogger(qmpLogger()))
	t.Cleanup(func() { _ = hv.Close() })
	rec := runVM(t, "TPM|Firmware", hv, storage.New(nil), g)
	expectStatus(t, rec, map[string]conformance.Status{"TPM/Persistent": conformance.StatusPass, "Firmware/EFIPersistent": conformance.StatusPass}, nil)
}

// persistenceIgnored is the QEMU driver declaring Capabilities.persistent_state and keeping
// nothing in the persistent state directory: its VMs' TPM state stays in their run
// directories.
type persistenceIgnored struct{ *qmp.Driver }

func (h persistenceIgnored) Create(ctx context.Context, spec *domainv1.DomainSpec) (*hypervisorv1.Handle, error) {
	spec = proto.CloneOf(spec)
	spec.PersistentStateDir = ""
	if spec.Tpm != nil {
		spec.Tpm.Persistent = false
	}
	if efi := spec.GetFirmware().GetEfi(); efi != nil {
		efi.Persistent = false
	}
	return h.Driver.Create(ctx, spec)
}

// TestVMPersistenceIgnored: TPM/Persistent and Firmware/EFIPersistent fail against a driver that declares persistent
// state and ignores the directory (each VM gets a new TPM).
func TestVMPersistenceIgnored(t *testing.T) {
	g := testGuest(t)
	hv := qmp.New(qmp.WithLogger(qmpLogger()))
	t.Cleanup(func() { _ = hv.Close() })
	rec := runVM(t, "TPM|Firmware", persistenceIgnored{hv}, storage.New(nil), g)
	expectStatus(t, rec, map[string]conformance.Status{"TPM/Persistent": conformance.StatusFail, "Firmware/EFIPersistent": conformance.StatusFail},
		map[string]string{
			"TPM/Persistent":         "the persistent state directory holds nothing after the VM with the persistent TPM was deleted",
			"Firmware/EFIPersistent": "the persistent state directory holds nothing after the VM with the persistent EFI variable store was deleted",
		})
}

// persistenceReset is the QEMU driver keeping its VMs' TPM state and EFI variable stores in
// the persistent state directory and emptying the directory at every Create: each VM gets a
// new TPM and a new store there.
type persistenceReset struct{ *qmp.Driver }

func (h persistenceReset) Create(ctx context.Context, spec *domainv1.DomainSpec) (*hypervisorv1.Handle, error) {
	if dir := spec.GetPersistentStateDir(); dir != "" {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	return h.Driver.Create(ctx, spec)
}

// TestVMPersistenceReset: TPM/Persistent and Firmware/EFIPersistent fail against a driver that
// keeps the state in the directory and does not reuse it (the second VM's TPM counts its
// resets from the start, its store its boots).
func TestVMPersistenceReset(t *testing.T) {
	g := testGuest(t)
	hv := qmp.New(qmp.WithLogger(qmpLogger()))
	t.Cleanup(func() { _ = hv.Close() })
	rec := runVM(t, "TPM|Firmware", persistenceReset{hv}, storage.New(nil), g)
	expectStatus(t, rec, map[string]conformance.Status{"TPM/Persistent": conformance.StatusFail, "Firmware/EFIPersistent": conformance.StatusFail},
		map[string]string{
			"TPM/Persistent":         "a new TPM, not the one whose state the persistent state directory was to keep",
			"Firmware/EFIPersistent": "a new store, not the one the persistent state directory was to keep",
		})
}

// TestVMDevicesIgnored: the Devices and Clock checks fail against a driver that accepts the
// devices and does not give them to the guest.
func TestVMDevicesIgnored(t *testing.T) {
	g := testGuest(t)
	hv := qmp.New(qmp.WithLogger(qmpLogger()))
	t.Cleanup(func() { _ = hv.Close() })
	rec := runVM(t, "Devices|Clock|CPU", devicesDropped{hv}, storage.New(nil), g)
	expectStatus(t, rec, map[string]conformance.Status{
		"Devices/RNG": conformance.StatusFail, "Devices/Chassis": conformance.StatusFail, "Devices/Watchdog": conformance.StatusFail,
		"Devices/Balloon": conformance.StatusFail, "Devices/Input": conformance.StatusFail, "Clock/Start": conformance.StatusFail,
		"CPU/Features": conformance.StatusFail, "Devices/Sound": conformance.StatusFail, "Devices/VirtioTransitional": conformance.StatusFail,
		"Devices/TPM": conformance.StatusFail, "CPU/Pinning": conformance.StatusFail,
	}, map[string]string{
		"Devices/RNG": "no virtio RNG", "Devices/Chassis": "from the domain spec's chassis", "Devices/Watchdog": "no i6300esb",
		"Devices/Balloon": "no virtio balloon", "Devices/Input": "want two virtio input devices", "Clock/Start": "ahead of UTC, want 5h30m0s",
		"CPU/Features": `has "aes", which the domain spec forbids`, "Devices/Sound": "no Intel HD Audio controller",
		"Devices/VirtioTransitional": "no transitional virtio balloon", "Devices/TPM": "no TPM 2.0",
		"CPU/Pinning": "main thread may run on CPUs",
	})
}

// noDiskCopy is the fake hypervisor without Capabilities.migration_disks.
type noDiskCopy struct{ *fake.Hypervisor }

func (h noDiskCopy) Capabilities(ctx context.Context) (*basev1.Capabilities, error) {
	caps, err := h.Hypervisor.Capabilities(ctx)
	if caps != nil {
		caps.MigrationDisks = false
	}
	return caps, err
}

// TestVMLocalDisksSkippedWithoutDiskCopy: a driver that migrates but does not declare
// migration_disks has Migrate/LocalDisks and Migrate/LocalDisksCancel skipped, saying so.
func TestVMLocalDisksSkippedWithoutDiskCopy(t *testing.T) {
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(kernel, []byte("not really a kernel"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := conformance.Guest{Kernel: kernel, ReadyMarker: fake.ConsoleMarker, UserDataBegin: "BEGIN", UserDataEnd: "END"}
	peer := noDiskCopy{fake.NewHypervisor()}
	rec := runVM(t, "Migrate/LocalDisks", noDiskCopy{fake.NewHypervisor()}, fake.NewStorage(), g,
		conformance.WithMigrationPeer(func(ct conformance.T) driver.Hypervisor {
			return conformance.ServeInProcess(ct, basev1.Kind_KIND_HYPERVISOR, peer).(driver.Hypervisor)
		}, t.TempDir()))
	expectStatus(t, rec, map[string]conformance.Status{"Migrate/LocalDisks": conformance.StatusSkip, "Migrate/LocalDisksCancel": conformance.StatusSkip},
		map[string]string{"Migrate/LocalDisks": "does not declare Capabilities.migration_disks", "Migrate/LocalDisksCancel": "does not declare Capabilities.migration_disks"})
}
