package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Format is an on-disk image format, named as qemu-img names it.
type Format string

// The image formats the driver hands to a hypervisor.
const (
	FormatRaw   Format = "raw"
	FormatQcow2 Format = "qcow2"
)

// headerSize is how much of an image detectImage reads: enough for the deepest signature it
// looks for (the btrfs superblock magic at 64 KiB + 64).
const headerSize = 0x10048

// qcow2Magic starts every qcow2 image ("QFI\xfb").
var qcow2Magic = []byte{'Q', 'F', 'I', 0xfb}

// imageFile is what detectImage learnt of an image file or block device from its bytes.
type imageFile struct {
	// path is the file as the caller named it.
	path   string
	format Format
	// size is the file's (or block device's) size in bytes; for qcow2 the virtual size is in
	// qcow2.
	size    int64
	isBlock bool
	qcow2   *qcow2Header
	// content names what a raw image holds ("MBR partition table", "ext4 file system", ...);
	// empty when no known signature was found.
	content string
}

// virtualSize is the size of the disk the guest sees.
func (im *imageFile) virtualSize() int64 {
	if im.qcow2 != nil {
		return int64(im.qcow2.size)
	}
	return im.size
}

// qcow2Header is the part of a qcow2 header the driver checks.
type qcow2Header struct {
	version uint32
	// size is the virtual disk size in bytes.
	size uint64
	// hasBacking is true when the image names a backing file.
	hasBacking bool
	// hasDataFile is true when the image keeps its data in an external file (qcow2 v3
	// incompatible feature bit 2).
	hasDataFile bool
}

// badImageError says why a file is not a usable disk image. Callers turn it into
// InvalidArgument naming the volume.
type badImageError struct{ msg string }

func (e *badImageError) Error() string { return e.msg }

func badImage(format string, args ...any) error {
	return &badImageError{msg: fmt.Sprintf(format, args...)}
}

// isBadImage reports whether err says a source is not a usable image (as opposed to, say, an
// I/O error reading it).
func isBadImage(err error) bool {
	var b *badImageError
	return errors.As(err, &b)
}

// otherFormats are image formats qemu knows but this driver does not hand out, and compressed
// files, recognised so that the error says what the file is instead of "not a disk image".
var otherFormats = []struct {
	offset int
	magic  []byte
	what   string
}{
	{0, []byte("KDMV"), "a VMDK image"},
	{0, []byte("# Disk DescriptorFile"), "a VMDK descriptor"},
	{0, []byte("vhdxfile"), "a VHDX image"},
	{0, []byte("conectix"), "a VHD (vpc) image"},
	{64, []byte{0x7f, 0x10, 0xda, 0xbe}, "a VDI image"},
	{0, []byte{'Q', 'E', 'D', 0}, "a QED image"},
	{0, []byte{0x1f, 0x8b}, "gzip-compressed"},
	{0, []byte{0xfd, '7', 'z', 'X', 'Z', 0}, "xz-compressed"},
	{0, []byte{0x28, 0xb5, 0x2f, 0xfd}, "zstd-compressed"},
	{0, []byte("BZh"), "bzip2-compressed"},
}

// rawSignatures are what a raw disk image starts with: a partition table, or a file system
// written to the whole disk.
var rawSignatures = []struct {
	offset int
	magic  []byte
	what   string
}{
	{512, []byte("EFI PART"), "GPT partition table"},
	{4096, []byte("EFI PART"), "GPT partition table (4K sectors)"},
	{0x8001, []byte("CD001"), "ISO 9660 file system"},
	{1080, []byte{0x53, 0xef}, "ext2/3/4 file system"},
	{0, []byte("XFSB"), "XFS file system"},
	{0x10040, []byte("_BHRfS_M"), "btrfs file system"},
	{0, []byte{'L', 'U', 'K', 'S', 0xba, 0xbe}, "LUKS volume"},
	{512, []byte("LABELONE"), "LVM physical volume"},
	{0, []byte("hsqs"), "squashfs file system"},
	{54, []byte("FAT"), "FAT file system"},
	{82, []byte("FAT32"), "FAT32 file system"},
	{3, []byte("NTFS    "), "NTFS file system"},
	// Last: MBR partition tables and every FAT, NTFS or isohybrid boot sector end their first
	// sector with it.
	{510, []byte{0x55, 0xaa}, "MBR partition table or boot sector"},
}

