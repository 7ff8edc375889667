package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// hostDisk types, as in KubeVirt.
const (
	hostDiskDisk         = "Disk"
	hostDiskDiskOrCreate = "DiskOrCreate"
)

// pvcDiskImage is the disk image of a file system PVC, in the directory the claim is mounted
// on (KubeVirt's convention).
const pvcDiskImage = "disk.img"

// maxVolumeName leaves room for the suffixes the driver adds within a file name's 255 bytes.
const maxVolumeName = 200

// Prepare implements driver.Storage. It checks and resolves every volume before it makes
// anything, so that a bad volume leaves nothing behind; should a later step fail, it removes
// what this call made and puts the record back as it was before it returns.
func (l *Local) Prepare(ctx context.Context, req *storagev1.PrepareRequest) (*storagev1.PrepareResponse, error) {
	dir, err := workDirOf(req.GetVmiId(), req.GetWorkDir())
	if err != nil {
		return nil, err
	}
	unlock := l.locks.Lock(dir)
	defer unlock()

	tool := l.imageTool()
	plans, err := planVolumes(ctx, tool, dir, req.GetVmiId(), req.GetVolumes())
	if err != nil {
		return nil, err
	}
	prev, err := loadState(dir, req.GetVmiId())
	if err != nil {
		return nil, err
	}
	p := &preparer{dir: dir, vmiID: req.GetVmiId(), prev: prev}
	disks, err := p.run(ctx, plans)
	if err != nil {
		if uerr := p.undo(); uerr != nil {
			l.log.Warn("undo failed prepare", "vmi", req.GetVmiId(), "error", uerr)
		}
		return nil, err
	}
	for _, pl := range plans {
		if pl.created != "" && slices.ContainsFunc(pl.steps, func(s step) bool { return slices.Contains(p.made, s.path) }) {
			l.log.Info(pl.created, "vmi", req.GetVmiId(), "volume", pl.name, "path", pl.disk.GetPath())
		}
	}
	l.log.Info("prepared", "vmi", req.GetVmiId(), "workDir", dir, "disks", len(disks), "made", len(p.made))
	return &storagev1.PrepareResponse{Disks: disks}, nil
}

// Release implements driver.Storage. It removes the files the record lists in the work
// directory (never a base image), then the record, then the work directory if Prepare made it
// and it is empty. Without a record there is nothing to release. The volumes of the request
// are not needed: the record says what was made.
//
// A hostDisk is the user's persistent disk, as in KubeVirt: one that DiskOrCreate created is
// kept, so its data outlives the VMI (a failed Prepare call still removes what it created, as
// no guest has used it yet). So is the disk.img Prepare made on a persistentVolumeClaim.
func (l *Local) Release(_ context.Context, req *storagev1.ReleaseRequest) error {
	dir, err := workDirOf(req.GetVmiId(), req.GetWorkDir())
	if err != nil {
		return err
	}
	unlock := l.locks.Lock(dir)
	defer unlock()

	st, err := loadState(dir, req.GetVmiId())
	if err != nil || st == nil {
		return err
	}
	var errs []error
	removed := 0
	for _, v := range st.Volumes {
		var left []string
		// Last made first: an overlay before its base.
		for _, f := range slices.Backward(v.Files) {
			if !inDir(dir, f) {
				l.log.Info(v.Type+" kept", "vmi", req.GetVmiId(), "volume", v.Name, "path", f)
				continue
			}
			if err := removeMade(dir, f); err != nil {
				left = append([]string{f}, left...)
				errs = append(errs, err)
				continue
			}
			removed++
		}
		v.Files, v.Ready = left, false
	}
	if len(errs) > 0 {
		// Keep what could not be removed on record, so that the next Release tries again.
		if err := saveState(dir, st); err != nil {
			errs = append(errs, err)
		}
		return status.Errorf(codes.Internal, "release volumes of VMI %s: %v", req.GetVmiId(), errors.Join(errs...))
	}
	if err := removeState(dir); err != nil {
		return status.Errorf(codes.Internal, "release volumes of VMI %s: %v", req.GetVmiId(), err)
	}
	if st.CreatedWorkDir {
		if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			// Someone else put files there: they are not ours to remove.
			l.log.Warn("work directory not removed", "vmi", req.GetVmiId(), "workDir", dir, "error", err)
		}
	}
	l.log.Info("released", "vmi", req.GetVmiId(), "workDir", dir, "files", removed)
	return nil
}

