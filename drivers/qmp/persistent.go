package qmp

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
)

// Persistent state: a spec with tpm.persistent or firmware.efi.persistent names a
// persistent_state_dir that outlives the VM, and the driver keeps there what the spec asks for,
// each in its own entry so that one directory holds both:
//
//	<dir>/tpm/              swtpm's state directory (--tpmstate dir=): swtpm manufactures the
//	                        TPM in it when it is empty and loads it on every later start
//	<dir>/efi/vars.fd       the EFI variable store (QEMU's pflash1), copied from OVMF's
//	                        template only when absent
//	<dir>/efi/vars.template which template the store was made from (varsTemplateSecure or
//	                        varsTemplatePlain), so that a VM booting the other firmware build
//	                        is refused rather than given a store it did not make
//
// The driver never removes any of it (Delete included): the directory's owner does.
const (
	// PersistentTPMDir is swtpm's state directory in the persistent state directory.
	PersistentTPMDir = "tpm"
	// PersistentVarsFile is the EFI variable store in the persistent state directory.
	PersistentVarsFile = "efi/vars.fd"

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

// prepareVars makes the VM's EFI variable store at vars from template when it is absent, and
// otherwise uses it as found. A persistent store's directory is made (0700), the kind of its
// template recorded beside it, and a store made from the other kind of template refused
// (FailedPrecondition): the Secure Boot build's store holds enrolled keys the plain build
// does not expect, and the plain one's lacks them, so either would boot, differently from
// what the VMI says, or not at all.
func prepareVars(spec *domainv1.DomainSpec, template, vars string) error {
	persistent := spec.GetFirmware().GetEfi().GetPersistent()
	if persistent {
		if err := os.MkdirAll(filepath.Dir(vars), 0o700); err != nil {
			return status.Errorf(codes.FailedPrecondition, "firmware.efi.persistent: %v", err)
		}
		if err := ownLikeParent(filepath.Dir(vars)); err != nil {
			return status.Errorf(codes.FailedPrecondition, "firmware.efi.persistent: %v", err)
		}
		if err := checkVarsTemplate(vars, varsTemplateKind(spec)); err != nil {
			return err
		}
	}
	if _, err := os.Stat(vars); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return status.Errorf(codes.FailedPrecondition, "UEFI variables: %v", err)
	}
	// Copied beside it and renamed, so that a store found later is always a whole one.
	tmp := vars + ".tmp"
	_ = os.Remove(tmp)
	if err := copyFile(template, tmp); err != nil {
		return status.Errorf(codes.FailedPrecondition, "copy UEFI variables: %v", err)
	}
	if err := ownLikeParent(tmp); err != nil {
		_ = os.Remove(tmp)
		return status.Errorf(codes.FailedPrecondition, "copy UEFI variables: %v", err)
	}
	if err := os.Rename(tmp, vars); err != nil {
		_ = os.Remove(tmp)
		return status.Errorf(codes.FailedPrecondition, "copy UEFI variables: %v", err)
	}
	return nil
}

// varsTemplateRecord is where the kind of template of the store at vars is recorded.
func varsTemplateRecord(vars string) string {
	return filepath.Join(filepath.Dir(vars), "vars.template")
}

// checkVarsTemplate refuses the persistent store at vars when it was made from another kind of
// template than want, and records want when nothing is recorded yet (a new store, or one made
// before the record).
func checkVarsTemplate(vars, want string) error {
	rec := varsTemplateRecord(vars)
	b, err := os.ReadFile(rec)
	switch {
	case err == nil:
		if got := string(bytes.TrimSpace(b)); got != want {
			return status.Errorf(codes.FailedPrecondition,
				"firmware.efi.persistent: the persistent EFI variable store %s was made from the %s firmware's template, and this VM boots the %s firmware (secureBoot %s): it is not used or replaced; boot with the secureBoot it was made with, or remove the VM's persistent EFI state",
				vars, got, want, map[bool]string{true: "true", false: "false"}[want == varsTemplateSecure])
		}
		return nil
	case errors.Is(err, os.ErrNotExist):
		if err := os.WriteFile(rec, []byte(want+"\n"), 0o600); err != nil {
			return status.Errorf(codes.FailedPrecondition, "firmware.efi.persistent: %v", fmt.Errorf("record the store's template: %w", err))
		}
		return nil
	default:
		return status.Errorf(codes.FailedPrecondition, "firmware.efi.persistent: %v", err)
	}
}
