package webhook

import (
	"encoding/base64"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"
	_ "time/tzdata" // clock.timezone is checked against the tz database, present or not on the host

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/cloudinit"
	"github.com/kubevisor/kubevisor/core/domain"
	"github.com/kubevisor/kubevisor/core/domain/assemble"
)

// Limits on inline cloud-init data, counted in bytes after base64 decoding. They are the
// webhook's own (KubeVirt limits inline data in its admission webhook too): the data travels in
// the object, which etcd caps at about 1.5 MiB, and is copied into every VMI a VM or replica set
// creates. Larger data belongs in a Secret (secretRef / networkDataSecretRef), which has no limit
// here.
const (
	// MaxCloudInitUserDataBytes is the largest inline userData or userDataBase64 (decoded).
	MaxCloudInitUserDataBytes = 2048
	// MaxCloudInitNetworkDataBytes is the largest inline networkData or networkDataBase64 (decoded).
	MaxCloudInitNetworkDataBytes = 2048
)

// The guest networks of the masquerade binding (drivers/network's address plan).
const (
	defaultVMNetworkCIDR     = "10.0.2.0/24"
	defaultVMIPv6NetworkCIDR = "fd10:0:2::/120"
)

// notSupported is the detail of every rejection of a field our types have but the node runtime
// cannot honour; users and tests look for these words.
const notSupported = "not supported"

// Validate checks a VirtualMachineInstance spec found at path (spec, or spec.template.spec of a
// VM or replica set) and returns every rule it breaks, each with its field path:
//
//   - disk, volume, interface and network names unique; volume and network names DNS labels;
//   - every disk names a volume and every volume is used by a disk;
//   - every interface names a network and every network is used by an interface;
//   - an interface's dhcpOptions: values of at most 255 bytes, ntpServers IPv4 addresses,
//     privateOptions with codes 224 to 254, each once;
//   - boot orders positive and distinct across disks and interfaces;
//   - memory given (memory.guest, resources.requests.memory or resources.limits.memory), and for
//     cpu and memory requests ≤ limits, and memory.guest ≤ limits.memory;
//   - memory.hugepages: pageSize 2Mi or 1Gi (x86_64's huge page sizes), and the guest memory a
//     multiple of it;
//   - cpu.isolateEmulatorThread only with cpu.dedicatedCpuPlacement; with dedicatedCpuPlacement,
//     resources.requests.cpu and resources.limits.cpu, when set, equal to the vCPU count
//     (whole CPUs), and resources.requests.memory equal to resources.limits.memory when both
//     are set (the launcher pod must be Guaranteed); cpu.numa.guestMappingPassthrough only with
//     dedicatedCpuPlacement and memory.hugepages;
//   - inline cloud-init data within MaxCloudInitUserDataBytes / MaxCloudInitNetworkDataBytes;
//   - livenessProbe and readinessProbe: one of httpGet and tcpSocket, on a numeric port the
//     kubelet reaches the guest at through the pod network (probes);
//   - dnsPolicy and dnsConfig as Kubernetes checks them for a pod;
//   - each access credential names a Secret and one propagation method whose cloud-init volume
//     exists, with user data SSH keys can be added to (cloud-config) when it is inline;
//   - fields the node runtime does not support rejected with "not supported".
//
// When those structural rules hold, the spec is also run through core/domain/assemble with stand-in
// driver results (as the node handler does before it calls a driver), so that what the webhook
// admits is what the handler can build; its errors come back with their field paths.
//
// Unknown JSON fields never reach Validate: the API server's structural schema prunes them, and
// with field validation Strict (kubectl's default) rejects the request with `unknown field
// "spec.x"` before any webhook is called.
func Validate(spec *v1alpha1.VirtualMachineInstanceSpec, path *field.Path) field.ErrorList {
	if spec == nil {
		return field.ErrorList{field.Required(path, "")}
	}
	v := &validator{spec: spec, path: path}
	v.domain()
	v.volumes()
	v.disks()
	v.networks()
	v.interfaces()
	v.hostDevices()
	v.scheduling()
	v.probes()
	v.dns()
	v.accessCredentials()
	if len(v.errs) == 0 {
		v.build()
	}
	return v.errs
}

type validator struct {
	spec *v1alpha1.VirtualMachineInstanceSpec
	path *field.Path
	errs field.ErrorList
	// boot maps a boot order to the path of the device that took it.
	boot map[uint]*field.Path
}

func (v *validator) add(err *field.Error) { v.errs = append(v.errs, err) }

// hostDevices checks gpus[] and hostDevices[]: names unique among both, and each deviceName an
// extended resource a device plugin can offer (v1alpha1.CheckDeviceName).
func (v *validator) hostDevices() {
	dp := v.domainPath().Child("devices")
	seen := map[string]bool{}
	check := func(p *field.Path, name, deviceName string) {
		if seen[name] {
			v.add(field.Duplicate(p.Child("name"), name))
		}
		seen[name] = true
		if err := v1alpha1.CheckDeviceName(deviceName); err != nil {
			v.add(field.Invalid(p.Child("deviceName"), deviceName, err.Error()))
		}
	}
	for i, g := range v.spec.Domain.Devices.GPUs {
		check(dp.Child("gpus").Index(i), g.Name, g.DeviceName)
	}
	for i, h := range v.spec.Domain.Devices.HostDevices {
		check(dp.Child("hostDevices").Index(i), h.Name, h.DeviceName)
	}
}

func (v *validator) domainPath() *field.Path { return v.path.Child("domain") }

