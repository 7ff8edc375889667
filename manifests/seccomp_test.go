package manifests_test

import (
	"path"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubevisor/kubevisor/core/seccomp"
)

// TestHandlerInstallsSeccompProfile: the handler DaemonSet writes the launcher's Localhost
// profile into the kubelet's seccomp directory before the handler runs, from a container that
// can write that one directory of the node and nothing else.
func TestHandlerInstallsSeccompProfile(t *testing.T) {
	r := render(t, drivers(t), "")
	var ds appsv1.DaemonSet
	r.get(t, "DaemonSet", "kubevisor-handler", &ds)
	spec := ds.Spec.Template.Spec
	dir := path.Join(seccomp.KubeletDir, path.Dir(seccomp.LauncherProfileName))

	i := slices.IndexFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == "install-seccomp" })
	if i < 0 {
		t.Fatal("the handler DaemonSet has no init container install-seccomp")
	}
	c := spec.InitContainers[i]
	if want := []string{"kubevisor-handler", "install-seccomp", "--dir=" + dir}; !slices.Equal(c.Command, want) || len(c.Args) > 0 {
		t.Errorf("install-seccomp command %q args %q, want %q", c.Command, c.Args, want)
	}
	if c.Image != container(t, spec, "handler").Image {
		t.Errorf("install-seccomp image %s, want the handler's (its kubevisor-handler writes the profile it embeds)", c.Image)
	}
	sc := c.SecurityContext
	if sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("install-seccomp security context %+v: want unprivileged, no privilege escalation, read-only root, every capability dropped", sc)
	}
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != dir || c.VolumeMounts[0].ReadOnly || c.VolumeMounts[0].SubPath != "" {
		t.Fatalf("install-seccomp mounts %+v, want %s alone, writable", c.VolumeMounts, dir)
	}
	vi := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[0].Name })
	if vi < 0 {
		t.Fatalf("no volume %s", c.VolumeMounts[0].Name)
	}
	hp := spec.Volumes[vi].HostPath
	if hp == nil || hp.Path != dir || hp.Type == nil || *hp.Type != corev1.HostPathDirectoryOrCreate {
		t.Errorf("volume %s = %+v, want the hostPath %s (DirectoryOrCreate): Kubevisor's directory of the kubelet's seccomp profiles, not more", spec.Volumes[vi].Name, hp, dir)
	}
	// Nothing else mounts it: only this container writes the profile.
	for _, o := range slices.Concat(spec.InitContainers, spec.Containers) {
		if o.Name == c.Name {
			continue
		}
		for _, m := range o.VolumeMounts {
			if m.Name == spec.Volumes[vi].Name {
				t.Errorf("container %s mounts %s too", o.Name, m.Name)
			}
		}
	}
	// Before the handler and the device plugins (which let launcher pods be scheduled) start:
	// an init container, so it runs to completion first; and the controller keeps the
	// Localhost default.
	var dep appsv1.Deployment
	r.get(t, "Deployment", "kubevisor-controller", &dep)
	if v, ok := flagValue(container(t, dep.Spec.Template.Spec, "controller"), "--launcher-seccomp-profile"); ok && v != string(corev1.SeccompProfileTypeLocalhost) {
		t.Errorf("controller --launcher-seccomp-profile=%s: the install ships the Localhost profile", v)
	}
}
