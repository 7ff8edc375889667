package qmp

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// probedDriver is a driver whose host probe has already run and found info, so that Create
// builds a command line without running QEMU.
func probedDriver(t *testing.T) *Driver {
	t.Helper()
	d := New(WithLogger(testLogger()))
	d.probe.Set(&HostInfo{})
	d.stateDir = t.TempDir()
	return d
}

// loopDevice attaches a loop device to a new 1 MiB file and returns its path: a block device
// that does not take SG_IO.
func loopDevice(t *testing.T) string {
	t.Helper()
	testenv.Root(t, "losetup attaches a loop device")
	bin := testenv.Command(t, "losetup", "mount")
	img := filepath.Join(t.TempDir(), "loop.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--find", "--show", img).CombinedOutput()
	if err != nil {
		testenv.Missing(t, "losetup --find --show: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command(bin, "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup --detach %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

// TestCreateRefusesLUNWithoutSGIO: Create, before anything starts, refuses a lun whose path is
// a regular file, a character device or a block device that does not answer SG_GET_VERSION_NUM
// (a loop device: this machine's kernel has no SCSI layer to give a real one), naming the disk
// and the path.
func TestCreateRefusesLUNWithoutSGIO(t *testing.T) {
	file := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(file, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		path    func(*testing.T) string
		problem string
	}{
		{"regular file", func(*testing.T) string { return file }, "a regular file, not a block device"},
		{"character device", func(*testing.T) string { return "/dev/null" }, "not a block device (mode Dc---------)"},
		// The loop driver answers the SCSI ioctls with EINVAL.
		{"loop device", loopDevice, "a block device but not a SCSI one: ioctl SG_GET_VERSION_NUM: invalid argument"},
		{"missing", func(*testing.T) string { return "/dev/kubevisor-no-such-device" }, "stat /dev/kubevisor-no-such-device: no such file or directory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := c.path(t)
			d := probedDriver(t)
			spec := baseSpec()
			spec.Disks = []*domainv1.Disk{{Name: "san", Path: p, Bus: domainv1.DiskBus_DISK_BUS_SCSI, Device: domainv1.DiskDevice_DISK_DEVICE_LUN}}
			_, err := d.Create(context.Background(), spec)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("Create: %v (%s), want InvalidArgument", err, status.Code(err))
			}
			want := "disks[0].path: disk san: lun needs a SCSI device that takes SG_IO; " + p + " is not (" + c.problem + ")"
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Create: %q\nwant it to contain %q", err, want)
			}
		})
	}
}

// TestQEMUTakesTheLUNCommandLine runs QEMU with the command line BuildArgs gives a read-only,
// shared lun with an error policy and a boot order, on a loop device, the driver's SG_IO check
// bypassed: QEMU accepts every option and stops where scsi-block asks the device its SG version,
// the question sgioProblem asks first. (This machine's kernel has no SCSI layer: no device here
// answers it.)
func TestQEMUTakesTheLUNCommandLine(t *testing.T) {
	requireQEMU(t)
	dev := loopDevice(t)
	spec := baseSpec()
	spec.Disks = []*domainv1.Disk{{Name: "san", Path: dev, Device: domainv1.DiskDevice_DISK_DEVICE_LUN, ReadOnly: true, Shareable: true,
		Cache: "none", ErrorPolicy: "report", BootOrder: 1}}
	env := baseEnv()
	env.RunDir = t.TempDir()
	env.SGIO = map[string]string{dev: ""}
	cl, err := BuildArgs(spec, env)
	if err != nil {
		t.Fatalf("BuildArgs: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "qemu-system-x86_64", cl.Args...).CombinedOutput()
	if err == nil {
		t.Fatalf("QEMU started with a lun on %s:\n%s", dev, out)
	}
	if !strings.Contains(string(out), "-device scsi-block,") || !strings.Contains(string(out), "cannot get SG_IO version number") {
		t.Fatalf("QEMU: %v, want it to stop at scsi-block's SG_IO version:\n%s", err, out)
	}
}
