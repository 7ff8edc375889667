package conformance

import (
	"bufio"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

func TestConsoleLogWaitFor(t *testing.T) {
	l := newConsoleLog()
	go func() {
		for i := range 3 {
			time.Sleep(10 * time.Millisecond)
			_, _ = io.WriteString(l, "boot "+string(rune('a'+i))+"\r\nREADY\r\n")
		}
	}()
	if err := l.WaitFor(t.Context(), "READY", 3, 5*time.Second); err != nil {
		t.Fatalf("WaitFor 3 markers: %v", err)
	}
	if got := l.Count("READY"); got != 3 {
		t.Errorf("Count = %d, want 3", got)
	}
	// Already there: no wait, even with no time left.
	if err := l.WaitFor(t.Context(), "READY", 2, 0); err != nil {
		t.Errorf("WaitFor a marker already seen: %v", err)
	}
}

func TestConsoleLogWaitForTimeoutQuotesTail(t *testing.T) {
	l := newConsoleLog()
	head := "HEAD-" + strings.Repeat("x", 4<<10)
	tail := strings.Repeat("y", consoleTail-10) + "THE-END\r\n"
	_, _ = io.WriteString(l, head+tail)
	start := time.Now()
	err := l.WaitFor(t.Context(), "READY", 1, 50*time.Millisecond)
	if err == nil {
		t.Fatal("WaitFor of a marker never printed succeeded")
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("WaitFor with a 50ms timeout took %s", time.Since(start))
	}
	msg := err.Error()
	for _, want := range []string{`"READY" once`, "50ms", "THE-END", "last 2048 bytes"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q:\n%.300s…", want, msg)
		}
	}
	if strings.Contains(msg, "HEAD-") || strings.Contains(msg, "\r") {
		t.Errorf("the error quotes more than the last 2 KiB, or carriage returns")
	}
	if len(msg) > consoleTail+300 {
		t.Errorf("the error is %d bytes long, want about 2 KiB", len(msg))
	}
}

func TestConsoleLogWaitForEnded(t *testing.T) {
	l := newConsoleLog()
	_, _ = io.WriteString(l, "booting\n")
	go func() {
		time.Sleep(20 * time.Millisecond)
		_, _ = io.WriteString(l, "READY\n")
		l.end(nil)
	}()
	// What arrived before the end still counts.
	if err := l.WaitFor(t.Context(), "READY", 1, 5*time.Second); err != nil {
		t.Fatalf("WaitFor: %v", err)
	}
	start := time.Now()
	err := l.WaitFor(t.Context(), "READY", 2, time.Minute)
	if err == nil || !strings.Contains(err.Error(), "the console ended") || !strings.Contains(err.Error(), "booting") {
		t.Errorf("WaitFor after the console ended = %v, want an error saying so with the output", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("WaitFor after the console ended waited %s", time.Since(start))
	}
}

func TestConsoleLogWaitForContext(t *testing.T) {
	l := newConsoleLog()
	ctx, cancel := context.WithCancel(t.Context())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if err := l.WaitFor(ctx, "READY", 1, time.Minute); err == nil || !strings.Contains(err.Error(), "time ran out") {
		t.Errorf("WaitFor with a cancelled context = %v", err)
	}
}

// shell is a Consoler whose "guest" echoes each input line, as a terminal does, and runs
// `echo` of an arithmetic expansion of 6*7; it ignores the first lines, as a shell that is
// not reading yet.
type shell struct {
	ignore int
	mu     sync.Mutex
	lines  []string
}

func (s *shell) Console(ctx context.Context, _ string, in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		line := sc.Text()
		s.mu.Lock()
		s.lines = append(s.lines, line)
		n := len(s.lines)
		s.mu.Unlock()
		if n <= s.ignore {
			continue
		}
		reply := line + "\r\n"
		if arg, ok := strings.CutPrefix(line, "echo "); ok {
			reply += strings.ReplaceAll(arg, "$((6*7))", "42") + "\r\n"
		}
		if _, err := io.WriteString(out, reply); err != nil {
			return err
		}
	}
	return nil
}

