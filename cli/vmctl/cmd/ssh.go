package cmd

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

// sshCommand is the argument list of the system ssh for user@target, with a ProxyCommand that
// runs self port-forward --stdio (with the connection flags globals) to the guest's port, and
// extra (ssh options, then the remote command) after the destination.
func sshCommand(self string, globals []string, namespace, user, target, name string, port int, extra []string) []string {
	proxy := []string{shellQuote(self)}
	for _, g := range globals {
		proxy = append(proxy, shellQuote(g))
	}
	proxy = append(proxy, "port-forward", "--stdio", shellQuote(target), strconv.Itoa(port))
	host := name + "." + namespace
	args := []string{
		"-o", "ProxyCommand=" + strings.Join(proxy, " "),
		// Known host keys are kept per VM, not per the proxy's address.
		"-o", "HostKeyAlias=vmi." + host,
	}
	if user != "" {
		args = append(args, "-l", user)
	}
	// The destination before the caller's arguments: OpenSSH's ssh reads options after the
	// destination too, and takes the first argument that is not one as the remote command.
	return append(append(args, "vmi."+host), extra...)
}

// shellQuote quotes s for the shell that runs ssh's ProxyCommand.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:@,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func newSSHCommand(o *options) *cobra.Command {
	var (
		port   int
		binary string
	)
	cmd := &cobra.Command{
		Use:   "ssh [USER@]vm/NAME|vmi/NAME|NAME [-- SSH ARGS...]",
		Short: "Run ssh to a VMI's guest through the port-forward stream",
		Long: "Run the system ssh with a ProxyCommand of \"port-forward --stdio\", so that the guest's sshd is\n" +
			"reached through the API server; arguments after -- go to ssh.",
		Example: "  vmctl ssh fedora@vm/vm1\n  vmctl ssh vm/vm1 -- -i ~/.ssh/id_ed25519 uptime",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			user, target, found := strings.Cut(args[0], "@")
			if !found {
				user, target = "", args[0]
			}
			_, name, err := parseTarget(target)
			if err != nil {
				return err
			}
			c, err := o.Client()
			if err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find this program: %w", err)
			}
			globals := o.changedGlobalFlags()
			if o.explicitNamespace() == "" {
				globals = append(globals, "--namespace="+c.Namespace)
			}
			sshArgs := sshCommand(self, globals, c.Namespace, user, target, name, port, args[1:])
			run := exec.CommandContext(cmdContext(cmd), binary, sshArgs...)
			run.Stdin, run.Stdout, run.Stderr = o.streams.In, o.streams.Out, o.streams.ErrOut
			if err := run.Run(); err != nil {
				return fmt.Errorf("%s: %w", binary, err)
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&port, "port", "p", 22, "The guest's ssh port")
	cmd.Flags().StringVar(&binary, "ssh-binary", "ssh", "The ssh client to run")
	return cmd
}
