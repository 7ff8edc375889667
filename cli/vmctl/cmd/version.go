package cmd

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// GitVersion is the client's version, set at build time with
// -ldflags "-X github.com/kubevisor/kubevisor/cli/vmctl/cmd.GitVersion=v0.1.0"; without it the
// module's version from the build info is printed.
var GitVersion = ""

func clientVersion() string {
	if GitVersion != "" {
		return GitVersion
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

func newVersionCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the client's and kubevisor-api's versions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintf(o.streams.Out, "client: %s %s %s/%s\n", clientVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
			c, err := o.Client()
			if err == nil {
				v, verr := c.ServerVersion(cmdContext(cmd))
				if verr == nil {
					fmt.Fprintf(o.streams.Out, "server: %s %s %s\n", v.GitVersion, v.GoVersion, v.Platform)
					return nil
				}
				err = verr
			}
			fmt.Fprintf(o.streams.Out, "server: unavailable (%v)\n", err)
			return nil
		},
	}
}