func TestConsoleTypeUntilRetypes(t *testing.T) {
	sh := &shell{ignore: 2}
	cs := attachConsole(FromTesting(t), sh, "vm")
	cs.retype = 50 * time.Millisecond
	if err := cs.typeUntil(t.Context(), "echo kv-$((6*7))", "kv-42", 5*time.Second); err != nil {
		t.Fatalf("typeUntil: %v", err)
	}
	sh.mu.Lock()
	typed := len(sh.lines)
	sh.mu.Unlock()
	if typed != 3 {
		t.Errorf("the command was typed %d times, want 3 (two lost, one answered)", typed)
	}
	// The terminal's echo of the typed line is not its output.
	if err := cs.typeUntil(t.Context(), "true kv-$((6*7))", "kv-42", 200*time.Millisecond); err == nil {
		t.Errorf("typeUntil took the echo of the line for its output")
	}
}

func TestConsoleTypeUntilEnded(t *testing.T) {
	cs := attachConsole(FromTesting(t), consolerFunc(func(context.Context, string, io.Reader, io.Writer) error {
		return errors.New("VM stopped")
	}), "vm")
	if ended, _ := cs.wait(5 * time.Second); !ended {
		t.Fatal("the Console call did not end")
	}
	// Typing into a console that ended fails at once instead of blocking.
	err := cs.typeUntil(t.Context(), "echo kv-$((6*7))", "kv-42", time.Minute)
	if err == nil {
		t.Fatal("typeUntil on an ended console succeeded")
	}
}

type consolerFunc func(ctx context.Context, id string, in io.Reader, out io.Writer) error

func (f consolerFunc) Console(ctx context.Context, id string, in io.Reader, out io.Writer) error {
	return f(ctx, id, in, out)
}