func (v *validator) domain() {
	d := &v.spec.Domain
	dp := v.domainPath()

	// Resources: only cpu and memory, non-negative, requests ≤ limits.
	rp := dp.Child("resources")
	for _, list := range []struct {
		name string
		rl   corev1.ResourceList
	}{{"requests", d.Resources.Requests}, {"limits", d.Resources.Limits}} {
		// In name order, so that a response lists its errors the same way every time.
		for _, name := range slices.Sorted(maps.Keys(list.rl)) {
			q, p := list.rl[name], rp.Child(list.name).Key(string(name))
			switch name {
			case corev1.ResourceCPU, corev1.ResourceMemory:
				if q.Sign() < 0 {
					v.add(field.Invalid(p, q.String(), "must not be negative"))
				}
			default:
				v.add(field.Invalid(p, q.String(), "resources other than cpu and memory are "+notSupported))
			}
		}
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, hasReq := d.Resources.Requests[name]
		lim, hasLim := d.Resources.Limits[name]
		if hasReq && hasLim && req.Cmp(lim) > 0 {
			v.add(field.Invalid(rp.Child("requests").Key(string(name)), req.String(),
				fmt.Sprintf("must be less than or equal to the %s limit %s", name, lim.String())))
		}
	}

	// The vCPUs derived from cpu resources when the spec gives no topology.
	for _, list := range []string{"limits", "requests"} {
		rl := d.Resources.Limits
		if list == "requests" {
			rl = d.Resources.Requests
		}
		if q, ok := rl[corev1.ResourceCPU]; ok && q.Cmp(*resource.NewQuantity(domain.MaxVCPUs, resource.DecimalSI)) > 0 {
			v.add(field.Invalid(rp.Child(list).Key(string(corev1.ResourceCPU)), q.String(),
				fmt.Sprintf("more than the maximum of %d vCPUs", domain.MaxVCPUs)))
		}
	}

	// Memory: the guest needs some.
	var guest *resource.Quantity
	if d.Memory != nil {
		guest = d.Memory.Guest
	}
	reqMem, hasReqMem := d.Resources.Requests[corev1.ResourceMemory]
	limMem, hasLimMem := d.Resources.Limits[corev1.ResourceMemory]
	switch {
	case guest != nil:
		if guest.Sign() <= 0 {
			v.add(field.Invalid(dp.Child("memory", "guest"), guest.String(), "must be greater than 0"))
		} else if hasLimMem && guest.Cmp(limMem) > 0 {
			v.add(field.Invalid(dp.Child("memory", "guest"), guest.String(),
				fmt.Sprintf("must be less than or equal to the memory limit %s", limMem.String())))
		}
	case hasReqMem && reqMem.Sign() > 0, hasLimMem && limMem.Sign() > 0:
	default:
		v.add(field.Required(rp.Child("requests").Key(string(corev1.ResourceMemory)),
			"the guest needs memory: set resources.requests.memory, resources.limits.memory or memory.guest"))
	}

	// Huge pages: a size x86_64 has, and whole pages of guest memory.
	if h := d.MemoryHugepages(); h != nil {
		hp := dp.Child("memory", "hugepages", "pageSize")
		size := h.PageSizeBytes()
		gp, g := dp.Child("memory", "guest"), guest
		if g == nil {
			gp, g = rp.Child("requests").Key(string(corev1.ResourceMemory)), &reqMem
			if !hasReqMem {
				gp, g = rp.Child("limits").Key(string(corev1.ResourceMemory)), &limMem
			}
		}
		switch {
		case h.PageSize == "":
			v.add(field.Required(hp, "the huge page size: "+strings.Join(v1alpha1.HugepageSizes, " or ")))
		case size == 0:
			v.add(field.NotSupported(hp, h.PageSize, v1alpha1.HugepageSizes))
		case g.Sign() > 0 && g.Value()%size != 0:
			v.add(field.Invalid(gp, g.String(), fmt.Sprintf("must be a multiple of the huge page size %s (memory.hugepages.pageSize)", h.PageSize)))
		}
	}

	// CPU topology: no more vCPUs than any domain may have.
	if n, from := d.VCPUs(); from == v1alpha1.VCPUsFromTopology && n > domain.MaxVCPUs {
		v.add(field.Invalid(dp.Child("cpu"), n, fmt.Sprintf("%d vCPUs (sockets*cores*threads) exceed the maximum of %d", n, domain.MaxVCPUs)))
	}

	// Dedicated CPUs: the launcher pod must be Guaranteed with a whole CPU per vCPU.
	v.dedicatedCPUs()

	// Clock: a zone of the tz database (this binary carries it: time/tzdata).
	if c := d.Clock; c != nil && c.Timezone != nil && *c.Timezone != "" {
		if _, err := time.LoadLocation(string(*c.Timezone)); err != nil {
			v.add(field.Invalid(dp.Child("clock", "timezone"), string(*c.Timezone), "not a time zone of the tz database (such as Europe/Paris)"))
		}
	}

	// Firmware.
	if f := d.Firmware; f != nil {
		fp := dp.Child("firmware")
		if bl := f.Bootloader; bl != nil && bl.BIOS != nil && bl.EFI != nil {
			v.add(field.Invalid(fp.Child("bootloader"), "bios+efi", "bios and efi are mutually exclusive"))
		}
		if kb := f.KernelBoot; kb != nil {
			kp := fp.Child("kernelBoot")
			if f.Bootloader != nil && f.Bootloader.EFI != nil {
				v.add(field.Invalid(kp, "kernelBoot", "kernel boot together with bootloader.efi is "+notSupported))
			}
			switch c := kb.Container; {
			case c == nil:
				v.add(field.Required(kp.Child("container"), "the kernel boot container is required"))
			default:
				if c.Image == "" {
					v.add(field.Required(kp.Child("container", "image"), ""))
				}
				if c.KernelPath == "" {
					v.add(field.Required(kp.Child("container", "kernelPath"), ""))
				}
			}
		}
	}
}

func (v *validator) volumes() {
	vp := v.path.Child("volumes")
	seen := map[string]bool{}
	for i := range v.spec.Volumes {
		vol := &v.spec.Volumes[i]
		p := vp.Index(i)
		v.name(p.Child("name"), vol.Name, seen)
		v.volumeSource(p, vol)
	}
	used := map[string]bool{}
	for _, d := range v.spec.Domain.Devices.Disks {
		used[d.Name] = true
	}
	for i, vol := range v.spec.Volumes {
		if vol.Name != "" && !used[vol.Name] {
			v.add(field.Invalid(vp.Index(i).Child("name"), vol.Name, "volume is not used by any disk in domain.devices.disks"))
		}
	}
}

