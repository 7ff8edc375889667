package handler

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kubevisor/kubevisor/internal/testenv"
	"k8s.io/apimachinery/pkg/types"
)

// ownerOf is the uid and gid of path (not followed).
func ownerOf(t *testing.T, path string) (int, int) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return int(st.Uid), int(st.Gid)
}

// TestOwnerGivesFiles: a sandbox whose processes run as 107 (an unprivileged launcher pod) gets
// the sandbox directory itself, and everything in the storage driver's work directory and the
// run directory, as 107's before the VM starts; the launcher's own directory stays as it is;
// the network driver is asked for taps of 107; OwnFiles gives what the program around the
// handler makes, for that VMI only. A sandbox without an owner leaves everything root's.
func TestOwnerGivesFiles(t *testing.T) {
	testenv.Root(t, "giving files to another user")
	e := newEnv(t, fakeSet, fakeManifests(t))
	owned, dir := sandboxWithLevel(t, e, "uid-107", "")
	owned.Owner = &FileOwner{UID: 107, GID: 108}
	rootOnly, rootDir := sandboxWithLevel(t, e, "uid-root", "")
	e.opts.Sandboxes = sandboxesOf(map[types.UID]*testSandbox{"uid-107": newTestSandbox(owned), "uid-root": newTestSandbox(rootOnly)})
	h := e.start()
	mustRun(t, h, testVMI("owned", "uid-107", e.disk))
	mustRun(t, h, testVMI("root", "uid-root", e.disk))

	var files int
	for _, sub := range []string{SandboxVolumesDir, SandboxRunDir} {
		err := filepath.Walk(filepath.Join(dir, sub), func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			if filepath.Base(p) == "kubevisor-fake-vm.json" {
				return nil // the fake hypervisor's record, written at Start, after the step
			}
			files++
			if uid, gid := ownerOf(t, p); uid != 107 || gid != 108 {
				t.Errorf("%s is %d:%d, want 107:108", p, uid, gid)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if files < 3 { // the two directories and a file at least (the disk's overlay)
		t.Errorf("%d files under the work and run directories, want the storage driver's too", files)
	}
	if uid, gid := ownerOf(t, dir); uid != 107 || gid != 108 {
		t.Errorf("sandbox directory is %d:%d, want 107:108", uid, gid)
	}
	if uid, _ := ownerOf(t, filepath.Join(dir, "launcher")); uid != 0 {
		t.Errorf("the launcher's directory is %d's, want it left root's", uid)
	}
	h.mu.Lock()
	req := h.vmis["uid-107"].state.setupRequest()
	h.mu.Unlock()
	if u := req.GetSandboxUser(); u.GetUid() != 107 || u.GetGid() != 108 {
		t.Errorf("network Setup's sandbox_user = %v, want 107:108", u)
	}

	probe := filepath.Join(dir, "guest-probe")
	if err := os.Mkdir(probe, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := h.OwnFiles("uid-107", probe, true); err != nil {
		t.Fatal(err)
	}
	if uid, _ := ownerOf(t, probe); uid != 107 {
		t.Errorf("OwnFiles left %s %d's, want 107's", probe, uid)
	}

	// Root's sandbox: nothing given away, and no sandbox_user asked.
	_ = filepath.Walk(rootDir, func(p string, _ os.FileInfo, err error) error {
		if err == nil {
			if uid, _ := ownerOf(t, p); uid != 0 {
				t.Errorf("%s of a root sandbox is %d's", p, uid)
			}
		}
		return nil
	})
	rootProbe := filepath.Join(rootDir, "guest-probe")
	if err := os.Mkdir(rootProbe, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := h.OwnFiles("uid-root", rootProbe, true); err != nil {
		t.Fatal(err)
	}
	if uid, _ := ownerOf(t, rootProbe); uid != 0 {
		t.Errorf("OwnFiles gave a root sandbox's %s to %d", rootProbe, uid)
	}
	h.mu.Lock()
	rreq := h.vmis["uid-root"].state.setupRequest()
	h.mu.Unlock()
	if rreq.GetSandboxUser() != nil {
		t.Errorf("network Setup of a root sandbox asked for sandbox_user %v", rreq.GetSandboxUser())
	}
}
