package seccomp

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// TestGenerated fails when launcher.json is not what hack/seccomp makes from the runtime's
// default profile (make generate was not run, or the file was edited by hand).
func TestGenerated(t *testing.T) {
	cmd := exec.Command("go", "run", ".")
	cmd.Dir = filepath.Join("..", "..", "hack", "seccomp")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go run hack/seccomp: %v\n%s", err, stderr.Bytes())
	}
	if !bytes.Equal(out, LauncherProfile) {
		t.Fatalf("core/seccomp/launcher.json differs from what hack/seccomp generates: run make generate and commit (generated %d bytes, committed %d)", len(out), len(LauncherProfile))
	}
}

type profile struct {
	DefaultAction string   `json:"defaultAction"`
	Architectures []string `json:"architectures"`
	Syscalls      []struct {
		Names  []string          `json:"names"`
		Action string            `json:"action"`
		Args   []json.RawMessage `json:"args"`
	} `json:"syscalls"`
}

// allowed says whether p lets name through for some arguments, and whether for any.
func (p profile) allowed(name string) (some, any bool) {
	for _, r := range p.Syscalls {
		if r.Action == "SCMP_ACT_ALLOW" && slices.Contains(r.Names, name) {
			some = true
			any = any || len(r.Args) == 0
		}
	}
	return some, any
}

func TestLauncherProfile(t *testing.T) {
	var p profile
	if err := json.Unmarshal(LauncherProfile, &p); err != nil {
		t.Fatal(err)
	}
	if p.DefaultAction != "SCMP_ACT_ERRNO" {
		t.Errorf("defaultAction %q, want SCMP_ACT_ERRNO: what the profile does not name is refused", p.DefaultAction)
	}
	if !slices.Contains(p.Architectures, "SCMP_ARCH_X86_64") {
		t.Errorf("architectures %v, want SCMP_ARCH_X86_64 among them", p.Architectures)
	}
	// What QEMU needs: post-copy migration, and what it runs on.
	for _, name := range []string{"userfaultfd", "ioctl", "mmap", "madvise", "io_uring_setup", "memfd_create"} {
		if _, any := p.allowed(name); !any {
			t.Errorf("%s is not allowed", name)
		}
	}
	// What the runtime's default refuses a container without capabilities stays refused.
	for _, name := range []string{"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
		"mount", "umount2", "pivot_root", "unshare", "setns", "bpf", "reboot", "swapon", "settimeofday",
		"open_by_handle_at", "perf_event_open", "process_vm_writev", "iopl", "ioperm", "acct", "add_key", "keyctl"} {
		if some, _ := p.allowed(name); some {
			t.Errorf("%s is allowed", name)
		}
	}
	// clone with namespace flags stays refused: clone is allowed only with a mask.
	for _, r := range p.Syscalls {
		if slices.Contains(r.Names, "clone") && r.Action == "SCMP_ACT_ALLOW" && len(r.Args) == 0 {
			t.Error("clone is allowed with any flags")
		}
	}
}

func TestInstall(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "launcher.json")
	if err := os.WriteFile(file, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := Install(dir); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, LauncherProfile) {
		t.Error("installed profile differs from LauncherProfile")
	}
	if fi, err := os.Stat(file); err != nil {
		t.Error(err)
	} else if fi.Mode().Perm() != 0o644 {
		t.Errorf("installed profile mode %v, want 0644", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want launcher.json alone: %v", len(entries), entries)
	}
	if err := Install(filepath.Join(dir, "missing")); err == nil {
		t.Error("Install into a missing directory succeeded")
	}
}
