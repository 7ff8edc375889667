package layout

import (
	"go/build"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// TestPaths pins the layout: the control plane and nodes of different versions meet in it.
func TestPaths(t *testing.T) {
	const uid = types.UID("6f1c")
	for _, tc := range []struct {
		name, got, want string
	}{
		{"VMIsDir default", VMIsDir(""), "/var/run/kubevisor/vmi"},
		{"VMIsDir", VMIsDir("/run/kubevisor"), "/run/kubevisor/vmi"},
		{"VMIDir default", VMIDir("", uid), "/var/run/kubevisor/vmi/6f1c"},
		{"VMIDir", VMIDir("/run/kubevisor/", uid), "/run/kubevisor/vmi/6f1c"},
		{"LauncherDir", LauncherDir("/run/kubevisor", uid), "/run/kubevisor/vmi/6f1c/launcher"},
		{"ConsoleLog", ConsoleLog("/run/kubevisor", uid), "/run/kubevisor/vmi/6f1c/console.log"},
		{"GuestProbeDir", GuestProbeDir("/run/kubevisor", uid), "/run/kubevisor/vmi/6f1c/guest-probe"},
		{"GuestProbeSocket", GuestProbeSocket("", uid), "/var/run/kubevisor/vmi/6f1c/guest-probe/probe.sock"},
		{"ContainerDiskDir", ContainerDiskDir("/run/kubevisor", uid), "/run/kubevisor/vmi/6f1c/containerdisks"},
		{"ContainerDiskSocket", ContainerDiskSocket("/run/kubevisor", uid, "root"), "/run/kubevisor/vmi/6f1c/containerdisks/root.sock"},
		{"ContainerDiskImage", ContainerDiskImage("", uid, "root"), "/var/run/kubevisor/vmi/6f1c/containerdisks/root.img"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}

// TestImports keeps the package usable by the launcher image's static, stdlib-only helpers.
func TestImports(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		if !slices.Contains([]string{"path", "time", "k8s.io/apimachinery/pkg/types"}, imp) {
			t.Errorf("imports %s: the launcher image's static helpers link this package", imp)
		}
	}
}
