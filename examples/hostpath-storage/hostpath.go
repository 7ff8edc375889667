package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// DriverName is the driver's name, as in its plugin manifest and in Info.
const DriverName = "hostpath"

// Version is the driver's own release version.
const Version = "0.1.0"

// Volume source names, as in Capabilities.volume_types.
const (
	volumeEmptyDisk = "emptyDisk"
	volumeHostDisk  = "hostDisk"
)

// hostDisk types, as in KubeVirt.
const (
	hostDiskDisk         = "Disk"
	hostDiskDiskOrCreate = "DiskOrCreate"
)

// recordFile is the name of the per-VMI record of what Prepare created, kept in the VMI's
// directory.
const recordFile = "hostpath-record.json"

const (
	dirMode  = 0o750
	fileMode = 0o660
)

// Logger is the part of the SDK's logger (driver.NewLogger) the driver uses. Naming the two
// methods here keeps the driver free of a direct dependency on the logging library.
type Logger interface {
	Info(msg string, args ...any)
	Warn(msg string, args ...any)
}

// Config is the driver's configuration, the JSON the host passes to Configure.
type Config struct {
	// Root, when set, is where the driver keeps each VMI's files, in a directory named by the
	// VMI id. Empty means the per-VMI work_dir the host passes to Prepare and Release.
	Root string `json:"root,omitempty"`
}

// HostPath is the hostpath storage driver. It turns emptyDisk volumes into sparse raw images
// in the VMI's directory and hostDisk volumes into raw images at the path they name, and
// records per VMI which files it created so that Release removes those and nothing else.
type HostPath struct {
	log Logger

	// mu serialises configuration, Prepare and Release. The driver's work is a few file
	// system calls per volume, so one lock is simpler than one per VMI and costs nothing.
	mu  sync.Mutex
	cfg Config
}

var _ driver.Storage = (*HostPath)(nil)

// New returns the driver. log may be nil.
func New(log Logger) *HostPath {
	if log == nil {
		log = nopLogger{}
	}
	return &HostPath{log: log}
}

// Info implements driver.Driver.
func (h *HostPath) Info(context.Context) (*basev1.InfoResponse, error) {
	return &basev1.InfoResponse{
		Name:        DriverName,
		Kind:        basev1.Kind_KIND_STORAGE,
		Version:     Version,
		Description: "example storage driver: emptyDisk and hostDisk volumes as raw files on the node",
	}, nil
}

// Capabilities implements driver.Driver. The driver has no optional features.
func (h *HostPath) Capabilities(context.Context) (*basev1.Capabilities, error) {
	return &basev1.Capabilities{VolumeTypes: []string{volumeEmptyDisk, volumeHostDisk}}, nil
}

// Fingerprint implements driver.Driver: the driver is always healthy, and says so once.
func (h *HostPath) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	err := send(&basev1.FingerprintResponse{
		Health:            basev1.Health_HEALTH_HEALTHY,
		HealthDescription: "ready",
		// Attributes become node labels (kubevisor.io/example=true): keep keys and values
		// valid label name parts, so no paths or sizes here.
		Attributes: map[string]string{"example": "true"},
	})
	if err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// Configure implements driver.Driver. An empty config means defaults; unknown fields are
// rejected so that a typo in a manifest does not go unnoticed.
func (h *HostPath) Configure(_ context.Context, req *basev1.ConfigureRequest) error {
	var cfg Config
	if raw := bytes.TrimSpace(req.GetConfig()); len(raw) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return status.Errorf(codes.InvalidArgument, "config: %v", err)
		}
	}
	if cfg.Root != "" {
		if !filepath.IsAbs(cfg.Root) {
			return status.Errorf(codes.InvalidArgument, "config.root: must be an absolute path, not %q", cfg.Root)
		}
		cfg.Root = filepath.Clean(cfg.Root)
	}
	h.mu.Lock()
	h.cfg = cfg
	h.mu.Unlock()
	h.log.Info("configured", "root", cfg.Root, "node", req.GetNodeName())
	return nil
}

// Prepare implements driver.Storage. It checks every volume before it touches the file
// system, so a bad volume leaves nothing behind; should a later step fail, it removes the files
// this call created before it returns.
func (h *HostPath) Prepare(ctx context.Context, req *storagev1.PrepareRequest) (*storagev1.PrepareResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()

	dir, err := h.vmiDir(req.GetVmiId(), req.GetWorkDir())
	if err != nil {
		return nil, err
	}
	plans, err := planVolumes(dir, req.GetVolumes())
	if err != nil {
		return nil, err
	}
	prev, err := loadRecord(dir, req.GetVmiId())
	if err != nil {
		return nil, err
	}

	p := &preparer{dir: dir, vmiID: req.GetVmiId(), prev: prev}
	disks, err := p.run(ctx, plans)
	if err != nil {
		if uerr := p.undo(); uerr != nil {
			h.log.Warn("undo failed prepare", "vmi", req.GetVmiId(), "error", uerr)
		}
		return nil, err
	}
	h.log.Info("prepared", "vmi", req.GetVmiId(), "dir", dir, "disks", len(disks))
	return &storagev1.PrepareResponse{Disks: disks}, nil
}