// name checks a volume or network name: required, a DNS label, unique.
func (v *validator) name(p *field.Path, name string, seen map[string]bool) {
	switch {
	case name == "":
		v.add(field.Required(p, ""))
		return
	case seen[name]:
		v.add(field.Duplicate(p, name))
	}
	seen[name] = true
	for _, msg := range validation.IsDNS1123Label(name) {
		v.add(field.Invalid(p, name, msg))
	}
}

func (v *validator) volumeSource(p *field.Path, vol *v1alpha1.Volume) {
	s := &vol.VolumeSource
	n := 0
	if hd := s.HostDisk; hd != nil {
		n++
		hp := p.Child("hostDisk")
		if hd.Path == "" {
			v.add(field.Required(hp.Child("path"), ""))
		} else if !filepath.IsAbs(hd.Path) {
			v.add(field.Invalid(hp.Child("path"), hd.Path, "must be an absolute path"))
		}
		switch hd.Type {
		case v1alpha1.HostDiskExists:
		case v1alpha1.HostDiskExistsOrCreate:
			if hd.Capacity.Sign() <= 0 {
				v.add(field.Required(hp.Child("capacity"), "a positive capacity is required when type is DiskOrCreate"))
			}
		default:
			v.add(field.NotSupported(hp.Child("type"), hd.Type, []v1alpha1.HostDiskType{v1alpha1.HostDiskExists, v1alpha1.HostDiskExistsOrCreate}))
		}
	}
	if pvc := s.PersistentVolumeClaim; pvc != nil {
		n++
		pp := p.Child("persistentVolumeClaim")
		if pvc.ClaimName == "" {
			v.add(field.Required(pp.Child("claimName"), ""))
		}
		if pvc.Hotpluggable {
			v.add(field.Invalid(pp.Child("hotpluggable"), true, "hot-plugging volumes is "+notSupported))
		}
	}
	if ci := s.CloudInitNoCloud; ci != nil {
		n++
		v.cloudInit(p.Child("cloudInitNoCloud"), ci.UserData, ci.UserDataBase64, ci.UserDataSecretRef,
			ci.NetworkData, ci.NetworkDataBase64, ci.NetworkDataSecretRef)
	}
	if ci := s.CloudInitConfigDrive; ci != nil {
		n++
		v.cloudInit(p.Child("cloudInitConfigDrive"), ci.UserData, ci.UserDataBase64, ci.UserDataSecretRef,
			ci.NetworkData, ci.NetworkDataBase64, ci.NetworkDataSecretRef)
	}
	if cd := s.ContainerDisk; cd != nil {
		n++
		if cd.Image == "" {
			v.add(field.Required(p.Child("containerDisk", "image"), ""))
		}
	}
	if e := s.Ephemeral; e != nil {
		n++
		ep := p.Child("ephemeral", "persistentVolumeClaim")
		if e.PersistentVolumeClaim == nil {
			v.add(field.Required(ep, ""))
		} else if e.PersistentVolumeClaim.ClaimName == "" {
			v.add(field.Required(ep.Child("claimName"), ""))
		}
	}
	if e := s.EmptyDisk; e != nil {
		n++
		if e.Capacity.Sign() <= 0 {
			v.add(field.Invalid(p.Child("emptyDisk", "capacity"), e.Capacity.String(), "must be greater than 0"))
		}
	}
	if n != 1 {
		v.add(field.Invalid(p, vol.Name, fmt.Sprintf("exactly one volume source must be set, not %d "+
			"(containerDisk, cloudInitNoCloud, cloudInitConfigDrive, emptyDisk, hostDisk, persistentVolumeClaim, ephemeral)", n)))
	}
}

func (v *validator) cloudInit(p *field.Path, userData, userDataB64 string, userSecret *corev1.LocalObjectReference,
	netData, netDataB64 string, netSecret *corev1.LocalObjectReference) {
	one := func(what string, limit int, inline, b64 string, secret *corev1.LocalObjectReference, inlineField, b64Field, secretField string) bool {
		set := 0
		for _, ok := range []bool{inline != "", b64 != "", secret != nil} {
			if ok {
				set++
			}
		}
		if set > 1 {
			v.add(field.Invalid(p, what, fmt.Sprintf("only one of %s, %s and %s may be set", inlineField, b64Field, secretField)))
		}
		if secret != nil && secret.Name == "" {
			v.add(field.Required(p.Child(secretField, "name"), ""))
		}
		size, sizeField := len(inline), inlineField
		if b64 != "" {
			decoded, err := base64.StdEncoding.DecodeString(b64)
			if err != nil {
				v.add(field.Invalid(p.Child(b64Field), "<base64>", "not valid base64: "+err.Error()))
			}
			size, sizeField = len(decoded), b64Field
		}
		if size > limit {
			v.add(field.TooLong(p.Child(sizeField), "", limit))
		}
		return set > 0
	}
	hasUser := one("userData", MaxCloudInitUserDataBytes, userData, userDataB64, userSecret, "userData", "userDataBase64", "secretRef")
	hasNet := one("networkData", MaxCloudInitNetworkDataBytes, netData, netDataB64, netSecret, "networkData", "networkDataBase64", "networkDataSecretRef")
	if !hasUser && !hasNet {
		v.add(field.Required(p, "user data or network data is required"))
	}
}

