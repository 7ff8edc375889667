package storage

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
	"google.golang.org/grpc/codes"
	"sigs.k8s.io/yaml"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// readISO opens an ISO image with go-diskfs and returns its label and the files asked for.
func readISO(t *testing.T, p string, names ...string) (string, map[string]string) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size()%isoBlockSize != 0 {
		t.Errorf("ISO size %d is not a multiple of %d", fi.Size(), isoBlockSize)
	}
	iso, err := iso9660.Read(file.New(f, true), fi.Size(), 0, isoBlockSize)
	if err != nil {
		t.Fatalf("read ISO %s: %v", p, err)
	}
	files := map[string]string{}
	for _, n := range names {
		b, err := iso.ReadFile(n)
		if err != nil {
			t.Fatalf("read %s from ISO: %v", n, err)
		}
		files[n] = string(b)
	}
	return strings.TrimRight(iso.Label(), " "), files
}

// checkISOWithLinuxTools lists the ISO with the tools Linux users have: isoinfo (genisoimage)
// with Rock Ridge and Joliet names, xorriso, blkid and file for the label. Each is a subtest
// that needs its tool (skipped under -short, a failure under CI=true when it is missing).
func checkISOWithLinuxTools(t *testing.T, p, label string, files []string) {
	t.Helper()
	t.Run("isoinfo", func(t *testing.T) {
		testenv.Command(t, "isoinfo", "genisoimage")
		listing := run(t, "isoinfo", "-R", "-f", "-i", p)
		for _, f := range files {
			if !strings.Contains(listing, "/"+f+"\n") {
				t.Errorf("isoinfo -R -f does not list /%s:\n%s", f, listing)
			}
		}
		if desc := run(t, "isoinfo", "-d", "-i", p); !strings.Contains(desc, "Volume id: "+label+"\n") ||
			!strings.Contains(desc, "Rock Ridge signatures version") || !strings.Contains(desc, "Joliet with UCS level") {
			t.Errorf("isoinfo -d: want volume id %s, Rock Ridge and Joliet:\n%s", label, desc)
		}
		joliet := run(t, "isoinfo", "-J", "-f", "-i", p)
		for _, f := range files {
			if !strings.Contains(joliet, "/"+f+"\n") {
				t.Errorf("isoinfo -J -f does not list /%s:\n%s", f, joliet)
			}
		}
	})
	t.Run("xorriso", func(t *testing.T) {
		testenv.Command(t, "xorriso", "xorriso")
		out, err := exec.Command("xorriso", "-indev", p, "-find", "/", "-type", "f").CombinedOutput()
		if err != nil {
			t.Fatalf("xorriso: %v\n%s", err, out)
		}
		for _, f := range files {
			if !strings.Contains(string(out), "'/"+f+"'") {
				t.Errorf("xorriso -find does not list /%s:\n%s", f, out)
			}
		}
	})
	t.Run("blkid", func(t *testing.T) {
		testenv.Command(t, "blkid", "util-linux")
		if got := strings.TrimSpace(run(t, "blkid", "-p", "-o", "value", "-s", "LABEL", p)); got != label {
			t.Errorf("blkid LABEL = %q, want %q", got, label)
		}
		if got := strings.TrimSpace(run(t, "blkid", "-p", "-o", "value", "-s", "TYPE", p)); got != "iso9660" {
			t.Errorf("blkid TYPE = %q, want iso9660", got)
		}
	})
	t.Run("file", func(t *testing.T) {
		testenv.Command(t, "file", "file")
		if got := run(t, "file", "-b", p); !strings.Contains(got, "ISO 9660") || !strings.Contains(got, "'"+label+"'") {
			t.Errorf("file: %q, want an ISO 9660 image labelled %q", got, label)
		}
	})
}