// workDirOf checks a request's VMI id and work directory.
func workDirOf(vmiID, workDir string) (string, error) {
	switch {
	case vmiID == "":
		return "", status.Error(codes.InvalidArgument, "vmiId: required")
	case workDir == "":
		return "", status.Error(codes.InvalidArgument, "workDir: required")
	case !filepath.IsAbs(workDir):
		return "", status.Errorf(codes.InvalidArgument, "workDir: must be an absolute path, not %q", workDir)
	}
	return filepath.Clean(workDir), nil
}

// plan is one volume checked and resolved, before anything is made.
type plan struct {
	name string
	typ  string
	// disk is the answer for the volume; SizeBytes is filled in by steps that learn it.
	disk *storagev1.PreparedDisk
	// source names the inputs of the files the steps make (see volumeState.Source). A volume
	// used in place has no steps.
	source string
	steps  []step
	// created, when set, is what Prepare logs once it made the steps' files (a disk image made
	// on a claim, which the user may not expect).
	created string
}

// step makes one file of a volume.
type step struct {
	path string
	// external is true for a file outside the work directory (a hostDisk the driver creates):
	// it is made at path with O_EXCL, not written aside and renamed into place.
	external bool
	// make writes the file at to: a temporary name in the work directory that is renamed to
	// path once make succeeds (path itself when external).
	make func(ctx context.Context, to string) error
}

// planVolumes checks every volume and resolves its source without changing anything. Errors
// are InvalidArgument naming the volume, except for I/O errors.
func planVolumes(ctx context.Context, tool ImageTool, dir, vmiID string, vols []*storagev1.Volume) ([]*plan, error) {
	seen := map[string]bool{}
	for i, v := range vols {
		name := v.GetName()
		switch {
		case name == "":
			return nil, status.Errorf(codes.InvalidArgument, "volumes[%d].name: required", i)
		case !validVolumeName(name):
			return nil, status.Errorf(codes.InvalidArgument, "volume %q: name cannot be used in a file name (no path separators, NUL, \".\" or \"..\", at most %d bytes)", name, maxVolumeName)
		case seen[name]:
			return nil, status.Errorf(codes.InvalidArgument, "volume %q: duplicate volume name", name)
		}
		seen[name] = true
	}
	plans := make([]*plan, 0, len(vols))
	for _, v := range vols {
		pl, err := planVolume(ctx, tool, dir, vmiID, v)
		if err != nil {
			return nil, volumeError(v.GetName(), err)
		}
		plans = append(plans, pl)
	}
	return plans, nil
}

