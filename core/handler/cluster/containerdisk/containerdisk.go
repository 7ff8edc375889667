// Package containerdisk is the in-pod side of containerDisk volumes in a cluster:
// kubevisor-containerdisk runs as the command of one container per containerDisk volume of the
// launcher pod, whose image is the volume's image, and serves a unix socket at
// layout.ContainerDiskSocket until SIGTERM. The node handler dials that socket, takes the
// serving process's pid from the connection and finds the image's disk under
// /proc/<pid>/root/disk/ (package core/handler/cluster).
//
// The package imports nothing beyond the standard library and core/layout (which adds only
// k8s.io/apimachinery/pkg/types, a package without imports), and no package that needs cgo
// (not even net): kubevisor-containerdisk is a static binary that runs in images with nothing
// but a disk in them.
package containerdisk

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/kubevisor/kubevisor/core/layout"
)

// DiskDir is where a containerDisk image keeps its disk (KubeVirt's convention): the single
// file under /disk/, unless the volume names a path in the image.
const DiskDir = "/disk"

// Server is a listening socket; it accepts connections and closes them at once: a connection
// only serves to tell the handler the pid of the process (SO_PEERCRED).
type Server struct {
	fd   int
	path string
	done chan struct{}
}

// Listen serves a unix socket at p, replacing a socket a previous process left there, and
// making p's directory if it is missing.
func Listen(p string) (*Server, error) {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if fi, err := os.Lstat(p); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", p)
		}
		if err := os.Remove(p); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: p}); err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("bind %s: %w", p, err)
	}
	if err := syscall.Listen(fd, 16); err != nil {
		_ = syscall.Close(fd)
		_ = os.Remove(p)
		return nil, fmt.Errorf("listen %s: %w", p, err)
	}
	s := &Server{fd: fd, path: p, done: make(chan struct{})}
	go s.accept()
	return s, nil
}

func (s *Server) accept() {
	defer close(s.done)
	for {
		nfd, _, err := syscall.Accept4(s.fd, syscall.SOCK_CLOEXEC)
		switch {
		case err == nil:
			_ = syscall.Close(nfd)
		case errors.Is(err, syscall.EINTR), errors.Is(err, syscall.ECONNABORTED):
		default:
			return // closed
		}
	}
}

// Close stops serving and removes the socket.
func (s *Server) Close() error {
	// shutdown wakes the blocked accept; close alone does not.
	_ = syscall.Shutdown(s.fd, syscall.SHUT_RDWR)
	err := syscall.Close(s.fd)
	<-s.done
	if rerr := os.Remove(s.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}

// CopySelf copies the running executable to dir/layout.ContainerDiskCommand (mode 0555, made
// under a temporary name and renamed, so that a container starting meanwhile runs the old copy
// or the new, never half of one), making dir when it is missing. The launcher pod's init
// container copies the binary so from the launcher image into an emptyDir, from where the
// containerDisk containers, whose images hold nothing but a disk, run it.
func CopySelf(dir string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	in, err := os.Open(exe)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dst := filepath.Join(dir, layout.ContainerDiskCommand)
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o555)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
