package conformance_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	devicev1 "github.com/kubevisor/kubevisor/core/driver/device/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
	"github.com/kubevisor/kubevisor/drivers/fake"
)

// runKit runs the kit of a kind against impl, served in-process, with a Recorder.
func runKit(t *testing.T, kind basev1.Kind, impl driver.Driver, opts ...conformance.Option) *conformance.Recorder {
	t.Helper()
	rec, err := conformance.NewRecorder(conformance.RecorderConfig{TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	opts = append([]conformance.Option{conformance.WithImplementation(impl), conformance.WithTimeout(10 * time.Second)}, opts...)
	rec.Run(driver.KindName(kind), func(ct conformance.T) {
		client := conformance.ServeInProcess(ct, kind, impl)
		switch kind {
		case basev1.Kind_KIND_HYPERVISOR:
			conformance.Hypervisor(ct, func(conformance.T) driver.Hypervisor { return client.(driver.Hypervisor) }, opts...)
		case basev1.Kind_KIND_NETWORK:
			conformance.Network(ct, func(conformance.T) driver.Network { return client.(driver.Network) }, opts...)
		case basev1.Kind_KIND_STORAGE:
			conformance.Storage(ct, func(conformance.T) driver.Storage { return client.(driver.Storage) }, opts...)
		case basev1.Kind_KIND_DEVICE:
			conformance.Device(ct, func(conformance.T) driver.Device { return client.(driver.Device) }, opts...)
		}
	})
	if testing.Verbose() {
		for _, res := range rec.Results() {
			t.Logf("%s %s: %s", res.Status, res.Name, res.Message)
		}
	}
	return rec
}

// withStatus returns the names (below the suite) of the checks with status st.
func withStatus(rec *conformance.Recorder, st conformance.Status) []string {
	var names []string
	for _, res := range rec.Results() {
		if res.Status == st {
			_, name, _ := strings.Cut(res.Name, "/")
			names = append(names, name)
		}
	}
	return names
}

// expectFailures asserts that exactly the checks named failed, each with a message containing
// the text given.
func expectFailures(t *testing.T, rec *conformance.Recorder, want map[string]string) {
	t.Helper()
	got := withStatus(rec, conformance.StatusFail)
	var wantNames []string
	for name := range want {
		wantNames = append(wantNames, name)
	}
	slices.Sort(got)
	slices.Sort(wantNames)
	if !slices.Equal(got, wantNames) {
		t.Errorf("failed checks: %v, want %v", got, wantNames)
	}
	for _, res := range rec.Results() {
		_, name, _ := strings.Cut(res.Name, "/")
		if text, ok := want[name]; ok && res.Status == conformance.StatusFail && !strings.Contains(strings.Join(res.Output, "\n"), text) {
			t.Errorf("check %s failed with %q, want a message containing %q", name, res.Output, text)
		}
	}
}

// deleteUnknownNotFound breaks the Delete contract: deleting an unknown VM is NotFound.
type deleteUnknownNotFound struct{ *fake.Hypervisor }

func (h deleteUnknownNotFound) Delete(ctx context.Context, id string) error {
	if _, err := h.Status(ctx, id); status.Code(err) == codes.NotFound {
		return err
	}
	return h.Hypervisor.Delete(ctx, id)
}

func TestBrokenHypervisorDeleteUnknown(t *testing.T) {
	rec := runKit(t, basev1.Kind_KIND_HYPERVISOR, deleteUnknownNotFound{fake.NewHypervisor()},
		conformance.WithConsoleMarker(fake.ConsoleMarker))
	expectFailures(t, rec, map[string]string{"Delete/Unknown": "Delete of an unknown VM: NotFound"})
	if _, ok := rec.Result("hypervisor/Lifecycle/CreateStartStatusShutdownDelete"); !ok {
		t.Errorf("Lifecycle did not run")
	}
}

// noValidation breaks the Create contract: it accepts any spec.
type noValidation struct{ *fake.Hypervisor }

func (h noValidation) Create(ctx context.Context, spec *domainv1.DomainSpec) (*hypervisorv1.Handle, error) {
	fixed := &domainv1.DomainSpec{Id: spec.GetId(), Memory: &domainv1.Memory{GuestBytes: 1}, RunDir: spec.GetRunDir()}
	if fixed.Id == "" {
		fixed.Id = "unnamed"
	}
	return h.Hypervisor.Create(ctx, fixed)
}

// pauseDoesNothing declares FEATURE_HYPERVISOR_PAUSE but Pause leaves the VM running.
type pauseDoesNothing struct{ *fake.Hypervisor }

func (pauseDoesNothing) Pause(context.Context, string) error { return nil }

// eventsUnfiltered sends the events of every VM to a stream that asked for one.
type eventsUnfiltered struct{ *fake.Hypervisor }

func (h eventsUnfiltered) Events(ctx context.Context, _ string, send func(*hypervisorv1.Event) error) error {
	return h.Hypervisor.Events(ctx, "", send)
}

// softRebootAnything declares FEATURE_HYPERVISOR_SOFT_REBOOT and accepts a SoftReboot of any id
// in any state.
type softRebootAnything struct{ *fake.Hypervisor }

func (softRebootAnything) SoftReboot(context.Context, string) error { return nil }

// agentAnything declares FEATURE_HYPERVISOR_GUEST_AGENT and answers "not connected" for any id,
// running or not.
type agentAnything struct{ *fake.Hypervisor }

func (agentAnything) GuestAgentInfo(context.Context, string) (*hypervisorv1.GuestAgentInfoResponse, error) {
	return &hypervisorv1.GuestAgentInfoResponse{}, nil
}

// execAnything declares FEATURE_HYPERVISOR_GUEST_EXEC and answers "exited 0" for any id,
// running or not.
type execAnything struct{ *fake.Hypervisor }

func (execAnything) GuestAgentPing(context.Context, string) (*hypervisorv1.GuestAgentPingResponse, error) {
	return &hypervisorv1.GuestAgentPingResponse{Connected: true}, nil
}

func (execAnything) GuestAgentExec(context.Context, string, []string, time.Duration) (*hypervisorv1.GuestAgentExecResponse, error) {
	return &hypervisorv1.GuestAgentExecResponse{Connected: true, Exited: true}, nil
}

// rebootDoesNothing declares FEATURE_HYPERVISOR_REBOOT but Reboot does not boot again.
type rebootDoesNothing struct{ *fake.Hypervisor }

func (rebootDoesNothing) Reboot(context.Context, string) error { return nil }

// deleteAnything deletes a running VM instead of refusing.
type deleteAnything struct{ *fake.Hypervisor }

func (h deleteAnything) Delete(ctx context.Context, id string) error {
	_ = h.Kill(ctx, id)
	return h.Hypervisor.Delete(ctx, id)
}

// shutdownOnlyRunning refuses to shut down a VM that is not running.
type shutdownOnlyRunning struct{ *fake.Hypervisor }

func (h shutdownOnlyRunning) Shutdown(ctx context.Context, id string, timeout time.Duration) (bool, error) {
	if st, err := h.Status(ctx, id); err == nil && st.GetState() == hypervisorv1.State_STATE_STOPPED {
		return false, status.Error(codes.FailedPrecondition, "not running")
	}
	return h.Hypervisor.Shutdown(ctx, id, timeout)
}

// recoverForgets cannot re-adopt a VM: every Recover is NotFound.
type recoverForgets struct{ *fake.Hypervisor }

func (recoverForgets) Recover(_ context.Context, h *hypervisorv1.Handle) (*hypervisorv1.VMStatus, error) {
	return nil, status.Errorf(codes.NotFound, "no VM %q", h.GetId())
}

// badIdentity reports a name that is not a manifest name, and no health.
type badIdentity struct{ *fake.Hypervisor }

func (h badIdentity) Info(ctx context.Context) (*basev1.InfoResponse, error) {
	info, err := h.Hypervisor.Info(ctx)
	info.Name = "Fake_Driver"
	return info, err
}

func (badIdentity) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	if err := send(&basev1.FingerprintResponse{Attributes: map[string]string{"bad key!": "x"}}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

func TestBrokenHypervisors(t *testing.T) {
	restart := conformance.WithRestart(func(conformance.T) driver.Hypervisor { return recoverForgets{fake.NewHypervisor()} })
	for _, c := range []struct {
		name string
		impl driver.Hypervisor
		opts []conformance.Option
		want map[string]string
	}{
		{"NoValidation", noValidation{fake.NewHypervisor()}, nil, map[string]string{"Create/InvalidSpec": "want InvalidArgument"}},
		{"PauseDoesNothing", pauseDoesNothing{fake.NewHypervisor()}, []conformance.Option{conformance.WithTimeout(2 * time.Second)}, map[string]string{
			"Pause/PauseResume":     "want STATE_PAUSED",
			"Pause/NotRunning":      "Pause of a created VM: got no error, want FailedPrecondition",
			"Unknown/NotFound":      "Pause of an unknown VM: got no error, want NotFound",
			"Shutdown/Paused":       "no RESUMED event before it stopped",
			"Events/Sequence":       "after Pause, no such event",
			"Reboot/NotRunning":     "Reboot of a paused VM: got no error, want FailedPrecondition",
			"SoftReboot/NotRunning": "SoftReboot of a paused VM: got no error, want FailedPrecondition",
			"GuestAgent/NotRunning": "GuestAgentInfo of a paused VM: got no error, want FailedPrecondition",
			"GuestExec/NotRunning":  "GuestAgentPing of a paused VM: got no error, want FailedPrecondition",
		}},
		{"EventsUnfiltered", eventsUnfiltered{fake.NewHypervisor()}, nil, map[string]string{"Events/StartStop": "got an event of VM"}},
		{"RebootDoesNothing", rebootDoesNothing{fake.NewHypervisor()}, []conformance.Option{conformance.WithTimeout(300 * time.Millisecond)},
			map[string]string{
				"Reboot/SecondBoot": "want RUNNING with more than 1",
				"Reboot/NotRunning": "Reboot of a created VM: got no error, want FailedPrecondition",
				"Unknown/NotFound":  "Reboot of an unknown VM: got no error, want NotFound",
			}},
		{"SoftRebootAnything", softRebootAnything{fake.NewHypervisor()}, nil, map[string]string{
			"SoftReboot/NotRunning": "SoftReboot of a created VM: got no error, want FailedPrecondition",
			"Unknown/NotFound":      "SoftReboot of an unknown VM: got no error, want NotFound",
		}},
		{"AgentAnything", agentAnything{fake.NewHypervisor()}, nil, map[string]string{
			"GuestAgent/NotRunning": "GuestAgentInfo of a created VM: got no error, want FailedPrecondition",
			"Unknown/NotFound":      "GuestAgentInfo of an unknown VM: got no error, want NotFound",
		}},
		{"ExecAnything", execAnything{fake.NewHypervisor()}, nil, map[string]string{
			"GuestExec/NotRunning": "GuestAgentPing of a created VM: got no error, want FailedPrecondition",
			"Unknown/NotFound":     "GuestAgentPing of an unknown VM: got no error, want NotFound",
		}},
		{"DeleteAnything", deleteAnything{fake.NewHypervisor()}, nil, map[string]string{"Delete/Running": "want FailedPrecondition"}},
		{"ShutdownOnlyRunning", shutdownOnlyRunning{fake.NewHypervisor()}, nil, map[string]string{"Shutdown/Idempotent": "Shutdown, call 2: FailedPrecondition"}},
		{"RecoverForgets", fake.NewHypervisor(), []conformance.Option{restart}, map[string]string{
			"Recover/Running": "Recover of a running VM: NotFound",
			"Recover/Created": "Recover of a created VM: NotFound",
			"Recover/Stopped": "must be reported as stopped",
			"Recover/Gone":    "must be reported as stopped",
		}},
		{"BadIdentity", badIdentity{fake.NewHypervisor()}, nil, map[string]string{
			"Info/NameAndKind":        "is not a DNS label",
			"Fingerprint/SendsAtOnce": "health is unspecified",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := runKit(t, basev1.Kind_KIND_HYPERVISOR, c.impl, c.opts...)
			expectFailures(t, rec, c.want)
		})
	}
}

// featureless offers only the required hypervisor operations and declares no feature.
type featureless struct{ driver.Hypervisor }

func (featureless) Capabilities(context.Context) (*basev1.Capabilities, error) {
	return &basev1.Capabilities{}, nil
}

func TestUndeclaredFeaturesAreSkipped(t *testing.T) {
	rec := runKit(t, basev1.Kind_KIND_HYPERVISOR, featureless{fake.NewHypervisor()},
		conformance.WithRestart(func(conformance.T) driver.Hypervisor { return fake.NewHypervisor() }))
	expectFailures(t, rec, nil)
	want := map[string]string{
		"Shutdown/Paused":        "driver does not declare FEATURE_HYPERVISOR_PAUSE",
		"Pause/PauseResume":      "driver does not declare FEATURE_HYPERVISOR_PAUSE",
		"Pause/NotRunning":       "driver does not declare FEATURE_HYPERVISOR_PAUSE",
		"Reboot/SecondBoot":      "driver does not declare FEATURE_HYPERVISOR_REBOOT",
		"Reboot/NotRunning":      "driver does not declare FEATURE_HYPERVISOR_REBOOT",
		"SoftReboot/NotRunning":  "driver does not declare FEATURE_HYPERVISOR_SOFT_REBOOT",
		"GuestAgent/NotRunning":  "driver does not declare FEATURE_HYPERVISOR_GUEST_AGENT",
		"GuestExec/NotRunning":   "driver does not declare FEATURE_HYPERVISOR_GUEST_EXEC",
		"GuestExec/NoCommand":    "driver does not declare FEATURE_HYPERVISOR_GUEST_EXEC",
		"Console/Output":         "driver does not declare FEATURE_HYPERVISOR_CONSOLE",
		"Console/EndsOnStop":     "driver does not declare FEATURE_HYPERVISOR_CONSOLE",
		"Console/BeforeStart":    "driver does not declare FEATURE_HYPERVISOR_CONSOLE",
		"Console/SeveralReaders": "driver does not declare FEATURE_HYPERVISOR_CONSOLE",
		"Recover/Running":        "driver does not declare FEATURE_HYPERVISOR_RECOVER",
		"Recover/Created":        "driver does not declare FEATURE_HYPERVISOR_RECOVER",
		"Recover/Stopped":        "driver does not declare FEATURE_HYPERVISOR_RECOVER",
		"Recover/Gone":           "driver does not declare FEATURE_HYPERVISOR_RECOVER",
	}
	for name, msg := range want {
		res, ok := rec.Result("hypervisor/" + name)
		if !ok || res.Status != conformance.StatusSkip || res.Message != msg {
			t.Errorf("%s: %s %q, want SKIP %q", name, res.Status, res.Message, msg)
		}
	}
	if got := withStatus(rec, conformance.StatusSkip); len(got) != len(want) {
		t.Errorf("skipped %v, want only %d checks", got, len(want))
	}
}

func TestRecoverNeedsRestartHook(t *testing.T) {
	rec := runKit(t, basev1.Kind_KIND_HYPERVISOR, fake.NewHypervisor(), conformance.WithConsoleMarker(fake.ConsoleMarker))
	expectFailures(t, rec, nil)
	res, _ := rec.Result("hypervisor/Recover/Running")
	if res.Status != conformance.StatusSkip || !strings.Contains(res.Message, "WithRestart") {
		t.Errorf("Recover/Running: %s %q, want a skip naming WithRestart", res.Status, res.Message)
	}
}

// wrongMarker: the console never shows the marker the kit is told to wait for.
func TestConsoleMarkerMissing(t *testing.T) {
	rec := runKit(t, basev1.Kind_KIND_HYPERVISOR, fake.NewHypervisor(),
		conformance.WithConsoleMarker("this text is never printed"), conformance.WithTimeout(300*time.Millisecond))
	expectFailures(t, rec, map[string]string{
		"Console/Output":         "did not show \"this text is never printed\"",
		"Console/SeveralReaders": "did not show \"this text is never printed\"",
	})
}

// unstableMAC breaks the Network contract: every Setup gives new MACs.
type unstableMAC struct {
	*fake.Network
	calls atomic.Int32
}

func (n *unstableMAC) Setup(ctx context.Context, req *networkv1.SetupRequest) (*networkv1.SetupResponse, error) {
	resp, err := n.Network.Setup(ctx, req)
	if err != nil {
		return nil, err
	}
	call := n.calls.Add(1)
	for _, r := range resp.GetInterfaces() {
		r.Mac = r.GetMac()[:len(r.GetMac())-2] + strings.Repeat(string("0123456789abcdef"[call%16]), 2)
	}
	return resp, nil
}

func TestBrokenNetworkUnstableMAC(t *testing.T) {
	rec := runKit(t, basev1.Kind_KIND_NETWORK, &unstableMAC{Network: fake.NewNetwork()})
	expectFailures(t, rec, map[string]string{
		"Setup/Idempotent":   "returned another result",
		"Setup/StableMAC":    "MACs must be stable",
		"Setup/RequestedMAC": "asked for MAC 02:00:00:c0:ff:ee",
		"Check/AfterSetup":   "Setup made MAC",
	})
}

// dhcpUnchecked breaks the Network contract: it declares the interface option dhcp-options but
// takes options the contract refuses.
type dhcpUnchecked struct{ *fake.Network }

func (n dhcpUnchecked) Capabilities(ctx context.Context) (*basev1.Capabilities, error) {
	c, err := n.Network.Capabilities(ctx)
	if c != nil {
		c.InterfaceOptions = []string{driver.InterfaceDHCPOptions}
	}
	return c, err
}

func TestBrokenNetworkDHCPOptionsUnchecked(t *testing.T) {
	rec := runKit(t, basev1.Kind_KIND_NETWORK, dhcpUnchecked{fake.NewNetwork()})
	expectFailures(t, rec, map[string]string{
		"Setup/BadDHCPOptions": "got no error, want InvalidArgument",
	})
}

// releaseEverything breaks the Storage contract: Release empties the work directory.
type releaseEverything struct{ *fake.Storage }

func (s releaseEverything) Release(ctx context.Context, req *storagev1.ReleaseRequest) error {
	if err := s.Storage.Release(ctx, req); err != nil {
		return err
	}
	entries, _ := os.ReadDir(req.GetWorkDir())
	for _, e := range entries {
		_ = os.RemoveAll(filepath.Join(req.GetWorkDir(), e.Name()))
	}
	return nil
}

// releaseNothing breaks the Storage contract: Release leaves the disks.
type releaseNothing struct{ *fake.Storage }

func (releaseNothing) Release(context.Context, *storagev1.ReleaseRequest) error { return nil }

func TestBrokenStorage(t *testing.T) {
	t.Run("ReleaseEverything", func(t *testing.T) {
		rec := runKit(t, basev1.Kind_KIND_STORAGE, releaseEverything{fake.NewStorage()})
		expectFailures(t, rec, map[string]string{"Release/OnlyOwnFiles": "conformance-keep.txt"})
	})
	t.Run("ReleaseNothing", func(t *testing.T) {
		rec := runKit(t, basev1.Kind_KIND_STORAGE, releaseNothing{fake.NewStorage()})
		expectFailures(t, rec, map[string]string{"Release/RemovesDisks": "is still there after Release"})
	})
}

// unknownIsInvalid breaks the Device contract: an unknown device is InvalidArgument.
type unknownIsInvalid struct{ *fake.Device }

func (d unknownIsInvalid) Allocate(ctx context.Context, req *devicev1.AllocateRequest) (*devicev1.AllocateResponse, error) {
	resp, err := d.Device.Allocate(ctx, req)
	if status.Code(err) == codes.NotFound {
		return nil, status.Error(codes.InvalidArgument, "bad id")
	}
	return resp, err
}

// stuckFingerprint breaks the base contract: Fingerprint does not return when cancelled.
type stuckFingerprint struct {
	*fake.Device
	release chan struct{}
}

func (d stuckFingerprint) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	if err := send(&basev1.FingerprintResponse{Health: basev1.Health_HEALTH_HEALTHY}); err != nil {
		return err
	}
	<-d.release
	return nil
}

func TestBrokenDevices(t *testing.T) {
	t.Run("UnknownIsInvalid", func(t *testing.T) {
		rec := runKit(t, basev1.Kind_KIND_DEVICE, unknownIsInvalid{fake.NewDevice()})
		expectFailures(t, rec, map[string]string{"Allocate/Unknown": "want NotFound"})
	})
	t.Run("StuckFingerprint", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		// Served directly: through gRPC the client side returns on cancel whatever the server does.
		rec, err := conformance.NewRecorder(conformance.RecorderConfig{TempDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		impl := stuckFingerprint{fake.NewDevice(), release}
		rec.Run("device", func(ct conformance.T) {
			conformance.Device(ct, func(conformance.T) driver.Device { return impl },
				conformance.WithTimeout(200*time.Millisecond), conformance.WithImplementation(impl))
		})
		expectFailures(t, rec, map[string]string{"Fingerprint/StopsOnCancel": "did not return within"})
	})
}