// Release implements driver.Storage. It removes the files its record says Prepare created,
// then the record, then the VMI's directory if Prepare created it and it is empty. Without a
// record there is nothing to release.
func (h *HostPath) Release(_ context.Context, req *storagev1.ReleaseRequest) error {
	h.mu.Lock()
	defer h.mu.Unlock()

	dir, err := h.vmiDir(req.GetVmiId(), req.GetWorkDir())
	if err != nil {
		return err
	}
	rec, err := loadRecord(dir, req.GetVmiId())
	if err != nil {
		return err
	}
	if rec == nil {
		return nil
	}
	var left []createdFile
	var errs []error
	for _, f := range rec.Files {
		if err := os.Remove(f.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			left = append(left, f)
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		// Keep what could not be removed on record, so that the next Release tries again.
		rec.Files = left
		if err := saveRecord(dir, rec); err != nil {
			errs = append(errs, err)
		}
		return status.Errorf(codes.Internal, "release volumes of VMI %s: %v", req.GetVmiId(), errors.Join(errs...))
	}
	if err := removeRecord(dir); err != nil {
		return status.Errorf(codes.Internal, "release volumes of VMI %s: %v", req.GetVmiId(), err)
	}
	if rec.CreatedDir {
		if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			// Someone else put files there: they are not ours to remove.
			h.log.Warn("directory not removed", "vmi", req.GetVmiId(), "dir", dir, "error", err)
		}
	}
	h.log.Info("released", "vmi", req.GetVmiId(), "dir", dir, "files", len(rec.Files))
	return nil
}

// vmiDir returns the directory that holds a VMI's files and record.
func (h *HostPath) vmiDir(vmiID, workDir string) (string, error) {
	if vmiID == "" {
		return "", status.Error(codes.InvalidArgument, "vmiId: required")
	}
	if root := h.cfg.Root; root != "" {
		if !validFileName(vmiID) {
			return "", status.Errorf(codes.InvalidArgument, "vmiId: %q cannot be used as a directory name", vmiID)
		}
		return filepath.Join(root, vmiID), nil
	}
	switch {
	case workDir == "":
		return "", status.Error(codes.InvalidArgument, "workDir: required")
	case !filepath.IsAbs(workDir):
		return "", status.Errorf(codes.InvalidArgument, "workDir: must be an absolute path, not %q", workDir)
	}
	return filepath.Clean(workDir), nil
}

// plan is one volume checked and resolved to a file, before anything is made.
type plan struct {
	name     string
	path     string
	capacity int64
	// mayCreate is true when the file is made if it is missing (emptyDisk, DiskOrCreate).
	mayCreate bool
	// owned is true for a file in the VMI's directory, which only this driver may have made.
	owned bool
}

// planVolumes checks every volume without changing anything and returns what to do for each.
// The errors are InvalidArgument with the field path and the volume's name.
func planVolumes(dir string, vols []*storagev1.Volume) ([]plan, error) {
	seen := map[string]bool{}
	plans := make([]plan, 0, len(vols))
	for i, v := range vols {
		field := fmt.Sprintf("volumes[%d]", i)
		bad := func(subfield, format string, args ...any) error {
			return status.Errorf(codes.InvalidArgument, "%s%s: volume %q: %s", field, subfield, v.GetName(), fmt.Sprintf(format, args...))
		}
		switch {
		case v.GetName() == "":
			return nil, status.Errorf(codes.InvalidArgument, "%s.name: required", field)
		case !validFileName(v.GetName()):
			return nil, bad(".name", "not usable as a file name")
		case seen[v.GetName()]:
			return nil, bad(".name", "duplicate volume name")
		}
		seen[v.GetName()] = true

		switch src := v.GetSource().(type) {
		case *storagev1.Volume_EmptyDisk:
			capacity, err := capacityOf(src.EmptyDisk.GetCapacityBytes())
			if err != nil {
				return nil, bad(".emptyDisk.capacityBytes", "%v", err)
			}
			plans = append(plans, plan{name: v.GetName(), path: filepath.Join(dir, v.GetName()+".img"), capacity: capacity, mayCreate: true, owned: true})

		case *storagev1.Volume_HostDisk:
			hd := src.HostDisk
			path := hd.GetPath()
			if !filepath.IsAbs(path) {
				return nil, bad(".hostDisk.path", "must be an absolute path, not %q", path)
			}
			path = filepath.Clean(path)
			pl := plan{name: v.GetName(), path: path}
			fi, statErr := os.Stat(path)
			switch hd.GetType() {
			case hostDiskDisk:
				if statErr != nil {
					return nil, bad(".hostDisk.path", "%s", describeStatError(path, statErr))
				}
			case hostDiskDiskOrCreate:
				capacity, capErr := capacityOf(hd.GetCapacityBytes())
				pl.capacity, pl.mayCreate = capacity, true
				if errors.Is(statErr, fs.ErrNotExist) {
					if capErr != nil {
						return nil, bad(".hostDisk.capacityBytes", "%v (%s does not exist and must be created)", capErr, path)
					}
					if di, err := os.Stat(filepath.Dir(path)); err != nil || !di.IsDir() {
						return nil, bad(".hostDisk.path", "directory %s does not exist", filepath.Dir(path))
					}
				} else if statErr != nil {
					return nil, bad(".hostDisk.path", "%s", describeStatError(path, statErr))
				}
			default:
				return nil, bad(".hostDisk.type", "type %q is not supported (want %s or %s)", hd.GetType(), hostDiskDisk, hostDiskDiskOrCreate)
			}
			if statErr == nil && !fi.Mode().IsRegular() {
				return nil, bad(".hostDisk.path", "%s is not a regular file", path)
			}
			plans = append(plans, pl)

		case nil:
			return nil, bad("", "no volume source")

		default:
			return nil, bad("", "volume type %s is not supported by the %s driver (it supports %s and %s)", sourceName(v), DriverName, volumeEmptyDisk, volumeHostDisk)
		}
	}
	return plans, nil
}

