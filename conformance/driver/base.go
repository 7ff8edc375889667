package conformance

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
)

// suite is one run of the kit against one driver.
type suite struct {
	kind basev1.Kind
	opts Options
	// newDriver returns the driver under test, not configured.
	newDriver func(t T) driver.Driver
	// ctxs holds the context of each running check, by its T.
	ctxs sync.Map
}

func newSuite(t T, kind basev1.Kind, newDriver func(t T) driver.Driver, opts []Option) *suite {
	return &suite{kind: kind, opts: newOptions(t, opts), newDriver: newDriver}
}

// unconfigured returns the driver under test without configuring it.
func (s *suite) unconfigured(t T) driver.Driver {
	t.Helper()
	d := s.newDriver(t)
	if d == nil {
		t.Fatalf("the factory returned no driver")
	}
	return d
}

// driver returns the driver under test, configured with Options.Config.
func (s *suite) driver(t T) driver.Driver {
	t.Helper()
	d := s.unconfigured(t)
	s.configure(t, d)
	return d
}

func (s *suite) configure(t T, d driver.Driver) {
	t.Helper()
	if err := d.Configure(s.ctx(t), s.configureRequest(s.opts.Config)); err != nil {
		t.Fatalf("Configure: %s", describe(err))
	}
}

func (s *suite) configureRequest(config []byte) *basev1.ConfigureRequest {
	return &basev1.ConfigureRequest{
		Config:          config,
		NodeName:        s.opts.NodeName,
		StateDir:        s.opts.StateDir,
		ProtocolVersion: driver.ProtocolVersion,
	}
}

// ctx returns the context for the calls of one check: done when the check ends or
// Options.Timeout after the check first asked for it.
func (s *suite) ctx(t T) context.Context {
	if !reflect.TypeOf(t).Comparable() {
		// Such a T cannot key the map: every call gets its own Options.Timeout.
		ctx, cancel := context.WithTimeout(t.Context(), s.opts.Timeout)
		t.Cleanup(cancel)
		return ctx
	}
	if ctx, ok := s.ctxs.Load(t); ok {
		return ctx.(context.Context)
	}
	ctx, cancel := context.WithTimeout(t.Context(), s.opts.Timeout)
	if prev, loaded := s.ctxs.LoadOrStore(t, ctx); loaded {
		cancel()
		return prev.(context.Context)
	}
	t.Cleanup(func() {
		cancel()
		s.ctxs.Delete(t)
	})
	return ctx
}

// cleanupCtx returns a context for a Cleanup function, which runs after the check's context is
// cancelled.
func (s *suite) cleanupCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.opts.Timeout)
}

// capabilities returns the driver's capabilities, failing the check if it cannot.
func (s *suite) capabilities(t T, d driver.Driver) *basev1.Capabilities {
	t.Helper()
	caps, err := d.Capabilities(s.ctx(t))
	if err != nil {
		t.Fatalf("Capabilities: %s", describe(err))
	}
	if caps == nil {
		caps = &basev1.Capabilities{}
	}
	return caps
}

// requireFeature skips the check unless caps declares f.
func requireFeature(t T, caps *basev1.Capabilities, f basev1.Feature) {
	t.Helper()
	if !driver.HasFeature(caps, f) {
		t.Skipf("driver does not declare %s", f)
	}
}

// optional returns d as the optional interface I of feature f, as the host reaches it
// (driver.Optional), failing the check when the driver does not offer it: it does not declare f
// (the caller skips such checks first) or declares it without implementing it.
func optional[I any](t T, d driver.Driver, f basev1.Feature) I {
	t.Helper()
	i, ok := driver.Optional[I](t.Context(), d)
	if !ok {
		t.Fatalf("driver declares %s but %T does not offer %s", f, d, strings.TrimPrefix(fmt.Sprintf("%T", (*I)(nil)), "*"))
	}
	return i
}