func planVolume(ctx context.Context, tool ImageTool, dir, vmiID string, v *storagev1.Volume) (*plan, error) {
	name := v.GetName()
	pl := &plan{name: name, typ: volumeType(v)}
	own := func(suffix string) string { return filepath.Join(dir, name+suffix) }

	switch src := v.GetSource().(type) {
	case *storagev1.Volume_ContainerDisk:
		p, err := absPath("containerDisk.path", src.ContainerDisk.GetPath())
		if err != nil {
			return nil, err
		}
		cs, err := resolveContainerDisk(p, src.ContainerDisk.GetImage())
		if err != nil {
			return nil, err
		}
		if cs.file != "" {
			return overlayPlan(ctx, tool, pl, cs.file, own(".qcow2"))
		}
		return ociPlan(tool, pl, cs.oci, own(".base"), own(".qcow2")), nil

	case *storagev1.Volume_Ephemeral:
		p, err := absPath("ephemeral.backingPath", src.Ephemeral.GetBackingPath())
		if err != nil {
			return nil, err
		}
		if p, err = claimImage(p); err != nil {
			return nil, err
		}
		return overlayPlan(ctx, tool, pl, p, own(".qcow2"))

	case *storagev1.Volume_EmptyDisk:
		capacity, err := capacityOf("emptyDisk.capacityBytes", src.EmptyDisk.GetCapacityBytes())
		if err != nil {
			return nil, err
		}
		path := own(".qcow2")
		pl.disk = &storagev1.PreparedDisk{VolumeName: name, Path: path, Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, SizeBytes: uint64(roundUp512(capacity))}
		pl.source = fmt.Sprintf("empty:%d", capacity)
		pl.steps = []step{{path: path, make: func(ctx context.Context, to string) error {
			if err := tool.Create(ctx, to, CreateOptions{Format: FormatQcow2, Size: capacity}); err != nil {
				return fmt.Errorf("create empty disk: %w", err)
			}
			return os.Chmod(to, filePerm)
		}}}
		return pl, nil

	case *storagev1.Volume_HostDisk:
		return hostDiskPlan(ctx, tool, pl, src.HostDisk)

	case *storagev1.Volume_PersistentVolumeClaim:
		return claimPlan(ctx, tool, pl, src.PersistentVolumeClaim)

	case *storagev1.Volume_CloudInitNoCloud:
		sd, err := noCloudSeed(src.CloudInitNoCloud, vmiID)
		if err != nil {
			return nil, err
		}
		return cloudInitPlan(pl, sd, own(".iso")), nil

	case *storagev1.Volume_CloudInitConfigDrive:
		sd, err := configDriveSeed(src.CloudInitConfigDrive, vmiID)
		if err != nil {
			return nil, err
		}
		return cloudInitPlan(pl, sd, own(".iso")), nil

	case nil:
		return nil, badImage("no volume source")
	}
	return nil, badImage("volume type %s is not supported", pl.typ)
}

// overlayPlan makes a qcow2 overlay over a base image that is never written.
func overlayPlan(ctx context.Context, tool ImageTool, pl *plan, basePath, overlay string) (*plan, error) {
	base, err := inspectBase(ctx, tool, basePath, basePath)
	if err != nil {
		return nil, err
	}
	id, err := fileIdentity(basePath)
	if err != nil {
		return nil, err
	}
	pl.disk = &storagev1.PreparedDisk{VolumeName: pl.name, Path: overlay, Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, SizeBytes: uint64(base.virtualSize())}
	pl.source = fmt.Sprintf("%s:%s:%s", base.format, basePath, id)
	pl.steps = []step{overlayStep(tool, overlay, basePath, base.format)}
	return pl, nil
}

func overlayStep(tool ImageTool, overlay, basePath string, baseFormat Format) step {
	return step{path: overlay, make: func(ctx context.Context, to string) error {
		err := tool.Create(ctx, to, CreateOptions{Format: FormatQcow2, BackingFile: basePath, BackingFormat: baseFormat})
		if err != nil {
			return fmt.Errorf("create overlay over %s: %w", basePath, err)
		}
		return os.Chmod(to, filePerm)
	}}
}

// ociPlan extracts the disk of an OCI image layout into the work directory, then makes an
// overlay over it. Both are made again only when the image's manifest changes.
func ociPlan(tool ImageTool, pl *plan, img *ociImage, basePath, overlay string) *plan {
	pl.disk = &storagev1.PreparedDisk{VolumeName: pl.name, Path: overlay, Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2}
	pl.source = fmt.Sprintf("oci:%s@%s", img.layout, img.manifest)
	var baseFormat Format
	extract := step{path: basePath, make: func(ctx context.Context, to string) error {
		diskName, err := img.extractDisk(ctx, to)
		if err != nil {
			return err
		}
		shown := fmt.Sprintf("/%s/%s of OCI image %s in %s", containerDiskDir, diskName, img.manifest, img.layout)
		base, err := inspectBase(ctx, tool, to, shown)
		if err != nil {
			return err
		}
		baseFormat, pl.disk.SizeBytes = base.format, uint64(base.virtualSize())
		// The base is never written: not even by mistake.
		return os.Chmod(to, 0o440)
	}}
	ov := step{path: overlay, make: func(ctx context.Context, to string) error {
		return overlayStep(tool, overlay, basePath, baseFormat).make(ctx, to)
	}}
	pl.steps = []step{extract, ov}
	return pl
}

