package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode/utf16"
)

// ECMA-119 (ISO 9660) layout used by fixISO.
const (
	isoDescriptorStart = 16 // first volume descriptor sector
	isoMaxDescriptors  = 32
	vdTypePrimary      = 1
	vdTypeSupplement   = 2
	vdTypeTerminator   = 255
	maxJolietDepth     = 8
	recordFlagDir      = 1 << 1
)

// fixISO corrects, in place, two flaws of the ISO images go-diskfs v1.9.4 writes, and returns
// the paths of the files in the Joliet tree:
//   - the volume identifier is padded with NULs, where ECMA-119 pads with spaces (and Joliet
//     with UCS-2 spaces);
//   - in the Joliet tree, the record of a subdirectory points at the primary tree's extent of
//     that directory, so that a Joliet reader (Windows, cloudbase-init) sees garbled names
//     below the root. fixISO points it at the Joliet extent the Joliet path table names.
//
// An image without a Joliet descriptor gets only the first fix.
func fixISO(f *os.File, label string) ([]string, error) {
	var svd []byte
	for i := range isoMaxDescriptors {
		at := int64(isoDescriptorStart+i) * isoBlockSize
		vd := make([]byte, isoBlockSize)
		if _, err := f.ReadAt(vd, at); err != nil {
			return nil, fmt.Errorf("read volume descriptor %d: %w", i, err)
		}
		if !bytes.Equal(vd[1:6], []byte("CD001")) {
			return nil, fmt.Errorf("volume descriptor %d: no CD001 identifier", i)
		}
		switch vd[0] {
		case vdTypePrimary:
			copy(vd[40:72], padRight([]byte(label), 32, ' '))
			if _, err := f.WriteAt(vd, at); err != nil {
				return nil, err
			}
		case vdTypeSupplement:
			if isJoliet(vd) {
				copy(vd[40:72], ucs2(label, 16))
				if _, err := f.WriteAt(vd, at); err != nil {
					return nil, err
				}
				svd = vd
			}
		}
		if vd[0] == vdTypeTerminator {
			break
		}
	}
	if svd == nil {
		return nil, nil
	}
	le := binary.LittleEndian
	pt, err := readJolietPathTable(f, le.Uint32(svd[140:144]), le.Uint32(svd[132:136]))
	if err != nil {
		return nil, err
	}
	root := svd[156:190]
	j := &jolietFixer{f: f, pt: pt}
	if err := j.walk(1, le.Uint32(root[2:6]), le.Uint32(root[10:14]), "", 0); err != nil {
		return nil, err
	}
	return j.files, nil
}

// isJoliet reports whether a supplementary volume descriptor is Joliet's (UCS-2 level 1-3).
func isJoliet(vd []byte) bool {
	esc := vd[88:91]
	return bytes.Equal(esc, []byte("%/@")) || bytes.Equal(esc, []byte("%/C")) || bytes.Equal(esc, []byte("%/E"))
}

// ptEntry is a path table entry: directory number i+1 of the table is entry i.
type ptEntry struct {
	loc    uint32
	parent uint16
	name   string
}

func readJolietPathTable(f *os.File, loc, size uint32) ([]ptEntry, error) {
	if size > 1<<20 {
		return nil, fmt.Errorf("joliet path table of %d bytes", size)
	}
	b := make([]byte, size)
	if _, err := f.ReadAt(b, int64(loc)*isoBlockSize); err != nil {
		return nil, fmt.Errorf("read Joliet path table: %w", err)
	}
	var out []ptEntry
	for off := 0; off+8 <= len(b); {
		n := int(b[off])
		if n == 0 || off+8+n > len(b) {
			break
		}
		e := ptEntry{
			loc:    binary.LittleEndian.Uint32(b[off+2 : off+6]),
			parent: binary.LittleEndian.Uint16(b[off+6 : off+8]),
		}
		if id := b[off+8 : off+8+n]; !(n == 1 && id[0] == 0) {
			e.name = fromUCS2(id)
		}
		out = append(out, e)
		off += 8 + n + n%2
	}
	if len(out) == 0 {
		return nil, errors.New("empty Joliet path table")
	}
	return out, nil
}