func TestCloudInitNoCloud(t *testing.T) {
	d := newFake(&fakeTool{})
	work := filepath.Join(t.TempDir(), "vmi")
	userData := "#cloud-config\npassword: secret\nchpasswd: { expire: False }\n"
	networkData := "version: 2\nethernets:\n  eth0:\n    dhcp4: true\n"
	disks := prepare(t, d, "vmi-uid-1", work,
		noCloudVol("cloudinit", &storagev1.CloudInit{UserData: []byte(userData), NetworkData: []byte(networkData), Hostname: "vm1"}),
		noCloudVol("noid", &storagev1.CloudInit{UserData: []byte(userData), InstanceId: "i-123"}))

	d0 := disks[0]
	if d0.GetPath() != filepath.Join(work, "cloudinit.iso") || !d0.GetCdrom() || !d0.GetReadOnly() || d0.GetFormat() != domainv1.DiskFormat_DISK_FORMAT_RAW {
		t.Errorf("disk = %v, want a read-only RAW cdrom at cloudinit.iso", d0)
	}
	fi, err := os.Stat(d0.GetPath())
	if err != nil {
		t.Fatal(err)
	}
	if uint64(fi.Size()) != d0.GetSizeBytes() {
		t.Errorf("size_bytes %d, file is %d", d0.GetSizeBytes(), fi.Size())
	}
	if fi.Size() < minISOSize {
		t.Errorf("ISO is %d bytes: guests whose probe skips small devices (busybox) would not see it", fi.Size())
	}
	label, files := readISO(t, d0.GetPath(), "user-data", "meta-data", "network-config")
	if label != "cidata" {
		t.Errorf("label %q, want cidata", label)
	}
	if files["user-data"] != userData || files["network-config"] != networkData {
		t.Errorf("user-data/network-config differ: %q %q", files["user-data"], files["network-config"])
	}
	var meta map[string]string
	if err := yaml.Unmarshal([]byte(files["meta-data"]), &meta); err != nil {
		t.Fatalf("meta-data is not YAML: %v\n%s", err, files["meta-data"])
	}
	if meta["instance-id"] != "vmi-uid-1" || meta["local-hostname"] != "vm1" {
		t.Errorf("meta-data = %v", meta)
	}
	checkISOWithLinuxTools(t, d0.GetPath(), "cidata", []string{"user-data", "meta-data", "network-config"})

	// Without network data there is no network-config; instance_id wins over the VMI id.
	_, files = readISO(t, disks[1].GetPath(), "meta-data")
	meta = nil
	if err := yaml.Unmarshal([]byte(files["meta-data"]), &meta); err != nil {
		t.Fatal(err)
	}
	if meta["instance-id"] != "i-123" || meta["local-hostname"] != "" {
		t.Errorf("meta-data = %v", meta)
	}
	checkISOWithLinuxTools(t, disks[1].GetPath(), "cidata", []string{"user-data", "meta-data"})
	if _, err := os.Stat(filepath.Join(work, "cloudinit.iso.tmp.d")); !os.IsNotExist(err) {
		t.Errorf("staging directory left behind: %v", err)
	}
}

func TestCloudInitConfigDrive(t *testing.T) {
	d := newFake(&fakeTool{})
	work := t.TempDir()
	userData := "#cloud-config\nruncmd: [touch, /ok]\n"
	networkData := `{"links":[{"id":"eth0","type":"phy","ethernet_mac_address":"52:54:00:12:34:56"}],"networks":[{"id":"n0","link":"eth0","type":"ipv4_dhcp"}],"services":[]}`
	disks := prepare(t, d, "vmi-uid-2", work,
		configDriveVol("configdrive", &storagev1.CloudInit{UserData: []byte(userData), NetworkData: []byte(networkData), Hostname: "vm2"}))
	d0 := disks[0]
	if !d0.GetCdrom() || !d0.GetReadOnly() || d0.GetFormat() != domainv1.DiskFormat_DISK_FORMAT_RAW {
		t.Errorf("disk = %v", d0)
	}
	names := []string{"openstack/latest/user_data", "openstack/latest/meta_data.json", "openstack/latest/network_data.json"}
	label, files := readISO(t, d0.GetPath(), names...)
	if label != "config-2" {
		t.Errorf("label %q, want config-2", label)
	}
	if files[names[0]] != userData || files[names[2]] != networkData {
		t.Errorf("user_data/network_data.json differ: %q %q", files[names[0]], files[names[2]])
	}
	var meta map[string]string
	if err := json.Unmarshal([]byte(files[names[1]]), &meta); err != nil {
		t.Fatalf("meta_data.json: %v", err)
	}
	if meta["uuid"] != "vmi-uid-2" || meta["instance_id"] != "vmi-uid-2" || meta["hostname"] != "vm2" {
		t.Errorf("meta_data.json = %v", meta)
	}
	checkISOWithLinuxTools(t, d0.GetPath(), "config-2", names)
}