func hostDiskPlan(ctx context.Context, tool ImageTool, pl *plan, hd *storagev1.HostDisk) (*plan, error) {
	p, err := absPath("hostDisk.path", hd.GetPath())
	if err != nil {
		return nil, err
	}
	typ := hd.GetType()
	if typ != hostDiskDisk && typ != hostDiskDiskOrCreate {
		return nil, badImage("hostDisk.type %q is not supported (want %s or %s)", typ, hostDiskDisk, hostDiskDiskOrCreate)
	}
	_, statErr := os.Stat(p)
	switch {
	case statErr == nil:
		return pl, inPlacePlan(ctx, tool, pl, p)
	case !errors.Is(statErr, fs.ErrNotExist):
		return nil, fmt.Errorf("stat %s: %w", p, statErr)
	case typ == hostDiskDisk:
		return nil, badImage("hostDisk.path: %s does not exist (type %s needs an existing disk)", p, hostDiskDisk)
	}
	capacity, err := capacityOf("hostDisk.capacityBytes", hd.GetCapacityBytes())
	if err != nil {
		return nil, badImage("%v (%s does not exist and must be created)", err, p)
	}
	if di, err := os.Stat(filepath.Dir(p)); err != nil || !di.IsDir() {
		return nil, badImage("hostDisk.path: directory %s does not exist", filepath.Dir(p))
	}
	size := roundUp512(capacity)
	pl.disk = &storagev1.PreparedDisk{VolumeName: pl.name, Path: p, Format: domainv1.DiskFormat_DISK_FORMAT_RAW, SizeBytes: uint64(size)}
	pl.source = fmt.Sprintf("raw:%d", size)
	pl.steps = []step{{path: p, external: true, make: func(_ context.Context, to string) error {
		return createSparse(to, size)
	}}}
	return pl, nil
}

// inPlacePlan uses an existing file or block device as the disk, in the format its bytes say.
func inPlacePlan(ctx context.Context, tool ImageTool, pl *plan, p string) error {
	im, err := detectImage(p, p)
	if err != nil {
		return err
	}
	if err := checkInPlace(im); err != nil {
		return err
	}
	if err := checkWithTool(ctx, tool, p, im); err != nil {
		return err
	}
	pl.disk = &storagev1.PreparedDisk{VolumeName: pl.name, Path: p, Format: diskFormat(im.format), SizeBytes: uint64(im.virtualSize())}
	return nil
}

func cloudInitPlan(pl *plan, sd *seed, iso string) *plan {
	pl.disk = &storagev1.PreparedDisk{VolumeName: pl.name, Path: iso, Format: domainv1.DiskFormat_DISK_FORMAT_RAW, ReadOnly: true, Cdrom: true}
	pl.source = sd.digest()
	pl.steps = []step{{path: iso, make: func(_ context.Context, to string) error {
		if err := writeISO(sd, to, tmpDir(iso)); err != nil {
			return fmt.Errorf("write %s ISO: %w", sd.label, err)
		}
		fi, err := os.Stat(to)
		if err != nil {
			return err
		}
		pl.disk.SizeBytes = uint64(fi.Size())
		return nil
	}}}
	return pl
}

// inspectBase detects a base image's format and checks that it is a disk image qemu can open.
func inspectBase(ctx context.Context, tool ImageTool, p, shown string) (*imageFile, error) {
	im, err := detectImage(p, shown)
	if err != nil {
		return nil, err
	}
	if err := checkBase(im); err != nil {
		return nil, err
	}
	if err := checkWithTool(ctx, tool, p, im); err != nil {
		return nil, err
	}
	return im, nil
}

// checkWithTool has the image tool open a qcow2 image, which checks far more of it than its
// header, and takes the virtual size from it.
func checkWithTool(ctx context.Context, tool ImageTool, p string, im *imageFile) error {
	if im.format != FormatQcow2 {
		return nil
	}
	info, err := tool.Info(ctx, p, FormatQcow2)
	if err != nil {
		if errors.Is(err, ErrToolUnavailable) || ctx.Err() != nil {
			return err
		}
		return badImage("%s is not a usable qcow2 image: %v", im.path, err)
	}
	if info.BackingFile != "" {
		return badImage("%s is a qcow2 image with a backing file, which is not allowed", im.path)
	}
	if info.VirtualSize > 0 {
		im.qcow2.size = uint64(info.VirtualSize)
	}
	return nil
}

