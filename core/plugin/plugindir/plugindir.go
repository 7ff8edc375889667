// Package plugindir installs driver plugins into a node's plugin directory: the binary and
// manifest a driver image carries (ImageDir) copied in by an init container of the handler
// DaemonSet (cmd/kubevisor-plugin-install, manifests/install/drivers), for the handler to
// discover (plugin.Discover) and run only when the binary's SHA-256 matches its manifest.
package plugindir

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kubevisor/kubevisor/core/plugin"
)

const (
	// ImageDir is where a driver image holds its manifest (<anything>.json, .yaml or .yml, as
	// plugin.Discover reads) and the binary it names, relative to the manifest.
	ImageDir = "/kubevisor/plugin"
	// ToolsDir is where the handler DaemonSet's init containers find kubevisor-plugin-install,
	// copied there from the handler image, so that a driver image needs no program of its own
	// besides the driver.
	ToolsDir = "/kubevisor/tools"
	// Command is the installer's file name.
	Command = "kubevisor-plugin-install"
)

// Installed is one driver copied into a plugin directory.
type Installed struct {
	// Manifest is the manifest as written into the plugin directory.
	Manifest plugin.Manifest
	// Path is the manifest file written.
	Path string
	// Mismatch is the binary's actual SHA-256 when it differs from the manifest's: the
	// driver is installed as it is, and the host refuses to run it (go-plugin's SecureConfig),
	// reporting the driver as not loaded.
	Mismatch string
}

// Prepare makes dir a plugin directory: created if missing (with its parents), and made
// root-only (0700, the caller owning it), so that nobody but root can put a binary or a
// manifest in it.
func Prepare(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("plugin directory %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("plugin directory %s: %w", dir, err)
	}
	return nil
}

// Install copies every driver whose manifest is in src into the plugin directory dst (made
// root-only, Prepare): the binary as dst/<name>/<file name> (0755 in a 0700 directory) and the
// manifest as dst/<name>.json, naming that binary and keeping the manifest's sha256, args and
// config. Each file is written under a temporary name and renamed into place, so the host
// never reads half a file. The digest is the manifest's: a binary that does not match it is
// still installed (Installed.Mismatch says so) and the host refuses it by name, so one bad
// driver image keeps no other driver from running.
//
// A manifest that cannot be read (plugin.Discover's errors, naming the file) is skipped and
// reported in the error with the drivers that were installed; no manifest at all in src is an
// error.
func Install(src, dst string) ([]Installed, error) {
	found, discoverErr := plugin.Discover(src)
	if len(found) == 0 {
		if discoverErr != nil {
			return nil, fmt.Errorf("no driver to install from %s: %w", src, discoverErr)
		}
		return nil, fmt.Errorf("no driver to install from %s: no manifest (.json, .yaml or .yml) there", src)
	}
	if err := Prepare(dst); err != nil {
		return nil, err
	}
	var (
		out  []Installed
		errs = []error{discoverErr}
	)
	for _, m := range found {
		in, err := installOne(m, dst)
		if err != nil {
			errs = append(errs, fmt.Errorf("driver %q: %w", m.Name, err))
			continue
		}
		out = append(out, in)
	}
	return out, errors.Join(errs...)
}

func installOne(m plugin.Manifest, dst string) (Installed, error) {
	sub := filepath.Join(dst, m.Name)
	if err := Prepare(sub); err != nil {
		return Installed{}, err
	}
	file := filepath.Base(m.Binary)
	actual, err := copyFile(m.Binary, filepath.Join(sub, file), 0o755)
	if err != nil {
		return Installed{}, fmt.Errorf("binary %s: %w", m.Binary, err)
	}
	out := plugin.Manifest{
		Name: m.Name, Kind: m.Kind, Binary: filepath.Join(m.Name, file), SHA256: m.SHA256,
		Args: m.Args, Config: m.Config,
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return Installed{}, fmt.Errorf("manifest: %w", err)
	}
	path := filepath.Join(dst, m.Name+".json")
	if err := writeFile(path, append(data, '\n'), 0o600); err != nil {
		return Installed{}, fmt.Errorf("manifest %s: %w", path, err)
	}
	in := Installed{Manifest: out, Path: path}
	in.Manifest.Dir = dst
	in.Manifest.Binary = filepath.Join(sub, file)
	if actual != m.SHA256 {
		in.Mismatch = actual
	}
	return in, nil
}

// CopySelf copies the running executable into dir (created 0755 if missing) as Command.
func CopySelf(dir string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("copy %s: %w", Command, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("copy %s: %w", Command, err)
	}
	to := filepath.Join(dir, Command)
	if _, err := copyFile(exe, to, 0o755); err != nil {
		return "", fmt.Errorf("copy %s to %s: %w", Command, dir, err)
	}
	return to, nil
}

// copyFile copies from into to (a temporary file renamed into place) with mode perm and
// returns the hex SHA-256 of what it copied.
func copyFile(from, to string, perm os.FileMode) (string, error) {
	in, err := os.Open(from)
	if err != nil {
		return "", err
	}
	defer in.Close()
	h := sha256.New()
	tmp, err := os.CreateTemp(filepath.Dir(to), "."+filepath.Base(to)+".*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	if _, err := io.Copy(io.MultiWriter(tmp, h), in); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), to); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeFile writes data to path through a temporary file renamed into place.
func writeFile(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
