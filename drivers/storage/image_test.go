package storage

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDetectImage(t *testing.T) {
	at := func(size int64, off int, magic string) []byte {
		b := make([]byte, size)
		copy(b[off:], magic)
		return b
	}
	tests := []struct {
		name    string
		data    []byte
		format  Format
		content string
		// badDetect is what detectImage rejects; badBase what checkBase rejects; badInPlace what
		// checkInPlace rejects.
		badDetect, badBase, badInPlace string
	}{
		{name: "qcow2 v3", data: qcow2Bytes(3, 1<<30, false, false), format: FormatQcow2},
		{name: "qcow2 v2", data: qcow2Bytes(2, 1<<20, false, false), format: FormatQcow2},
		{name: "qcow2 with backing file", data: qcow2Bytes(3, 1<<20, true, false), format: FormatQcow2,
			badBase: "backing file, which is not allowed", badInPlace: "backing file, which is not allowed"},
		{name: "qcow2 with data file", data: qcow2Bytes(3, 1<<20, false, true), format: FormatQcow2,
			badBase: "external data file", badInPlace: "external data file"},
		{name: "qcow2 magic, bad version", data: qcow2Bytes(7, 1<<20, false, false), badDetect: "version 7 is not a qcow2 version"},
		{name: "qcow2 magic, truncated", data: []byte("QFI\xfb\x00\x00"), badDetect: "truncated"},
		{name: "MBR", data: at(1<<20, 510, "\x55\xaa"), format: FormatRaw, content: "MBR"},
		{name: "GPT", data: at(1<<20, 512, "EFI PART"), format: FormatRaw, content: "GPT"},
		{name: "ISO 9660", data: at(1<<20, 0x8001, "CD001"), format: FormatRaw, content: "ISO 9660"},
		{name: "ext4", data: at(1<<20, 1080, "\x53\xef"), format: FormatRaw, content: "ext2/3/4"},
		{name: "XFS", data: at(1<<20, 0, "XFSB"), format: FormatRaw, content: "XFS"},
		{name: "FAT", data: append(at(512, 54, "FAT16   "), make([]byte, 1<<20)...), format: FormatRaw, content: "FAT"},
		{name: "btrfs", data: at(1<<20, 0x10040, "_BHRfS_M"), format: FormatRaw, content: "btrfs"},
		{name: "blank raw", data: make([]byte, 1<<20), format: FormatRaw,
			badBase: "is not a disk image: no partition table, filesystem or qcow2 header"},
		{name: "text, 512-multiple", data: []byte(strings.Repeat("#cloud-config\n", 512)), format: FormatRaw,
			badBase: "no partition table, filesystem or qcow2 header"},
		{name: "MBR, odd size", data: at(1000, 510, "\x55\xaa"), format: FormatRaw, content: "MBR",
			badBase: "1000 bytes, is not a multiple of 512"},
		{name: "empty", data: nil, badDetect: "is empty"},
		{name: "vmdk", data: at(4096, 0, "KDMV"), badDetect: "is a VMDK image; only qcow2 and raw"},
		{name: "gzip", data: at(4096, 0, "\x1f\x8b\x08"), badDetect: "gzip-compressed"},
		{name: "xz", data: at(4096, 0, "\xfd7zXZ\x00"), badDetect: "xz-compressed"},
	}
	dir := t.TempDir()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, "img"+string(rune('a'+i)))
			if err := os.WriteFile(p, tt.data, 0o644); err != nil {
				t.Fatal(err)
			}
			im, err := detectImage(p, "/shown/name")
			if tt.badDetect != "" {
				if err == nil || !isBadImage(err) || !strings.Contains(err.Error(), tt.badDetect) || !strings.Contains(err.Error(), "/shown/name") {
					t.Fatalf("detectImage: got %v, want a bad image error naming /shown/name and saying %q", err, tt.badDetect)
				}
				return
			}
			if err != nil {
				t.Fatalf("detectImage: %v", err)
			}
			if im.format != tt.format || !strings.Contains(im.content, tt.content) {
				t.Errorf("got format %s content %q, want %s %q", im.format, im.content, tt.format, tt.content)
			}
			for _, c := range []struct {
				name  string
				check func(*imageFile) error
				want  string
			}{{"checkBase", checkBase, tt.badBase}, {"checkInPlace", checkInPlace, tt.badInPlace}} {
				err := c.check(im)
				switch {
				case c.want == "" && err != nil:
					t.Errorf("%s: %v", c.name, err)
				case c.want != "" && (err == nil || !isBadImage(err) || !strings.Contains(err.Error(), c.want)):
					t.Errorf("%s: got %v, want a bad image error saying %q", c.name, err, c.want)
				}
			}
		})
	}
}

func TestDetectImageNotAFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := detectImage(dir, dir); err == nil || !isBadImage(err) || !strings.Contains(err.Error(), "not a regular file or block device") {
		t.Errorf("directory: got %v", err)
	}
	missing := filepath.Join(dir, "missing")
	if _, err := detectImage(missing, missing); err == nil || !isBadImage(err) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing: got %v", err)
	}
}

func TestQcow2VirtualSize(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.qcow2")
	if err := os.WriteFile(p, qcow2Bytes(3, 5<<30, false, false), 0o644); err != nil {
		t.Fatal(err)
	}
	im, err := detectImage(p, p)
	if err != nil {
		t.Fatal(err)
	}
	if im.virtualSize() != 5<<30 || im.size != 512 {
		t.Errorf("virtual size %d, file size %d", im.virtualSize(), im.size)
	}
}