type jolietFixer struct {
	f     *os.File
	pt    []ptEntry
	files []string
}

// walk fixes the records of directory number num (1-based, in the path table) at extent loc
// of size bytes, and those below it.
func (j *jolietFixer) walk(num int, loc, size uint32, prefix string, depth int) error {
	if depth > maxJolietDepth {
		return fmt.Errorf("joliet tree deeper than %d at %s", maxJolietDepth, prefix)
	}
	if size > 1<<20 {
		return fmt.Errorf("joliet directory %s of %d bytes", prefix, size)
	}
	ext := make([]byte, size)
	if _, err := j.f.ReadAt(ext, int64(loc)*isoBlockSize); err != nil {
		return fmt.Errorf("read Joliet directory %s: %w", prefix, err)
	}
	type sub struct {
		num       int
		loc, size uint32
		path      string
	}
	var subs []sub
	changed := false
	for off := 0; off < len(ext); {
		n := int(ext[off])
		if n == 0 {
			// Records do not cross sectors: the rest of this one is padding.
			off = (off/isoBlockSize + 1) * isoBlockSize
			continue
		}
		if n < 34 || off+n > len(ext) {
			return fmt.Errorf("joliet directory %s: bad record at %d", prefix, off)
		}
		rec := ext[off : off+n]
		off += n
		nameLen := int(rec[32])
		if 33+nameLen > len(rec) {
			return fmt.Errorf("joliet directory %s: bad name length", prefix)
		}
		id := rec[33 : 33+nameLen]
		if nameLen == 1 && (id[0] == 0 || id[0] == 1) {
			continue // "." and ".."
		}
		name := fromUCS2(id)
		if rec[25]&recordFlagDir == 0 {
			name, _, _ = strings.Cut(name, ";")
			j.files = append(j.files, prefix+name)
			continue
		}
		child := -1
		for i, e := range j.pt {
			if int(e.parent) == num && e.name == name && i+1 != num {
				child = i + 1
				break
			}
		}
		if child < 0 {
			return fmt.Errorf("joliet directory %s%s is not in the path table", prefix, name)
		}
		cloc := j.pt[child-1].loc
		// The directory's size is in its own "." record, the first of its extent.
		self := make([]byte, 34)
		if _, err := j.f.ReadAt(self, int64(cloc)*isoBlockSize); err != nil {
			return fmt.Errorf("read Joliet directory %s%s: %w", prefix, name, err)
		}
		csize := binary.LittleEndian.Uint32(self[10:14])
		if binary.LittleEndian.Uint32(rec[2:6]) != cloc || binary.LittleEndian.Uint32(rec[10:14]) != csize {
			putBoth32(rec[2:10], cloc)
			putBoth32(rec[10:18], csize)
			changed = true
		}
		subs = append(subs, sub{child, cloc, csize, prefix + name + "/"})
	}
	if changed {
		if _, err := j.f.WriteAt(ext, int64(loc)*isoBlockSize); err != nil {
			return err
		}
	}
	for _, s := range subs {
		if err := j.walk(s.num, s.loc, s.size, s.path, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// putBoth32 writes v in ECMA-119's both-byte-order form: little-endian, then big-endian.
func putBoth32(b []byte, v uint32) {
	binary.LittleEndian.PutUint32(b[0:4], v)
	binary.BigEndian.PutUint32(b[4:8], v)
}

func padRight(b []byte, n int, pad byte) []byte {
	out := bytes.Repeat([]byte{pad}, n)
	copy(out, b)
	return out
}

// ucs2 encodes s as UCS-2 big-endian in n characters, padded with spaces.
func ucs2(s string, n int) []byte {
	out := make([]byte, 0, 2*n)
	for _, u := range utf16.Encode([]rune(s)) {
		if len(out) == 2*n {
			break
		}
		out = binary.BigEndian.AppendUint16(out, u)
	}
	for len(out) < 2*n {
		out = binary.BigEndian.AppendUint16(out, ' ')
	}
	return out
}

func fromUCS2(b []byte) string {
	u := make([]uint16, 0, len(b)/2)
	for i := 0; i+1 < len(b); i += 2 {
		u = append(u, binary.BigEndian.Uint16(b[i:]))
	}
	return string(utf16.Decode(u))
}
