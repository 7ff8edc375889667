package cmd

import (
	"fmt"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
)

// vmAction is one PUT on a VM's subresource.
type vmAction struct {
	use, short, verb, subresource, done string
	// body builds the request body from the command's flags; nil sends none.
	body func() (runtime.Object, error)
}

func newActionCommands(o *options) []*cobra.Command {
	var (
		grace int64
		force bool
	)
	typeMeta := func(kind string) metav1.TypeMeta {
		return metav1.TypeMeta{APIVersion: subv1.GroupVersion.String(), Kind: kind}
	}
	gracePtr := func(cmd *cobra.Command) *int64 {
		if cmd.Flags().Changed("grace-period") {
			return &grace
		}
		return nil
	}
	var cmds []*cobra.Command
	vmActions := []vmAction{
		{use: "start NAME", short: "Start a VM", verb: "start", subresource: subv1.SubresourceStart, done: "was scheduled to start",
			body: func() (runtime.Object, error) { return &subv1.StartOptions{TypeMeta: typeMeta("StartOptions")}, nil }},
		{use: "stop NAME", short: "Stop a VM (the guest gets its grace period to power off)", verb: "stop",
			subresource: subv1.SubresourceStop, done: "was scheduled to stop"},
		{use: "restart NAME", short: "Restart a VM: stop its VMI and start a new one", verb: "restart",
			subresource: subv1.SubresourceRestart, done: "was scheduled to restart"},
	}
	for _, a := range vmActions {
		a := a
		cmd := &cobra.Command{
			Use: a.use, Short: a.short, Args: cobra.ExactArgs(1),
			ValidArgsFunction: o.completeNames(subv1.VirtualMachines),
		}
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			var body runtime.Object
			switch a.subresource {
			case subv1.SubresourceStart:
				body, _ = a.body()
			case subv1.SubresourceStop:
				if force && gracePtr(cmd) != nil && grace != 0 {
					return fmt.Errorf("--force stops at once: drop --grace-period or set it to 0")
				}
				body = &subv1.StopOptions{TypeMeta: typeMeta("StopOptions"), GracePeriodSeconds: gracePtr(cmd), Force: force}
			case subv1.SubresourceRestart:
				body = &subv1.RestartOptions{TypeMeta: typeMeta("RestartOptions"), GracePeriodSeconds: gracePtr(cmd)}
			}
			return o.put(cmd, subv1.VirtualMachines, args[0], a.verb, a.subresource, body, "VM "+args[0]+" "+a.done)
		}
		switch a.subresource {
		case subv1.SubresourceStop:
			cmd.Flags().Int64Var(&grace, "grace-period", 0, "Seconds the guest gets to power off, instead of the VMI's terminationGracePeriodSeconds")
			cmd.Flags().BoolVar(&force, "force", false, "Stop at once, without asking the guest")
		case subv1.SubresourceRestart:
			cmd.Flags().Int64Var(&grace, "grace-period", 0, "Seconds the running guest gets to power off")
		}
		cmds = append(cmds, cmd)
	}

	// Actions on a VMI: the VMI of a VM has the VM's name.
	vmiActions := []struct{ use, short, verb, subresource, done string }{
		{"pause vm|vmi NAME", "Pause a VMI's guest (its vCPUs stop; memory stays)", "pause", subv1.SubresourcePause, "was paused"},
		{"unpause vm|vmi NAME", "Resume a paused VMI", "unpause", subv1.SubresourceUnpause, "was unpaused"},
		{"soft-reboot NAME", "Reboot a VMI's guest with an ACPI request", "soft-reboot", subv1.SubresourceSoftReboot, "was asked to reboot"},
		{"reset NAME", "Reset a VMI like a machine's reset button", "reset", subv1.SubresourceReset, "was reset"},
	}
	for _, a := range vmiActions {
		a := a
		cmd := &cobra.Command{Use: a.use, Short: a.short, Args: cobra.RangeArgs(1, 2),
			ValidArgsFunction: o.completeNames(subv1.VirtualMachineInstances)}
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			name, err := vmiName(args)
			if err != nil {
				return err
			}
			return o.put(cmd, subv1.VirtualMachineInstances, name, a.verb, a.subresource, nil, "VMI "+name+" "+a.done)
		}
		cmds = append(cmds, cmd)
	}
	return cmds
}

// vmiName reads "NAME", "vm NAME", "vmi NAME", "vm/NAME" or "vmi/NAME" as a VMI's name.
func vmiName(args []string) (string, error) {
	if len(args) == 2 {
		switch args[0] {
		case "vm", "vmi":
			return args[1], nil
		}
		return "", fmt.Errorf("%q: the kind must be vm or vmi", args[0])
	}
	_, name, err := parseTarget(args[0])
	return name, err
}

// put runs one action and prints done.
func (o *options) put(cmd *cobra.Command, resource, name, verb, subresource string, body runtime.Object, done string) error {
	c, err := o.Client()
	if err != nil {
		return err
	}
	ctx := cmdContext(cmd)
	if err := c.Put(ctx, resource, name, subresource, body); err != nil {
		return c.Explain(ctx, err, o.action(c, verb, resource, name))
	}
	fmt.Fprintln(o.streams.Out, done)
	return nil
}