// claimPlan uses a persistentVolumeClaim's disk in place: the path itself (a block device or
// an image file), or disk.img in it when the claim is a mounted file system. On a file-system
// claim without disk.img that is writable and has a capacity, it makes disk.img as KubeVirt
// does: a sparse raw image of capacity_bytes rounded down to whole MiB (the handler leaves the
// file system's overhead out of the capacity). The image is the claim's data, so, as a
// hostDisk that Prepare created, Release keeps it; only a failed Prepare call removes it.
func claimPlan(ctx context.Context, tool ImageTool, pl *plan, pvc *storagev1.PersistentVolumeClaim) (*plan, error) {
	p, err := absPath("persistentVolumeClaim.path", pvc.GetPath())
	if err != nil {
		return nil, err
	}
	img, err := claimImage(p)
	var missing *missingImageError
	switch {
	case errors.As(err, &missing) && !pvc.GetReadOnly() && pvc.GetCapacityBytes() >= 1<<20:
		size := pvc.GetCapacityBytes() &^ (1<<20 - 1)
		pl.disk = &storagev1.PreparedDisk{VolumeName: pl.name, Path: missing.image, Format: domainv1.DiskFormat_DISK_FORMAT_RAW, SizeBytes: uint64(size)}
		pl.source = fmt.Sprintf("raw:%d", size)
		pl.created = fmt.Sprintf("created the claim's %s (sparse raw, %d bytes)", pvcDiskImage, size)
		pl.steps = []step{{path: missing.image, external: true, make: func(_ context.Context, to string) error {
			if err := createSparse(to, size); err != nil {
				return err
			}
			// filePerm, as the driver's other images, whatever the umask.
			if err := os.Chmod(to, filePerm); err != nil {
				_ = os.Remove(to)
				return err
			}
			return nil
		}}}
		return pl, nil
	case errors.As(err, &missing) && pvc.GetReadOnly():
		return nil, badImage("%v; the claim is read-only, so none is made", err)
	case errors.As(err, &missing) && pvc.GetCapacityBytes() > 0:
		return nil, badImage("%v; the claim's capacity less its file-system overhead (%d bytes) is less than 1 MiB, so none is made", err, pvc.GetCapacityBytes())
	case errors.As(err, &missing):
		return nil, badImage("%v; the request gives no capacity to make one of", err)
	case err != nil:
		return nil, err
	}
	if err := inPlacePlan(ctx, tool, pl, img); err != nil {
		return nil, err
	}
	pl.disk.ReadOnly = pvc.GetReadOnly()
	return pl, nil
}

// missingImageError says that a claim is a directory without disk.img (claimImage).
type missingImageError struct{ dir, image string }

func (e *missingImageError) Error() string {
	return fmt.Sprintf("%s is a directory without %s", e.dir, pvcDiskImage)
}

// Unwrap makes it a bad image: the source is not usable as it is.
func (e *missingImageError) Unwrap() error { return &badImageError{msg: e.Error()} }

// claimImage is the disk image of a claim: the path itself, or disk.img in it when the claim
// is a mounted file system. A directory without disk.img is a *missingImageError, which is a
// bad image (isBadImage).
func claimImage(p string) (string, error) {
	fi, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", badImage("%s does not exist", p)
		}
		return "", fmt.Errorf("stat %s: %w", p, err)
	}
	if fi.IsDir() {
		img := filepath.Join(p, pvcDiskImage)
		if _, err := os.Lstat(img); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return "", &missingImageError{dir: p, image: img}
			}
			return "", fmt.Errorf("stat %s: %w", img, err)
		}
		return img, nil
	}
	return p, nil
}

// fileIdentity names a file's identity and version: the same path replaced or modified has
// another.
func fileIdentity(p string) (string, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("stat %s: %w", p, err)
	}
	id := fmt.Sprintf("size=%d,mtime=%d", fi.Size(), fi.ModTime().UnixNano())
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id = fmt.Sprintf("dev=%d,ino=%d,%s", uint64(st.Dev), uint64(st.Ino), id)
	}
	return id, nil
}

