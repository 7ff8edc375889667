package manifests_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// exampleComponents are the driver components of the out-of-tree examples, which install their
// drivers from driver images (docs/driver-authoring.md), as render takes them: relative to
// install/drivers.
var exampleComponents = []string{"../../../examples/hostpath-storage/deploy", "../../../examples/sim-device/deploy"}

// TestDriverImages: driver components from driver images append init containers that run after
// the base's plugin-dir (which prepares the plugin directory and leaves the installer in
// plugin-tools), copy into the volume the handler reads as its pluginDir, read-only for the
// handler, and configure their drivers; the default install keeps its drivers in the image.
func TestDriverImages(t *testing.T) {
	r := render(t, append([]string{"qmp", "cni"}, exampleComponents...), "")
	var ds appsv1.DaemonSet
	r.get(t, "DaemonSet", "kubevisor-handler", &ds)
	spec := ds.Spec.Template.Spec
	cfg := r.handlerConfig(t)
	if cfg.PluginDir == "" {
		t.Fatal("the handler configuration has no pluginDir")
	}
	if d := cfg.Drivers; d.Storage != "hostpath" || d.Device != "sim" || d.Network != "cni" {
		t.Errorf("handler drivers %+v, want storage hostpath, device sim, network cni", d)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	// mountOf returns the volume c mounts at path, and whether read-only.
	mountOf := func(c corev1.Container, path string) (string, bool) {
		for _, m := range c.VolumeMounts {
			if m.MountPath == path {
				return m.Name, m.ReadOnly
			}
		}
		return "", false
	}
	h := container(t, spec, "handler")
	pluginVol, ro := mountOf(h, cfg.PluginDir)
	if pluginVol == "" || !ro {
		t.Fatalf("the handler mounts its pluginDir %s: volume %q, read-only %v; want a read-only volume", cfg.PluginDir, pluginVol, ro)
	}
	if v := volumes[pluginVol]; v.EmptyDir == nil {
		t.Errorf("plugin volume %s: %+v, want an emptyDir (filled by the init containers at each start)", pluginVol, v.VolumeSource)
	}
	names := make([]string, len(spec.InitContainers))
	for i, c := range spec.InitContainers {
		names[i] = c.Name
	}
	prep := slices.Index(names, "plugin-dir")
	if prep < 0 {
		t.Fatalf("no plugin-dir init container: %v", names)
	}
	p := spec.InitContainers[prep]
	if !slices.Contains(p.Command, "--plugin-dir="+cfg.PluginDir) {
		t.Errorf("plugin-dir command %v does not prepare %s", p.Command, cfg.PluginDir)
	}
	var toolsDir string
	for _, a := range p.Command {
		if v, ok := strings.CutPrefix(a, "--copy-self-to="); ok {
			toolsDir = v
		}
	}
	toolsVol, _ := mountOf(p, toolsDir)
	if v, _ := mountOf(p, cfg.PluginDir); v != pluginVol || toolsVol == "" {
		t.Fatalf("plugin-dir mounts %q at the pluginDir and %q at %q", v, toolsVol, toolsDir)
	}
	for _, name := range []string{"driver-hostpath", "driver-sim"} {
		i := slices.Index(names, name)
		if i < prep {
			t.Errorf("init container %s at %d, plugin-dir at %d: it must run after (init containers: %v)", name, i, prep, names)
			continue
		}
		c := spec.InitContainers[i]
		if len(c.Command) == 0 || filepath.Dir(c.Command[0]) != toolsDir || !slices.Contains(c.Command, "--plugin-dir="+cfg.PluginDir) {
			t.Errorf("%s command %v: want the installer in %s copying into %s", name, c.Command, toolsDir, cfg.PluginDir)
		}
		if v, ro := mountOf(c, cfg.PluginDir); v != pluginVol || ro {
			t.Errorf("%s mounts %q at %s (read-only %v), want %s writable", name, v, cfg.PluginDir, ro, pluginVol)
		}
		if v, ro := mountOf(c, toolsDir); v != toolsVol || !ro {
			t.Errorf("%s mounts %q at %s (read-only %v), want %s read-only", name, v, toolsDir, ro, toolsVol)
		}
		for _, m := range c.VolumeMounts {
			if volumes[m.Name].HostPath != nil {
				t.Errorf("%s mounts the host path volume %s: a driver image reaches nothing of the node", name, m.Name)
			}
		}
		sc := c.SecurityContext
		if sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("%s security context %+v: want no privilege, no escalation, capabilities dropped", name, sc)
		}
		if c.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("%s pull policy %q", name, c.ImagePullPolicy)
		}
	}

	// The default install: its drivers come from the handler image, and its only init
	// containers are Kubevisor's.
	def := render(t, drivers(t), "")
	var dds appsv1.DaemonSet
	def.get(t, "DaemonSet", "kubevisor-handler", &dds)
	for _, c := range dds.Spec.Template.Spec.InitContainers {
		if strings.HasPrefix(c.Name, "driver-") {
			t.Errorf("the in-tree components add init container %s: their drivers are in the handler image", c.Name)
		}
	}
}
