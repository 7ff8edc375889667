package storage

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
	"sigs.k8s.io/yaml"

	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// Volume labels cloud-init looks for (its NoCloud and ConfigDrive data sources).
const (
	labelNoCloud     = "cidata"
	labelConfigDrive = "config-2"
)

// isoBlockSize is the ISO 9660 logical block size.
const isoBlockSize = 2048

// minISOSize is the least size of a cloud-init ISO. Some guests' probes take a smaller device
// for an empty drive and never read its label: busybox's volume_id (findfs/blkid in CirrOS and
// in the project's test guest) ignores devices under 0x11000 bytes. genisoimage's smallest
// images are about 360 KiB; the padding is zeros past the file system's end.
const minISOSize = 384 << 10

// seedFile is one file of a cloud-init seed ISO, by its path in the ISO.
type seedFile struct {
	name string
	data []byte
}

// seed is the content of a cloud-init ISO.
type seed struct {
	label string
	files []seedFile
}

// noCloudSeed is the NoCloud data source's ISO, as KubeVirt writes it: user-data, meta-data,
// and network-config when there is network data.
func noCloudSeed(ci *storagev1.CloudInit, vmiID string) (*seed, error) {
	meta := struct {
		InstanceID    string `json:"instance-id"`
		LocalHostname string `json:"local-hostname,omitempty"`
	}{InstanceID: instanceID(ci, vmiID), LocalHostname: ci.GetHostname()}
	metaData, err := yaml.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("encode meta-data: %w", err)
	}
	s := &seed{label: labelNoCloud, files: []seedFile{
		{"user-data", ci.GetUserData()},
		{"meta-data", metaData},
	}}
	if nd := ci.GetNetworkData(); len(nd) > 0 {
		s.files = append(s.files, seedFile{"network-config", nd})
	}
	return s, nil
}

// configDriveSeed is the OpenStack config drive's ISO: openstack/latest/{user_data,
// meta_data.json, network_data.json}. cloud-init takes the instance id from uuid; KubeVirt also
// writes instance_id, and hostname.
func configDriveSeed(ci *storagev1.CloudInit, vmiID string) (*seed, error) {
	id := instanceID(ci, vmiID)
	meta := struct {
		UUID       string `json:"uuid"`
		InstanceID string `json:"instance_id"`
		Hostname   string `json:"hostname,omitempty"`
	}{UUID: id, InstanceID: id, Hostname: ci.GetHostname()}
	metaData, err := json.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("encode meta_data.json: %w", err)
	}
	const dir = "openstack/latest/"
	s := &seed{label: labelConfigDrive, files: []seedFile{
		{dir + "user_data", ci.GetUserData()},
		{dir + "meta_data.json", metaData},
	}}
	if nd := ci.GetNetworkData(); len(nd) > 0 {
		if !json.Valid(nd) {
			return nil, badImage("networkData of a config drive must be JSON (network_data.json)")
		}
		s.files = append(s.files, seedFile{dir + "network_data.json", nd})
	}
	return s, nil
}

func instanceID(ci *storagev1.CloudInit, vmiID string) string {
	if id := ci.GetInstanceId(); id != "" {
		return id
	}
	return vmiID
}

// digest names the seed's content: an ISO made from a seed with the same digest is the same.
func (s *seed) digest() string {
	h := sha256.New()
	put := func(b []byte) {
		_ = binary.Write(h, binary.BigEndian, uint64(len(b)))
		h.Write(b)
	}
	put([]byte(s.label))
	for _, f := range s.files {
		put([]byte(f.name))
		put(f.data)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// writeISO writes the seed as an ISO 9660 image at dst, which must not exist, with Rock Ridge
// (Linux sees the real file names) and Joliet (so do Windows guests running cloudbase-init).
// workspace is a directory path, which must not exist, where the files are staged. The image
// is read back and compared before writeISO returns.
func writeISO(s *seed, dst, workspace string) (err error) {
	if err := os.Mkdir(workspace, dirPerm); err != nil {
		return err
	}
	defer func() {
		if rerr := os.RemoveAll(workspace); err == nil && rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = rerr
		}
	}()
	f, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, isoPerm)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	w := &isoWriter{File: f}
	iso, err := iso9660.Create(file.New(w, false), 0, 0, isoBlockSize, workspace)
	if err != nil {
		return fmt.Errorf("create ISO 9660 file system: %w", err)
	}
	for _, sf := range s.files {
		if dir := path.Dir(sf.name); dir != "." {
			if err := iso.Mkdir(dir); err != nil {
				return err
			}
		}
		w, err := iso.OpenFile(sf.name, os.O_CREATE|os.O_RDWR|os.O_TRUNC)
		if err != nil {
			return fmt.Errorf("stage %s: %w", sf.name, err)
		}
		_, err = w.Write(sf.data)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("stage %s: %w", sf.name, err)
		}
	}
	if err := iso.Finalize(iso9660.FinalizeOptions{RockRidge: true, Joliet: true, VolumeIdentifier: s.label}); err != nil {
		return fmt.Errorf("write ISO 9660 file system: %w", err)
	}
	// As long as go-diskfs wrote, in whole blocks, as readers of ISO images expect, and no
	// smaller than minISOSize.
	if err := f.Truncate(max((w.end+isoBlockSize-1)/isoBlockSize*isoBlockSize, minISOSize)); err != nil {
		return err
	}
	joliet, err := fixISO(f, s.label)
	if err != nil {
		return fmt.Errorf("fix up ISO: %w", err)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	// Finalize does not report every failed write: check what landed on disk, in both trees.
	var want []string
	for _, sf := range s.files {
		want = append(want, sf.name)
	}
	slices.Sort(want)
	slices.Sort(joliet)
	if !slices.Equal(joliet, want) {
		return fmt.Errorf("read back ISO: Joliet tree holds %v, want %v", joliet, want)
	}
	return verifyISO(f, s)
}

// verifyISO reads the ISO in f back and checks that it holds the seed.
func verifyISO(f *os.File, s *seed) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	iso, err := iso9660.Read(file.New(f, true), fi.Size(), 0, isoBlockSize)
	if err != nil {
		return fmt.Errorf("read back ISO: %w", err)
	}
	if got := strings.TrimRight(iso.Label(), " \x00"); got != s.label {
		return fmt.Errorf("read back ISO: label is %q, not %q", got, s.label)
	}
	for _, sf := range s.files {
		got, err := iso.ReadFile(sf.name)
		if err != nil {
			return fmt.Errorf("read back ISO: %s: %w", sf.name, err)
		}
		if !bytes.Equal(got, sf.data) {
			return fmt.Errorf("read back ISO: %s differs from what was written", sf.name)
		}
	}
	return nil
}

// isoWriter is the file go-diskfs writes an ISO image through. It drops writes of zeroes:
// the file is new, so they would only read back as what is already there, and go-diskfs
// v1.9.4 pads a file whose size is a multiple of the block size (an empty one too) with a
// whole block of zeroes past its extent, over the Joliet directory it wrote there before. end
// is where the image ends, dropped writes included.
type isoWriter struct {
	*os.File
	end int64
}

// WriteAt implements io.WriterAt.
func (w *isoWriter) WriteAt(b []byte, off int64) (int, error) {
	w.end = max(w.end, off+int64(len(b)))
	if isZero(b) {
		return len(b), nil
	}
	return w.File.WriteAt(b, off)
}

func isZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeroChunk))
		if !bytes.Equal(b[:n], zeroChunk[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}