// preparer carries out the plans of one Prepare call and can undo what that call made.
type preparer struct {
	dir   string
	vmiID string
	// prev is the record as it was before this call; nil when there was none.
	prev *record
	// rec is the record as this call extends it; nil until the first change.
	rec *record
	// made are the files this call created, and madeDir the VMI's directory.
	made    []string
	madeDir bool
}

func (p *preparer) run(ctx context.Context, plans []plan) ([]*storagev1.PreparedDisk, error) {
	p.rec = &record{VMIID: p.vmiID}
	if p.prev != nil {
		p.rec = p.prev.clone()
	}
	if err := p.ensureDir(); err != nil {
		return nil, err
	}
	disks := make([]*storagev1.PreparedDisk, 0, len(plans))
	for _, pl := range plans {
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		size, err := p.ensureFile(pl)
		if err != nil {
			return nil, err
		}
		disks = append(disks, &storagev1.PreparedDisk{
			VolumeName: pl.name,
			Path:       pl.path,
			Format:     domainv1.DiskFormat_DISK_FORMAT_RAW,
			SizeBytes:  uint64(size),
		})
	}
	if p.prev == nil {
		// Even with no file to create, the record says this VMI owns the directory.
		if err := saveRecord(p.dir, p.rec); err != nil {
			return nil, err
		}
	}
	return disks, nil
}

// ensureDir makes the VMI's directory when it is missing, and records that it did before
// anything is put in it.
func (p *preparer) ensureDir() error {
	if _, err := os.Stat(p.dir); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return status.Errorf(codes.Internal, "stat %s: %v", p.dir, err)
	}
	if err := os.MkdirAll(p.dir, dirMode); err != nil {
		return status.Errorf(codes.Internal, "create %s: %v", p.dir, err)
	}
	p.madeDir = true
	p.rec.CreatedDir = true
	return saveRecord(p.dir, p.rec)
}

// ensureFile makes pl's file when it is missing and may be made, and returns its size. A file
// is put on record before it is created, so that a crash in between leaves nothing Release
// would not remove; a file on record that a crashed call left short is sized again.
func (p *preparer) ensureFile(pl plan) (int64, error) {
	fi, err := os.Stat(pl.path)
	switch {
	case err == nil:
		if !fi.Mode().IsRegular() {
			return 0, status.Errorf(codes.FailedPrecondition, "volume %q: %s exists and is not a regular file", pl.name, pl.path)
		}
		recorded := p.rec.has(pl.path)
		if pl.owned && !recorded {
			return 0, status.Errorf(codes.FailedPrecondition, "volume %q: %s exists and was not made by the %s driver", pl.name, pl.path, DriverName)
		}
		if recorded && fi.Size() < pl.capacity {
			if err := os.Truncate(pl.path, pl.capacity); err != nil {
				return 0, status.Errorf(codes.Internal, "volume %q: size %s to %d bytes: %v", pl.name, pl.path, pl.capacity, err)
			}
			return pl.capacity, nil
		}
		return fi.Size(), nil
	case !errors.Is(err, fs.ErrNotExist):
		return 0, status.Errorf(codes.Internal, "volume %q: stat %s: %v", pl.name, pl.path, err)
	case !pl.mayCreate:
		// A hostDisk of type Disk that went away since planVolumes looked.
		return 0, status.Errorf(codes.InvalidArgument, "volume %q: %s does not exist", pl.name, pl.path)
	}

	if !p.rec.has(pl.path) {
		p.rec.Files = append(p.rec.Files, createdFile{Volume: pl.name, Path: pl.path})
		if err := saveRecord(p.dir, p.rec); err != nil {
			return 0, err
		}
	}
	f, err := os.OpenFile(pl.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return 0, status.Errorf(codes.Internal, "volume %q: create %s: %v", pl.name, pl.path, err)
	}
	p.made = append(p.made, pl.path)
	// Truncate makes a sparse file: it takes no space until the guest writes.
	err = f.Truncate(pl.capacity)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, status.Errorf(codes.Internal, "volume %q: size %s to %d bytes: %v", pl.name, pl.path, pl.capacity, err)
	}
	return pl.capacity, nil
}