func (v *validator) disks() {
	dp := v.domainPath().Child("devices", "disks")
	volumes := map[string]*v1alpha1.Volume{}
	for i := range v.spec.Volumes {
		volumes[v.spec.Volumes[i].Name] = &v.spec.Volumes[i]
	}
	seen := map[string]bool{}
	for i := range v.spec.Domain.Devices.Disks {
		d := &v.spec.Domain.Devices.Disks[i]
		p := dp.Index(i)
		switch {
		case d.Name == "":
			v.add(field.Required(p.Child("name"), ""))
		case seen[d.Name]:
			v.add(field.Duplicate(p.Child("name"), d.Name))
		case volumes[d.Name] == nil:
			v.add(field.NotFound(p.Child("name"), d.Name))
		}
		seen[d.Name] = true
		v.bootOrder(p, d.BootOrder)
		switch d.Cache {
		case "", v1alpha1.CacheNone, v1alpha1.CacheWriteThrough, v1alpha1.CacheWriteBack:
		default:
			v.add(field.NotSupported(p.Child("cache"), d.Cache, []v1alpha1.DriverCache{v1alpha1.CacheNone, v1alpha1.CacheWriteThrough, v1alpha1.CacheWriteBack}))
		}
		if n := btoi(d.Disk != nil) + btoi(d.CDRom != nil) + btoi(d.LUN != nil); n > 1 {
			v.add(field.Invalid(p, d.Name, "disk, cdrom and lun are mutually exclusive"))
		}
		if d.LUN != nil {
			v.lun(p.Child("lun"), d.LUN, volumes[d.Name])
		}
		buses := []v1alpha1.DiskBus{v1alpha1.DiskBusVirtio, v1alpha1.DiskBusSATA, v1alpha1.DiskBusSCSI, v1alpha1.DiskBusUSB}
		if t := d.Disk; t != nil && t.Bus != "" && !slices.Contains(buses, t.Bus) {
			v.add(field.NotSupported(p.Child("disk", "bus"), t.Bus, buses))
		}
		if c := d.CDRom; c != nil {
			cp := p.Child("cdrom")
			switch c.Bus {
			case "", v1alpha1.DiskBusSATA, v1alpha1.DiskBusSCSI:
			case v1alpha1.DiskBusVirtio, v1alpha1.DiskBusUSB:
				// KubeVirt refuses these too; QEMU has no virtio cdrom and the qmp driver no usb one.
				v.add(field.Invalid(cp.Child("bus"), c.Bus, "a cdrom on bus "+string(c.Bus)+" is "+notSupported+" (use sata or scsi)"))
			default:
				v.add(field.NotSupported(cp.Child("bus"), c.Bus, []v1alpha1.DiskBus{v1alpha1.DiskBusSATA, v1alpha1.DiskBusSCSI}))
			}
			switch c.Tray {
			case "", v1alpha1.TrayStateClosed:
			case v1alpha1.TrayStateOpen:
				v.add(field.Invalid(cp.Child("tray"), c.Tray, "an open tray is "+notSupported))
			default:
				v.add(field.NotSupported(cp.Child("tray"), c.Tray, []v1alpha1.TrayState{v1alpha1.TrayStateClosed}))
			}
		}
	}
}

