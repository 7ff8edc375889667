package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/launcher"
	"github.com/kubevisor/kubevisor/core/layout"
)

// maxSecretBytes bounds what is read of one key of a Secret: the API server's limit on a
// Secret (1 MiB).
const maxSecretBytes = 1 << 20

// podSecrets is the agent's handler.Resolver: images and claims as the handler's default
// (handler.MapResolver), and Secrets from the launcher pod, whose compute container has each
// Secret the VMI names as a read-only volume at layout.SecretDir (controlplane/launcherpod). It
// finds the launcher process through its socket (as podSandbox.Open does) and reads the files
// in that process's root, resolving every path inside it (openat2 RESOLVE_IN_ROOT), so that a
// symlink in the container cannot name a file of the node. The handler thus reads only Secrets
// the kubelet gave to a pod of the VMI, with no right on Secrets of its own.
type podSecrets struct {
	handler.MapResolver
	a *Agent
}

var _ handler.Resolver = podSecrets{}

// Secret implements handler.Resolver.
func (r podSecrets) Secret(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, name string) (map[string][]byte, error) {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return nil, fmt.Errorf("secret name %q: %s", name, strings.Join(errs, "; "))
	}
	socket := path.Join(layout.LauncherDir(r.a.cfg.HostStateDir, vmi.UID), launcher.SocketName)
	dctx, cancel := context.WithTimeout(ctx, r.a.cfg.DialTimeout)
	defer cancel()
	c, err := launcher.Dial(dctx, socket)
	if err != nil {
		return nil, fmt.Errorf("secret %q: the launcher, whose pod has it: %w", name, err)
	}
	pid := c.LauncherPid()
	_ = c.Close()
	if pid <= 0 {
		return nil, fmt.Errorf("secret %q: the launcher's pid is not visible from the handler (the handler needs the host's pid namespace)", name)
	}
	data, err := readSecretDir(fmt.Sprintf("/proc/%d/root", pid), layout.SecretDir(name))
	if err != nil {
		return nil, fmt.Errorf("secret %q in the launcher pod: %w", name, err)
	}
	return data, nil
}

// readSecretDir reads a Secret volume's directory dir inside root: a file per key. The
// kubelet's own entries (..data, ..<timestamp>) are skipped; the keys are symlinks into them,
// followed inside root.
func readSecretDir(root, dir string) (map[string][]byte, error) {
	rootFd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the container's root: %w", err)
	}
	defer unix.Close(rootFd)
	open := func(p string, flags uint64) (*os.File, error) {
		rel := strings.TrimPrefix(path.Clean("/"+p), "/")
		fd, err := unix.Openat2(rootFd, rel, &unix.OpenHow{
			Flags:   flags | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: "/" + rel, Err: err}
		}
		return os.NewFile(uintptr(fd), "/"+rel), nil
	}
	d, err := open(dir, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("not mounted at %s (a launcher pod made before the VMI named it?): %w", dir, err)
		}
		return nil, err
	}
	names, err := d.Readdirnames(-1)
	_ = d.Close()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	data := map[string][]byte{}
	for _, n := range names {
		if strings.HasPrefix(n, "..") {
			continue
		}
		f, err := open(path.Join(dir, n), unix.O_RDONLY)
		if err != nil {
			return nil, err
		}
		fi, err := f.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			_ = f.Close()
			continue // not a key (a directory, a device)
		}
		b, err := io.ReadAll(io.LimitReader(f, maxSecretBytes+1))
		_ = f.Close()
		if err != nil {
			return nil, fmt.Errorf("read key %s: %w", n, err)
		}
		if len(b) > maxSecretBytes {
			return nil, fmt.Errorf("key %s: more than %d bytes", n, maxSecretBytes)
		}
		data[n] = b
	}
	return data, nil
}