// undo removes what this call made and puts the record back as it was.
func (p *preparer) undo() error {
	var errs []error
	for _, path := range p.made {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	switch {
	case len(errs) > 0:
		// Leave the record as this call extended it, so that Release removes the rest.
	case p.prev != nil:
		errs = append(errs, saveRecord(p.dir, p.prev))
	default:
		errs = append(errs, removeRecord(p.dir))
		if p.madeDir {
			if err := os.Remove(p.dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// record is what Prepare created for one VMI, kept as JSON in the VMI's directory.
type record struct {
	VMIID string `json:"vmiId"`
	// CreatedDir is true when Prepare made the VMI's directory.
	CreatedDir bool `json:"createdDir,omitempty"`
	// Files are the files Prepare created, which Release removes.
	Files []createdFile `json:"files,omitempty"`
}

type createdFile struct {
	Volume string `json:"volume"`
	Path   string `json:"path"`
}

func (r *record) has(path string) bool {
	return slices.ContainsFunc(r.Files, func(f createdFile) bool { return f.Path == path })
}

func (r *record) clone() *record {
	c := *r
	c.Files = slices.Clone(r.Files)
	return &c
}

// loadRecord reads the record in dir; it returns nil when there is none, and
// FailedPrecondition when the directory belongs to another VMI.
func loadRecord(dir, vmiID string) (*record, error) {
	data, err := os.ReadFile(filepath.Join(dir, recordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read record: %v", err)
	}
	var rec record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, status.Errorf(codes.Internal, "read record %s: %v", filepath.Join(dir, recordFile), err)
	}
	if rec.VMIID != vmiID {
		return nil, status.Errorf(codes.FailedPrecondition, "%s holds the volumes of VMI %q, not %q", dir, rec.VMIID, vmiID)
	}
	return &rec, nil
}

// saveRecord replaces the record in dir atomically.
func saveRecord(dir string, rec *record) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return status.Errorf(codes.Internal, "encode record: %v", err)
	}
	path := filepath.Join(dir, recordFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return status.Errorf(codes.Internal, "write record: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return status.Errorf(codes.Internal, "write record: %v", err)
	}
	return nil
}

func removeRecord(dir string) error {
	path := filepath.Join(dir, recordFile)
	for _, p := range []string{path + ".tmp", path} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove record: %w", err)
		}
	}
	return nil
}

// capacityOf checks a requested disk size.
func capacityOf(n uint64) (int64, error) {
	switch {
	case n == 0:
		return 0, errors.New("required and > 0")
	case n > math.MaxInt64:
		return 0, fmt.Errorf("%d bytes is too large", n)
	}
	return int64(n), nil
}

// validFileName reports whether s can name a file in a directory without leaving it.
func validFileName(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\x00")
}

func describeStatError(path string, err error) string {
	if errors.Is(err, fs.ErrNotExist) {
		return path + " does not exist"
	}
	return fmt.Sprintf("%s cannot be used: %v", path, err)
}

// sourceName is the KubeVirt name of a volume's source ("containerDisk", ...).
func sourceName(v *storagev1.Volume) string {
	switch v.GetSource().(type) {
	case *storagev1.Volume_ContainerDisk:
		return "containerDisk"
	case *storagev1.Volume_EmptyDisk:
		return volumeEmptyDisk
	case *storagev1.Volume_HostDisk:
		return volumeHostDisk
	case *storagev1.Volume_Ephemeral:
		return "ephemeral"
	case *storagev1.Volume_CloudInitNoCloud:
		return "cloudInitNoCloud"
	case *storagev1.Volume_CloudInitConfigDrive:
		return "cloudInitConfigDrive"
	case *storagev1.Volume_PersistentVolumeClaim:
		return "persistentVolumeClaim"
	}
	return fmt.Sprintf("%T", v.GetSource())
}

type nopLogger struct{}

func (nopLogger) Info(string, ...any) {}
func (nopLogger) Warn(string, ...any) {}
