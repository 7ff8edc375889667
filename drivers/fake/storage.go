package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// StorageManifest is the file in a work directory where the fake storage driver lists the files
// it made there, so that Release removes those and nothing else, even after a driver restart.
const StorageManifest = ".kubevisor-fake-storage.json"

// nominalImageSize is the size the fake storage driver gives an overlay over a container disk
// directory, whose image it does not read.
const nominalImageSize = 1 << 30

// StorageConfig is the JSON configuration of the fake storage driver.
type StorageConfig struct {
	// PrepareDelay is how long every Prepare takes.
	PrepareDelay Duration `json:"prepareDelay,omitempty"`
}

// Storage is the fake storage driver. It supports every volume type. Disks it makes are sparse
// files under the work directory (raw images of zeros, whatever the source); cloud-init data
// becomes a small read-only CD-ROM image that is not a real ISO. Volumes that name a path on the
// node (hostDisk, persistentVolumeClaim) are used in place. A hostDisk of type DiskOrCreate
// that did not exist is created where it is named and, being the user's data, survives Release.
type Storage struct {
	base

	// mu serialises Prepare and Release: they are cheap, and it keeps manifests consistent.
	mu  sync.Mutex
	cfg StorageConfig
}

var _ driver.Storage = (*Storage)(nil)

// VolumeTypes are the volume sources the fake storage driver declares, as in
// basev1.Capabilities.VolumeTypes.
var VolumeTypes = []string{"containerDisk", "emptyDisk", "hostDisk", "ephemeral", "cloudInitNoCloud", "cloudInitConfigDrive", "persistentVolumeClaim"}

// NewStorage returns a fake storage driver with the default configuration.
func NewStorage() *Storage {
	return &Storage{base: newBase(basev1.Kind_KIND_STORAGE, "simulated storage: disks are sparse files of zeros, cloud-init media are not real ISOs")}
}

// Capabilities implements driver.Driver: every volume type.
func (s *Storage) Capabilities(context.Context) (*basev1.Capabilities, error) {
	return &basev1.Capabilities{VolumeTypes: append([]string(nil), VolumeTypes...)}, nil
}

// Fingerprint implements driver.Driver.
func (s *Storage) Fingerprint(ctx context.Context, send func(*basev1.FingerprintResponse) error) error {
	return s.fingerprint(ctx, send, func() *basev1.FingerprintResponse {
		return healthy("simulated storage: disks are sparse files")
	})
}

// Configure implements driver.Driver. The configuration is a StorageConfig.
func (s *Storage) Configure(_ context.Context, req *basev1.ConfigureRequest) error {
	var cfg StorageConfig
	if err := decodeConfig(req.GetConfig(), &cfg); err != nil {
		return err
	}
	s.mu.Lock()
	s.cfg = cfg
	s.mu.Unlock()
	return nil
}

// plannedDisk is one volume's disk as Prepare will make or use it.
type plannedDisk struct {
	disk *storagev1.PreparedDisk
	// make is set when Prepare makes the file; content, when set, is written to it, otherwise it
	// is a sparse file of disk.SizeBytes.
	make    bool
	content []byte
	// keep is set for a file made outside the work directory that Release must not remove.
	keep bool
}