// lun checks a disk's lun: bus scsi and a volume that can be a SCSI device on
// the node. Only a hostDisk of type Disk (whose path is a device) can be today; every other
// volume is a file the node makes, and a persistentVolumeClaim too: the launcher pod mounts
// every claim as a file system (a Block-mode claim as a volumeDevice is not implemented), so a
// lun on one could never start and is refused here rather than at the node. Whether the device
// takes SCSI commands (SG_IO) is known only on the node: the hypervisor driver checks it before
// it starts the VM.
func (v *validator) lun(p *field.Path, l *v1alpha1.LunTarget, vol *v1alpha1.Volume) {
	switch l.Bus {
	case "", v1alpha1.DiskBusSCSI:
	case v1alpha1.DiskBusVirtio, v1alpha1.DiskBusSATA, v1alpha1.DiskBusUSB:
		v.add(field.Invalid(p.Child("bus"), l.Bus, "a lun on bus "+string(l.Bus)+" is "+notSupported+": SCSI passthrough needs a SCSI bus (use scsi)"))
	default:
		v.add(field.NotSupported(p.Child("bus"), l.Bus, []v1alpha1.DiskBus{v1alpha1.DiskBusSCSI}))
	}
	if vol == nil {
		return
	}
	s := &vol.VolumeSource
	switch {
	case s.PersistentVolumeClaim != nil:
		v.add(field.Invalid(p, vol.Name, "a lun on a persistentVolumeClaim is "+notSupported+": the launcher pod mounts claims as file systems, not as block devices (use a hostDisk of type Disk with the device's path)"))
	case s.HostDisk != nil && s.HostDisk.Type == v1alpha1.HostDiskExists:
	case s.HostDisk != nil:
		v.add(field.Invalid(p, vol.Name, "a lun needs a SCSI block device: a hostDisk of type "+string(s.HostDisk.Type)+" is a file (use type Disk with the device's path)"))
	default:
		v.add(field.Invalid(p, vol.Name, "a lun needs a SCSI block device: only a hostDisk of type Disk can be one, and volume "+vol.Name+" is a file the node makes"))
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (v *validator) bootOrder(p *field.Path, order *uint) {
	if order == nil {
		return
	}
	bp := p.Child("bootOrder")
	if *order == 0 {
		v.add(field.Invalid(bp, *order, "must be greater than 0"))
		return
	}
	if v.boot == nil {
		v.boot = map[uint]*field.Path{}
	}
	if other, ok := v.boot[*order]; ok {
		v.add(field.Invalid(bp, *order, "boot order is already used by "+other.String()))
		return
	}
	v.boot[*order] = p
}

func (v *validator) networks() {
	np := v.path.Child("networks")
	seen := map[string]bool{}
	used := map[string]bool{}
	for _, iface := range v.spec.Domain.Devices.Interfaces {
		used[iface.Name] = true
	}
	for i := range v.spec.Networks {
		n := &v.spec.Networks[i]
		p := np.Index(i)
		v.name(p.Child("name"), n.Name, seen)
		switch {
		case n.Pod != nil && n.Multus != nil:
			v.add(field.Invalid(p, n.Name, "pod and multus are mutually exclusive"))
		case n.Pod == nil && n.Multus == nil:
			v.add(field.Required(p.Child("pod"), "a network source (pod or multus) is required"))
		}
		if pod := n.Pod; pod != nil {
			// The network driver's masquerade binding has a fixed address plan (KubeVirt's
			// defaults) and the handler passes no CIDR to it: only those values are honoured.
			if c := pod.VMNetworkCIDR; c != "" && c != defaultVMNetworkCIDR {
				v.add(field.Invalid(p.Child("pod", "vmNetworkCIDR"), c, "a guest network other than "+defaultVMNetworkCIDR+" is "+notSupported))
			}
			if c := pod.VMIPv6NetworkCIDR; c != "" && c != defaultVMIPv6NetworkCIDR {
				v.add(field.Invalid(p.Child("pod", "vmIPv6NetworkCIDR"), c, "a guest network other than "+defaultVMIPv6NetworkCIDR+" is "+notSupported))
			}
		}
		if m := n.Multus; m != nil {
			if m.NetworkName == "" {
				v.add(field.Required(p.Child("multus", "networkName"), ""))
			}
			if m.Default {
				v.add(field.Invalid(p.Child("multus", "default"), true, "replacing the pod's default network is "+notSupported))
			}
		}
		if n.Name != "" && !used[n.Name] {
			v.add(field.Invalid(p.Child("name"), n.Name, "network is not used by any interface in domain.devices.interfaces"))
		}
	}
	var pods []string
	for _, n := range v.spec.Networks {
		if n.Pod != nil {
			pods = append(pods, n.Name)
		}
	}
	if len(pods) > 1 {
		v.add(field.Invalid(np, strings.Join(pods, ","), "more than one pod network is "+notSupported))
	}
}

func (v *validator) interfaces() {
	ip := v.domainPath().Child("devices", "interfaces")
	networks := map[string]*v1alpha1.Network{}
	for i := range v.spec.Networks {
		networks[v.spec.Networks[i].Name] = &v.spec.Networks[i]
	}
	seen := map[string]bool{}
	macs := map[string]*field.Path{}
	for i := range v.spec.Domain.Devices.Interfaces {
		iface := &v.spec.Domain.Devices.Interfaces[i]
		p := ip.Index(i)
		network := networks[iface.Name]
		switch {
		case iface.Name == "":
			v.add(field.Required(p.Child("name"), ""))
		case seen[iface.Name]:
			v.add(field.Duplicate(p.Child("name"), iface.Name))
		case network == nil:
			v.add(field.NotFound(p.Child("name"), iface.Name))
		}
		seen[iface.Name] = true
		switch {
		case iface.Bridge != nil && iface.Masquerade != nil:
			v.add(field.Invalid(p, iface.Name, "bridge and masquerade are mutually exclusive"))
		case iface.Bridge == nil && iface.Masquerade == nil:
			v.add(field.Required(p.Child("masquerade"), "a binding (masquerade or bridge) is required; other bindings are "+notSupported))
		case iface.Masquerade != nil && network != nil && network.Multus != nil:
			v.add(field.Invalid(p.Child("masquerade"), iface.Name, "masquerade on a multus network is "+notSupported+" (only on the pod network)"))
		}
		if len(iface.Ports) > 0 && iface.Masquerade == nil {
			v.add(field.Invalid(p.Child("ports"), len(iface.Ports), "port forwarding is "+notSupported+" without the masquerade binding"))
		}
		portNames := map[string]bool{}
		for j, port := range iface.Ports {
			pp := p.Child("ports").Index(j)
			if port.Port < 1 || port.Port > 65535 {
				v.add(field.Invalid(pp.Child("port"), port.Port, "must be between 1 and 65535"))
			}
			switch port.Protocol {
			case "", "TCP", "UDP":
			default:
				v.add(field.NotSupported(pp.Child("protocol"), port.Protocol, []string{"TCP", "UDP"}))
			}
			if port.Name != "" {
				if portNames[port.Name] {
					v.add(field.Duplicate(pp.Child("name"), port.Name))
				}
				portNames[port.Name] = true
				for _, msg := range validation.IsValidPortName(port.Name) {
					v.add(field.Invalid(pp.Child("name"), port.Name, msg))
				}
			}
		}
		if mac := iface.MacAddress; mac != "" {
			mp := p.Child("macAddress")
			hw, err := net.ParseMAC(mac)
			switch {
			case err != nil || len(hw) != 6:
				v.add(field.Invalid(mp, mac, "must be a MAC-48 address such as de:ad:00:00:be:af"))
			case hw[0]&1 == 1:
				v.add(field.Invalid(mp, mac, "must be a unicast address"))
			case macs[hw.String()] != nil:
				v.add(field.Invalid(mp, mac, "is already used by "+macs[hw.String()].String()))
			default:
				macs[hw.String()] = p
			}
		}
		v.bootOrder(p, iface.BootOrder)
		v.dhcpOptions(p.Child("dhcpOptions"), iface.DHCPOptions)
	}
}

// dhcpOptions checks an interface's DHCP options: values that fit in one option, NTP servers
// that are IPv4 addresses, private options with site-specific codes, each once.
func (v *validator) dhcpOptions(p *field.Path, o *v1alpha1.DHCPOptions) {
	if o == nil {
		return
	}
	long := func(p *field.Path, s string) {
		if len(s) > v1alpha1.DHCPOptionMaxBytes {
			v.add(field.TooLong(p, "", v1alpha1.DHCPOptionMaxBytes))
		}
	}
	long(p.Child("bootFileName"), o.BootFileName)
	long(p.Child("tftpServerName"), o.TFTPServerName)
	for i, s := range o.NTPServers {
		if a, err := netip.ParseAddr(s); err != nil || !a.Is4() {
			v.add(field.Invalid(p.Child("ntpServers").Index(i), s, "must be an IPv4 address such as 192.0.2.1"))
		}
	}
	if n := len(o.NTPServers); n*4 > v1alpha1.DHCPOptionMaxBytes {
		v.add(field.TooMany(p.Child("ntpServers"), n, v1alpha1.DHCPOptionMaxBytes/4))
	}
	seen := map[int]bool{}
	for i, po := range o.PrivateOptions {
		pp := p.Child("privateOptions").Index(i)
		switch {
		case po.Option < v1alpha1.DHCPPrivateOptionMin || po.Option > v1alpha1.DHCPPrivateOptionMax:
			v.add(field.Invalid(pp.Child("option"), po.Option, fmt.Sprintf("must be between %d and %d, the site-specific DHCP options", v1alpha1.DHCPPrivateOptionMin, v1alpha1.DHCPPrivateOptionMax)))
		case seen[po.Option]:
			v.add(field.Duplicate(pp.Child("option"), po.Option))
		}
		seen[po.Option] = true
		long(pp.Child("value"), po.Value)
	}
}

func (v *validator) scheduling() {
	if g := v.spec.TerminationGracePeriodSeconds; g != nil && *g < 0 {
		v.add(field.Invalid(v.path.Child("terminationGracePeriodSeconds"), *g, "must not be negative"))
	}
	if es := v.spec.EvictionStrategy; es != nil {
		all := []v1alpha1.EvictionStrategy{v1alpha1.EvictionStrategyNone, v1alpha1.EvictionStrategyLiveMigrate,
			v1alpha1.EvictionStrategyLiveMigrateIfPossible, v1alpha1.EvictionStrategyExternal}
		if !slices.Contains(all, *es) {
			v.add(field.NotSupported(v.path.Child("evictionStrategy"), *es, all))
		}
	}
	if a := v.spec.Architecture; a != "" && a != "amd64" {
		v.add(field.NotSupported(v.path.Child("architecture"), a, []string{"amd64"}))
	}
	if ss := v.spec.StartStrategy; ss != nil && *ss != v1alpha1.StartStrategyPaused {
		v.add(field.NotSupported(v.path.Child("startStrategy"), *ss, []v1alpha1.StartStrategy{v1alpha1.StartStrategyPaused}))
	}
	if h := v.spec.Hostname; h != "" {
		for _, msg := range validation.IsDNS1123Label(h) {
			v.add(field.Invalid(v.path.Child("hostname"), h, msg))
		}
	}
	if s := v.spec.Subdomain; s != "" {
		for _, msg := range validation.IsDNS1123Label(s) {
			v.add(field.Invalid(v.path.Child("subdomain"), s, msg))
		}
	}
	if c := v.spec.HypervisorClassName; c != "" {
		for _, msg := range validation.IsDNS1123Subdomain(c) {
			v.add(field.Invalid(v.path.Child("hypervisorClassName"), c, msg))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(v.spec.NodeSelector)) {
		val, p := v.spec.NodeSelector[k], v.path.Child("nodeSelector").Key(k)
		for _, msg := range validation.IsQualifiedName(k) {
			v.add(field.Invalid(p, k, msg))
		}
		for _, msg := range validation.IsValidLabelValue(val) {
			v.add(field.Invalid(p, val, msg))
		}
	}
}

// The limits Kubernetes puts on a pod's dnsConfig (k8s.io/kubernetes/pkg/apis/core/validation).
const (
	maxDNSNameservers     = 3
	maxDNSSearchPaths     = 32
	maxDNSSearchListChars = 2048
)

// dns checks dnsPolicy and dnsConfig as the API server checks them for a pod, which they are
// copied to: a known policy, None only with a nameserver, at most 3 IP nameservers, at most 32
// search domains of at most 2048 characters together, options with names.
func (v *validator) dns() {
	policies := []corev1.DNSPolicy{corev1.DNSClusterFirstWithHostNet, corev1.DNSClusterFirst, corev1.DNSDefault, corev1.DNSNone}
	if p := v.spec.DNSPolicy; p != "" && !slices.Contains(policies, p) {
		v.add(field.NotSupported(v.path.Child("dnsPolicy"), p, policies))
	}
	cp := v.path.Child("dnsConfig")
	c := v.spec.DNSConfig
	if v.spec.DNSPolicy == corev1.DNSNone && (c == nil || len(c.Nameservers) == 0) {
		v.add(field.Required(cp.Child("nameservers"), "at least one nameserver is required when dnsPolicy is None"))
	}
	if c == nil {
		return
	}
	np := cp.Child("nameservers")
	if len(c.Nameservers) > maxDNSNameservers {
		v.add(field.Invalid(np, c.Nameservers, fmt.Sprintf("must not have more than %d nameservers", maxDNSNameservers)))
	}
	for i, ns := range c.Nameservers {
		v.errs = append(v.errs, validation.IsValidIP(np.Index(i), ns)...)
	}
	sp := cp.Child("searches")
	if len(c.Searches) > maxDNSSearchPaths {
		v.add(field.Invalid(sp, c.Searches, fmt.Sprintf("must not have more than %d search paths", maxDNSSearchPaths)))
	}
	if n := len(strings.Join(c.Searches, " ")); n > maxDNSSearchListChars {
		v.add(field.Invalid(sp, c.Searches, fmt.Sprintf("must not have more than %d characters (including spaces) in the search list", maxDNSSearchListChars)))
	}
	for i, s := range c.Searches {
		if s == "." {
			continue // the root domain, as Kubernetes allows
		}
		for _, msg := range validation.IsDNS1123Subdomain(strings.TrimSuffix(s, ".")) {
			v.add(field.Invalid(sp.Index(i), s, msg))
		}
	}
	for i, o := range c.Options {
		if o.Name == "" {
			v.add(field.Required(cp.Child("options").Index(i).Child("name"), ""))
		}
	}
}

// accessCredentials checks each credential: a Secret name, exactly one propagation method, and
// a cloud-init volume of that kind whose user data, when inline, is cloud-config or empty (a
// script cannot take keys: refused here rather than found on the node). User data in a Secret
// is checked by the node handler, which reads it.
func (v *validator) accessCredentials() {
	var noCloud, configDrive *field.Path
	var noCloudData, configDriveData []byte
	for i, vol := range v.spec.Volumes {
		p := v.path.Child("volumes").Index(i)
		if ci := vol.CloudInitNoCloud; ci != nil && noCloud == nil {
			noCloud = p.Child("cloudInitNoCloud")
			noCloudData = inlineUserData(ci.UserData, ci.UserDataBase64)
		}
		if ci := vol.CloudInitConfigDrive; ci != nil && configDrive == nil {
			configDrive = p.Child("cloudInitConfigDrive")
			configDriveData = inlineUserData(ci.UserData, ci.UserDataBase64)
		}
	}
	checked := map[*field.Path]bool{}
	for i, ac := range v.spec.AccessCredentials {
		p := v.path.Child("accessCredentials").Index(i)
		ssh := ac.SSHPublicKey
		if ssh == nil {
			v.add(field.Required(p.Child("sshPublicKey"), "the only access credential Kubevisor supports"))
			continue
		}
		p = p.Child("sshPublicKey")
		if s := ssh.Source.Secret; s == nil {
			v.add(field.Required(p.Child("source", "secret"), ""))
		} else {
			for _, msg := range validation.IsDNS1123Subdomain(s.SecretName) {
				v.add(field.Invalid(p.Child("source", "secret", "secretName"), s.SecretName, msg))
			}
		}
		pm, pp := ssh.PropagationMethod, p.Child("propagationMethod")
		var vol *field.Path
		var data []byte
		var kind string
		switch {
		case pm.NoCloud != nil && pm.ConfigDrive != nil:
			v.add(field.Invalid(pp, "noCloud, configDrive", "only one of noCloud and configDrive may be set"))
			continue
		case pm.NoCloud != nil:
			vol, data, kind, pp = noCloud, noCloudData, "cloudInitNoCloud", pp.Child("noCloud")
		case pm.ConfigDrive != nil:
			vol, data, kind, pp = configDrive, configDriveData, "cloudInitConfigDrive", pp.Child("configDrive")
		default:
			v.add(field.Required(pp, "one of noCloud and configDrive (the keys go into that cloud-init volume's user data)"))
			continue
		}
		if vol == nil {
			v.add(field.Invalid(pp, "{}", "needs a "+kind+" volume, whose user data the keys are added to"))
			continue
		}
		if checked[vol] {
			continue
		}
		checked[vol] = true
		if err := cloudinit.CanAddKeys(data); err != nil {
			v.add(field.Invalid(vol.Child("userData"), "<user data>", "accessCredentials add SSH keys to this user data: "+err.Error()))
		}
	}
}

// inlineUserData is cloud-init user data given in the object (nil for a Secret's, or undecodable
// base64, which the volume's check reports).
func inlineUserData(inline, b64 string) []byte {
	if inline != "" {
		return []byte(inline)
	}
	b, _ := base64.StdEncoding.DecodeString(b64)
	return b
}

// build runs the spec through core/domain/assemble with stand-in driver results
// (assemble.StandIns), the way the node handler checks a VMI before it calls any driver, and
// maps its errors to field errors under v.path. It only runs once the structural rules hold, so it reports what they do not cover.
func (v *validator) build() {
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "stand-in", UID: "stand-in"},
		Spec:       *v.spec,
	}
	var volumes, interfaces []string
	for _, vol := range v.spec.Volumes {
		volumes = append(volumes, vol.Name)
	}
	for _, iface := range v.spec.Domain.Devices.Interfaces {
		interfaces = append(interfaces, iface.Name)
	}
	_, err := assemble.Domain(vmi, assemble.StandIns(volumes, interfaces))
	if err == nil {
		return
	}
	berrs, ok := err.(assemble.Error)
	if !ok {
		v.add(field.InternalError(v.path, err))
		return
	}
	for _, fe := range berrs {
		v.add(&field.Error{Type: field.ErrorTypeInvalid, Field: v.rebase(fe.Field), BadValue: field.OmitValueType{}, Detail: fe.Detail})
	}
}

// rebase moves a path that core/domain/assemble gives relative to a VMI ("spec.domain...") under
// v.path; anything else (a stand-in problem) is reported at v.path itself.
func (v *validator) rebase(p string) string {
	if rest, ok := strings.CutPrefix(p, "spec."); ok {
		return v.path.String() + "." + rest
	}
	return v.path.String()
}

// ValidateVirtualMachineSpec checks a VirtualMachine spec: running and runStrategy are not both
// set, the run strategy is known, and the template's spec passes Validate.
func ValidateVirtualMachineSpec(spec *v1alpha1.VirtualMachineSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if spec.Running != nil && spec.RunStrategy != nil {
		errs = append(errs, field.Invalid(path.Child("running"), *spec.Running, "running and runStrategy are mutually exclusive"))
	}
	if rs := spec.RunStrategy; rs != nil {
		all := []v1alpha1.VirtualMachineRunStrategy{v1alpha1.RunStrategyAlways, v1alpha1.RunStrategyRerunOnFailure,
			v1alpha1.RunStrategyManual, v1alpha1.RunStrategyHalted, v1alpha1.RunStrategyOnce}
		if !slices.Contains(all, *rs) {
			errs = append(errs, field.NotSupported(path.Child("runStrategy"), *rs, all))
		}
	}
	if spec.Template == nil {
		return append(errs, field.Required(path.Child("template"), ""))
	}
	return append(errs, Validate(&spec.Template.Spec, path.Child("template", "spec"))...)
}

// ValidateReplicaSetSpec checks a VirtualMachineInstanceReplicaSet spec: a selector that matches
// the template's labels, a non-negative replica count, and a template whose spec passes Validate.
func ValidateReplicaSetSpec(spec *v1alpha1.VirtualMachineInstanceReplicaSetSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if r := spec.Replicas; r != nil && *r < 0 {
		errs = append(errs, field.Invalid(path.Child("replicas"), *r, "must not be negative"))
	}
	if spec.Template == nil {
		errs = append(errs, field.Required(path.Child("template"), ""))
	}
	switch {
	case spec.Selector == nil:
		errs = append(errs, field.Required(path.Child("selector"), ""))
	default:
		sel, err := metav1.LabelSelectorAsSelector(spec.Selector)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(path.Child("selector"), spec.Selector, err.Error()))
		case sel.Empty():
			errs = append(errs, field.Invalid(path.Child("selector"), spec.Selector, "must not be empty"))
		case spec.Template != nil && !sel.Matches(labels.Set(spec.Template.ObjectMeta.Labels)):
			errs = append(errs, field.Invalid(path.Child("selector"), spec.Selector, "does not match template.metadata.labels"))
		}
	}
	if spec.Template != nil {
		errs = append(errs, Validate(&spec.Template.Spec, path.Child("template", "spec"))...)
	}
	return errs
}

