package handler

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/core/plugin"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// The test guest's console markers (hack/guest/README.md).
const (
	guestReady  = "KUBEVISOR-GUEST-READY"
	guestKernel = "kubevisor/test-guest-kernel:latest"
)

// guestDir is where `make guest` builds the test guest, or $KUBEVISOR_GUEST_DIR; the test
// is skipped when the guest or QEMU is missing (under -short always; failed under CI=true).
func guestDir(t *testing.T) string {
	t.Helper()
	testenv.Heavy(t, "QEMU and the test guest")
	dir := os.Getenv("KUBEVISOR_GUEST_DIR")
	if dir == "" {
		dir, _ = filepath.Abs(filepath.Join("..", "..", "_output", "guest"))
	}
	for _, f := range []string{"vmlinuz", "initramfs.cpio.gz"} {
		testenv.File(t, filepath.Join(dir, f), "guest")
	}
	testenv.Command(t, "qemu-system-x86_64", "qemu-system-x86")
	testenv.Command(t, "qemu-img", "qemu-utils")
	return dir
}

// guestVMI boots the test guest's kernel (a kernelBoot container mapped to the guest
// directory) with a cloud-init seed on a scsi cdrom and no network.
func guestVMI(name string, uid types.UID, cmdline string) *v1alpha1.VirtualMachineInstance {
	mem := resource.MustParse("256Mi")
	return &v1alpha1.VirtualMachineInstance{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachineInstance"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uid},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			Domain: v1alpha1.DomainSpec{
				Memory: &v1alpha1.Memory{Guest: &mem},
				Firmware: &v1alpha1.Firmware{KernelBoot: &v1alpha1.KernelBoot{KernelArgs: cmdline, Container: &v1alpha1.KernelBootContainer{
					Image: guestKernel, KernelPath: "vmlinuz", InitrdPath: "initramfs.cpio.gz",
				}}},
				Devices: v1alpha1.Devices{
					Disks:                    []v1alpha1.Disk{{Name: "cloudinitdisk", DiskDevice: v1alpha1.DiskDevice{CDRom: &v1alpha1.CDRomTarget{Bus: v1alpha1.DiskBusSCSI}}}},
					AutoattachGraphicsDevice: ptr(false),
				},
			},
			Volumes: []v1alpha1.Volume{{Name: "cloudinitdisk", VolumeSource: v1alpha1.VolumeSource{
				CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config\n# " + name + "\n"},
			}}},
		},
	}
}

// console follows a VMI's serial console through the handler.
type console struct {
	mu  sync.Mutex
	out bytes.Buffer
	in  *io.PipeWriter
}

func (c *console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.Write(p)
}

func (c *console) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

func (c *console) count(s string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Count(c.out.String(), s)
}

func attach(t *testing.T, h *Handler, uid types.UID) *console {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, w := io.Pipe()
	c := &console{in: w}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = h.Console(ctx, uid, r, c)
	}()
	t.Cleanup(func() { cancel(); _ = w.Close(); <-done })
	return c
}

// newQMPGuestEnv is an env with the qmp (TCG) and local driver plugins and the test network
// driver, the project's test guest as the kernel image; cmdline is its kernel command line.
func newQMPGuestEnv(t *testing.T) (e *env, cmdline string) {
	t.Helper()
	dir := guestDir(t)
	cmdline = "console=ttyS0"
	if b, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil {
		cmdline = strings.TrimSpace(string(b))
	}
	e = newEnv(t, DriverSet{Hypervisor: "qmp", Network: testNetwork, Storage: "local"}, []plugin.Manifest{
		manifest(t, bins.qmp, driver.KindHypervisor, "qmp"),
		manifest(t, bins.local, driver.KindStorage, "local"),
		manifest(t, bins.testdriver, driver.KindNetwork, testNetwork, driver.KindNetwork, "name="+testNetwork),
	})
	e.cfg.Images = map[string]string{guestKernel: dir}
	e.cfg.DriverConfig = map[string]json.RawMessage{"qmp": json.RawMessage(`{"disableKVM": true}`)}
	return e, cmdline
}

