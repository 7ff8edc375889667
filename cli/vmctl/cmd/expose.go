package cmd

import (
	"fmt"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// exposeFlags are expose's flags.
type exposeFlags struct {
	Port, TargetPort int32
	Type, Name       string
	Protocol         string
}

// buildService is the Service of the VMI vmi (a VM's VMI has its name): it selects the launcher
// pod by the label the pod carries for its VMI.
func buildService(vmi, namespace string, f exposeFlags) (*corev1.Service, error) {
	if f.Port < 1 || f.Port > 65535 {
		return nil, fmt.Errorf("--port %d: a port from 1 to 65535 is required", f.Port)
	}
	target := f.TargetPort
	if target == 0 {
		target = f.Port
	}
	switch corev1.ServiceType(f.Type) {
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
	default:
		return nil, fmt.Errorf("--type %q: ClusterIP, NodePort or LoadBalancer", f.Type)
	}
	name := f.Name
	if name == "" {
		name = vmi
	}
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceType(f.Type),
			Selector: map[string]string{v1alpha1.VirtualMachineInstanceNameLabel: vmi},
			Ports: []corev1.ServicePort{{
				Protocol: corev1.Protocol(f.Protocol), Port: f.Port, TargetPort: intstr.FromInt32(target),
			}},
		},
	}, nil
}

func newExposeCommand(o *options) *cobra.Command {
	var (
		f      exposeFlags
		dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "expose vm|vmi NAME --port PORT",
		Short: "Create a Service that reaches a VM's guest",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := vmiName(args)
			if err != nil {
				return err
			}
			c, err := o.Client()
			if err != nil {
				return err
			}
			svc, err := buildService(name, c.Namespace, f)
			if err != nil {
				return err
			}
			if dryRun {
				out, err := yaml.Marshal(svc)
				if err != nil {
					return err
				}
				_, err = o.streams.Out.Write(out)
				return err
			}
			ctx := cmdContext(cmd)
			resource := subv1.VirtualMachines
			if args[0] == "vmi" {
				resource = subv1.VirtualMachineInstances
				_, err = c.VirtualMachineInstance(ctx, name)
			} else {
				_, err = c.VirtualMachine(ctx, name)
			}
			if err != nil {
				return c.Explain(ctx, err, o.action(c, "get", resource, name))
			}
			if _, err := c.Core.CoreV1().Services(c.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
				return c.Explain(ctx, err, o.action(c, "create services for", resource, name))
			}
			fmt.Fprintf(o.streams.Out, "service/%s created\n", svc.Name)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.Int32Var(&f.Port, "port", 0, "The Service's port")
	fl.Int32Var(&f.TargetPort, "target-port", 0, "The guest's port (the Service's port when 0)")
	fl.StringVar(&f.Type, "type", string(corev1.ServiceTypeClusterIP), "ClusterIP, NodePort or LoadBalancer")
	fl.StringVar(&f.Name, "name", "", "The Service's name (the VM's when empty)")
	fl.StringVar(&f.Protocol, "protocol", string(corev1.ProtocolTCP), "TCP, UDP or SCTP")
	fl.BoolVar(&dryRun, "dry-run", false, "Print the Service instead of creating it")
	return cmd
}