// preparer carries out the plans of one Prepare call and can undo what that call made.
type preparer struct {
	dir   string
	vmiID string
	// prev is the record as it was before this call; nil when there was none.
	prev *state
	// cur is the record as this call changes it; changed when it differs from prev on disk.
	cur     *state
	changed bool
	// made are the files this call put in place; temps the temporary names it wrote; madeDir
	// is true when it made the work directory.
	made    []string
	temps   []string
	madeDir bool
}

func (p *preparer) run(ctx context.Context, plans []*plan) ([]*storagev1.PreparedDisk, error) {
	p.cur = &state{VMIID: p.vmiID}
	if p.prev != nil {
		p.cur = p.prev.clone()
	}
	disks := make([]*storagev1.PreparedDisk, 0, len(plans))
	for _, pl := range plans {
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		if len(pl.steps) > 0 {
			if err := p.make(ctx, pl); err != nil {
				return nil, volumeError(pl.name, err)
			}
		}
		disks = append(disks, pl.disk)
	}
	return disks, nil
}

// make makes a volume's files, unless the record says they were made from the same inputs
// and they are all there.
func (p *preparer) make(ctx context.Context, pl *plan) error {
	paths := make([]string, len(pl.steps))
	for i, s := range pl.steps {
		paths[i] = s.path
	}
	old := p.cur.volume(pl.name)
	if old != nil && old.Ready && old.Source == pl.source && allExist(paths) && subset(paths, old.Files) {
		pl.disk.SizeBytes = uint64(old.SizeBytes)
		return nil
	}
	for _, s := range pl.steps {
		if !p.cur.owns(s.path) && exists(s.path) {
			return status.Errorf(codes.FailedPrecondition, "%s exists and was not made by the %s storage driver", s.path, DriverName)
		}
	}
	if err := p.ensureWorkDir(); err != nil {
		return err
	}
	vs := &volumeState{Name: pl.name, Type: pl.typ, Source: pl.source}
	if old != nil {
		vs.Files = slices.Clone(old.Files)
	}
	for _, f := range paths {
		if !slices.Contains(vs.Files, f) {
			vs.Files = append(vs.Files, f)
		}
	}
	// On record before it is made: a crash in between leaves nothing Release would not remove.
	p.cur.put(vs)
	if err := p.save(); err != nil {
		return err
	}
	for _, s := range pl.steps {
		if err := p.makeFile(ctx, s); err != nil {
			return err
		}
	}
	if err := syncDir(p.dir); err != nil {
		return fmt.Errorf("sync %s: %w", p.dir, err)
	}
	vs.Ready, vs.SizeBytes = true, int64(pl.disk.GetSizeBytes())
	return p.save()
}

func (p *preparer) makeFile(ctx context.Context, s step) error {
	if s.external {
		if err := s.make(ctx, s.path); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return status.Errorf(codes.FailedPrecondition, "%s appeared while it was being created; try again", s.path)
			}
			return fmt.Errorf("create %s: %w", s.path, err)
		}
		p.made = append(p.made, s.path)
		return nil
	}
	tmp := tmpPath(s.path)
	p.temps = append(p.temps, s.path)
	// What a crashed call may have left.
	if err := cleanTemps(s.path); err != nil {
		return err
	}
	if err := s.make(ctx, tmp); err != nil {
		return err
	}
	// Durable before it is put in place: the record will say it is complete.
	if err := syncFile(tmp); err != nil {
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	p.made = append(p.made, s.path)
	return nil
}

