package mcs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/opencontainers/selinux/go-selinux"
	"github.com/opencontainers/selinux/go-selinux/label"
)

// Mode is a node's SELinux mode, as the node label kubevisor.io/selinux says it
// (v1alpha1.SELinuxNodeLabel).
type Mode string

// The modes.
const (
	// ModeDisabled: the kernel has no SELinux, or it is off. Levels are ignored and nothing is
	// labelled.
	ModeDisabled Mode = "disabled"
	// ModePermissive: SELinux labels and logs what it would refuse, and refuses nothing.
	ModePermissive Mode = "permissive"
	// ModeEnforcing: SELinux refuses what the policy does not allow.
	ModeEnforcing Mode = "enforcing"
)

// NodeMode is this machine's SELinux mode: disabled unless selinuxfs is mounted and the process
// has a label (selinux.GetEnabled; a privileged container of an SELinux node sees the host's),
// else what selinuxfs's enforce file says.
func NodeMode() Mode {
	if !selinux.GetEnabled() {
		return ModeDisabled
	}
	switch selinux.EnforceMode() {
	case selinux.Enforcing:
		return ModeEnforcing
	case selinux.Permissive:
		return ModePermissive
	}
	return ModeDisabled
}

// Labeler labels the files a node makes for a VMI with the VMI's level.
type Labeler struct {
	// Mode is the node's SELinux mode: a Labeler of a node where it is disabled labels nothing.
	Mode Mode
	// FileLabel is the label of a VMI's files at a level. NodeLabeler's is ContainerFileLabel.
	FileLabel func(Level) (string, error)
	// Chcon sets the label of a path, not following a symbolic link, and of everything beneath
	// a directory with recurse. NodeLabeler's is selinux.Chcon.
	Chcon func(path, label string, recurse bool) error
}

// NodeLabeler is the Labeler of this machine, in its mode (NodeMode), with the library's
// ContainerFileLabel and selinux.Chcon.
func NodeLabeler() *Labeler {
	return &Labeler{Mode: NodeMode(), FileLabel: ContainerFileLabel, Chcon: selinux.Chcon}
}

// Enabled says whether l labels files: SELinux is enabled (enforcing or permissive).
func (l *Labeler) Enabled() bool {
	return l != nil && (l.Mode == ModeEnforcing || l.Mode == ModePermissive)
}

// Label gives path, and with recurse everything beneath it, the label of a VMI's files at
// level; a path that does not exist is left alone. Where SELinux is disabled it does nothing.
// The error names the path.
func (l *Labeler) Label(level Level, path string, recurse bool) error {
	if !l.Enabled() {
		return nil
	}
	if level.IsZero() {
		return fmt.Errorf("label %s: no SELinux level", path)
	}
	if l.FileLabel == nil || l.Chcon == nil {
		return fmt.Errorf("label %s at %s: the labeler has no FileLabel or Chcon", path, level)
	}
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	fl, err := l.FileLabel(level)
	if err != nil {
		return fmt.Errorf("label %s at %s: %w", path, level, err)
	}
	if err := l.Chcon(path, fl, recurse); err != nil {
		return fmt.Errorf("label %s %s: %w", path, fl, err)
	}
	return nil
}

// ContainerFileLabel is the label of a container's files at level on this machine: the file
// context of the node policy's container contexts (lxc_contexts' "file", container_file_t on
// the usual policies, which the container runtime gives the pod's own volumes) with level, from
// label.InitLabels as the runtime asks it. An error where SELinux is disabled, or where the
// policy names no container file context.
func ContainerFileLabel(level Level) (string, error) {
	if !selinux.GetEnabled() {
		return "", errors.New("SELinux is disabled")
	}
	process, file, err := label.InitLabels([]string{"level:" + level.String()})
	if err != nil {
		return "", fmt.Errorf("the container labels of the node's SELinux policy: %w", err)
	}
	// InitLabels reserved the level in this process's list, which only the runtime's own
	// allocation reads: the handler's levels are the controller's.
	selinux.ReleaseLabel(process)
	return fileLabelAt(file, level)
}

// fileLabelAt is the file label base (a context, whatever its level) at level.
func fileLabelAt(base string, level Level) (string, error) {
	c, err := selinux.NewContext(base)
	if err != nil {
		return "", fmt.Errorf("container file context %q: %w", base, err)
	}
	if c["type"] == "" {
		return "", errors.New("the node's SELinux policy names no container file context (lxc_contexts: file)")
	}
	c["level"] = level.String()
	return c.Get(), nil
}
