package cmd

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/controlplane/webhook"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// vmFlags are create vm's flags.
type vmFlags struct {
	Name, Namespace, Memory, ContainerDisk, UserDataFile, RunStrategy, HypervisorClass string
	CPUs                                                                               uint32
}

// buildVM is the VirtualMachine of f, checked by the admission webhook's own validation.
func buildVM(f vmFlags, userData string) (*v1alpha1.VirtualMachine, error) {
	mem, err := resource.ParseQuantity(f.Memory)
	if err != nil {
		return nil, fmt.Errorf("--memory %q: %w", f.Memory, err)
	}
	rs := v1alpha1.VirtualMachineRunStrategy(f.RunStrategy)
	spec := v1alpha1.VirtualMachineInstanceSpec{
		Domain: v1alpha1.DomainSpec{
			Resources: v1alpha1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: mem}},
		},
		HypervisorClassName: f.HypervisorClass,
	}
	if f.CPUs > 0 {
		spec.Domain.CPU = &v1alpha1.CPU{Cores: f.CPUs}
	}
	addDisk := func(name string, src v1alpha1.VolumeSource) {
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, v1alpha1.Disk{Name: name,
			DiskDevice: v1alpha1.DiskDevice{Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}})
		spec.Volumes = append(spec.Volumes, v1alpha1.Volume{Name: name, VolumeSource: src})
	}
	if f.ContainerDisk != "" {
		addDisk("containerdisk", v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: f.ContainerDisk}})
	}
	if userData != "" {
		addDisk("cloudinitdisk", v1alpha1.VolumeSource{CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserData: userData}})
	}
	vm := &v1alpha1.VirtualMachine{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachine"},
		ObjectMeta: metav1.ObjectMeta{Name: f.Name, Namespace: f.Namespace},
		Spec: v1alpha1.VirtualMachineSpec{
			RunStrategy: &rs,
			Template: &v1alpha1.VirtualMachineInstanceTemplateSpec{
				Spec: spec,
			},
		},
	}
	// Validate what the server will see: the webhook defaults first, then validates.
	check := vm.DeepCopy()
	webhook.Default(&check.Spec.Template.Spec, webhook.DefaultOptions{})
	if errs := webhook.ValidateVirtualMachineSpec(&check.Spec, field.NewPath("spec")); len(errs) > 0 {
		return nil, fmt.Errorf("the VM would be rejected: %w", errs.ToAggregate())
	}
	return vm, nil
}

func newCreateCommand(o *options) *cobra.Command {
	create := &cobra.Command{Use: "create", Short: "Write manifests"}
	var f vmFlags
	var output string
	vm := &cobra.Command{
		Use:     "vm NAME",
		Short:   "Write a VirtualMachine manifest to stdout",
		Example: "  vmctl create vm vm1 --containerdisk quay.io/containerdisks/fedora:41 --memory 1Gi | kubectl apply -f -",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f.Name, f.Namespace = args[0], o.explicitNamespace()
			userData := ""
			if f.UserDataFile != "" {
				b, err := os.ReadFile(f.UserDataFile)
				if err != nil {
					return fmt.Errorf("--cloud-init-user-data: %w", err)
				}
				userData = string(b)
			}
			obj, err := buildVM(f, userData)
			if err != nil {
				return err
			}
			var out []byte
			switch output {
			case "yaml":
				out, err = yaml.Marshal(obj)
			case "json":
				out, err = json.MarshalIndent(obj, "", "  ")
				out = append(out, '\n')
			default:
				return fmt.Errorf("-o %q: yaml or json", output)
			}
			if err != nil {
				return fmt.Errorf("encode: %w", err)
			}
			_, err = o.streams.Out.Write(out)
			return err
		},
	}
	fl := vm.Flags()
	fl.StringVar(&f.Memory, "memory", "512Mi", "Guest memory (resources.requests.memory)")
	fl.Uint32Var(&f.CPUs, "cpus", 0, "vCPUs (domain.cpu.cores); 0 leaves it to the defaults")
	fl.StringVar(&f.ContainerDisk, "containerdisk", "", "Container image holding the boot disk")
	fl.StringVar(&f.UserDataFile, "cloud-init-user-data", "", "File of cloud-init user data (a NoCloud disk)")
	fl.StringVar(&f.RunStrategy, "run-strategy", string(v1alpha1.RunStrategyAlways), "Always, RerunOnFailure, Manual, Halted or Once")
	fl.StringVar(&f.HypervisorClass, "hypervisor-class", "", "HypervisorClass name (the default class when empty)")
	fl.StringVarP(&output, "output", "o", "yaml", "yaml or json")
	create.AddCommand(vm)
	return create
}