func TestCloudInitConfigDriveNetworkDataMustBeJSON(t *testing.T) {
	d := newFake(&fakeTool{})
	work := t.TempDir()
	_, err := d.Prepare(t.Context(), &storagev1.PrepareRequest{VmiId: "v", WorkDir: work, Volumes: []*storagev1.Volume{
		configDriveVol("cd", &storagev1.CloudInit{NetworkData: []byte("version: 2\n")}),
	}})
	wantCode(t, err, codes.InvalidArgument, `volume "cd"`, "must be JSON")
	if got := listDir(t, work); len(got) != 0 {
		t.Errorf("work dir holds %v", got)
	}
}

// An ISO is made again when its content changes, and only then.
func TestCloudInitRemadeOnChange(t *testing.T) {
	d := newFake(&fakeTool{})
	work := t.TempDir()
	ci := &storagev1.CloudInit{UserData: []byte("#cloud-config\n")}
	p := prepare(t, d, "v", work, noCloudVol("ci", ci))[0].GetPath()
	before := inode(t, p)
	prepare(t, d, "v", work, noCloudVol("ci", ci))
	if inode(t, p) != before {
		t.Error("same content: the ISO was written again")
	}
	ci.UserData = []byte("#cloud-config\nhostname: changed\n")
	prepare(t, d, "v", work, noCloudVol("ci", ci))
	if inode(t, p) == before {
		t.Error("changed content: the ISO was not written again")
	}
	if _, files := readISO(t, p, "user-data"); files["user-data"] != string(ci.UserData) {
		t.Errorf("user-data = %q", files["user-data"])
	}
	if got := listDir(t, work); !slices.Equal(got, []string{"ci.iso", stateFile}) {
		t.Errorf("work dir = %v", got)
	}
}

// go-diskfs pads a file whose size is a multiple of the ISO block size with a block of zeroes
// past its end: the file last in the image must not wipe what follows it (the Joliet tree).
func TestCloudInitBlockSizedFiles(t *testing.T) {
	d := newFake(&fakeTool{})
	for _, n := range []int{0, 1, 2047, 2048, 4096} {
		userData := []byte(strings.Repeat("#", n))
		for _, vol := range []*storagev1.Volume{
			noCloudVol("nocloud", &storagev1.CloudInit{UserData: userData}),
			configDriveVol("configdrive", &storagev1.CloudInit{UserData: userData}),
		} {
			t.Run(fmt.Sprintf("%s/%d", vol.GetName(), n), func(t *testing.T) {
				disks := prepare(t, d, "v", t.TempDir(), vol)
				name, label := "user-data", "cidata"
				files := []string{"user-data", "meta-data"}
				if vol.GetName() == "configdrive" {
					name, label = "openstack/latest/user_data", "config-2"
					files = []string{name, "openstack/latest/meta_data.json"}
				}
				_, got := readISO(t, disks[0].GetPath(), name)
				if got[name] != string(userData) {
					t.Errorf("user data of %d bytes reads back as %d bytes", n, len(got[name]))
				}
				checkISOWithLinuxTools(t, disks[0].GetPath(), label, files)
			})
		}
	}
}
