package handler

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
)

// noOwner says the sandbox's processes run as root: the files stay root's.
func (r *syncRun) noOwner() bool { return r.sandbox.Owner == nil }

// ownFiles gives what the node made for the VMI in its sandbox directory to the sandbox's user
// (SandboxSpec.Owner), as labelFiles labels it: the directory itself (not what is beneath: the
// launcher's own directory, the containerDisk containers' sockets), the storage driver's work
// directory (overlays, emptyDisk images, cloud-init media) and the run directory (what
// hypervisor Create made there; the VM process makes its sockets there), and the VM's
// persistent state directory. Mounts beneath them (a claim, a containerDisk image, read-only)
// are not entered: their owners are the claim's and the image's, but for the disks the VM
// writes, which are its user's.
func (r *syncRun) ownFiles(context.Context) error {
	o := r.sandbox.Owner
	for _, p := range []struct {
		path    string
		recurse bool
	}{{r.sandbox.Dir, false}, {r.st.WorkDir, true}, {r.st.RunDir, true}} {
		if p.path == "" {
			continue
		}
		if err := chownTree(p.path, o.UID, o.GID, p.recurse); err != nil {
			return failed(ReasonOwnerFailed, err)
		}
	}
	// The VM's persistent state (its TPM's, its EFI variables), which only it writes.
	if d := r.spec.GetPersistentStateDir(); d != "" {
		if err := chownTree(d, o.UID, o.GID, true); err != nil {
			return failed(ReasonOwnerFailed, err)
		}
	}
	// Every disk the VM writes, wherever it is (a claim's disk.img, a hostDisk image), as
	// KubeVirt gives them to its qemu user; a file on a read-only mount is left as it is.
	for _, d := range r.spec.GetDisks() {
		if d.GetReadOnly() || d.GetPath() == "" {
			continue
		}
		paths := []string{d.GetPath()}
		if dir := filepath.Dir(d.GetPath()); r.sandbox.Dir != "" && strings.HasPrefix(dir, r.sandbox.Dir+"/") {
			// A claim's disk.img: the claim's directory too, which the provisioner may have
			// made for root alone (the runtime applies the pod's fsGroup only to volumes that
			// support it).
			paths = append(paths, dir)
		}
		for _, p := range paths {
			if err := os.Lchown(p, o.UID, o.GID); err != nil && !errors.Is(err, unix.EROFS) && !errors.Is(err, fs.ErrNotExist) {
				return failed(ReasonOwnerFailed, fmt.Errorf("give disk %s (%s) to %d:%d: %w", d.GetName(), p, o.UID, o.GID, err))
			}
		}
	}
	return nil
}

// OwnFiles gives path, and with recurse everything beneath it, which the program around the
// handler made for VMI uid in its sandbox directory (in a cluster the console log and the guest
// probe socket), to the sandbox's user, as the sync does the files it makes. It does nothing
// for a VMI whose sandbox runs as root, or that the handler does not know.
func (h *Handler) OwnFiles(uid types.UID, path string, recurse bool) error {
	h.mu.Lock()
	var o *FileOwner
	if e := h.vmis[uid]; e != nil && e.state != nil {
		o = e.state.Sandbox.Owner
	}
	h.mu.Unlock()
	if o == nil {
		return nil
	}
	return chownTree(path, o.UID, o.GID, recurse)
}

// chownTree gives root, and with recurse every file beneath it on the same mount, to uid and
// gid, without following symbolic links.
func chownTree(root string, uid, gid int, recurse bool) error {
	var top unix.Stat_t
	if err := unix.Lstat(root, &top); err != nil {
		return fmt.Errorf("give %s to %d:%d: %w", root, uid, gid, err)
	}
	if !recurse {
		return lchown(root, uid, gid)
	}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // gone meanwhile (a socket removed)
			}
			return err
		}
		if d.IsDir() && p != root {
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			if st.Dev != top.Dev {
				return fs.SkipDir // a mount: not the node's to give
			}
		}
		return lchown(p, uid, gid)
	})
}

func lchown(p string, uid, gid int) error {
	if err := os.Lchown(p, uid, gid); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("give %s to %d:%d: %w", p, uid, gid, err)
	}
	return nil
}