func cleanTemps(p string) error {
	if err := os.Remove(tmpPath(p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.RemoveAll(tmpDir(p))
}

// ensureWorkDir makes the work directory when it is missing, and records that it did.
func (p *preparer) ensureWorkDir() error {
	fi, err := os.Stat(p.dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return status.Errorf(codes.FailedPrecondition, "work directory %s is not a directory", p.dir)
	case !errors.Is(err, fs.ErrNotExist):
		return status.Errorf(codes.Internal, "stat %s: %v", p.dir, err)
	}
	if err := os.MkdirAll(p.dir, dirPerm); err != nil {
		return status.Errorf(codes.Internal, "create work directory: %v", err)
	}
	p.madeDir = true
	p.cur.CreatedWorkDir = true
	return nil
}

func (p *preparer) save() error {
	if err := saveState(p.dir, p.cur); err != nil {
		return err
	}
	p.changed = true
	return nil
}

// undo removes what this call made and puts the record back as it was.
func (p *preparer) undo() error {
	var errs []error
	for _, f := range slices.Backward(p.made) {
		if err := removeMade(p.dir, f); err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range p.temps {
		if err := cleanTemps(f); err != nil {
			errs = append(errs, err)
		}
	}
	switch {
	case len(errs) > 0:
		// Leave the record as this call extended it, so that Release removes the rest.
	case !p.changed:
	case p.prev != nil:
		errs = append(errs, saveState(p.dir, p.prev))
	default:
		errs = append(errs, removeState(p.dir))
	}
	err := errors.Join(errs...)
	if err == nil && p.madeDir {
		if err := os.Remove(p.dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return err
}

// volumeError names the volume in err and gives it its gRPC code: InvalidArgument for a source
// that is not usable, FailedPrecondition when the image tool does not run, the code err
// already has if it is a status error, Internal otherwise.
func volumeError(name string, err error) error {
	code := codes.Internal
	msg := err.Error()
	if st, ok := status.FromError(err); ok {
		code, msg = st.Code(), st.Message()
	}
	switch {
	case isBadImage(err):
		code = codes.InvalidArgument
	case errors.Is(err, ErrToolUnavailable):
		code = codes.FailedPrecondition
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return status.Errorf(code, "volume %q: %s", name, msg)
}

// volumeType is the KubeVirt name of a volume's source ("containerDisk", ...).
func volumeType(v *storagev1.Volume) string {
	switch v.GetSource().(type) {
	case *storagev1.Volume_ContainerDisk:
		return TypeContainerDisk
	case *storagev1.Volume_EmptyDisk:
		return TypeEmptyDisk
	case *storagev1.Volume_HostDisk:
		return TypeHostDisk
	case *storagev1.Volume_Ephemeral:
		return TypeEphemeral
	case *storagev1.Volume_CloudInitNoCloud:
		return TypeCloudInitNoCloud
	case *storagev1.Volume_CloudInitConfigDrive:
		return TypeCloudInitConfigDrive
	case *storagev1.Volume_PersistentVolumeClaim:
		return TypePersistentVolumeClaim
	case nil:
		return ""
	}
	return fmt.Sprintf("%T", v.GetSource())
}

func diskFormat(f Format) domainv1.DiskFormat {
	if f == FormatQcow2 {
		return domainv1.DiskFormat_DISK_FORMAT_QCOW2
	}
	return domainv1.DiskFormat_DISK_FORMAT_RAW
}

// validVolumeName reports whether a volume name can be part of a file name in the work
// directory without leaving it.
func validVolumeName(s string) bool {
	return s != "" && s != "." && s != ".." && len(s) <= maxVolumeName && !strings.ContainsAny(s, "/\\\x00")
}

func absPath(field, p string) (string, error) {
	switch {
	case p == "":
		return "", badImage("%s: required", field)
	case !filepath.IsAbs(p):
		return "", badImage("%s: must be an absolute path, not %q", field, p)
	}
	return filepath.Clean(p), nil
}

func capacityOf(field string, n uint64) (int64, error) {
	switch {
	case n == 0:
		return 0, badImage("%s: required and > 0", field)
	case n > math.MaxInt64-511:
		return 0, badImage("%s: %d bytes is too large", field, n)
	}
	return int64(n), nil
}

func roundUp512(n int64) int64 { return (n + 511) &^ 511 }

// createSparse makes a raw disk of size bytes that takes no space until written.
func createSparse(p string, size int64) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, filePerm)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(p)
	}
	return err
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func allExist(paths []string) bool {
	return !slices.ContainsFunc(paths, func(p string) bool { return !exists(p) })
}

func subset(a, b []string) bool {
	return !slices.ContainsFunc(a, func(s string) bool { return !slices.Contains(b, s) })
}