// TestRecoverQMPAfterPluginKilled is TestRecoverAfterHypervisorPluginKilled with QEMU and the
// project's test guest (TCG): three guests boot through the qmp and local driver plugins; the
// qmp plugin is killed with SIGKILL; the host restarts it and the handler re-adopts the QEMU
// processes (qmp's Recover). Same QEMU pids, no new boot, status never Failed, and each guest
// still answers on its console.
func TestRecoverQMPAfterPluginKilled(t *testing.T) {
	e, cmdline := newQMPGuestEnv(t)
	h := e.start()

	const n = 3
	var vmis []*v1alpha1.VirtualMachineInstance
	var consoles []*console
	pids := map[types.UID]int64{}
	for i := range n {
		vmi := guestVMI(fmt.Sprintf("guest-%d", i), types.UID(fmt.Sprintf("00000000-0000-4000-8000-00000000000%d", i)), cmdline)
		mustRun(t, h, vmi)
		vmis = append(vmis, vmi)
		consoles = append(consoles, attach(t, h, vmi.UID))
	}
	for i, vmi := range vmis {
		eventually(t, string(vmi.UID)+" boots", 3*time.Minute, func() error {
			if consoles[i].count(guestReady) == 0 {
				return fmt.Errorf("no %s on the console yet", guestReady)
			}
			return nil
		})
		vs, err := vmOf(h, "qmp", vmi.UID)
		if err != nil || vs.GetPid() == 0 || vs.GetBoots() != 1 {
			t.Fatalf("VM %s: %v, %v", vmi.UID, vs, err)
		}
		pids[vmi.UID] = vs.GetPid()
	}

	old := h.PluginStatus(driver.KindHypervisor)
	if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the qmp plugin restarted", 30*time.Second, func() error {
		if st := h.PluginStatus(driver.KindHypervisor); !st.Running || st.Pid == old.Pid {
			return fmt.Errorf("plugin status %+v", st)
		}
		return nil
	})
	for i, vmi := range vmis {
		eventually(t, string(vmi.UID)+" recovered", 30*time.Second, func() error {
			vs, err := vmOf(h, "qmp", vmi.UID)
			switch {
			case err != nil:
				return err
			case vs.GetState() != hypervisorv1.State_STATE_RUNNING || vs.GetPid() != pids[vmi.UID] || vs.GetBoots() != 1:
				return fmt.Errorf("VM %v: want running as pid %d after 1 boot", vs, pids[vmi.UID])
			}
			return nil
		})
		// The same guest answers on a console attached through the new plugin process.
		c := attach(t, h, vmi.UID)
		if _, err := io.WriteString(c.in, "\necho kv-recovered-$((6*7))\n"); err != nil {
			t.Fatal(err)
		}
		eventually(t, string(vmi.UID)+" answers", time.Minute, func() error {
			if c.count("kv-recovered-42") == 0 {
				return fmt.Errorf("no answer on the console")
			}
			return nil
		})
		if c.count(guestReady) != 0 {
			t.Errorf("guest %d booted again: a ready marker on the console after the recovery", i)
		}
		requireNeverFailed(t, e.rec, vmi.UID)
	}
	for _, vmi := range vmis {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		final, err := h.Stop(ctx, vmi, 30*time.Second)
		cancel()
		if err != nil || final.Phase != v1alpha1.Succeeded {
			t.Errorf("Stop %s = %s, %v", vmi.UID, final.Phase, err)
		}
		requireNothingLeft(t, h, vmi.UID)
		eventually(t, "QEMU of "+string(vmi.UID)+" gone", 10*time.Second, func() error {
			if err := syscall.Kill(int(pids[vmi.UID]), 0); err == nil {
				return fmt.Errorf("QEMU %d still runs", pids[vmi.UID])
			}
			return nil
		})
	}
}