// isClient reports whether d is the host's client of a driver (in-process or a plugin), as
// opposed to a Go implementation called directly.
func isClient(d driver.Driver) bool {
	switch d.(type) {
	case *driver.HypervisorClient, *driver.NetworkClient, *driver.StorageClient, *driver.DeviceClient:
		return true
	}
	return false
}

// baseChecks are the checks every kind runs.
func (s *suite) baseChecks(t T) {
	t.Run("Info", func(t T) {
		t.Run("NameAndKind", s.checkInfoNameAndKind)
		t.Run("ProtocolVersion", s.checkInfoProtocolVersion)
	})
	t.Run("Capabilities", func(t T) {
		t.Run("Stable", s.checkCapabilitiesStable)
		t.Run("Valid", s.checkCapabilitiesValid)
		t.Run("ImplementsDeclared", s.checkCapabilitiesImplementsDeclared)
	})
	t.Run("Fingerprint", func(t T) {
		t.Run("SendsAtOnce", s.checkFingerprintSendsAtOnce)
		t.Run("StopsOnCancel", s.checkFingerprintStopsOnCancel)
	})
	t.Run("Configure", func(t T) {
		t.Run("Idempotent", s.checkConfigureIdempotent)
		t.Run("Empty", s.checkConfigureEmpty)
	})
}

// dnsLabel is what a driver name must be: the name of its plugin manifest.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// checkInfoNameAndKind: Info answers before Configure, with a manifest-style name, a version
// and the right kind.
func (s *suite) checkInfoNameAndKind(t T) {
	d := s.unconfigured(t)
	info, err := d.Info(s.ctx(t))
	if err != nil {
		t.Fatalf("Info: %s (Info must answer at any time, before Configure too, and never fail)", describe(err))
	}
	switch {
	case !dnsLabel.MatchString(info.GetName()):
		t.Errorf("Info name %q is not a DNS label (lowercase letters, digits and '-', at most 63), as a plugin manifest's name must be", info.GetName())
	case s.opts.Name != "" && info.GetName() != s.opts.Name:
		t.Errorf("Info name is %q, want %q", info.GetName(), s.opts.Name)
	}
	if info.GetVersion() == "" {
		t.Errorf("Info reports no version")
	}
	switch {
	case info.GetKind() == s.kind:
	case info.GetKind() == basev1.Kind_KIND_UNSPECIFIED && !isClient(d):
		t.Logf("Info reports no kind; driver.Serve fills it in")
	default:
		t.Errorf("Info kind is %s, want %s", info.GetKind(), s.kind)
	}
}

// checkInfoProtocolVersion: the driver speaks the protocol version of this SDK.
func (s *suite) checkInfoProtocolVersion(t T) {
	d := s.unconfigured(t)
	if !isClient(d) {
		t.Skipf("protocol versions are filled in by driver.Serve: test the driver through driver.InProcess (the *Testing functions) or as a plugin")
	}
	info, err := d.Info(s.ctx(t))
	if err != nil {
		t.Fatalf("Info: %s", describe(err))
	}
	if !slices.Contains(info.GetProtocolVersions(), driver.ProtocolVersion) {
		t.Errorf("Info protocol versions are %v, want them to include %d", info.GetProtocolVersions(), driver.ProtocolVersion)
	}
}

// checkCapabilitiesStable: Capabilities answer the same before and after Configure, except a
// device driver's resources, which may come from its configuration; and the same again after
// a second Configure with the same request.
func (s *suite) checkCapabilitiesStable(t T) {
	d := s.unconfigured(t)
	before := proto.CloneOf(s.capabilities(t, d))
	s.configure(t, d)
	after := s.capabilities(t, d)
	b, a := before, proto.CloneOf(after)
	if s.kind == basev1.Kind_KIND_DEVICE {
		b.Resources, a.Resources = nil, nil
	}
	if !proto.Equal(b, a) {
		t.Errorf("Capabilities changed across Configure:\nbefore: %v\nafter:  %v", before, after)
	}
	s.configure(t, d)
	if again := s.capabilities(t, d); !proto.Equal(after, again) {
		t.Errorf("Capabilities changed across a second Configure with the same request:\nfirst:  %v\nsecond: %v", after, again)
	}
	if impl := s.opts.Implementation; impl != nil {
		// The host's client caches Capabilities; ask the implementation itself too.
		a, errA := impl.Capabilities(s.ctx(t))
		b, errB := impl.Capabilities(s.ctx(t))
		switch {
		case errA != nil || errB != nil:
			t.Errorf("Capabilities of the implementation: %v", errors.Join(errA, errB))
		case !proto.Equal(a, b):
			t.Errorf("Capabilities of the implementation changed between two calls:\nfirst:  %v\nsecond: %v", a, b)
		case !proto.Equal(a, after):
			t.Errorf("Capabilities of the implementation differ from what the host got:\nimplementation: %v\nhost:           %v", a, after)
		}
	}
}

