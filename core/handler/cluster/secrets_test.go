package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadSecretDir reads a Secret volume laid out as the kubelet writes it (keys are symlinks
// into ..data, a symlink to a timestamped directory) inside a container root, and follows an
// absolute symlink inside that root, not on the node.
func TestReadSecretDir(t *testing.T) {
	root := t.TempDir()
	dir := "/var/run/kubevisor-private/secrets/keys"
	vol := filepath.Join(root, dir)
	ts := filepath.Join(vol, "..2026_12_02_14_00_00.000000001")
	mustMkdir(t, ts)
	mustWrite(t, filepath.Join(ts, "alice"), "ssh-ed25519 A alice\n")
	mustWrite(t, filepath.Join(ts, "bob"), "ssh-ed25519 B bob\n")
	mustSymlink(t, filepath.Base(ts), filepath.Join(vol, "..data"))
	mustSymlink(t, "..data/alice", filepath.Join(vol, "alice"))
	mustSymlink(t, "..data/bob", filepath.Join(vol, "bob"))
	// Absolute: resolved in the container's root, where /etc/hostname is the container's.
	mustMkdir(t, filepath.Join(root, "etc"))
	mustWrite(t, filepath.Join(root, "etc", "hostname"), "the container's")
	mustSymlink(t, "/etc/hostname", filepath.Join(vol, "host"))

	data, err := readSecretDir(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"alice": "ssh-ed25519 A alice\n", "bob": "ssh-ed25519 B bob\n", "host": "the container's"}
	if len(data) != len(want) {
		t.Errorf("keys %v, want %v", keysOf(data), want)
	}
	for k, v := range want {
		if string(data[k]) != v {
			t.Errorf("%s = %q, want %q", k, data[k], v)
		}
	}

	if _, err := readSecretDir(root, "/var/run/kubevisor-private/secrets/other"); err == nil || !strings.Contains(err.Error(), "not mounted") {
		t.Errorf("a Secret not mounted: %v", err)
	}
}

func keysOf(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func mustMkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o700); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func mustSymlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}
