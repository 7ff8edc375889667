package plugindir

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/core/plugin"
	"github.com/kubevisor/kubevisor/internal/testbin"
)

// TestHostRunsInstalledDrivers installs two driver images of the plugin host's test driver,
// one whose manifest has a wrong sha256, the way the handler DaemonSet's init containers do,
// and starts what the plugin directory holds as the handler does (plugin.Discover, Host.Start):
// the good driver runs from its subdirectory with its manifest's args; the other is refused
// with an error naming it and the mismatch, and the good one keeps answering.
func TestHostRunsInstalledDrivers(t *testing.T) {
	bin := t.TempDir()
	if err := testbin.Build(bin, false, "github.com/kubevisor/kubevisor/core/plugin/internal/testdriver"); err != nil {
		t.Fatal(err)
	}
	imageOf := func(name, sum string) string {
		dir := t.TempDir()
		m, err := plugin.ManifestFor(filepath.Join(bin, "testdriver"), driver.KindHypervisor, name)
		if err != nil {
			t.Fatal(err)
		}
		if sum != "" {
			m.SHA256 = sum
		}
		data, err := os.ReadFile(m.Binary)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "driver"), data, 0o755); err != nil {
			t.Fatal(err)
		}
		manifest := `{"name": "` + name + `", "kind": "hypervisor", "binary": "driver", "sha256": "` + m.SHA256 + `", "args": ["name=` + name + `"]}`
		if err := os.WriteFile(filepath.Join(dir, name+".json"), []byte(manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	plugins := filepath.Join(t.TempDir(), "plugins")
	wrong := strings.Repeat("ab", 32)
	for _, img := range []string{imageOf("good", ""), imageOf("bad", wrong)} {
		if _, err := Install(img, plugins); err != nil {
			t.Fatal(err)
		}
	}
	found, err := plugin.Discover(plugins)
	if err != nil || len(found) != 2 {
		t.Fatalf("Discover: %+v, %v", found, err)
	}
	h, err := plugin.NewHost(plugin.HostConfig{StateDir: t.TempDir(), NodeName: "node-1", Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	errs := map[string]error{}
	for _, m := range found {
		errs[m.Name] = h.Start(ctx, m)
	}
	if errs["good"] != nil {
		t.Fatalf("good driver: %v", errs["good"])
	}
	want := `driver "bad": binary ` + filepath.Join(plugins, "bad", "driver") + `: sha256 mismatch: manifest says ` + wrong
	if err := errs["bad"]; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("bad driver: %v; want an error containing %q", err, want)
	}
	d, err := h.Driver("good")
	if err != nil {
		t.Fatal(err)
	}
	info, err := d.Info(ctx)
	if err != nil || info.GetName() != "good" {
		t.Errorf("good driver Info: %v, %v", info, err)
	}
	if st := h.Status("bad"); st.Running {
		t.Errorf("bad driver status %+v: running", st)
	}
}