func TestGuestDomain(t *testing.T) {
	guest := Guest{
		Kernel: "/guest/vmlinuz", Initrd: "/guest/initramfs.cpio.gz", Cmdline: "console=ttyS0",
		Disk: "/guest/disk.qcow2", ReadyMarker: GuestReadyMarker, MemoryBytes: 128 << 20, Machine: "pc",
	}
	disks := []*storagev1.PreparedDisk{
		{VolumeName: containerDiskVolume, Path: "/work/containerdisk.qcow2", Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2},
		{VolumeName: emptyDiskVolume, Path: "/work/emptydisk.qcow2", Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2},
		{VolumeName: cloudInitVolume, Path: "/work/cloudinitdisk.iso", Format: domainv1.DiskFormat_DISK_FORMAT_RAW, ReadOnly: true, Cdrom: true},
	}
	base := func() *domainv1.DomainSpec {
		return &domainv1.DomainSpec{
			Id: "6f1c1c64-4f57-4b5e-9d8a-1b1d3c1e0a01", Name: "conformance/6f1c1c64-4f57-4b5e-9d8a-1b1d3c1e0a01",
			Uuid:    "6f1c1c64-4f57-4b5e-9d8a-1b1d3c1e0a01",
			Machine: &domainv1.Machine{Type: "pc"},
			Memory:  &domainv1.Memory{GuestBytes: 128 << 20},
			Serial:  &domainv1.Serial{SocketPath: "/tmp/kvc-vm-1/serial.sock"},
			RunDir:  "/tmp/kvc-vm-1",
			Labels:  map[string]string{"kubevisor.io/conformance": "true"},
			Disks: []*domainv1.Disk{
				{Name: containerDiskVolume, Path: "/work/containerdisk.qcow2", Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, Bus: domainv1.DiskBus_DISK_BUS_VIRTIO},
				{Name: emptyDiskVolume, Path: "/work/emptydisk.qcow2", Format: domainv1.DiskFormat_DISK_FORMAT_QCOW2, Bus: domainv1.DiskBus_DISK_BUS_VIRTIO},
				{Name: cloudInitVolume, Path: "/work/cloudinitdisk.iso", Format: domainv1.DiskFormat_DISK_FORMAT_RAW, Bus: domainv1.DiskBus_DISK_BUS_SCSI, Device: domainv1.DiskDevice_DISK_DEVICE_CDROM, ReadOnly: true},
			},
		}
	}
	plan := domainPlan{
		ID: "6f1c1c64-4f57-4b5e-9d8a-1b1d3c1e0a01", RunDir: "/tmp/kvc-vm-1", Guest: guest, BootVolume: containerDiskVolume,
		DiskBus: domainv1.DiskBus_DISK_BUS_VIRTIO, CDROMBus: domainv1.DiskBus_DISK_BUS_SCSI,
	}
	for _, c := range []struct {
		name  string
		plan  func(p *domainPlan)
		disks []*storagev1.PreparedDisk
		want  func(spec *domainv1.DomainSpec)
	}{
		{"kernel boot", func(p *domainPlan) { p.KernelBoot = true }, disks, func(spec *domainv1.DomainSpec) {
			spec.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{
				KernelPath: "/guest/vmlinuz", InitrdPath: "/guest/initramfs.cpio.gz", Cmdline: "console=ttyS0",
			}}}
		}},
		{"BIOS boot from the containerDisk", nil, disks, func(spec *domainv1.DomainSpec) {
			spec.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Bios{Bios: &domainv1.BIOS{}}}
			spec.Disks[0].BootOrder = 1
		}},
		{"other buses", func(p *domainPlan) {
			p.KernelBoot = true
			p.DiskBus, p.CDROMBus = domainv1.DiskBus_DISK_BUS_SCSI, domainv1.DiskBus_DISK_BUS_SATA
		}, disks, func(spec *domainv1.DomainSpec) {
			spec.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Kernel{Kernel: &domainv1.KernelBoot{
				KernelPath: "/guest/vmlinuz", InitrdPath: "/guest/initramfs.cpio.gz", Cmdline: "console=ttyS0",
			}}}
			spec.Disks[0].Bus, spec.Disks[1].Bus, spec.Disks[2].Bus = domainv1.DiskBus_DISK_BUS_SCSI, domainv1.DiskBus_DISK_BUS_SCSI, domainv1.DiskBus_DISK_BUS_SATA
		}},
		{"a read-only disk, a CD-ROM the driver did not mark read-only, defaults", func(p *domainPlan) {
			p.Guest.MemoryBytes, p.Guest.Machine = 0, ""
		}, []*storagev1.PreparedDisk{
			{VolumeName: "pvc", Path: "/pvc/disk.img", Format: domainv1.DiskFormat_DISK_FORMAT_RAW, ReadOnly: true},
			{VolumeName: "seed", Path: "/work/seed.iso", Format: domainv1.DiskFormat_DISK_FORMAT_RAW, Cdrom: true},
		}, func(spec *domainv1.DomainSpec) {
			spec.Machine = nil
			spec.Memory.GuestBytes = DefaultGuestMemory
			spec.Firmware = &domainv1.Firmware{Boot: &domainv1.Firmware_Bios{Bios: &domainv1.BIOS{}}}
			spec.Disks = []*domainv1.Disk{
				{Name: "pvc", Path: "/pvc/disk.img", Format: domainv1.DiskFormat_DISK_FORMAT_RAW, Bus: domainv1.DiskBus_DISK_BUS_VIRTIO, ReadOnly: true},
				{Name: "seed", Path: "/work/seed.iso", Format: domainv1.DiskFormat_DISK_FORMAT_RAW, Bus: domainv1.DiskBus_DISK_BUS_SCSI, Device: domainv1.DiskDevice_DISK_DEVICE_CDROM, ReadOnly: true},
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := plan
			if c.plan != nil {
				c.plan(&p)
			}
			got := guestDomain(p, c.disks)
			want := base()
			c.want(want)
			if !proto.Equal(got, want) {
				t.Errorf("guestDomain:\ngot:  %v\nwant: %v", got, want)
			}
			if err := domain.Validate(got); err != nil {
				t.Errorf("the spec does not pass domain.Validate: %v", err)
			}
		})
	}
}

func TestBusName(t *testing.T) {
	for bus, want := range map[domainv1.DiskBus]string{
		domainv1.DiskBus_DISK_BUS_VIRTIO: "virtio", domainv1.DiskBus_DISK_BUS_SATA: "sata",
		domainv1.DiskBus_DISK_BUS_SCSI: "scsi", domainv1.DiskBus_DISK_BUS_USB: "usb",
	} {
		if got := busName(bus); got != want || !strings.Contains(strings.Join(knownDiskBuses, " "), got) {
			t.Errorf("busName(%s) = %q, want %q", bus, got, want)
		}
	}
}

