// Command seccomp generates core/seccomp/launcher.json, the seccomp profile of the launcher
// pods' compute container: containerd's default profile (the one a container gets with
// seccompProfile RuntimeDefault) for a container with no capabilities, plus userfaultfd, which
// QEMU needs for post-copy migration and which that profile refuses.
//
// The profile is containerd's own code, not a copy: this module requires the containerd release
// the nodes run, and calls its DefaultProfile. Its output depends on the machine's architecture
// (the profile lists the architectures of runtime.GOARCH) and, for ptrace, on the kernel (allowed
// from Linux 4.8 on): make generate runs it on amd64 nodes' kind of machine.
//
//	go run . -o ../../core/seccomp/launcher.json
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/contrib/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// added are the syscalls the launcher needs beyond the runtime's default.
var added = []string{"userfaultfd"}

func main() {
	out := flag.String("o", "", "write the profile to `file` (atomically) instead of stdout")
	flag.Parse()
	b, err := generate()
	if err != nil {
		fmt.Fprintf(os.Stderr, "seccomp: %v\n", err)
		os.Exit(1)
	}
	if *out == "" {
		_, _ = os.Stdout.Write(b)
		return
	}
	if err := writeFile(*out, b); err != nil {
		fmt.Fprintf(os.Stderr, "seccomp: %v\n", err)
		os.Exit(1)
	}
}

// generate returns the profile as indented JSON with a final newline.
func generate() ([]byte, error) {
	// The compute container drops every capability (controlplane/launcherpod); the capabilities a
	// HypervisorClass may keep (SETUID, SETGID) do not change containerd's profile.
	p := seccomp.DefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}})
	for _, r := range p.Syscalls {
		for _, n := range r.Names {
			for _, a := range added {
				if n == a {
					return nil, fmt.Errorf("the runtime's profile names %s already: review whether the launcher still needs its own", a)
				}
			}
		}
	}
	p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{Names: added, Action: specs.ActAllow})
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(p); err != nil {
		return nil, fmt.Errorf("encode profile: %w", err)
	}
	return buf.Bytes(), nil
}

func writeFile(name string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), ".seccomp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), name)
}