// detectImage reads the start of path and tells its format from its bytes: qcow2 when it has
// the qcow2 magic, raw otherwise. It returns a badImageError for what cannot be a disk at all
// (not a regular file or block device, empty, another format); whether a raw image holds
// anything recognisable is in content, for the caller to judge. Messages name the file shown.
func detectImage(path, shown string) (*imageFile, error) {
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, badImage("%s does not exist", shown)
		}
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	im := &imageFile{path: shown, isBlock: fi.Mode()&fs.ModeDevice != 0 && fi.Mode()&fs.ModeCharDevice == 0}
	if !fi.Mode().IsRegular() && !im.isBlock {
		return nil, badImage("%s is not a regular file or block device", shown)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	im.size = fi.Size()
	if im.isBlock {
		// A block device's size is where its end is.
		if im.size, err = f.Seek(0, io.SeekEnd); err != nil {
			return nil, fmt.Errorf("size of %s: %w", path, err)
		}
	}
	if im.size == 0 {
		return nil, badImage("%s is empty", shown)
	}
	hdr := make([]byte, min(im.size, headerSize))
	if _, err := f.ReadAt(hdr, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}

	if bytes.HasPrefix(hdr, qcow2Magic) {
		q, err := parseQcow2Header(hdr)
		if err != nil {
			return nil, badImage("%s has a qcow2 magic but %v", shown, err)
		}
		im.format, im.qcow2 = FormatQcow2, q
		return im, nil
	}
	for _, o := range otherFormats {
		if hasAt(hdr, o.offset, o.magic) {
			return nil, badImage("%s is %s; only qcow2 and raw images are supported", shown, o.what)
		}
	}
	im.format = FormatRaw
	for _, s := range rawSignatures {
		if hasAt(hdr, s.offset, s.magic) {
			im.content = s.what
			break
		}
	}
	return im, nil
}

// checkBase judges an image a VM boots from through an overlay (a containerDisk's disk, an
// ephemeral volume's backing image): it must look like a disk, because a mistake here (a
// config file, a truncated download) otherwise surfaces as a guest that does not boot.
func checkBase(im *imageFile) error {
	switch im.format {
	case FormatQcow2:
		return checkQcow2Standalone(im)
	case FormatRaw:
		if im.content == "" {
			return badImage("%s is not a disk image: no partition table, filesystem or qcow2 header", im.path)
		}
		if im.size%512 != 0 {
			return badImage("%s is not a disk image: its size, %d bytes, is not a multiple of 512", im.path, im.size)
		}
	}
	return nil
}

// checkInPlace judges an image the guest writes to in place (hostDisk, persistentVolumeClaim).
// A blank raw disk is fine there, so only the qcow2 rule applies.
func checkInPlace(im *imageFile) error {
	if im.format == FormatQcow2 {
		return checkQcow2Standalone(im)
	}
	return nil
}

// checkQcow2Standalone refuses a qcow2 image that points at another file. Such an image would
// let whoever wrote it (a container image's author, or a guest that wrote a qcow2 header onto
// its own raw disk) make the hypervisor read any file on the node.
func checkQcow2Standalone(im *imageFile) error {
	switch {
	case im.qcow2.hasBacking:
		return badImage("%s is a qcow2 image with a backing file, which is not allowed", im.path)
	case im.qcow2.hasDataFile:
		return badImage("%s is a qcow2 image with an external data file, which is not allowed", im.path)
	}
	return nil
}

// parseQcow2Header checks the fixed part of a qcow2 header (docs/interop/qcow2.txt in QEMU).
func parseQcow2Header(b []byte) (*qcow2Header, error) {
	if len(b) < 72 {
		return nil, errors.New("its header is truncated")
	}
	be := binary.BigEndian
	h := &qcow2Header{
		version:    be.Uint32(b[4:8]),
		hasBacking: be.Uint64(b[8:16]) != 0,
		size:       be.Uint64(b[24:32]),
	}
	switch h.version {
	case 2:
	case 3:
		if len(b) < 104 {
			return nil, errors.New("its version 3 header is truncated")
		}
		const incompatDataFile = 1 << 2
		h.hasDataFile = be.Uint64(b[72:80])&incompatDataFile != 0
	default:
		return nil, fmt.Errorf("version %d is not a qcow2 version (2 or 3)", h.version)
	}
	if clusterBits := be.Uint32(b[20:24]); clusterBits < 9 || clusterBits > 21 {
		return nil, fmt.Errorf("its cluster size 2^%d is out of range", clusterBits)
	}
	if h.size == 0 {
		return nil, errors.New("its virtual size is 0")
	}
	return h, nil
}

func hasAt(b []byte, off int, magic []byte) bool {
	return len(b) >= off+len(magic) && bytes.Equal(b[off:off+len(magic)], magic)
}
