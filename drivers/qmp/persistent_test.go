package qmp

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
)

// TestPersistentStatePaths: the TPM's state and the EFI variable store are in the persistent
// state directory exactly when the spec asks to keep each, on QEMU's and swtpm's command lines.
func TestPersistentStatePaths(t *testing.T) {
	efi := func(persistent bool) *domainv1.Firmware {
		return &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{Persistent: persistent}}}
	}
	for _, c := range []struct {
		name           string
		spec           func(*domainv1.DomainSpec)
		tpmState, vars string
	}{
		{
			name: "nothing persistent: the run directory",
			spec: func(s *domainv1.DomainSpec) {
				s.Tpm, s.Firmware = &domainv1.TPM{}, efi(false)
			},
			tpmState: "/run/vm1/tpm", vars: "/run/vm1/OVMF_VARS.fd",
		},
		{
			name: "persistent TPM and EFI",
			spec: func(s *domainv1.DomainSpec) {
				s.Tpm, s.Firmware, s.PersistentStateDir = &domainv1.TPM{Persistent: true}, efi(true), "/state/vm"
			},
			tpmState: "/state/vm/tpm", vars: "/state/vm/efi/vars.fd",
		},
		{
			name: "persistent TPM only: the variable store stays in the run directory",
			spec: func(s *domainv1.DomainSpec) {
				s.Tpm, s.Firmware, s.PersistentStateDir = &domainv1.TPM{Persistent: true}, efi(false), "/state/vm"
			},
			tpmState: "/state/vm/tpm", vars: "/run/vm1/OVMF_VARS.fd",
		},
		{
			name: "persistent EFI only: the TPM's state stays in the run directory",
			spec: func(s *domainv1.DomainSpec) {
				s.Tpm, s.Firmware, s.PersistentStateDir = &domainv1.TPM{}, efi(true), "/state/vm"
			},
			tpmState: "/run/vm1/tpm", vars: "/state/vm/efi/vars.fd",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec, env := baseSpec(), baseEnv()
			c.spec(spec)
			env.SWTPM = "/usr/bin/swtpm"
			p := RunPaths(spec, env.RunDir)
			if p.TPMState != c.tpmState || p.Vars != c.vars {
				t.Errorf("RunPaths: TPMState %q, Vars %q; want %q, %q", p.TPMState, p.Vars, c.tpmState, c.vars)
			}
			if p.SWTPMLog != "/run/vm1/swtpm.log" || p.QMP != "/run/vm1/qmp.sock" {
				t.Errorf("RunPaths moved the run directory's files: %+v", p)
			}
			cl, err := BuildArgs(spec, env)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(cl.TPM.Args, "dir="+c.tpmState+",mode=0600") {
				t.Errorf("swtpm %q, want its state in %s", cl.TPM.Args, c.tpmState)
			}
			if !hasArgs(cl.Args, "-blockdev", "driver=file,node-name=pflash1,filename="+c.vars) {
				t.Errorf("args lack the variable store %s:\n%s", c.vars, strings.Join(cl.Args, " "))
			}
		})
	}
}

// TestPrepareVars: a persistent store is copied from the template only when absent, is used as
// found later (what the guest wrote stays), and one made from the other template is refused,
// not used or replaced. A store in the run directory is copied once, as before.
func TestPrepareVars(t *testing.T) {
	dir := t.TempDir()
	plain, secure := filepath.Join(dir, "OVMF_VARS.fd"), filepath.Join(dir, "OVMF_VARS.ms.fd")
	for p, content := range map[string]string{plain: "plain template", secure: "secure template"} {
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	spec := func(secureBoot bool) *domainv1.DomainSpec {
		return &domainv1.DomainSpec{
			Firmware:           &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{SecureBoot: secureBoot, Persistent: true}}},
			PersistentStateDir: state,
		}
	}
	vars := RunPaths(spec(false), filepath.Join(dir, "run")).Vars
	read := func() string {
		t.Helper()
		b, err := os.ReadFile(vars)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	// First start: made from the plain template, in a 0700 efi directory.
	if err := prepareVars(spec(false), plain, vars); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "plain template" {
		t.Fatalf("store %q, want the plain template's copy", got)
	}
	if fi, err := os.Stat(filepath.Dir(vars)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("efi directory: %v, %v; want 0700", fi, err)
	}
	// The guest writes a variable; a later start (another VM given the directory) keeps it.
	if err := os.WriteFile(vars, []byte("plain template + BootOrder"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := prepareVars(spec(false), plain, vars); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "plain template + BootOrder" {
		t.Fatalf("second start: store %q, want what the guest wrote", got)
	}
	// Secure boot on a store made from the plain template: refused, saying so, and untouched.
	err := prepareVars(spec(true), secure, vars)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "made from the plain firmware's template") ||
		!strings.Contains(err.Error(), "secure-boot firmware") {
		t.Fatalf("secure boot on a plain store: %v, want FailedPrecondition naming both templates", err)
	}
	if got := read(); got != "plain template + BootOrder" {
		t.Errorf("refused store changed: %q", got)
	}
	if _, err := os.Stat(vars + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("a copy left beside the store: %v", err)
	}

	// Not persistent: the run directory's store, copied when absent and then kept.
	run := filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	ephemeral := &domainv1.DomainSpec{Firmware: &domainv1.Firmware{Boot: &domainv1.Firmware_Efi{Efi: &domainv1.EFI{SecureBoot: true}}}}
	rv := RunPaths(ephemeral, run).Vars
	if err := prepareVars(ephemeral, secure, rv); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(rv); string(b) != "secure template" {
		t.Errorf("run directory store %q, want the secure template's copy", b)
	}
	if _, err := os.Stat(filepath.Join(run, "vars.template")); !os.IsNotExist(err) {
		t.Errorf("a template record in the run directory: %v", err)
	}
}