// Values the host knows for the kind-specific lists of Capabilities.
var (
	knownFirmware    = []string{"bios", "efi", "kernel"}
	knownDiskBuses   = []string{"virtio", "sata", "scsi", "usb"}
	knownVolumeTypes = []string{"containerDisk", "emptyDisk", "hostDisk", "ephemeral", "cloudInitNoCloud", "cloudInitConfigDrive", "persistentVolumeClaim"}
	resourceName     = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)
)

// knownInterfaceOptions are the names of driver.OptionalInterfaceSettings.
func knownInterfaceOptions() []string {
	var names []string
	for _, o := range driver.OptionalInterfaceSettings {
		names = append(names, o.Name)
	}
	return names
}

// checkCapabilitiesValid: Capabilities declare only features of the driver's kind, fill only
// the lists of its kind, with values the host knows and no duplicates.
func (s *suite) checkCapabilitiesValid(t T) {
	d := s.driver(t)
	caps := s.capabilities(t, d)
	if err := driver.CheckCapabilities(s.kind, allOptional{}, caps); err != nil {
		t.Errorf("%v", err)
	}
	lists := []struct {
		field  string
		kind   basev1.Kind
		values []string
		known  []string
	}{
		{"features", s.kind, featureNames(caps.GetFeatures()), nil},
		{"firmware", basev1.Kind_KIND_HYPERVISOR, caps.GetFirmware(), knownFirmware},
		{"disk_buses", basev1.Kind_KIND_HYPERVISOR, caps.GetDiskBuses(), knownDiskBuses},
		{"nic_models", basev1.Kind_KIND_HYPERVISOR, caps.GetNicModels(), nil},
		{"bindings", basev1.Kind_KIND_NETWORK, caps.GetBindings(), nil},
		{"volume_types", basev1.Kind_KIND_STORAGE, caps.GetVolumeTypes(), knownVolumeTypes},
		{"resources", basev1.Kind_KIND_DEVICE, caps.GetResources(), nil},
		{"machine_types", basev1.Kind_KIND_HYPERVISOR, caps.GetMachineTypes(), nil},
		{"interface_options", basev1.Kind_KIND_NETWORK, caps.GetInterfaceOptions(), knownInterfaceOptions()},
	}
	if s.kind != basev1.Kind_KIND_HYPERVISOR {
		for field, set := range map[string]bool{"secure_boot": caps.GetSecureBoot(), "vnc": caps.GetVnc(), "host_devices": caps.GetHostDevices(), "tap_fd": caps.GetTapFd(), "launcher": caps.GetLauncher()} {
			if set {
				t.Errorf("Capabilities %s is set but is not for a %s driver", field, driver.KindName(s.kind))
			}
		}
	}
	if s.kind != basev1.Kind_KIND_NETWORK && caps.GetMultiQueueTaps() {
		t.Errorf("Capabilities multi_queue_taps is set but is not for a %s driver", driver.KindName(s.kind))
	}
	for _, l := range lists {
		if len(l.values) > 0 && l.kind != s.kind {
			t.Errorf("Capabilities %s is set (%v) but is not for a %s driver", l.field, l.values, driver.KindName(s.kind))
			continue
		}
		seen := map[string]bool{}
		for _, v := range l.values {
			switch {
			case seen[v]:
				t.Errorf("Capabilities %s lists %q twice", l.field, v)
			case v == "":
				t.Errorf("Capabilities %s lists an empty value", l.field)
			case l.known != nil && !slices.Contains(l.known, v):
				t.Errorf("Capabilities %s lists %q, which the host does not know (want some of %v)", l.field, v, l.known)
			case l.field == "resources" && !resourceName.MatchString(v):
				t.Errorf("Capabilities resources lists %q, which is not usable in a resource name (devices.kubevisor.io/<name>)", v)
			}
			seen[v] = true
		}
	}
}

