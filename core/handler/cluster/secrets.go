package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/layout"
)

// maxSecretBytes bounds what is read of one key of a Secret: the API server's limit on a
// Secret (1 MiB).
const maxSecretBytes = 1 << 20

// Secret implements handler.Resolver.
func (r podResolver) Secret(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, name string) (map[string][]byte, error) {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return nil, fmt.Errorf("secret name %q: %s", name, strings.Join(errs, "; "))
	}
	pid, err := r.launcherPid(ctx, vmi)
	if err != nil {
		return nil, fmt.Errorf("secret %q: the launcher, whose pod has it: %w", name, err)
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
	r, err := openRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	open := r.open
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
