package bench

import (
	"slices"
	"strings"
	"testing"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/core/domain"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

func TestGuestDomainBuildsTheDriversCommandLine(t *testing.T) {
	g := conformance.Guest{Kernel: "/g/vmlinuz", Initrd: "/g/initramfs.cpio.gz", Cmdline: "console=ttyS0 panic=-1", Disk: "/g/disk.qcow2", ReadyMarker: "R"}
	s := newSlot("/tmp/kvb", 3)
	spec := GuestDomain(g, s.id, s.runDir, s.overlay, 256<<20)
	if err := domain.Validate(spec); err != nil {
		t.Fatalf("the spec is not valid: %v", err)
	}
	cl, err := qmp.BuildArgs(spec, qmp.HostEnv{Accel: qmp.AccelTCG, RunDir: s.runDir})
	if err != nil {
		t.Fatalf("BuildArgs: %v", err)
	}
	args := strings.Join(cl.Args, " ")
	for _, want := range []string{
		"-name guest=kubevisor-bench/bench-3,",
		"-accel tcg",
		"-m 256M",
		"-kernel /g/vmlinuz -initrd /g/initramfs.cpio.gz -append console=ttyS0 panic=-1",
		"filename=/tmp/kvb/vm3/disk.qcow2",
		"-blockdev driver=qcow2,node-name=disk0,file=file-disk0 -device virtio-blk-pci-non-transitional,drive=disk0",
		"path=/tmp/kvb/vm3/serial.sock,server=on,wait=off -serial chardev:serial0",
		"-pidfile /tmp/kvb/vm3/qemu.pid",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("command line lacks %q:\n%s", want, args)
		}
	}
	if len(cl.ExtraFiles) > 0 || cl.VarsTemplate != "" {
		t.Errorf("the command line needs files from the driver: %q, %q", cl.ExtraFiles, cl.VarsTemplate)
	}
}

func TestRawArgs(t *testing.T) {
	in := []string{"-name", "guest=x", "-display", "none", "-S", "-msg", "timestamp=on"}
	got, err := RawArgs(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"-name", "guest=x", "-display", "none", "-msg", "timestamp=on"}; !slices.Equal(got, want) {
		t.Errorf("RawArgs = %q, want %q", got, want)
	}
	if !slices.Contains(in, "-S") {
		t.Error("RawArgs changed its input")
	}
	for _, bad := range [][]string{{"-m", "256M"}, {"-S", "-m", "256M", "-S"}} {
		if _, err := RawArgs(bad); err == nil {
			t.Errorf("RawArgs(%q) succeeded; want an error (not exactly one -S)", bad)
		}
	}
}

func TestIntsFlag(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{in: "1,5", want: []int{1, 5}},
		{in: " 2 , 4,8 ", want: []int{2, 4, 8}},
		{in: "", want: nil},
		{in: "0", wantErr: true},
		{in: "5,1", wantErr: true},
		{in: "x", wantErr: true},
	} {
		var f intsFlag
		err := f.Set(tt.in)
		if (err != nil) != tt.wantErr || (!tt.wantErr && !slices.Equal(f, tt.want)) {
			t.Errorf("Set(%q) = %v, %v; want %v (error %v)", tt.in, f, err, tt.want, tt.wantErr)
		}
	}
}