func featureNames(fs []basev1.Feature) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.String()
	}
	return out
}

// allOptional implements every optional interface, so that CheckCapabilities checks only that
// features are known and of the right kind.
type allOptional struct {
	driver.Pauser
	driver.Rebooter
	driver.SoftRebooter
	driver.GuestAgent
	driver.GuestExecer
	driver.Consoler
	driver.Displayer
	driver.Recoverer
	driver.Migrator
	driver.NetworkChecker
	driver.DeviceWatcher
}

// checkCapabilitiesImplementsDeclared: the implementation offers every optional interface it
// declares. It needs the implementation: the driver under test itself when it is not a client,
// or Options.Implementation.
func (s *suite) checkCapabilitiesImplementsDeclared(t T) {
	impl := s.opts.Implementation
	if impl == nil {
		if d := s.unconfigured(t); !isClient(d) {
			impl = d
		}
	}
	if impl == nil {
		t.Skipf("the implementation is behind the plugin boundary: driver.Serve checked it when the plugin started")
	}
	caps := s.capabilities(t, impl)
	if err := driver.CheckCapabilities(s.kind, impl, caps); err != nil {
		t.Errorf("%v", err)
	}
}

// labelPart is a valid Kubernetes label name (without prefix) or non-empty label value.
var labelPart = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

// checkFingerprintSendsAtOnce: Fingerprint sends at once, with a health and attributes that are
// valid label name parts.
func (s *suite) checkFingerprintSendsAtOnce(t T) {
	d := s.driver(t)
	fp := startFingerprint(s, t, d)
	msg := fp.first(t, s.opts.Timeout)
	if msg.GetHealth() == basev1.Health_HEALTH_UNSPECIFIED {
		t.Errorf("Fingerprint health is unspecified")
	}
	for k, v := range msg.GetAttributes() {
		if !labelPart.MatchString(k) {
			t.Errorf("Fingerprint attribute name %q is not a valid label name part", k)
		}
		if v != "" && !labelPart.MatchString(v) {
			t.Errorf("Fingerprint attribute %s=%q: the value is not a valid label value", k, v)
		}
	}
}

// checkFingerprintStopsOnCancel: Fingerprint returns nil once its context is done.
func (s *suite) checkFingerprintStopsOnCancel(t T) {
	d := s.driver(t)
	fp := startFingerprint(s, t, d)
	fp.first(t, s.opts.Timeout)
	if err := fp.stop(s.opts.Timeout); err != nil {
		t.Errorf("Fingerprint after its context was cancelled: %v", err)
	}
}

// fingerprintStream is a Fingerprint call running in the background.
type fingerprintStream struct {
	msgs   chan *basev1.FingerprintResponse
	cancel context.CancelFunc
	done   chan error
}

func startFingerprint(s *suite, t T, d driver.Driver) *fingerprintStream {
	ctx, cancel := context.WithCancel(t.Context())
	fp := &fingerprintStream{msgs: make(chan *basev1.FingerprintResponse, 16), cancel: cancel, done: make(chan error, 1)}
	go func() {
		fp.done <- d.Fingerprint(ctx, func(m *basev1.FingerprintResponse) error {
			select {
			case fp.msgs <- m:
			default: // the check reads only the first messages
			}
			return nil
		})
	}()
	t.Cleanup(func() { _ = fp.stop(s.opts.Timeout) })
	return fp
}

