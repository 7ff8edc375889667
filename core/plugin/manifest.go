package plugin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/core/driver"
)

// Manifest describes one installed driver. It is read from "<dir>/<anything>.json" (or .yaml,
// .yml) in the plugin directory:
//
//	{"name": "qmp", "kind": "hypervisor", "binary": "kubevisor-driver-qmp",
//	 "sha256": "9f86d0…", "config": {"accel": "auto"}}
type Manifest struct {
	// Name is the driver's name: a DNS label (lowercase letters, digits and '-', at most 63
	// characters, starting and ending with a letter or digit). The plugin's Info must report it.
	Name string `json:"name"`
	// Kind is hypervisor, network, storage or device (driver.ParseKind).
	Kind string `json:"kind"`
	// Binary is the plugin executable: absolute, or relative to the manifest's directory.
	// LoadManifest makes it absolute.
	Binary string `json:"binary"`
	// SHA256 is the hex digest of Binary. Required: the host runs nothing whose digest differs.
	SHA256 string `json:"sha256"`
	// Args are passed to the binary.
	Args []string `json:"args,omitempty"`
	// Config is the driver's own configuration, passed to Configure as JSON.
	Config json.RawMessage `json:"config,omitempty"`
	// Dir is the directory the manifest was found in.
	Dir string `json:"-"`
}

var (
	nameRE   = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// manifestExts are the file name extensions Discover reads.
var manifestExts = []string{".json", ".yaml", ".yml"}

// LoadManifest reads and validates one manifest file. A relative Binary is resolved against the
// manifest's directory. Errors name the file and, where there is one, the field.
func LoadManifest(path string) (Manifest, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return Manifest{}, fmt.Errorf("manifest %s: %w", path, err)
	}
	data, err := os.ReadFile(abs)
	if err != nil {
		return Manifest{}, fmt.Errorf("manifest %s: %w", path, err)
	}
	m, err := parseManifest(abs, data)
	if err != nil {
		return Manifest{}, fmt.Errorf("manifest %s: %w", path, err)
	}
	return m, nil
}

// parseManifest decodes and checks data, the manifest file at the absolute path abs: its
// extension says JSON or YAML, its directory is Dir.
func parseManifest(abs string, data []byte) (Manifest, error) {
	var m Manifest
	if err := decodeManifest(abs, data, &m); err != nil {
		return Manifest{}, err
	}
	m.Dir = filepath.Dir(abs)
	if err := m.normalize(); err != nil {
		return Manifest{}, err
	}
	return m, nil
}

// decodeManifest decodes JSON (for .json) or YAML strictly: an unknown field is an error, since
// it usually is a typo of a known one.
func decodeManifest(path string, data []byte, m *Manifest) error {
	if strings.EqualFold(filepath.Ext(path), ".json") {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(m); err != nil {
			var syn *json.SyntaxError
			if errors.As(err, &syn) {
				line, col := position(data, syn.Offset-1) // Offset is just after the bad byte
				return fmt.Errorf("invalid JSON at line %d, column %d: %w", line, col, err)
			}
			if errors.Is(err, io.EOF) {
				return errors.New("invalid JSON: empty file")
			}
			return fmt.Errorf("invalid manifest: %w", err)
		}
		if dec.More() {
			return errors.New("invalid JSON: more than one object")
		}
		return nil
	}
	if err := yaml.UnmarshalStrict(data, m); err != nil {
		return fmt.Errorf("invalid manifest: %w", err)
	}
	return nil
}

// position returns the 1-based line and column of the byte at offset off.
func position(data []byte, off int64) (line, col int) {
	off = min(max(off, 0), int64(len(data)))
	before := data[:off]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(off) - bytes.LastIndexByte(before, '\n')
	return line, col
}

// normalize checks every field, lowercases the digest and makes Binary absolute against Dir.
func (m *Manifest) normalize() error {
	switch {
	case m.Name == "":
		return errors.New("name: required")
	case !nameRE.MatchString(m.Name):
		return fmt.Errorf("name: %q is not a DNS label (lowercase letters, digits and '-', at most 63)", m.Name)
	case m.Kind == "":
		return errors.New("kind: required")
	case m.Binary == "":
		return errors.New("binary: required")
	case m.SHA256 == "":
		return errors.New("sha256: required")
	}
	if _, err := driver.ParseKind(m.Kind); err != nil {
		return fmt.Errorf("kind: %w", err)
	}
	m.SHA256 = strings.ToLower(m.SHA256)
	if !sha256RE.MatchString(m.SHA256) {
		return fmt.Errorf("sha256: %q is not 64 hex digits", m.SHA256)
	}
	if !filepath.IsAbs(m.Binary) {
		if m.Dir == "" {
			return fmt.Errorf("binary: %q is relative and the manifest has no directory", m.Binary)
		}
		m.Binary = filepath.Join(m.Dir, m.Binary)
	}
	m.Binary = filepath.Clean(m.Binary)
	if len(m.Config) > 0 && !json.Valid(m.Config) {
		return errors.New("config: not valid JSON")
	}
	if bytes.Equal(bytes.TrimSpace(m.Config), []byte("null")) {
		m.Config = nil
	}
	return nil
}

// Discover reads every manifest in dir (not its subdirectories), sorted by driver name. A bad
// manifest, or a second manifest for a name already seen, is reported in the error (naming its
// file) and left out; the good ones are still returned. A missing dir is an error.
func Discover(dir string) ([]Manifest, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("discover plugins: %w", err)
	}
	var (
		out   []Manifest
		errs  []error
		files = map[string]string{} // driver name -> manifest file
	)
	for _, e := range entries { // ReadDir sorts by file name, so duplicates resolve the same way every time
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") || !slices.Contains(manifestExts, strings.ToLower(filepath.Ext(e.Name()))) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if e.Type()&fs.ModeType != 0 && e.Type()&fs.ModeSymlink == 0 {
			continue // sockets, devices, ...
		}
		m, err := LoadManifest(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if prev, ok := files[m.Name]; ok {
			errs = append(errs, fmt.Errorf("manifest %s: name: %q is already used by %s", path, m.Name, prev))
			continue
		}
		files[m.Name] = path
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Manifest) int { return strings.Compare(a.Name, b.Name) })
	return out, errors.Join(errs...)
}

// ManifestFor makes the manifest of a binary a user points at directly (the conformance CLI):
// it computes the binary's digest itself. An empty name is taken from the binary's file name
// without a "kubevisor-driver-" prefix.
func ManifestFor(binary, kind, name string) (Manifest, error) {
	abs, err := filepath.Abs(binary)
	if err != nil {
		return Manifest{}, fmt.Errorf("manifest for %s: %w", binary, err)
	}
	if name == "" {
		name = strings.TrimPrefix(filepath.Base(abs), "kubevisor-driver-")
	}
	sum, err := fileSHA256(abs)
	if err != nil {
		return Manifest{}, fmt.Errorf("driver %q: binary %s: %w", name, abs, describeFileErr(err))
	}
	m := Manifest{Name: name, Kind: kind, Binary: abs, SHA256: sum, Dir: filepath.Dir(abs)}
	if err := m.normalize(); err != nil {
		return Manifest{}, fmt.Errorf("manifest for %s: %w", binary, err)
	}
	return m, nil
}

// fileSHA256 returns the hex SHA-256 digest of the file at path.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// describeFileErr shortens the common file errors to what a user needs to read.
func describeFileErr(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errors.New("no such file")
	case errors.Is(err, fs.ErrPermission):
		return errors.New("permission denied")
	}
	return err
}
