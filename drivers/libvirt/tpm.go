package libvirt

import (
	"bytes"
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"libvirt.org/go/libvirtxml"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

// The TPM and the persistent state.
//
// DomainSpec.tpm is libvirt's <tpm> with the emulator backend: the VM's daemon runs swtpm
// itself (swtpm_setup manufactures the TPM the first time, swtpm then runs beside QEMU, both as
// the VM's user, in the VM's sandbox). In session mode the daemon keeps the TPM's state under
// its XDG_CONFIG_HOME, libvirt/qemu/swtpm/<domain uuid>/, so in the run dir: it lasts as long as
// the VM. persistent_state='yes', as the domain is transient: libvirt would otherwise remove the
// state when the domain ends, and a guest's power-off and Start would give it a new TPM.
//
// A persistent TPM's state is in the persistent state directory instead, <dir>/tpm (the qmp
// driver's entry, with the same swtpm files in it): libvirt 9.0 has no element for where the
// emulator's state goes, so the daemon's <domain uuid>/tpm2 entry is a symlink to it. libvirt
// runs swtpm_setup only when it finds no state there, so a new VM given the directory has the
// same TPM.
//
// A persistent EFI variable store is <dir>/efi/vars.fd (the qmp driver's entry), the domain's
// NVRAM: libvirt copies the firmware's template there only when it is absent. Which template
// it was made from is recorded beside it (efi/vars.template, as the qmp driver does), and a
// store made from the other is refused.

const (
	persistentTPMDir   = qmp.PersistentTPMDir
	persistentVarsFile = qmp.PersistentVarsFile
)

// swtpmTools are what libvirt's emulator TPM runs (Debian's swtpm and swtpm-tools).
var swtpmTools = []string{"swtpm_setup", "swtpm_ioctl"}

// swtpmProblem is why libvirt cannot run an emulated TPM on this node, or "".
func (d *Driver) swtpmProblem(ctx context.Context) string {
	if sw := d.prober.SWTPM(ctx, ""); sw.Path == "" {
		return sw.Problem
	}
	for _, tool := range swtpmTools {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("%s not found (install swtpm-tools): %v", tool, err)
		}
	}
	return ""
}

