package handler

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/mcs"
)

// chconCall is one call of a recordingLabeler's Chcon.
type chconCall struct {
	path, label string
	recurse     bool
}

// recordingLabeler is an mcs.Labeler of a node in mode whose Chcon records its calls (and
// fails with err), as the library's would set them on a node with SELinux enabled.
type recordingLabeler struct {
	mu    sync.Mutex
	calls []chconCall
	err   error
}

func (r *recordingLabeler) labeler(mode mcs.Mode) *mcs.Labeler {
	return &mcs.Labeler{
		Mode:      mode,
		FileLabel: func(l mcs.Level) (string, error) { return "system_u:object_r:container_file_t:" + l.String(), nil },
		Chcon: func(path, label string, recurse bool) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.calls = append(r.calls, chconCall{path, label, recurse})
			return r.err
		},
	}
}

func (r *recordingLabeler) taken() []chconCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.calls)
	r.calls = nil
	return out
}

// sandboxWithLevel is a sandbox with a directory under the env's and an SELinux level.
func sandboxWithLevel(t *testing.T, e *env, uid types.UID, level string) (SandboxSpec, string) {
	t.Helper()
	dir := filepath.Join(e.dir, "vmi", string(uid))
	if err := os.MkdirAll(filepath.Join(dir, "launcher"), 0o700); err != nil {
		t.Fatal(err)
	}
	return SandboxSpec{NetNSPath: "/run/netns/none", Dir: dir, SELinuxLevel: level}, dir
}

// TestSELinuxLabelsEnabled: on a node with SELinux enabled, the sync labels the sandbox
// directory (itself only), the storage driver's work directory and the run directory with the
// sandbox's level before the VM starts, LabelFiles labels what the program around the handler
// makes there, and the node label says the mode.
func TestSELinuxLabelsEnabled(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	rec := &recordingLabeler{}
	e.opts.SELinux = rec.labeler(mcs.ModeEnforcing)
	spec, dir := sandboxWithLevel(t, e, "uid-se", "s0:c3,c811")
	e.opts.Sandboxes = sandboxesOf(map[types.UID]*testSandbox{"uid-se": newTestSandbox(spec)})
	h := e.start()
	mustRun(t, h, testVMI("se", "uid-se", e.disk))

	const label = "system_u:object_r:container_file_t:s0:c3,c811"
	want := []chconCall{
		{dir, label, false},
		{filepath.Join(dir, SandboxVolumesDir), label, true},
		{filepath.Join(dir, SandboxRunDir), label, true},
	}
	if got := rec.taken(); !slices.Equal(got, want) {
		t.Errorf("labelled %+v, want %+v", got, want)
	}
	probe := filepath.Join(dir, "guest-probe")
	if err := os.Mkdir(probe, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := h.LabelFiles("uid-se", probe, true); err != nil {
		t.Fatal(err)
	}
	if err := h.LabelFiles("uid-unknown", probe, true); err != nil {
		t.Fatal(err)
	}
	if got := rec.taken(); !slices.Equal(got, []chconCall{{probe, label, true}}) {
		t.Errorf("LabelFiles labelled %+v, want only %s of uid-se", got, probe)
	}
	if got := h.NodeLabels()[v1alpha1.SELinuxNodeLabel]; got != "enforcing" {
		t.Errorf("node label %s = %q, want enforcing", v1alpha1.SELinuxNodeLabel, got)
	}
}

// TestSELinuxLabelFails: a label that cannot be set, or a sandbox level that is not one, fails
// the sync with SELinuxLabelFailed naming the cause, and what the sync made is undone.
func TestSELinuxLabelFails(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	rec := &recordingLabeler{err: errors.New("lsetxattr: operation not supported")}
	e.opts.SELinux = rec.labeler(mcs.ModePermissive)
	failing, _ := sandboxWithLevel(t, e, "uid-xattr", "s0:c1,c2")
	bad, _ := sandboxWithLevel(t, e, "uid-bad", "s0:c2,c1")
	e.opts.Sandboxes = sandboxesOf(map[types.UID]*testSandbox{"uid-xattr": newTestSandbox(failing), "uid-bad": newTestSandbox(bad)})
	h := e.start()
	for uid, want := range map[types.UID]string{"uid-xattr": "operation not supported", "uid-bad": `"s0:c2,c1"`} {
		vmi := testVMI(string(uid), uid, e.disk)
		st, err := doSync(t, h, vmi)
		if err == nil {
			t.Fatalf("%s: Sync succeeded", uid)
		}
		c := Condition(st, v1alpha1.VirtualMachineInstanceSynchronized)
		if c == nil || c.Reason != ReasonSELinuxLabelFailed || !strings.Contains(c.Message, want) {
			t.Errorf("%s: Synchronized = %+v, want %s saying %s", uid, c, ReasonSELinuxLabelFailed, want)
		}
		requireNothingLeft(t, h, uid)
	}
}

// TestSELinuxDisabled: on a node without SELinux (this machine, through the library), the node
// label says disabled, a VMI whose sandbox has a level runs, and nothing is labelled; a
// disabled labeler never calls Chcon.
func TestSELinuxDisabled(t *testing.T) {
	if mcs.NodeMode() != mcs.ModeDisabled {
		t.Skip("SELinux is enabled on this machine")
	}
	e := newEnv(t, fakeSet, fakeManifests(t))
	spec, dir := sandboxWithLevel(t, e, "uid-off", "s0:c3,c4")
	e.opts.Sandboxes = sandboxesOf(map[types.UID]*testSandbox{"uid-off": newTestSandbox(spec)})
	h := e.start() // Options.SELinux: the machine's
	mustRun(t, h, testVMI("off", "uid-off", e.disk))
	if got := h.NodeLabels()[v1alpha1.SELinuxNodeLabel]; got != "disabled" {
		t.Errorf("node label %s = %q, want disabled", v1alpha1.SELinuxNodeLabel, got)
	}
	buf := make([]byte, 256)
	for _, p := range []string{dir, filepath.Join(dir, SandboxRunDir)} {
		if n, err := unix.Lgetxattr(p, "security.selinux", buf); err == nil {
			t.Errorf("%s has the label %q", p, buf[:n])
		}
	}
	if err := h.LabelFiles("uid-off", dir, true); err != nil {
		t.Error(err)
	}

	e2 := newEnv(t, fakeSet, fakeManifests(t))
	rec := &recordingLabeler{}
	e2.opts.SELinux = rec.labeler(mcs.ModeDisabled)
	spec2, _ := sandboxWithLevel(t, e2, "uid-off2", "s0:c3,c4")
	e2.opts.Sandboxes = sandboxesOf(map[types.UID]*testSandbox{"uid-off2": newTestSandbox(spec2)})
	h2 := e2.start()
	mustRun(t, h2, testVMI("off2", "uid-off2", e2.disk))
	if got := rec.taken(); len(got) > 0 {
		t.Errorf("a disabled labeler labelled %+v", got)
	}
}
