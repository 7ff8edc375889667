package main

import (
	"debug/elf"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubevisor/kubevisor/core/handler/cluster/containerdisk"
	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/internal/testbin"
)

// TestBinary runs the real binary: it is static (no ELF interpreter: it runs in images with
// nothing but a disk); --copy-to copies it, executable; --socket serves a socket whose peer
// credentials name its pid, until SIGTERM, on which it removes the socket and exits 0.
func TestBinary(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "kvcd-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := testbin.Build(filepath.Join(dir, "bin"), false, "github.com/kubevisor/kubevisor/cmd/kubevisor-containerdisk"); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin", layout.ContainerDiskCommand)

	t.Run("static", func(t *testing.T) {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Fatal("the binary has an ELF interpreter: it is dynamically linked")
			}
		}
	})

	t.Run("copy-to", func(t *testing.T) {
		to := filepath.Join(dir, "shared")
		if err := os.Mkdir(to, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bin, "--copy-to", to).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		fi, err := os.Stat(filepath.Join(to, layout.ContainerDiskCommand))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := os.Stat(bin)
		if fi.Size() != want.Size() || fi.Mode().Perm()&0o111 == 0 {
			t.Errorf("copy: size %d mode %v, want size %d and executable", fi.Size(), fi.Mode(), want.Size())
		}
	})

	t.Run("serve until SIGTERM", func(t *testing.T) {
		sock := layout.ContainerDiskSocket(dir, "vmi", "root") // its directory is made
		cmd := exec.Command(bin, "--socket", sock)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		var conn net.Conn
		deadline := time.Now().Add(10 * time.Second)
		for {
			if conn, err = net.Dial("unix", sock); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("dial %s: %v", sock, err)
		}
		raw, _ := conn.(*net.UnixConn).SyscallConn()
		var cred *unix.Ucred
		_ = raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
		_ = conn.Close()
		if err != nil || cred.Pid != int32(cmd.Process.Pid) {
			t.Errorf("peer credentials %+v (%v), want pid %d", cred, err, cmd.Process.Pid)
		}
		// It keeps serving.
		if c2, err := net.Dial("unix", sock); err != nil {
			t.Errorf("second dial: %v", err)
		} else {
			_ = c2.Close()
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("exit after SIGTERM: %v, want 0", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("still running 10s after SIGTERM")
		}
		if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket left after exit: %v", err)
		}
	})

	t.Run("stale socket replaced", func(t *testing.T) {
		sock := layout.ContainerDiskSocket(dir, "vmi2", "root")
		s, err := containerdisk.Listen(sock)
		if err != nil {
			t.Fatal(err)
		}
		// A process that died without removing its socket leaves the file; a new one binds.
		s2, err := containerdisk.Listen(sock)
		if err != nil {
			t.Fatalf("listen over a stale socket: %v", err)
		}
		_ = s2.Close()
		_ = s.Close()
		if err := os.WriteFile(sock, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := containerdisk.Listen(sock); err == nil {
			t.Error("listen over a regular file: no error")
		}
	})
}
