package mcs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/selinux/go-selinux"
	"golang.org/x/sys/unix"
)

// TestNodeModeDisabled: on a machine without SELinux (these test machines), the node's mode is
// disabled and the node's labeler labels nothing: no security.selinux attribute appears.
func TestNodeModeDisabled(t *testing.T) {
	if selinux.GetEnabled() {
		t.Skip("SELinux is enabled on this machine")
	}
	if m := NodeMode(); m != ModeDisabled {
		t.Fatalf("NodeMode() = %q, want %q", m, ModeDisabled)
	}
	l := NodeLabeler()
	if l.Enabled() {
		t.Fatal("the labeler of a node without SELinux is enabled")
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "disk.qcow2")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	level, _ := NewLevel(4, 9)
	if err := l.Label(level, dir, true); err != nil {
		t.Fatalf("Label on a node without SELinux: %v", err)
	}
	buf := make([]byte, 256)
	if n, err := unix.Lgetxattr(file, "security.selinux", buf); err == nil {
		t.Errorf("the file has the label %q", buf[:n])
	}
	if _, err := ContainerFileLabel(level); err == nil {
		t.Error("ContainerFileLabel without SELinux gave a label")
	}
}

type chconCall struct {
	path, label string
	recurse     bool
}

func fakeLabeler(mode Mode, calls *[]chconCall, chconErr error) *Labeler {
	return &Labeler{
		Mode:      mode,
		FileLabel: func(l Level) (string, error) { return fileLabelAt("system_u:object_r:container_file_t:s0", l) },
		Chcon: func(path, label string, recurse bool) error {
			*calls = append(*calls, chconCall{path, label, recurse})
			return chconErr
		},
	}
}

// TestLabelEnabled: where SELinux is enabled (enforcing or permissive), Label sets the
// container file context at the VMI's level, through Chcon; a path that does not exist is left
// alone.
func TestLabelEnabled(t *testing.T) {
	level, _ := NewLevel(12, 700)
	dir := t.TempDir()
	volumes := filepath.Join(dir, "volumes")
	if err := os.Mkdir(volumes, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []Mode{ModeEnforcing, ModePermissive} {
		var calls []chconCall
		l := fakeLabeler(mode, &calls, nil)
		for _, c := range []chconCall{{path: volumes, recurse: true}, {path: dir}, {path: filepath.Join(dir, "run"), recurse: true}} {
			if err := l.Label(level, c.path, c.recurse); err != nil {
				t.Fatal(err)
			}
		}
		want := []chconCall{
			{volumes, "system_u:object_r:container_file_t:s0:c12,c700", true},
			{dir, "system_u:object_r:container_file_t:s0:c12,c700", false},
		}
		if !slices.Equal(calls, want) {
			t.Errorf("%s: Chcon calls %+v, want %+v", mode, calls, want)
		}
	}
	var calls []chconCall
	if err := fakeLabeler(ModeDisabled, &calls, nil).Label(level, dir, true); err != nil || len(calls) > 0 {
		t.Errorf("disabled: %v, calls %v", err, calls)
	}
	if err := fakeLabeler(ModeEnforcing, &calls, nil).Label(Level{}, dir, true); err == nil {
		t.Error("labelled at no level")
	}
	err := fakeLabeler(ModeEnforcing, &calls, errors.New("operation not supported")).Label(level, dir, true)
	if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "operation not supported") {
		t.Errorf("a failed Chcon: %v", err)
	}
}

func TestFileLabelAt(t *testing.T) {
	level, _ := NewLevel(1, 2)
	for base, want := range map[string]string{
		"system_u:object_r:container_file_t:s0":             "system_u:object_r:container_file_t:s0:c1,c2",
		"system_u:object_r:container_file_t:s0:c1022,c1023": "system_u:object_r:container_file_t:s0:c1,c2",
		"system_u:object_r:svirt_sandbox_file_t":            "system_u:object_r:svirt_sandbox_file_t:s0:c1,c2",
		"system_u:object_r:container_file_t:s0-s0:c0.c1023": "system_u:object_r:container_file_t:s0:c1,c2",
	} {
		if got, err := fileLabelAt(base, level); err != nil || got != want {
			t.Errorf("fileLabelAt(%q) = %q, %v; want %q", base, got, err, want)
		}
	}
	for _, base := range []string{"", "nolabel"} {
		if got, err := fileLabelAt(base, level); err == nil {
			t.Errorf("fileLabelAt(%q) = %q, want an error", base, got)
		}
	}
}
