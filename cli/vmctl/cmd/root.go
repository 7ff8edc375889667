// Package cmd is the vmctl command line (also run as the kubectl plugin kubectl-vm): VM
// lifecycle actions, console, VNC, port forwarding and ssh through Kubevisor's subresource API,
// and manifest tools (create, convert, expose). Each command lives in its own file.
package cmd

import (
	"context"
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

// IOStreams are the command's standard streams.
type IOStreams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
}

// DisplayName is how the user runs the binary named arg0: "kubectl vm" for the kubectl plugin
// (kubectl-vm), "vmctl" otherwise.
func DisplayName(arg0 string) string {
	if strings.HasPrefix(filepath.Base(arg0), "kubectl-vm") {
		return "kubectl vm"
	}
	return "vmctl"
}

// NewRootCommand returns the command tree, named as DisplayName(arg0) in usage and hints.
func NewRootCommand(arg0 string, streams IOStreams) *cobra.Command {
	o := newOptions(DisplayName(arg0), streams)
	root := &cobra.Command{
		Use:   "vmctl",
		Short: "Manage Kubevisor virtual machines",
		Long: "Manage Kubevisor virtual machines: start, stop and migrate them, reach their console,\n" +
			"VNC display and ports, and write or convert their manifests.",
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: o.command},
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	o.addFlags(root.PersistentFlags())
	root.AddCommand(
		newConsoleCommand(o), newVNCCommand(o), newPortForwardCommand(o), newSSHCommand(o),
		newGuestOSInfoCommand(o), newCreateCommand(o), newConvertCommand(o), newExposeCommand(o),
		newVersionCommand(o), newMigrateCommand(o), newMigrateCancelCommand(o),
	)
	root.AddCommand(newActionCommands(o)...)
	return root
}

// Execute runs the command line args (without the program name) and returns the error to print.
func Execute(ctx context.Context, arg0 string, args []string, streams IOStreams) error {
	root := NewRootCommand(arg0, streams)
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}
