package cmd

import (
	"encoding/json"

	"github.com/spf13/cobra"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
)

func newGuestOSInfoCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:               "guestosinfo NAME",
		Short:             "Print what is known of a VMI's guest operating system, as JSON",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: o.completeNames(subv1.VirtualMachineInstances),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.Client()
			if err != nil {
				return err
			}
			_, name, err := parseTarget(args[0])
			if err != nil {
				return err
			}
			ctx := cmdContext(cmd)
			info, err := c.GuestOSInfo(ctx, name)
			if err != nil {
				return c.Explain(ctx, err, o.action(c, "get the guest OS info of", subv1.VirtualMachineInstances, name))
			}
			enc := json.NewEncoder(o.streams.Out)
			enc.SetIndent("", "  ")
			return enc.Encode(info)
		},
	}
}