// TestQMPRefusesLUNWithoutSGIO: a VMI whose lun is a hostDisk on a regular file goes through
// the local storage plugin to the qmp plugin, whose Create refuses it before anything starts;
// the VMI's Synchronized condition says which disk and path, and nothing is left on the node.
func TestQMPRefusesLUNWithoutSGIO(t *testing.T) {
	testenv.Command(t, "qemu-system-x86_64", "qemu-system-x86")
	testenv.Command(t, "qemu-img", "qemu-utils")
	e := newEnv(t, DriverSet{Hypervisor: "qmp", Network: testNetwork, Storage: "local"}, []plugin.Manifest{
		manifest(t, bins.qmp, driver.KindHypervisor, "qmp"),
		manifest(t, bins.local, driver.KindStorage, "local"),
		manifest(t, bins.testdriver, driver.KindNetwork, testNetwork, driver.KindNetwork, "name="+testNetwork),
	})
	e.cfg.DriverConfig = map[string]json.RawMessage{"qmp": json.RawMessage(`{"disableKVM": true}`)}
	h := e.start()
	img := filepath.Join(t.TempDir(), "san.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	mem := resource.MustParse("64Mi")
	vmi := &v1alpha1.VirtualMachineInstance{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachineInstance"},
		ObjectMeta: metav1.ObjectMeta{Name: "lun", Namespace: "default", UID: "9b2d4c1e-5a6f-4e21-8c3d-1f0a2b3c4d5e"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			Domain: v1alpha1.DomainSpec{
				Memory: &v1alpha1.Memory{Guest: &mem},
				Devices: v1alpha1.Devices{
					Disks:                    []v1alpha1.Disk{{Name: "san", DiskDevice: v1alpha1.DiskDevice{LUN: &v1alpha1.LunTarget{Bus: v1alpha1.DiskBusSCSI}}}},
					AutoattachGraphicsDevice: ptr(false),
				},
			},
			Volumes: []v1alpha1.Volume{{Name: "san", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: img, Type: v1alpha1.HostDiskExists}}}},
		},
	}
	st, err := doSync(t, h, vmi)
	if err == nil {
		t.Fatalf("Sync succeeded: %+v", st)
	}
	c := Condition(st, v1alpha1.VirtualMachineInstanceSynchronized)
	want := "disk san: lun needs a SCSI device that takes SG_IO; " + img + " is not (a regular file, not a block device)"
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != ReasonCreateFailed || !strings.Contains(c.Message, want) {
		t.Fatalf("Synchronized = %+v, want False, %s, saying %q", c, ReasonCreateFailed, want)
	}
	requireNothingLeft(t, h, vmi.UID)
}

// TestQMPPersistentTPMAcrossVMIs: a VMI with a persistent TPM runs through the qmp plugin with
// its TPM's state in the handler's persistent state directory for the VMI's name; once the VMI
// is stopped (its run and work directories removed) the state is still there, and the next VMI
// of that name (another UID) boots with the same TPM: its reset count is above the first's.
func TestQMPPersistentTPMAcrossVMIs(t *testing.T) {
	testenv.Command(t, "swtpm", "swtpm")
	e, cmdline := newQMPGuestEnv(t)
	h := e.start()
	dir := filepath.Join(e.cfg.StateDir, PersistentStateDirName, "default", "tpm-guest")
	resets := func(uid types.UID) string {
		t.Helper()
		vmi := guestVMI("tpm-guest", uid, cmdline)
		vmi.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Persistent: ptr(true)}
		mustRun(t, h, vmi)
		c := attach(t, h, vmi.UID)
		eventually(t, string(uid)+" boots", 3*time.Minute, func() error {
			if c.count(guestReady) == 0 {
				return fmt.Errorf("no %s on the console yet", guestReady)
			}
			return nil
		})
		m := regexp.MustCompile(`KUBEVISOR-TPM: tpm0 version=2 .* resets=([0-9]+)`).FindStringSubmatch(c.String())
		if m == nil {
			t.Fatalf("no TPM 2.0 with a reset count on the console: %s", c.String())
		}
		if _, err := os.Stat(filepath.Join(dir, "tpm")); err != nil {
			t.Errorf("the TPM's state is not in the persistent state directory: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := h.Stop(ctx, vmi, 5*time.Second); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		requireNothingLeft(t, h, vmi.UID)
		return m[1]
	}
	first := resets("5d0c6c3e-1f3a-4b7e-9a41-000000000001")
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("persistent state directory after Stop: %v, %v; want it kept, 0700", fi, err)
	}
	second := resets("5d0c6c3e-1f3a-4b7e-9a41-000000000002")
	a, _ := strconv.Atoi(first)
	b, _ := strconv.Atoi(second)
	t.Logf("TPM reset counts: first VMI %d, second %d", a, b)
	if b <= a {
		t.Errorf("the second VMI's TPM has reset count %d, the first's %d: not the same TPM", b, a)
	}
}
