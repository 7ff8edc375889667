package webhook

import (
	netutils "k8s.io/utils/net"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/domain"
)

// Defaults the mutating webhook applies.
const (
	// DefaultMachineType is the machine type of a VMI that names none.
	DefaultMachineType = "q35"
	// DefaultNetworkName is the name of the pod network and interface added to a VMI that has
	// neither networks nor interfaces.
	DefaultNetworkName = "default"
)

// DefaultOptions are the cluster-dependent inputs of Default.
type DefaultOptions struct {
	// MachineType replaces DefaultMachineType when set.
	MachineType string
	// HypervisorClassName is the class a spec that names none gets: the HypervisorClass annotated
	// hypervisorclass.kubevisor.io/is-default-class: "true". Empty leaves the spec without a
	// class, and the VMI controller reports why.
	HypervisorClassName string
}

// Default fills in what a VirtualMachineInstance spec leaves out, as KubeVirt's mutating webhook
// does. It is a pure function and idempotent:
//
//   - domain.machine.type: opts.MachineType, else q35;
//   - a disk that is neither disk, cdrom nor lun becomes a disk; a disk's bus defaults to virtio,
//     a cdrom's to sata (QEMU has no virtio cdrom) and a lun's to scsi;
//   - no interfaces and no networks: a pod network and a masquerade interface, both "default",
//     unless autoattachPodInterface is false (the VMI then has no network interface);
//     an interface without a binding gets masquerade on the pod network, bridge on a multus one;
//   - an interface's dhcpOptions.ntpServers written in canonical form, as KubeVirt does when it
//     reads them ("010.0.0.1" is 10.0.0.1, "::ffff:192.0.2.1" is 192.0.2.1);
//   - cpu: a topology field left 0 becomes 1; with no topology at all, sockets is the vCPU count
//     derived from resources (limits.cpu, else requests.cpu, rounded up: DomainSpec.VCPUs), as
//     the node builds it;
//   - hypervisorClassName: opts.HypervisorClassName.
func Default(spec *v1alpha1.VirtualMachineInstanceSpec, opts DefaultOptions) {
	if spec == nil {
		return
	}
	d := &spec.Domain
	machine := opts.MachineType
	if machine == "" {
		machine = DefaultMachineType
	}
	if d.Machine == nil {
		d.Machine = &v1alpha1.Machine{}
	}
	if d.Machine.Type == "" {
		d.Machine.Type = machine
	}

	for i := range d.Devices.Disks {
		disk := &d.Devices.Disks[i]
		if disk.Disk == nil && disk.CDRom == nil && disk.LUN == nil {
			disk.Disk = &v1alpha1.DiskTarget{}
		}
		if disk.Disk != nil && disk.Disk.Bus == "" {
			disk.Disk.Bus = v1alpha1.DiskBusVirtio
		}
		if disk.CDRom != nil && disk.CDRom.Bus == "" {
			disk.CDRom.Bus = v1alpha1.DiskBusSATA
		}
		if disk.LUN != nil && disk.LUN.Bus == "" {
			disk.LUN.Bus = v1alpha1.DiskBusSCSI
		}
	}

	if len(d.Devices.Interfaces) == 0 && len(spec.Networks) == 0 && ptr.Deref(d.Devices.AutoattachPodInterface, true) {
		spec.Networks = []v1alpha1.Network{{
			Name:          DefaultNetworkName,
			NetworkSource: v1alpha1.NetworkSource{Pod: &v1alpha1.PodNetwork{}},
		}}
		d.Devices.Interfaces = []v1alpha1.Interface{{
			Name:                   DefaultNetworkName,
			InterfaceBindingMethod: v1alpha1.InterfaceBindingMethod{Masquerade: &v1alpha1.InterfaceMasquerade{}},
		}}
	}
	for i := range d.Devices.Interfaces {
		iface := &d.Devices.Interfaces[i]
		if o := iface.DHCPOptions; o != nil {
			// As KubeVirt reads them: "010.0.0.1" is 10.0.0.1, "::ffff:192.0.2.1" is 192.0.2.1.
			for j, s := range o.NTPServers {
				if ip := netutils.ParseIPSloppy(s); ip != nil {
					o.NTPServers[j] = ip.String()
				}
			}
		}
		if iface.Bridge != nil || iface.Masquerade != nil {
			continue
		}
		multus := false
		for _, n := range spec.Networks {
			if n.Name == iface.Name && n.Multus != nil && n.Pod == nil {
				multus = true
			}
		}
		if multus {
			iface.Bridge = &v1alpha1.InterfaceBridge{}
		} else {
			iface.Masquerade = &v1alpha1.InterfaceMasquerade{}
		}
	}

	if d.CPU == nil {
		d.CPU = &v1alpha1.CPU{}
	}
	if c := d.CPU; c.Sockets == 0 && c.Cores == 0 && c.Threads == 0 {
		// The count the node derives from resources. A count Validate would reject is left
		// at 1, so that validation, not defaulting, reports the resources.
		if n, _ := d.VCPUs(); n >= 1 && n <= domain.MaxVCPUs {
			c.Sockets = uint32(n)
		}
	}
	d.CPU.Sockets = max(d.CPU.Sockets, 1)
	d.CPU.Cores = max(d.CPU.Cores, 1)
	d.CPU.Threads = max(d.CPU.Threads, 1)

	if spec.HypervisorClassName == "" {
		spec.HypervisorClassName = opts.HypervisorClassName
	}
}
