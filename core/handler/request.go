package handler

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/cloudinit"
	"github.com/kubevisor/kubevisor/core/domain"
	"github.com/kubevisor/kubevisor/core/domain/assemble"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// Resolver finds on the node what a VMI names outside itself. In a cluster all of it comes from
// the launcher pod, which the kubelet gave the images, claims and secrets
// (core/handler/cluster); without one (standalone, tests) MapResolver reads them from the
// handler's configuration.
type Resolver interface {
	// Image returns the node path of a container image's content (containerDisk, kernelBoot):
	// a disk image file, or a directory (an unpacked image, an OCI image layout).
	Image(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, image string) (string, error)
	// Claim returns the node path of a PersistentVolumeClaim's disk: its disk image or block
	// device, or a file-system claim's directory (the storage driver uses, or makes, disk.img
	// there).
	Claim(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, claim string) (string, error)
	// Secret returns the data of a secret in the VMI's namespace.
	Secret(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, name string) (map[string][]byte, error)
	// PersistentState returns the node path of the VMI's persistent state directory (the TPM
	// state and EFI variable store that outlive the VMI), for a VMI that asks for one.
	PersistentState(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (string, error)
}

// ContainerDiskResolver finds the disk of a containerDisk volume by the volume, not only by its
// image (Options.ContainerDisks): in a cluster each containerDisk volume has its own container in
// the launcher pod, which serves the image. It returns the node path of the disk image file; the
// path in the image that the volume may name (src.Path) is its to apply.
type ContainerDiskResolver interface {
	ContainerDisk(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, volume string, src *v1alpha1.ContainerDiskSource) (string, error)
}

// byVolume is a Resolver that resolves containerDisk volumes with a ContainerDiskResolver.
type byVolume struct {
	Resolver
	ContainerDiskResolver
}

// MapResolver resolves images and claims from maps (Config.Images, Config.Claims); an image
// reference that is a path (absolute, or starting with ./ or ../) is that path. It knows no
// secrets. It keeps persistent state under StateDir (PersistentState).
type MapResolver struct {
	Images map[string]string
	Claims map[string]string
	// StateDir is the handler's node state directory (Config.StateDir), under which
	// PersistentState keeps the VMs' persistent state. Empty: no VMI can have any.
	StateDir string
}

// PersistentStateDirName is the subdirectory of the handler's node state directory where
// MapResolver keeps each VM's persistent state, at <namespace>/<name>: a VMI's name, not its
// UID, so that the VMI made again for the same VM finds it. Nothing of the handler removes
// it, undo included (it removes the VMI's own run and work directories).
const PersistentStateDirName = "persistent"

var errNotFound = errors.New("not found")

// Image implements Resolver.
func (r MapResolver) Image(_ context.Context, _ *v1alpha1.VirtualMachineInstance, image string) (string, error) {
	if p, ok := r.Images[image]; ok {
		return p, nil
	}
	if filepath.IsAbs(image) || strings.HasPrefix(image, "./") || strings.HasPrefix(image, "../") {
		return filepath.Abs(image)
	}
	return "", fmt.Errorf("image %q: %w on this node (no cluster pulls images: map it to a path in the handler config's images)", image, errNotFound)
}

// Claim implements Resolver.
func (r MapResolver) Claim(_ context.Context, vmi *v1alpha1.VirtualMachineInstance, claim string) (string, error) {
	for _, k := range []string{vmi.Namespace + "/" + claim, claim} {
		if p, ok := r.Claims[k]; ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("persistentVolumeClaim %q: %w on this node (map it to a path in the handler config's claims)", claim, errNotFound)
}

// Secret implements Resolver.
func (MapResolver) Secret(_ context.Context, _ *v1alpha1.VirtualMachineInstance, name string) (map[string][]byte, error) {
	return nil, fmt.Errorf("secret %q: not supported without a cluster", name)
}

// PersistentState implements Resolver: StateDir/persistent/<namespace>/<name> (namespace
// "default" when the VMI has none), made 0700 with its parents when absent and used as found
// otherwise.
func (r MapResolver) PersistentState(_ context.Context, vmi *v1alpha1.VirtualMachineInstance) (string, error) {
	if r.StateDir == "" {
		return "", errors.New("persistent state: the handler has no node state directory to keep it in")
	}
	ns := vmi.Namespace
	if ns == "" {
		ns = "default"
	}
	// Namespaces and VMI names are DNS labels and subdomains: no "/" and never "." or "..";
	// checked here all the same, as the path is made from them.
	for _, part := range []string{ns, vmi.Name} {
		if part == "" || part == "." || part == ".." || strings.ContainsRune(part, '/') {
			return "", fmt.Errorf("persistent state: %q is not a namespace or VMI name to keep state under", part)
		}
	}
	dir := filepath.Join(r.StateDir, PersistentStateDirName, ns, vmi.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("persistent state: %w", err)
	}
	// MkdirAll leaves an existing directory's mode as it is, and a new one's to the umask.
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", fmt.Errorf("persistent state: %w", err)
	}
	return dir, nil
}

// plan is what a sync asks the drivers for, worked out from the VMI before any driver is
// called.
type plan struct {
	volumes    []*storagev1.Volume
	interfaces []*networkv1.Interface
	kernel     *assemble.KernelArtifacts
}

// fieldErrors collects problems of a VMI by field path.
type fieldErrors []domain.FieldError

func (e *fieldErrors) add(field, format string, args ...any) {
	*e = append(*e, domain.FieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
}

func (e fieldErrors) err() error {
	if len(e) == 0 {
		return nil
	}
	return assemble.Error(e)
}

// makePlan translates the VMI into the storage and network drivers' requests and resolves what
// it names on the node. Every problem names its VMI field.
func makePlan(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, r Resolver) (*plan, error) {
	p := &plan{}
	var errs fieldErrors
	for i, v := range vmi.Spec.Volumes {
		field := fmt.Sprintf("spec.volumes[%d]", i)
		vol, err := storageVolume(ctx, vmi, r, v, field)
		if err != nil {
			var fe fieldErrors
			if errors.As(err, &fe) {
				errs = append(errs, fe...)
			} else {
				errs.add(field, "%v", err)
			}
			continue
		}
		p.volumes = append(p.volumes, vol)
	}
	addAccessCredentials(ctx, vmi, r, p.volumes, &errs)
	for i := range vmi.Spec.Domain.Devices.Interfaces {
		if fe := assemble.CheckInterface(vmi, i); fe != nil {
			errs = append(errs, *fe)
			continue
		}
		iface := &vmi.Spec.Domain.Devices.Interfaces[i]
		ni := &networkv1.Interface{Name: iface.Name, Binding: assemble.Binding(iface), Mac: iface.MacAddress, Queues: assemble.NICQueues(vmi, iface)}
		for _, n := range vmi.Spec.Networks {
			if n.Name == iface.Name && n.Multus != nil {
				ni.NetworkName = n.Multus.NetworkName
			}
		}
		for _, port := range iface.Ports {
			ni.Ports = append(ni.Ports, &networkv1.Port{Name: port.Name, Protocol: port.Protocol, Port: port.Port})
		}
		ni.DhcpOptions = dhcpOptions(iface.DHCPOptions)
		p.interfaces = append(p.interfaces, ni)
	}
	if fw := vmi.Spec.Domain.Firmware; fw != nil && fw.KernelBoot != nil {
		const field = "spec.domain.firmware.kernelBoot.container"
		c := fw.KernelBoot.Container
		switch {
		case c == nil:
			errs.add(field, "required")
		case c.KernelPath == "":
			errs.add(field+".kernelPath", "required")
		default:
			dir, err := r.Image(ctx, vmi, c.Image)
			if err != nil {
				errs.add(field+".image", "%v", err)
				break
			}
			p.kernel = &assemble.KernelArtifacts{KernelPath: filepath.Join(dir, c.KernelPath)}
			if c.InitrdPath != "" {
				p.kernel.InitrdPath = filepath.Join(dir, c.InitrdPath)
			}
		}
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	return p, nil
}

// dhcpOptions translates an interface's DHCP options into the network driver's; nil for none.
func dhcpOptions(o *v1alpha1.DHCPOptions) *networkv1.DHCPOptions {
	if o == nil {
		return nil
	}
	out := &networkv1.DHCPOptions{BootFileName: o.BootFileName, TftpServerName: o.TFTPServerName, NtpServers: o.NTPServers}
	for _, po := range o.PrivateOptions {
		// Codes out of range (the webhook refuses them) stay out of range, not wrapped into valid ones.
		code := uint32(min(max(po.Option, 0), 1<<16))
		out.PrivateOptions = append(out.PrivateOptions, &networkv1.DHCPPrivateOption{Code: code, Value: po.Value})
	}
	return out
}

// storageVolume translates one VMI volume into the storage driver's.
func storageVolume(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, r Resolver, v v1alpha1.Volume, field string) (*storagev1.Volume, error) {
	vol := &storagev1.Volume{Name: v.Name}
	var errs fieldErrors
	n := 0
	src := v.VolumeSource
	if s := src.ContainerDisk; s != nil {
		n++
		var path string
		var err error
		cr, perVolume := r.(ContainerDiskResolver)
		if perVolume {
			path, err = cr.ContainerDisk(ctx, vmi, v.Name, s)
		} else {
			path, err = r.Image(ctx, vmi, s.Image)
		}
		if err != nil {
			errs.add(field+".containerDisk.image", "%v", err)
		} else if s.Path != "" && !perVolume {
			// A path in the image, when the image is an unpacked directory that has it.
			if in := filepath.Join(path, s.Path); fileExists(in) {
				path = in
			}
		}
		vol.Source = &storagev1.Volume_ContainerDisk{ContainerDisk: &storagev1.ContainerDisk{Image: s.Image, Path: path}}
	}
	if s := src.EmptyDisk; s != nil {
		n++
		c := s.Capacity.Value()
		if c <= 0 {
			errs.add(field+".emptyDisk.capacity", "must be > 0")
		}
		vol.Source = &storagev1.Volume_EmptyDisk{EmptyDisk: &storagev1.EmptyDisk{CapacityBytes: uint64(max(c, 0))}}
	}
	if s := src.HostDisk; s != nil {
		n++
		hd := &storagev1.HostDisk{Path: s.Path, Type: string(s.Type), CapacityBytes: uint64(max(s.Capacity.Value(), 0))}
		if s.Shared != nil {
			hd.Shared = *s.Shared
		}
		vol.Source = &storagev1.Volume_HostDisk{HostDisk: hd}
	}
	if s := src.PersistentVolumeClaim; s != nil {
		n++
		path, err := r.Claim(ctx, vmi, s.ClaimName)
		if err != nil {
			errs.add(field+".persistentVolumeClaim.claimName", "%v", err)
		}
		if s.Hotpluggable {
			errs.add(field+".persistentVolumeClaim.hotpluggable", "not supported")
		}
		capacity, statusField, err := claimImageCapacity(vmi, v.Name, s.ClaimName)
		if err != nil {
			errs.add(statusField, "%v", err)
		}
		vol.Source = &storagev1.Volume_PersistentVolumeClaim{PersistentVolumeClaim: &storagev1.PersistentVolumeClaim{
			ClaimName: s.ClaimName, Path: path, ReadOnly: s.ReadOnly, CapacityBytes: capacity,
		}}
	}
	if s := src.Ephemeral; s != nil {
		n++
		var path string
		if s.PersistentVolumeClaim == nil {
			errs.add(field+".ephemeral.persistentVolumeClaim", "required")
		} else if p, err := r.Claim(ctx, vmi, s.PersistentVolumeClaim.ClaimName); err != nil {
			errs.add(field+".ephemeral.persistentVolumeClaim.claimName", "%v", err)
		} else {
			path = p
		}
		vol.Source = &storagev1.Volume_Ephemeral{Ephemeral: &storagev1.Ephemeral{BackingPath: path}}
	}
	if s := src.CloudInitNoCloud; s != nil {
		n++
		ci := cloudInit(ctx, vmi, r, field+".cloudInitNoCloud", &errs,
			s.UserData, s.UserDataBase64, refName(s.UserDataSecretRef), s.NetworkData, s.NetworkDataBase64, refName(s.NetworkDataSecretRef))
		vol.Source = &storagev1.Volume_CloudInitNoCloud{CloudInitNoCloud: ci}
	}
	if s := src.CloudInitConfigDrive; s != nil {
		n++
		ci := cloudInit(ctx, vmi, r, field+".cloudInitConfigDrive", &errs,
			s.UserData, s.UserDataBase64, refName(s.UserDataSecretRef), s.NetworkData, s.NetworkDataBase64, refName(s.NetworkDataSecretRef))
		vol.Source = &storagev1.Volume_CloudInitConfigDrive{CloudInitConfigDrive: ci}
	}
	if n != 1 {
		errs.add(field, "exactly one volume source must be set, not %d", n)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return vol, nil
}

func (e fieldErrors) Error() string { return assemble.Error(e).Error() }

// claimImageCapacity is the size of the disk image the storage driver makes on the claim of
// a persistentVolumeClaim volume when the claim is a file system without one (KubeVirt's
// sizing): the claim's capacity, as the control plane found it (status.volumeStatus), less its
// file-system overhead (v1alpha1.DefaultFilesystemOverhead when it says none). 0 when the
// status does not give the claim's capacity: the driver then makes no image.
// A bad overhead is an error at the field it returns.
func claimImageCapacity(vmi *v1alpha1.VirtualMachineInstance, volume, claim string) (int64, string, error) {
	for i, vs := range vmi.Status.VolumeStatus {
		info := vs.PersistentVolumeClaimInfo
		if vs.Name != volume || info == nil || (info.ClaimName != "" && info.ClaimName != claim) {
			continue
		}
		q, ok := info.Capacity[corev1.ResourceStorage]
		if !ok || q.Sign() <= 0 {
			return 0, "", nil
		}
		overhead := info.FilesystemOverhead
		if overhead == "" {
			overhead = v1alpha1.DefaultFilesystemOverhead
		}
		f, ok := new(big.Rat).SetString(overhead)
		if !ok || f.Sign() < 0 || f.Cmp(big.NewRat(1, 1)) >= 0 {
			return 0, fmt.Sprintf("status.volumeStatus[%d].persistentVolumeClaimInfo.filesystemOverhead", i),
				fmt.Errorf("%q is not a decimal fraction in [0, 1)", info.FilesystemOverhead)
		}
		// capacity × (1 − overhead), exactly, rounded down to a byte.
		r := new(big.Rat).Mul(new(big.Rat).SetInt64(q.Value()), new(big.Rat).Sub(big.NewRat(1, 1), f))
		return new(big.Int).Quo(r.Num(), r.Denom()).Int64(), "", nil
	}
	return 0, "", nil
}

// cloudInit resolves cloud-init data given inline, base64-encoded, or in a secret.
func cloudInit(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, r Resolver, field string, errs *fieldErrors,
	userData, userDataB64, userSecret, netData, netDataB64, netSecret string) *storagev1.CloudInit {
	ci := &storagev1.CloudInit{Hostname: vmi.GuestHostname()}
	// secretField is the JSON name of the reference: secretRef for user data (KubeVirt's name),
	// networkDataSecretRef for network data.
	resolve := func(what, secretField, inline, b64, secret string, keys ...string) []byte {
		set := 0
		for _, s := range []string{inline, b64, secret} {
			if s != "" {
				set++
			}
		}
		if set > 1 {
			errs.add(field, "more than one source of %s", what)
			return nil
		}
		switch {
		case inline != "":
			return []byte(inline)
		case b64 != "":
			b, err := base64.StdEncoding.DecodeString(b64)
			if err != nil {
				errs.add(field+"."+what+"Base64", "not base64: %v", err)
			}
			return b
		case secret != "":
			data, err := r.Secret(ctx, vmi, secret)
			if err != nil {
				errs.add(field+"."+secretField, "%v", err)
				return nil
			}
			for _, k := range keys {
				if v, ok := data[k]; ok {
					return v
				}
			}
			errs.add(field+"."+secretField, "secret %q has none of the keys %v", secret, keys)
		}
		return nil
	}
	ci.UserData = resolve("userData", "secretRef", userData, userDataB64, userSecret, "userdata", "userData")
	ci.NetworkData = resolve("networkData", "networkDataSecretRef", netData, netDataB64, netSecret, "networkdata", "networkData")
	return ci
}

// addAccessCredentials adds the SSH public keys of the VMI's access credentials to the user data
// of its cloud-init volume of the kind each names (propagationMethod noCloud or configDrive),
// as ssh_authorized_keys (core/cloudinit). The webhook refuses a credential without such a
// volume and inline user data that is not cloud-config; user data from a Secret is only seen
// here, and is reported at the volume's field. Errors name the Secret, never its data.
func addAccessCredentials(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, r Resolver, vols []*storagev1.Volume, errs *fieldErrors) {
	if len(vmi.Spec.AccessCredentials) == 0 {
		return
	}
	// The first volume of each kind, as built (a volume that failed to build is reported already).
	var noCloud, configDrive *storagev1.CloudInit
	var noCloudField, configDriveField string
	for i, v := range vmi.Spec.Volumes {
		for _, vol := range vols {
			if vol.Name != v.Name {
				continue
			}
			if ci := vol.GetCloudInitNoCloud(); ci != nil && noCloud == nil {
				noCloud, noCloudField = ci, fmt.Sprintf("spec.volumes[%d].cloudInitNoCloud", i)
			}
			if ci := vol.GetCloudInitConfigDrive(); ci != nil && configDrive == nil {
				configDrive, configDriveField = ci, fmt.Sprintf("spec.volumes[%d].cloudInitConfigDrive", i)
			}
		}
	}
	var noCloudKeys, configDriveKeys []string
	for i, ac := range vmi.Spec.AccessCredentials {
		field := fmt.Sprintf("spec.accessCredentials[%d].sshPublicKey", i)
		ssh := ac.SSHPublicKey
		if ssh == nil {
			errs.add(field, "required")
			continue
		}
		if ssh.Source.Secret == nil || ssh.Source.Secret.SecretName == "" {
			errs.add(field+".source.secret.secretName", "required")
			continue
		}
		pm := ssh.PropagationMethod
		if (pm.NoCloud != nil) == (pm.ConfigDrive != nil) {
			errs.add(field+".propagationMethod", "exactly one of noCloud and configDrive must be set")
			continue
		}
		name := ssh.Source.Secret.SecretName
		data, err := r.Secret(ctx, vmi, name)
		if err != nil {
			errs.add(field+".source.secret.secretName", "%v", err)
			continue
		}
		keys := cloudinit.KeysOf(data)
		if len(keys) == 0 {
			errs.add(field+".source.secret.secretName", "secret %q holds no SSH public key", name)
			continue
		}
		if pm.NoCloud != nil {
			noCloudKeys = append(noCloudKeys, keys...)
		} else {
			configDriveKeys = append(configDriveKeys, keys...)
		}
	}
	for _, t := range []struct {
		ci                  *storagev1.CloudInit
		field, kind, method string
		keys                []string
	}{{noCloud, noCloudField, "cloudInitNoCloud", "noCloud", noCloudKeys}, {configDrive, configDriveField, "cloudInitConfigDrive", "configDrive", configDriveKeys}} {
		if len(t.keys) == 0 {
			continue
		}
		if t.ci == nil {
			if !slices.ContainsFunc(vmi.Spec.Volumes, func(v v1alpha1.Volume) bool {
				return (t.kind == "cloudInitNoCloud" && v.CloudInitNoCloud != nil) || (t.kind == "cloudInitConfigDrive" && v.CloudInitConfigDrive != nil)
			}) {
				errs.add("spec.accessCredentials", "SSH keys propagated by %s need a %s volume", t.method, t.kind)
			}
			continue
		}
		ud, err := cloudinit.AddAuthorizedKeys(t.ci.UserData, t.keys)
		if err != nil {
			errs.add(t.field+".userData", "accessCredentials: %v", err)
			continue
		}
		t.ci.UserData = ud
	}
}

func refName(r *corev1.LocalObjectReference) string {
	if r == nil {
		return ""
	}
	return r.Name
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