// ValidateMigrationSpec checks a VirtualMachineInstanceMigration spec: it names a VMI.
func ValidateMigrationSpec(spec *v1alpha1.VirtualMachineInstanceMigrationSpec, path *field.Path) field.ErrorList {
	if spec.VMIName == "" {
		return field.ErrorList{field.Required(path.Child("vmiName"), "")}
	}
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Subdomain(spec.VMIName) {
		errs = append(errs, field.Invalid(path.Child("vmiName"), spec.VMIName, msg))
	}
	return errs
}

// ValidateVMISpecUpdate rejects any change of a VirtualMachineInstance's spec but its
// terminationGracePeriodSeconds: as in KubeVirt, a
// VMI's spec is fixed once created (KubeVirt lets only its own components change it, for
// hot-plug, which Kubevisor does not offer). Metadata (labels, annotations, finalizers) and the
// status subresource stay writable.
func ValidateVMISpecUpdate(newSpec, oldSpec *v1alpha1.VirtualMachineInstanceSpec, path *field.Path) field.ErrorList {
	// terminationGracePeriodSeconds alone may change: a stop with a grace period (vmctl stop
	// --grace-period, --force) shortens the running VMI's, and the node reads it when it stops
	// the VM.
	rest := oldSpec.DeepCopy()
	rest.TerminationGracePeriodSeconds = newSpec.TerminationGracePeriodSeconds
	if apiequality.Semantic.DeepEqual(newSpec, rest) {
		if g := newSpec.TerminationGracePeriodSeconds; g != nil && *g < 0 {
			return field.ErrorList{field.Invalid(path.Child("terminationGracePeriodSeconds"), *g, "must be 0 or more")}
		}
		return nil
	}
	return field.ErrorList{field.Forbidden(path, "the spec of a VirtualMachineInstance is immutable after creation")}
}

