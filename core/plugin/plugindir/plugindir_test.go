package plugindir

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubevisor/kubevisor/core/plugin"
)

// image writes a driver image's plugin directory: a binary with content body and its
// manifest, whose sha256 is sum (the body's digest when empty).
func image(t *testing.T, name, kind, binary, body, sum string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, binary), []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	if sum == "" {
		h := sha256.Sum256([]byte(body))
		sum = hex.EncodeToString(h[:])
	}
	manifest := `{"name": "` + name + `", "kind": "` + kind + `", "binary": "` + binary + `", "sha256": "` + sum + `", "config": {"a": 1}}`
	if err := os.WriteFile(filepath.Join(dir, "plugin.json"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestInstallTwoImagesWithTheSameFileNames(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "plugins")
	for _, d := range []struct{ name, kind, body string }{
		{"hostpath", "storage", "#!/bin/true storage"},
		{"example-sim", "device", "#!/bin/true device"},
	} {
		installed, err := Install(image(t, d.name, d.kind, "driver", d.body, ""), dst)
		if err != nil || len(installed) != 1 || installed[0].Mismatch != "" {
			t.Fatalf("Install %s: %+v, %v", d.name, installed, err)
		}
	}
	fi, err := os.Stat(dst)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("plugin directory: %v, %v; want mode 0700", fi.Mode(), err)
	}
	found, err := plugin.Discover(dst)
	if err != nil || len(found) != 2 {
		t.Fatalf("Discover: %+v, %v", found, err)
	}
	for _, m := range found {
		want := filepath.Join(dst, m.Name, "driver")
		if m.Binary != want {
			t.Errorf("%s: binary %s, want %s", m.Name, m.Binary, want)
		}
		if strings.Join(strings.Fields(string(m.Config)), "") != `{"a":1}` {
			t.Errorf("%s: config %s", m.Name, m.Config)
		}
		// The host's own check: the manifest's digest matches what was copied.
		again, err := plugin.ManifestFor(m.Binary, m.Kind, m.Name)
		if err != nil || again.SHA256 != m.SHA256 {
			t.Errorf("%s: copied binary's digest %s, manifest %s (%v)", m.Name, again.SHA256, m.SHA256, err)
		}
		fi, err := os.Stat(filepath.Join(dst, m.Name+".json"))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: manifest mode %v, %v; want 0600", m.Name, fi.Mode(), err)
		}
		fi, err = os.Stat(filepath.Join(dst, m.Name))
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: binary directory mode %v, %v; want 0700", m.Name, fi.Mode(), err)
		}
	}
	// No temporary file left behind.
	entries, _ := os.ReadDir(dst)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

func TestInstallMismatchIsInstalledAndReported(t *testing.T) {
	dst := t.TempDir()
	wrong := strings.Repeat("ab", 32)
	installed, err := Install(image(t, "bad", "device", "drv", "body", wrong), dst)
	if err != nil || len(installed) != 1 {
		t.Fatalf("Install: %+v, %v", installed, err)
	}
	h := sha256.Sum256([]byte("body"))
	if got, want := installed[0].Mismatch, hex.EncodeToString(h[:]); got != want {
		t.Errorf("Mismatch = %q, want %q", got, want)
	}
	if installed[0].Manifest.SHA256 != wrong {
		t.Errorf("manifest digest rewritten to %s: the host must see the image's own", installed[0].Manifest.SHA256)
	}
}

func TestInstallErrors(t *testing.T) {
	if _, err := Install(t.TempDir(), t.TempDir()); err == nil || !strings.Contains(err.Error(), "no manifest") {
		t.Errorf("empty image: %v, want an error saying there is no manifest", err)
	}
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "plugin.json"), []byte(`{"name": "x", "kind": "device"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(bad, t.TempDir()); err == nil || !strings.Contains(err.Error(), "plugin.json") || !strings.Contains(err.Error(), "binary: required") {
		t.Errorf("bad manifest: %v, want the file and the field named", err)
	}
	missing := image(t, "gone", "device", "drv", "body", "")
	if err := os.Remove(filepath.Join(missing, "drv")); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(missing, t.TempDir()); err == nil || !strings.Contains(err.Error(), `driver "gone"`) {
		t.Errorf("missing binary: %v, want the driver named", err)
	}
}

func TestPrepareMakesAnExistingDirectoryRootOnly(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := Prepare(dir); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("mode %v, want 0700", fi.Mode().Perm())
	}
}
