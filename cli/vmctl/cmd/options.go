package cmd

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubevisor/kubevisor/cli/vmctl/client"
	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
)

// options are the flags every command shares: the kubeconfig and its overrides, as kubectl has them.
type options struct {
	command   string
	streams   IOStreams
	rules     *clientcmd.ClientConfigLoadingRules
	overrides *clientcmd.ConfigOverrides
	flags     *pflag.FlagSet
	client    *client.Client
}

func newOptions(command string, streams IOStreams) *options {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.DefaultClientConfig = &clientcmd.DefaultClientConfig
	return &options{command: command, streams: streams, rules: rules, overrides: &clientcmd.ConfigOverrides{}}
}

// addFlags binds --kubeconfig and clientcmd's recommended overrides (--context, --cluster,
// --user, -n/--namespace, --server, --token, --certificate-authority, --insecure-skip-tls-verify,
// --as, --request-timeout...).
func (o *options) addFlags(fs *pflag.FlagSet) {
	o.flags = fs
	fs.StringVar(&o.rules.ExplicitPath, clientcmd.RecommendedConfigPathFlag, "", "Path to the kubeconfig file to use.")
	clientcmd.BindOverrideFlags(o.overrides, fs, clientcmd.RecommendedConfigOverrideFlags(""))
}

func (o *options) clientConfig() clientcmd.ClientConfig {
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(o.rules, o.overrides)
}

// Client loads the kubeconfig once and returns the client of its current context.
func (o *options) Client() (*client.Client, error) {
	if o.client != nil {
		return o.client, nil
	}
	cc := o.clientConfig()
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, fmt.Errorf("namespace: %w", err)
	}
	c, err := client.New(cfg, ns)
	if err != nil {
		return nil, err
	}
	o.client = c
	return c, nil
}

// explicitNamespace is the namespace given with -n, or "".
func (o *options) explicitNamespace() string { return o.overrides.Context.Namespace }

// action is the client.Action of verb on the named object, for Explain.
func (o *options) action(c *client.Client, verb, resource, name string) client.Action {
	return client.Action{Command: o.command, Verb: verb, Resource: resource, Name: name, Namespace: c.Namespace}
}

// changedGlobalFlags renders the connection flags the user set, so that a child vmctl (ssh's
// ProxyCommand) reaches the same cluster as the same user.
func (o *options) changedGlobalFlags() []string {
	var out []string
	o.flags.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			out = append(out, "--"+f.Name+"="+f.Value.String())
		}
	})
	return out
}

// parseTarget splits vm/NAME, vmi/NAME or NAME into the parent resource and name; a bare name is
// the VM's (its VMI has the same name).
func parseTarget(s string) (resource, name string, err error) {
	kind, name, found := strings.Cut(s, "/")
	if !found {
		return subv1.VirtualMachines, s, nil
	}
	switch strings.ToLower(kind) {
	case "vm", "vms", "virtualmachine", "virtualmachines":
		resource = subv1.VirtualMachines
	case "vmi", "vmis", "virtualmachineinstance", "virtualmachineinstances":
		resource = subv1.VirtualMachineInstances
	default:
		return "", "", fmt.Errorf("%q: the kind must be vm or vmi", s)
	}
	if name == "" {
		return "", "", fmt.Errorf("%q: a name is required after %s/", s, kind)
	}
	return resource, name, nil
}

// completeNames offers the names of resource's objects for shell completion.
func (o *options) completeNames(resource string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		c, err := o.Client()
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		names, err := c.Names(cmdContext(cmd), resource)
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

func cmdContext(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}