// ValidateMigrationSpecUpdate rejects any change of a VirtualMachineInstanceMigration's spec,
// as KubeVirt does.
func ValidateMigrationSpecUpdate(newSpec, oldSpec *v1alpha1.VirtualMachineInstanceMigrationSpec, path *field.Path) field.ErrorList {
	if apiequality.Semantic.DeepEqual(newSpec, oldSpec) {
		return nil
	}
	return field.ErrorList{field.Forbidden(path, "the spec of a VirtualMachineInstanceMigration is immutable after creation")}
}

// dedicatedCPUs checks cpu.dedicatedCpuPlacement and cpu.isolateEmulatorThread: the launcher pod
// of such a VMI is in the Guaranteed QoS class with exactly DomainSpec.DedicatedCPUs CPUs, which
// the kubelet's static CPU manager gives it only when they are whole (controlplane/launcherpod).
// So CPU requests and limits, when set, are the vCPU count, and memory requests equal limits.
func (v *validator) dedicatedCPUs() {
	d := &v.spec.Domain
	cp, rp := v.domainPath().Child("cpu"), v.domainPath().Child("resources")
	if d.NUMAPassthrough() {
		np := cp.Child("numa", "guestMappingPassthrough")
		if !d.CPU.DedicatedCPUPlacement {
			v.add(field.Invalid(np, "{}", "requires cpu.dedicatedCpuPlacement"))
		}
		if d.MemoryHugepages() == nil {
			v.add(field.Invalid(np, "{}", "requires memory.hugepages"))
		}
	}
	if d.CPU == nil || !d.CPU.DedicatedCPUPlacement {
		if d.CPU != nil && d.CPU.IsolateEmulatorThread {
			v.add(field.Invalid(cp.Child("isolateEmulatorThread"), true, "requires cpu.dedicatedCpuPlacement"))
		}
		return
	}
	n, _ := d.VCPUs()
	for _, list := range []struct {
		name string
		rl   corev1.ResourceList
	}{{"requests", d.Resources.Requests}, {"limits", d.Resources.Limits}} {
		q, ok := list.rl[corev1.ResourceCPU]
		if !ok {
			continue
		}
		if q.Cmp(*resource.NewQuantity(n, resource.DecimalSI)) != 0 {
			v.add(field.Invalid(rp.Child(list.name).Key(string(corev1.ResourceCPU)), q.String(),
				fmt.Sprintf("must be the vCPU count %d with cpu.dedicatedCpuPlacement (a whole CPU per vCPU)", n)))
		}
	}
	req, hasReq := d.Resources.Requests[corev1.ResourceMemory]
	lim, hasLim := d.Resources.Limits[corev1.ResourceMemory]
	if hasReq && hasLim && req.Cmp(lim) != 0 {
		v.add(field.Invalid(rp.Child("requests").Key(string(corev1.ResourceMemory)), req.String(),
			fmt.Sprintf("must equal the memory limit %s with cpu.dedicatedCpuPlacement (the launcher pod is in the Guaranteed QoS class)", lim.String())))
	}
}