func TestGuestFromDir(t *testing.T) {
	write := func(dir string, files ...string) {
		for _, f := range files {
			content := "x"
			if f == GuestCmdlineFile {
				content = "console=ttyS0 panic=-1\n"
			}
			if err := os.WriteFile(filepath.Join(dir, f), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Run("all", func(t *testing.T) {
		dir := t.TempDir()
		write(dir, GuestKernelFile, GuestInitrdFile, GuestCmdlineFile, GuestDiskFile)
		g, err := GuestFromDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		want := Guest{
			Kernel: filepath.Join(dir, GuestKernelFile), Initrd: filepath.Join(dir, GuestInitrdFile), Cmdline: "console=ttyS0 panic=-1",
			Disk: filepath.Join(dir, GuestDiskFile), ReadyMarker: GuestReadyMarker, UserDataBegin: GuestUserDataBegin,
			UserDataEnd: GuestUserDataEnd, PoweroffMarker: GuestPoweroffMarker, RNGMarker: GuestRNGMarker, DMIMarker: GuestDMIMarker,
			PCIMarker: GuestPCIMarker, InputMarker: GuestInputMarker, ClockMarker: GuestClockMarker,
			CPUFlagsMarker: GuestCPUFlagsMarker, AgentMarker: GuestAgentMarker, TPMMarker: GuestTPMMarker,
		}
		if g != want {
			t.Errorf("GuestFromDir = %+v, want %+v", g, want)
		}
		if err := g.validate(); err != nil {
			t.Errorf("validate: %v", err)
		}
	})
	t.Run("disk only, a kernel without initramfs", func(t *testing.T) {
		dir := t.TempDir()
		write(dir, GuestKernelFile, GuestDiskFile)
		g, err := GuestFromDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if g.Kernel != "" || g.Cmdline != "" || g.Disk != filepath.Join(dir, GuestDiskFile) {
			t.Errorf("GuestFromDir = %+v, want the disk only", g)
		}
	})
	t.Run("kernel without a cmdline file", func(t *testing.T) {
		dir := t.TempDir()
		write(dir, GuestKernelFile, GuestInitrdFile)
		g, err := GuestFromDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if g.Cmdline != "console=ttyS0" || g.Disk != "" {
			t.Errorf("GuestFromDir = %+v, want the kernel with console=ttyS0", g)
		}
	})
	t.Run("empty", func(t *testing.T) {
		if _, err := GuestFromDir(t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("GuestFromDir of an empty directory = %v, want fs.ErrNotExist", err)
		}
		if _, err := GuestFromDir(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("GuestFromDir of a missing directory = %v, want fs.ErrNotExist", err)
		}
	})
}

func TestGuestValidate(t *testing.T) {
	ok := Guest{Kernel: "/k", ReadyMarker: "READY"}
	for _, c := range []struct {
		mutate func(g *Guest)
		want   string
	}{
		{func(g *Guest) { g.ReadyMarker = "" }, "ReadyMarker"},
		{func(g *Guest) { g.Kernel = "" }, "one of Kernel and Disk"},
		{func(g *Guest) { g.Kernel, g.Disk, g.Initrd = "", "/d", "/i" }, "a Kernel is required with Initrd"},
		{func(g *Guest) { g.Kernel = "vmlinuz" }, "Kernel must be an absolute path"},
		{func(g *Guest) { g.Disk = "disk.qcow2" }, "Disk must be an absolute path"},
		{func(g *Guest) { g.UserDataBegin = "BEGIN" }, "go together"},
	} {
		g := ok
		c.mutate(&g)
		if err := g.validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("validate(%+v) = %v, want an error saying %q", g, err, c.want)
		}
	}
	if err := ok.validate(); err != nil {
		t.Errorf("validate(%+v) = %v", ok, err)
	}
}

func TestBetween(t *testing.T) {
	out := "noise\nBEGIN\n#cloud-config\ntoken: abc\nEND\nBEGIN\nother\nEND\n"
	if got, ok := between(out, "BEGIN", "END"); !ok || got != "\n#cloud-config\ntoken: abc\n" {
		t.Errorf("between = %q, %v", got, ok)
	}
	if _, ok := between("BEGIN\nno end", "BEGIN", "END"); ok {
		t.Errorf("between found a block without its end")
	}
}

func TestShortTempDir(t *testing.T) {
	dir := shortTempDir(FromTesting(t))
	if n := len(filepath.Join(dir, serialSocket)); n > 107-10 {
		t.Errorf("a socket in %s has a path of %d bytes: too long for a unix socket", dir, n)
	}
}