// domainUUID is the domain's UUID: the spec's, else one derived from the VM's id, so that the
// daemon's per-domain state (the TPM's) has the same name on every Start of the VM.
func domainUUID(spec *domainv1.DomainSpec) string {
	if u := spec.GetUuid(); u != "" {
		return u
	}
	h := sha1.Sum([]byte("kubevisor.io/libvirt/" + spec.GetId()))
	h[6] = h[6]&0x0f | 0x50 // version 5 (name-based, SHA-1)
	h[8] = h[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// tpm is the <tpm> device: CRB on q35 (what libvirt picks for TPM 2.0), TIS on pc.
func (b *builder) tpm(d *libvirtxml.Domain) {
	t := b.spec.GetTpm()
	if t == nil {
		return
	}
	if b.env.SWTPMProblem != "" {
		if b.missing == "" {
			b.missing = "tpm: swtpm is not usable on this node: " + b.env.SWTPMProblem
		}
		return
	}
	if t.GetPersistent() && b.spec.GetPersistentStateDir() == "" {
		b.fail("tpm.persistent", "needs persistentStateDir")
	}
	model := "tpm-crb"
	if m := d.OS.Type.Machine; m == "pc" || isI440FX(m) {
		model = "tpm-tis"
	}
	d.Devices.TPMs = append(d.Devices.TPMs, libvirtxml.DomainTPM{
		Model:   model,
		Backend: &libvirtxml.DomainTPMBackend{Emulator: &libvirtxml.DomainTPMBackendEmulator{Version: "2.0", PersistentState: "yes"}},
	})
	b.org.add("devices/tpm", "tpm", "")
}

// nvram is where the EFI variable store goes: the persistent state directory's entry when
// firmware.efi.persistent, else Env.NVRAM (the run dir).
func (b *builder) nvram() string {
	efi := b.spec.GetFirmware().GetEfi()
	if !efi.GetPersistent() {
		return b.env.NVRAM
	}
	dir := b.spec.GetPersistentStateDir()
	if dir == "" {
		b.fail("firmware.efi.persistent", "needs persistentStateDir")
		return b.env.NVRAM
	}
	return filepath.Join(dir, persistentVarsFile)
}

// checkPersistentStateDir refuses a persistent state directory the spec does not use.
func (b *builder) checkPersistentStateDir() {
	s := b.spec
	dir := s.GetPersistentStateDir()
	if dir == "" {
		return
	}
	if !filepath.IsAbs(dir) {
		b.fail("persistentStateDir", "%q is not an absolute path", dir)
	}
	if !s.GetTpm().GetPersistent() && !s.GetFirmware().GetEfi().GetPersistent() {
		b.fail("persistentStateDir", "set, but neither tpm.persistent nor firmware.efi.persistent is")
	}
}

// preparePersistent makes the persistent state's entries the spec uses, the VM user's: the
// TPM's directory, linked from where the VM's daemon looks for it, and the EFI variable store's
// directory (the store itself libvirt copies from the template). It removes nothing there.
func (d *Driver) preparePersistent(v *vm) error {
	dir := v.spec.GetPersistentStateDir()
	if dir == "" {
		return nil
	}
	u := v.rec.User
	if v.spec.GetTpm().GetPersistent() {
		tpm := filepath.Join(dir, persistentTPMDir)
		if err := os.MkdirAll(tpm, 0o700); err != nil {
			return status.Errorf(codes.FailedPrecondition, "tpm.persistent: %v", err)
		}
		if err := chownTree(tpm, u.UID, u.GID); err != nil {
			return status.Errorf(codes.FailedPrecondition, "tpm.persistent: %v", err)
		}
		if err := grantDir(u, tpm); err != nil {
			return status.Errorf(codes.FailedPrecondition, "tpm.persistent: %v", err)
		}
		// <XDG_CONFIG_HOME>/libvirt/qemu/swtpm/<uuid>/tpm2 -> <dir>/tpm: libvirt's state
		// directory of a TPM 2.0 is the link, swtpm's files are in <dir>/tpm itself.
		parent := filepath.Join(v.dmn.dir, "libvirt", "qemu", "swtpm", domainUUID(v.spec))
		if err := os.MkdirAll(parent, 0o700); err != nil {
			return status.Errorf(codes.FailedPrecondition, "tpm.persistent: %v", err)
		}
		link := filepath.Join(parent, "tpm2")
		if cur, err := os.Readlink(link); err != nil || cur != tpm {
			_ = os.Remove(link)
			if err := os.Symlink(tpm, link); err != nil {
				return status.Errorf(codes.FailedPrecondition, "tpm.persistent: %v", err)
			}
		}
		if err := chownTree(filepath.Join(v.dmn.dir, "libvirt"), u.UID, u.GID); err != nil {
			return status.Errorf(codes.FailedPrecondition, "tpm.persistent: %v", err)
		}
	}
	if v.spec.GetFirmware().GetEfi().GetPersistent() {
		vars := filepath.Join(dir, persistentVarsFile)
		efi := filepath.Dir(vars)
		if err := os.MkdirAll(efi, 0o700); err != nil {
			return status.Errorf(codes.FailedPrecondition, "firmware.efi.persistent: %v", err)
		}
		if err := checkVarsTemplate(vars, varsTemplateKind(v.spec)); err != nil {
			return err
		}
		if err := chownTree(efi, u.UID, u.GID); err != nil {
			return status.Errorf(codes.FailedPrecondition, "firmware.efi.persistent: %v", err)
		}
		if err := grantDir(u, efi); err != nil {
			return status.Errorf(codes.FailedPrecondition, "firmware.efi.persistent: %v", err)
		}
	}
	return nil
}

const (
	varsTemplateSecure = "secure-boot"
	varsTemplatePlain  = "plain"
)

// varsTemplateKind is the kind of template a variable store for spec is made from.
func varsTemplateKind(spec *domainv1.DomainSpec) string {
	if spec.GetFirmware().GetEfi().GetSecureBoot() {
		return varsTemplateSecure
	}
	return varsTemplatePlain
}

// checkVarsTemplate refuses the persistent store at vars when it was made from another kind of
// template than want (the record the qmp driver keeps too, efi/vars.template), and records want
// when nothing is recorded yet.
func checkVarsTemplate(vars, want string) error {
	rec := filepath.Join(filepath.Dir(vars), "vars.template")
	b, err := os.ReadFile(rec)
	switch {
	case err == nil:
		if got := string(bytes.TrimSpace(b)); got != want {
			return status.Errorf(codes.FailedPrecondition,
				"firmware.efi.persistent: the persistent EFI variable store %s was made from the %s firmware's template, and this VM boots the %s firmware: it is not used or replaced; boot with the secureBoot it was made with, or remove the VM's persistent EFI state",
				vars, got, want)
		}
		return nil
	case errors.Is(err, os.ErrNotExist):
		if err := os.WriteFile(rec, []byte(want+"\n"), 0o600); err != nil {
			return status.Errorf(codes.FailedPrecondition, "firmware.efi.persistent: record the store's template: %v", err)
		}
		return nil
	default:
		return status.Errorf(codes.FailedPrecondition, "firmware.efi.persistent: %v", err)
	}
}