// first waits for the first message.
func (fp *fingerprintStream) first(t T, timeout time.Duration) *basev1.FingerprintResponse {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case msg := <-fp.msgs:
		return msg
	case err := <-fp.done:
		fp.done <- err
		t.Fatalf("Fingerprint returned before sending anything: %s", describe(err))
	case <-timer.C:
		t.Fatalf("Fingerprint sent nothing within %s; it must send at once", timeout)
	}
	return nil
}

// stop cancels the call and returns its error, or an error if it does not return in time.
func (fp *fingerprintStream) stop(timeout time.Duration) error {
	fp.cancel()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-fp.done:
		fp.done <- err
		if err != nil {
			return fmt.Errorf("returned %s, want nil", describe(err))
		}
		return nil
	case <-timer.C:
		return fmt.Errorf("did not return within %s", timeout)
	}
}

// checkConfigureIdempotent: Configure succeeds again with the same configuration.
func (s *suite) checkConfigureIdempotent(t T) {
	d := s.driver(t)
	for i := 2; i <= 3; i++ {
		if err := d.Configure(s.ctx(t), s.configureRequest(s.opts.Config)); err != nil {
			t.Fatalf("Configure with the same configuration, call %d: %s", i, describe(err))
		}
	}
}

// checkConfigureEmpty: an empty configuration is accepted as the defaults. A driver the kit
// configured with another (non-empty) configuration first may refuse it with
// FailedPrecondition, as a configured driver may refuse another request: then the check is
// skipped, saying so.
func (s *suite) checkConfigureEmpty(t T) {
	d := s.driver(t)
	t.Cleanup(func() {
		// Restore the configuration for the checks that follow on the same driver.
		ctx, cancel := s.cleanupCtx()
		defer cancel()
		if err := d.Configure(ctx, s.configureRequest(s.opts.Config)); err != nil {
			t.Errorf("Configure with the configuration again after an empty one: %s", describe(err))
		}
	})
	err := d.Configure(s.ctx(t), s.configureRequest(nil))
	if status.Code(err) == codes.FailedPrecondition && len(s.opts.Config) > 0 {
		t.Skipf("the driver, configured with the suite's configuration, refuses another one (%s), as a configured driver may", describe(err))
	}
	if err != nil {
		t.Errorf("Configure with an empty configuration: %s; an empty configuration means the defaults", describe(err))
	}
}

// describe formats an error with its gRPC status code.
func describe(err error) string {
	if err == nil {
		return "no error"
	}
	if st, ok := status.FromError(err); ok {
		return fmt.Sprintf("%s: %s", st.Code(), st.Message())
	}
	return fmt.Sprintf("%v (not a gRPC status: %s)", err, codes.Unknown)
}

// expectCode fails the check unless err has the code want. what describes the call.
func expectCode(t T, err error, want codes.Code, what string) bool {
	t.Helper()
	if got := status.Code(err); got != want {
		if want == codes.OK {
			t.Errorf("%s: %s, want success", what, describe(err))
		} else {
			t.Errorf("%s: got %s, want %s", what, describe(err), want)
		}
		return false
	}
	return true
}

// expectMessageNames fails the check unless err's message contains one of names.
func expectMessageNames(t T, err error, what string, names ...string) {
	t.Helper()
	msg := status.Convert(err).Message()
	for _, n := range names {
		if strings.Contains(msg, n) {
			return
		}
	}
	t.Errorf("%s: the error %q does not name %s", what, msg, strings.Join(quoteAll(names), " or "))
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

// newID returns a random id in the form of a Kubernetes UID (a version 4 UUID), as the host
// uses for VMIs.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// poll calls cond until it returns true or ctx is done; it returns whether cond returned true.
func poll(ctx context.Context, cond func() bool) bool {
	wait := 5 * time.Millisecond
	for {
		if cond() {
			return true
		}
		select {
		case <-ctx.Done():
			return cond()
		case <-time.After(wait):
		}
		wait = min(2*wait, 250*time.Millisecond)
	}
}
