package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// stateFile is the record, in a VMI's work directory, of what Prepare made there (and of the
// hostDisk files it created elsewhere), so that Release removes those and nothing else.
const stateFile = "local-storage.json"

const (
	dirPerm  = 0o750
	filePerm = 0o660
	// isoPerm: cloud-init data may hold secrets, and the guest only reads it.
	isoPerm   = 0o640
	statePerm = 0o600
)

// state is what Prepare made for one VMI.
type state struct {
	VMIID string `json:"vmiId"`
	// CreatedWorkDir is true when Prepare made the work directory.
	CreatedWorkDir bool           `json:"createdWorkDir,omitempty"`
	Volumes        []*volumeState `json:"volumes,omitempty"`
}

// volumeState is what Prepare made for one volume.
type volumeState struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// Files are the files made for the volume, in the order they are made; Release removes
	// them. A file is on record before it is made.
	Files []string `json:"files"`
	// Source names the inputs the files were made from (a base image's identity, a cloud-init
	// seed's digest, a capacity). Files made from other inputs are made again.
	Source string `json:"source,omitempty"`
	// Ready is true once all Files are complete.
	Ready bool `json:"ready"`
	// SizeBytes is the size of the volume's disk as the guest sees it.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
}

func (s *state) volume(name string) *volumeState {
	for _, v := range s.Volumes {
		if v.Name == name {
			return v
		}
	}
	return nil
}

// put replaces the record of v.Name, or adds it.
func (s *state) put(v *volumeState) {
	for i, old := range s.Volumes {
		if old.Name == v.Name {
			s.Volumes[i] = v
			return
		}
	}
	s.Volumes = append(s.Volumes, v)
}

// owns reports whether path is on record for any volume.
func (s *state) owns(path string) bool {
	return slices.ContainsFunc(s.Volumes, func(v *volumeState) bool { return slices.Contains(v.Files, path) })
}

func (s *state) clone() *state {
	c := &state{VMIID: s.VMIID, CreatedWorkDir: s.CreatedWorkDir}
	for _, v := range s.Volumes {
		vc := *v
		vc.Files = slices.Clone(v.Files)
		c.Volumes = append(c.Volumes, &vc)
	}
	return c
}

// loadState reads the state in dir; nil when there is none, FailedPrecondition when the
// directory holds another VMI's volumes.
func loadState(dir, vmiID string) (*state, error) {
	p := filepath.Join(dir, stateFile)
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read state: %v", err)
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, status.Errorf(codes.Internal, "read state %s: %v", p, err)
	}
	if st.VMIID != vmiID {
		return nil, status.Errorf(codes.FailedPrecondition, "work directory %s holds the volumes of VMI %q, not %q", dir, st.VMIID, vmiID)
	}
	return &st, nil
}

// saveState replaces the state in dir atomically and durably: a crash leaves the old record or
// the new one, never a torn one.
func saveState(dir string, st *state) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return status.Errorf(codes.Internal, "encode state: %v", err)
	}
	p := filepath.Join(dir, stateFile)
	if err := writeFileAtomic(p, append(data, '\n'), statePerm); err != nil {
		return status.Errorf(codes.Internal, "write state: %v", err)
	}
	return nil
}

func writeFileAtomic(p string, data []byte, perm os.FileMode) error {
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(p))
}

func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncDir makes a rename or a removal in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

func removeState(dir string) error {
	p := filepath.Join(dir, stateFile)
	for _, f := range []string{p + ".tmp", p} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove state: %w", err)
		}
	}
	return nil
}

// Temporary names of a file being made: tmpPath while it is written, before it is renamed
// into place; tmpDir for a staging directory (a cloud-init ISO's files).
func tmpPath(p string) string { return p + ".tmp" }
func tmpDir(p string) string  { return p + ".tmp.d" }

// removeMade removes a file the driver made, and, for a file in the work directory, what a
// crash while making it may have left. A file already gone is not an error.
func removeMade(workDir, p string) error {
	var errs []error
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	if inDir(workDir, p) {
		if err := os.Remove(tmpPath(p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		if err := os.RemoveAll(tmpDir(p)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// inDir reports whether p names an entry of dir (both clean and absolute).
func inDir(dir, p string) bool {
	return filepath.Dir(p) == dir && !strings.ContainsRune(filepath.Base(p), filepath.Separator)
}