// Prepare implements driver.Storage. Every volume is checked before any file is made; a file
// that cannot be made undoes what this call made.
func (s *Storage) Prepare(ctx context.Context, req *storagev1.PrepareRequest) (*storagev1.PrepareResponse, error) {
	workDir := req.GetWorkDir()
	if !filepath.IsAbs(workDir) {
		return nil, invalid("work_dir: must be an absolute path, not %q", workDir)
	}
	plan, err := planVolumes(req)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	delay := time.Duration(s.cfg.PrepareDelay)
	s.mu.Unlock()
	if err := sleep(ctx, delay); err != nil {
		return nil, err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.MkdirAll(workDir, 0o750); err != nil {
		return nil, fmt.Errorf("make work directory: %w", err)
	}
	man, err := readManifest(workDir)
	if err != nil {
		return nil, err
	}
	var made []string
	undo := func() {
		for _, p := range made {
			_ = os.Remove(p)
			for name, path := range man.Files {
				if path == p {
					delete(man.Files, name)
				}
			}
		}
		_ = man.write(workDir)
	}
	resp := &storagev1.PrepareResponse{}
	for _, p := range plan {
		resp.Disks = append(resp.Disks, p.disk)
		if !p.make {
			continue
		}
		path := p.disk.GetPath()
		_, statErr := os.Lstat(path)
		exists := statErr == nil
		ours := man.Files[p.disk.GetVolumeName()] == path
		switch {
		case exists && p.keep:
			continue
		case exists && !ours:
			undo()
			return nil, precondition("volume %q: %s exists and was not made by this driver", p.disk.GetVolumeName(), path)
		case exists && p.content == nil:
			// Made by an earlier Prepare: keep what the guest wrote.
			continue
		}
		if !p.keep {
			// Record the file before making it, so that Release finds it whatever happens next.
			man.Files[p.disk.GetVolumeName()] = path
			if err := man.write(workDir); err != nil {
				undo()
				return nil, err
			}
		}
		if err := makeFile(path, p); err != nil {
			undo()
			return nil, fmt.Errorf("volume %q: %w", p.disk.GetVolumeName(), err)
		}
		if !exists {
			made = append(made, path)
		}
	}
	return resp, nil
}

// planVolumes checks every volume and decides its disk.
func planVolumes(req *storagev1.PrepareRequest) ([]plannedDisk, error) {
	names := map[string]bool{}
	var plan []plannedDisk
	for i, vol := range req.GetVolumes() {
		name := vol.GetName()
		if name == "" {
			return nil, invalid("volumes[%d].name: required", i)
		}
		if name == "." || name == ".." || strings.ContainsAny(name, `/\`) {
			return nil, invalid("volume %q: name is not usable as a file name", name)
		}
		if names[name] {
			return nil, invalid("volume %q: duplicate volume name", name)
		}
		names[name] = true
		p, err := planVolume(req, vol)
		if err != nil {
			return nil, invalid("volume %q: %v", name, err)
		}
		plan = append(plan, p)
	}
	return plan, nil
}

func planVolume(req *storagev1.PrepareRequest, vol *storagev1.Volume) (plannedDisk, error) {
	inWorkDir := func(ext string) string { return filepath.Join(req.GetWorkDir(), vol.GetName()+ext) }
	disk := &storagev1.PreparedDisk{VolumeName: vol.GetName(), Format: domainv1.DiskFormat_DISK_FORMAT_RAW}
	switch src := vol.GetSource().(type) {
	case nil:
		return plannedDisk{}, errors.New("no source: exactly one of containerDisk, emptyDisk, hostDisk, ephemeral, cloudInitNoCloud, cloudInitConfigDrive, persistentVolumeClaim is required")
	case *storagev1.Volume_ContainerDisk:
		size, err := imageSize("containerDisk.path", src.ContainerDisk.GetPath(), true)
		if err != nil {
			return plannedDisk{}, err
		}
		disk.Path, disk.SizeBytes = inWorkDir(".img"), size
		return plannedDisk{disk: disk, make: true}, nil
	case *storagev1.Volume_Ephemeral:
		size, err := imageSize("ephemeral.backingPath", src.Ephemeral.GetBackingPath(), false)
		if err != nil {
			return plannedDisk{}, err
		}
		disk.Path, disk.SizeBytes = inWorkDir(".img"), size
		return plannedDisk{disk: disk, make: true}, nil
	case *storagev1.Volume_EmptyDisk:
		if src.EmptyDisk.GetCapacityBytes() == 0 {
			return plannedDisk{}, errors.New("emptyDisk.capacityBytes: required and > 0")
		}
		disk.Path, disk.SizeBytes = inWorkDir(".img"), src.EmptyDisk.GetCapacityBytes()
		return plannedDisk{disk: disk, make: true}, nil
	case *storagev1.Volume_HostDisk:
		hd := src.HostDisk
		switch hd.GetType() {
		case "Disk":
			size, err := imageSize("hostDisk.path", hd.GetPath(), false)
			if err != nil {
				return plannedDisk{}, err
			}
			disk.Path, disk.SizeBytes = hd.GetPath(), size
			return plannedDisk{disk: disk}, nil
		case "DiskOrCreate":
			if !filepath.IsAbs(hd.GetPath()) {
				return plannedDisk{}, fmt.Errorf("hostDisk.path: must be an absolute path, not %q", hd.GetPath())
			}
			disk.Path = hd.GetPath()
			if size, err := imageSize("hostDisk.path", hd.GetPath(), false); err == nil {
				disk.SizeBytes = size
				return plannedDisk{disk: disk}, nil
			}
			if hd.GetCapacityBytes() == 0 {
				return plannedDisk{}, errors.New("hostDisk.capacityBytes: required and > 0 to create the disk")
			}
			disk.SizeBytes = hd.GetCapacityBytes()
			return plannedDisk{disk: disk, make: true, keep: true}, nil
		}
		return plannedDisk{}, fmt.Errorf("hostDisk.type: %q is not Disk or DiskOrCreate", hd.GetType())
	case *storagev1.Volume_PersistentVolumeClaim:
		pvc := src.PersistentVolumeClaim
		size, err := imageSize("persistentVolumeClaim.path", pvc.GetPath(), false)
		if err != nil {
			return plannedDisk{}, err
		}
		disk.Path, disk.SizeBytes, disk.ReadOnly = pvc.GetPath(), size, pvc.GetReadOnly()
		return plannedDisk{disk: disk}, nil
	case *storagev1.Volume_CloudInitNoCloud:
		return cloudInitDisk(req, vol, "NoCloud", src.CloudInitNoCloud, inWorkDir(".iso")), nil
	case *storagev1.Volume_CloudInitConfigDrive:
		return cloudInitDisk(req, vol, "ConfigDrive", src.CloudInitConfigDrive, inWorkDir(".iso")), nil
	}
	return plannedDisk{}, fmt.Errorf("source %T is not supported", vol.GetSource())
}

// imageSize checks that path names a disk image (a file or, with dirOK, an image directory) and
// returns its size.
func imageSize(field, path string, dirOK bool) (uint64, error) {
	if path == "" {
		return 0, fmt.Errorf("%s: required", field)
	}
	if !filepath.IsAbs(path) {
		return 0, fmt.Errorf("%s: must be an absolute path, not %q", field, path)
	}
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("%s: %s does not exist", field, path)
	}
	if err != nil {
		return 0, fmt.Errorf("%s: %w", field, err)
	}
	switch {
	case fi.Mode().IsRegular():
		return uint64(fi.Size()), nil
	case fi.IsDir() && dirOK:
		return nominalImageSize, nil
	case fi.Mode()&fs.ModeDevice != 0:
		return 0, nil
	}
	return 0, fmt.Errorf("%s: %s is not a disk image", field, path)
}

func cloudInitDisk(req *storagev1.PrepareRequest, vol *storagev1.Volume, flavour string, ci *storagev1.CloudInit, path string) plannedDisk {
	instanceID := ci.GetInstanceId()
	if instanceID == "" {
		instanceID = req.GetVmiId()
	}
	content := fmt.Appendf(nil, "simulated cloud-init %s media (not an ISO 9660 image) for volume %s\n"+
		"--- meta-data\ninstance-id: %s\nlocal-hostname: %s\n--- user-data\n%s\n--- network-config\n%s\n",
		flavour, vol.GetName(), instanceID, ci.GetHostname(), ci.GetUserData(), ci.GetNetworkData())
	return plannedDisk{
		disk: &storagev1.PreparedDisk{
			VolumeName: vol.GetName(),
			Path:       path,
			Format:     domainv1.DiskFormat_DISK_FORMAT_RAW,
			ReadOnly:   true,
			Cdrom:      true,
			SizeBytes:  uint64(len(content)),
		},
		make:    true,
		content: content,
	}
}

// makeFile writes a planned disk's file.
func makeFile(path string, p plannedDisk) error {
	if p.content != nil {
		return os.WriteFile(path, p.content, 0o600)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := f.Truncate(int64(p.disk.GetSizeBytes())); err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return err
	}
	return f.Close()
}

// Release implements driver.Storage. It removes the files the manifest lists for the volumes
// named (all, when none is), and nothing else.
func (s *Storage) Release(_ context.Context, req *storagev1.ReleaseRequest) error {
	workDir := req.GetWorkDir()
	if !filepath.IsAbs(workDir) {
		return invalid("work_dir: must be an absolute path, not %q", workDir)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	man, err := readManifest(workDir)
	if err != nil {
		return err
	}
	release := func(name string) error {
		path, ok := man.Files[name]
		if !ok {
			return nil
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("volume %q: remove %s: %w", name, path, err)
		}
		delete(man.Files, name)
		return nil
	}
	var errs []error
	if len(req.GetVolumes()) == 0 {
		for name := range man.Files {
			errs = append(errs, release(name))
		}
	}
	for _, vol := range req.GetVolumes() {
		errs = append(errs, release(vol.GetName()))
	}
	errs = append(errs, man.write(workDir))
	return errors.Join(errs...)
}

// storageManifest lists the files the driver made in one work directory, by volume name.
type storageManifest struct {
	Files map[string]string `json:"files"`
}

func readManifest(workDir string) (*storageManifest, error) {
	man := &storageManifest{Files: map[string]string{}}
	b, err := os.ReadFile(filepath.Join(workDir, StorageManifest))
	if errors.Is(err, fs.ErrNotExist) {
		return man, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read storage manifest: %w", err)
	}
	if err := json.Unmarshal(b, man); err != nil {
		return nil, fmt.Errorf("read storage manifest: %w", err)
	}
	if man.Files == nil {
		man.Files = map[string]string{}
	}
	return man, nil
}

// write saves the manifest, or removes it when it lists nothing.
func (m *storageManifest) write(workDir string) error {
	path := filepath.Join(workDir, StorageManifest)
	if len(m.Files) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove storage manifest: %w", err)
		}
		return nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return fmt.Errorf("write storage manifest: %w", err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return fmt.Errorf("write storage manifest: %w", err)
	}
	return nil
}
