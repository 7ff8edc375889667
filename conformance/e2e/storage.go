package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/conformance/e2e/guest"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// claimDiskSerial is the serial of the claim's disk in the storage spec: the guest finds the
// disk by it (/sys/block/<dev>/serial).
const claimDiskSerial = "e2eclaim"

// findClaimDisk sets $d, in the guest's shell, to the device of the disk whose serial is
// claimDiskSerial.
const findClaimDisk = "for b in /sys/block/vd*; do [ \"$(cat $b/serial 2>/dev/null)\" = " + claimDiskSerial + " ] && d=/dev/${b##*/}; done\r"

// tpmResets reads resets=<n> of the guest's KUBEVISOR-TPM line: how many times its TPM was
// reset (each boot), which the TPM keeps in its own state.
var tpmResets = regexp.MustCompile(`KUBEVISOR-TPM: tpm0 .*resets=(\d+)`)

// efiBoots reads boots=<n> of the guest's KUBEVISOR-EFIVAR line: how many boots its EFI
// variable store has seen (the guest adds a variable per boot).
var efiBoots = regexp.MustCompile(`KUBEVISOR-EFIVAR: boots=(\d+)`)

// counted is the number the regular expression re reads on the console; it fails the spec when
// the console has none.
func counted(re *regexp.Regexp, console, what string) int {
	GinkgoHelper()
	m := re.FindStringSubmatch(console)
	Expect(m).NotTo(BeNil(), "no %s on the console:\n%s", what, console)
	n, err := strconv.Atoi(m[1])
	Expect(err).NotTo(HaveOccurred())
	return n
}

var _ = Describe("VirtualMachine storage", Label("Conformance"), func() {
	f := NewFramework()

	It("keeps what the guest wrote on a PersistentVolumeClaim disk of the default class, and its persistent TPM's state and EFI variables on the VM's state claim, across a stop and a start", func(ctx SpecContext) {
		const name = "persist"
		By("a claim of the cluster's default storage class, which the node sizes a disk image on")
		f.Apply(ctx, `apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: e2e-disk
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 64Mi
`)
		// OVMF with the guest's kernel and initramfs needs more than the default 128Mi.
		spec := guestSpecOf(guest.Options{UserData: name, Memory: ptr.To(resource.MustParse("256Mi"))})
		spec.Domain.Devices.Disks[0].BootOrder = ptr.To[uint](1) // the containerDisk, which has the UEFI loader
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "data", Serial: claimDiskSerial})
		spec.Volumes = append(spec.Volumes, v1alpha1.Volume{Name: "data", VolumeSource: v1alpha1.VolumeSource{
			PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
				PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "e2e-disk"}}}})
		spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Persistent: ptr.To(true)}
		// The test guest's disk boots with UEFI too (OVMF without Secure Boot: its loader is unsigned).
		spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{
			SecureBoot: ptr.To(false), Persistent: ptr.To(true)}}}
		f.Apply(ctx, vmOf(name, spec))

		vmi := f.WaitRunning(ctx, name)
		f.WaitReady(ctx, vmi)
		Expect(vmi.Status.VolumeStatus).To(ContainElement(HaveField("Name", "data")), "volumeStatus: %+v", vmi.Status.VolumeStatus)
		console := f.Console(ctx, vmi)
		// 64Mi less KubeVirt's 5.5 % file-system overhead, rounded down to a MiB: 60 MiB.
		Expect(consoleField(console, "KUBEVISOR-DISKS:")).To(ContainSubstring(fmt.Sprintf("=%d", 60<<20)),
			"the claim's disk.img is not 60 MiB")
		resets, boots := counted(tpmResets, console, "TPM reset count"), counted(efiBoots, console, "EFI boot count")

		state := &corev1.PersistentVolumeClaim{}
		Expect(f.Client.Get(ctx, client.ObjectKey{Namespace: f.Namespace, Name: "persistent-state-for-" + name}, state)).To(Succeed())
		Expect(state.Status.Phase).To(Equal(corev1.ClaimBound))

		By("the guest writes a line to the claim's disk")
		mark := fmt.Sprintf("kubevisor-claim-%d", time.Now().UnixNano())
		c := f.OpenConsole(ctx, name)
		c.Send("\r")
		c.Send(findClaimDisk)
		c.Send("echo " + mark + " | dd of=$d conv=fsync 2>/dev/null && echo WROTE-$((1+1))\r")
		c.WaitFor(ctx, "WROTE-2", time.Minute)
		c.Close()

		By("stop, then start: a new VMI on the same claims")
		f.VmctlOK(ctx, "stop", name)
		f.WaitGone(ctx, name)
		f.VmctlOK(ctx, "start", name)
		again := f.WaitRunning(ctx, name)
		Expect(again.UID).NotTo(Equal(vmi.UID))
		f.WaitReady(ctx, again)

		console = f.Console(ctx, again)
		Expect(counted(tpmResets, console, "TPM reset count")).To(BeNumerically(">", resets), "the TPM's state was not kept")
		Expect(counted(efiBoots, console, "EFI boot count")).To(BeNumerically(">", boots), "the EFI variable store was not kept")

		c = f.OpenConsole(ctx, name)
		c.Send("\r")
		c.Send(findClaimDisk)
		c.Send("head -c 64 $d | tr -d '\\0'; echo; echo READ-$((2+2))\r")
		out := c.WaitFor(ctx, "READ-4", time.Minute)
		c.Close()
		Expect(out).To(ContainSubstring(mark), "the line written before the stop is not on the claim's disk")

		By("the VM deleted: its state claim goes with it")
		_, err := f.Kubectl(ctx, "", "delete", "vm", name, "--wait=false")
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() bool {
			err := f.Client.Get(ctx, client.ObjectKeyFromObject(state), &corev1.PersistentVolumeClaim{})
			return apierrors.IsNotFound(err)
		}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(2*time.Second).Should(BeTrue(),
			"state claim %s left after its VM was deleted", state.Name)
	})
})
