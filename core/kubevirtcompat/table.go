package kubevirtcompat

// Entry says why a field of KubeVirt's VirtualMachineInstanceSpec is not in Kubevisor's, for the
// field at Path and every field under it (a path prefix: "domain.features" covers all of
// domain.features.*). The entry with the longest Path that covers a field is the one for it.
type Entry struct {
	// Path is the field, as Node.Leaves writes paths.
	Path string
	// Issue, when not 0, is the issue that plans the field: the field is planned rather than
	// not supported.
	Issue int
	// Reason says why Kubevisor does not have the field (optional for a planned one).
	Reason string
	// Alternative is what to use instead, when something is.
	Alternative string
}

// Planned says whether an issue plans the field.
func (e Entry) Planned() bool { return e.Issue != 0 }

// The reasons several entries share.
const (
	guestAgentReason = "needs the guest agent to change the guest's accounts, which Kubevisor's agent channel does not do yet (it reads the guest's OS information and runs probes)"
	// KubeVirt's SEV attestation: a paused launch, the launch measurement read through a
	// subresource, then secrets injected before the guest runs.
	sevAttestationReason = "SEV attestation (a paused launch whose measurement the guest owner checks, with their session and Diffie-Hellman certificate) is not implemented"
	objectVolumeReason   = "Kubevisor has no volume that presents a Kubernetes object to the guest as a disk"
	objectVolumeAlt      = "cloudInitNoCloud (userData, or secretRef for secret data)"
	deviceTagReason      = "device role tags reach the guest as device metadata on a config drive, which Kubevisor does not write"
	pullSecretReason     = "the launcher pod takes no per-volume image pull secret"
	pullSecretAlt        = "imagePullSecrets on the namespace's default ServiceAccount, which the launcher pod runs as"
	networkBindingAlt    = "masquerade (pod network) or bridge"
	draReason            = "dynamic resource allocation (DRA) claims are not passed to the launcher pod"
)

// entries are the fields of KubeVirt's VirtualMachineInstanceSpec that Kubevisor does not
// support. A field Kubevisor supports has no entry: supported is read from its types (the tests
// fail on an entry for a field Kubevisor has, on an entry for a path KubeVirt does not have, on
// an entry no field uses, and on a KubeVirt field that is neither supported nor covered).
var entries = []Entry{
	// VMI spec.
	{Path: "accessCredentials[].sshPublicKey.propagationMethod.qemuGuestAgent", Reason: guestAgentReason, Alternative: "propagationMethod noCloud or configDrive (the keys go into the cloud-init user data)"},
	{Path: "accessCredentials[].userPassword", Reason: guestAgentReason, Alternative: "a password in cloudInitNoCloud userData"},
	{Path: "resourceClaims", Reason: draReason, Alternative: "extended resources through hostDevices[].deviceName and gpus[].deviceName"},
	{Path: "topologySpreadConstraints", Reason: "not passed on to the launcher pod", Alternative: "affinity (podAntiAffinity)"},

	// domain.
	{Path: "domain.clock.timer.hpet.tickPolicy", Reason: "QEMU has no tick policy for the HPET", Alternative: "present: false, or rtc.tickPolicy"},
	{Path: "domain.features.hypervPassthrough", Reason: "passing every Hyper-V enlightenment of the host through is not implemented", Alternative: "features.hyperv with the enlightenments the guest needs"},
	{Path: "domain.launchSecurity.sev.attestation", Reason: sevAttestationReason, Alternative: "launchSecurity.sev without attestation"},
	{Path: "domain.launchSecurity.sev.dhCert", Reason: sevAttestationReason, Alternative: "launchSecurity.sev without attestation"},
	{Path: "domain.launchSecurity.sev.session", Reason: sevAttestationReason, Alternative: "launchSecurity.sev without attestation"},
	{Path: "domain.launchSecurity.snp", Reason: "QEMU 7.2 (Debian 12's, which the qmp driver runs) has no SEV-SNP guests: sev-snp-guest came in QEMU 9.1", Alternative: "launchSecurity.sev"},
	{Path: "domain.launchSecurity.tdx", Reason: "QEMU 7.2 (Debian 12's, which the qmp driver runs) has no Intel TDX guests: tdx-guest came in QEMU 10.0"},
	{Path: "domain.cpu.maxSockets", Reason: "CPU hotplug is not implemented", Alternative: "sockets, set to what the guest needs"},
	{Path: "domain.cpu.realtime", Reason: "real-time vCPU tuning is not implemented", Alternative: "dedicatedCpuPlacement (each vCPU on an exclusive host CPU) with isolateEmulatorThread"},
	{Path: "domain.memory.maxGuest", Reason: "memory hotplug is not implemented", Alternative: "memory.guest, set to what the guest needs"},
	{Path: "domain.resources.overcommitGuestOverhead", Reason: "the launcher pod always requests the guest's overhead", Alternative: "the overhead of the HypervisorClass"},
	{Path: "domain.firmware.acpi", Reason: "custom ACPI tables (SLIC, MSDM) are not supported"},
	{Path: "domain.firmware.kernelBoot.container.imagePullSecret", Reason: pullSecretReason, Alternative: pullSecretAlt},

	// domain.devices.
	{Path: "domain.devices.autoattachVSOCK", Reason: "Kubevisor gives the guest no vsock device"},
	{Path: "domain.devices.clientPassthrough", Reason: "USB redirection from a client is not implemented"},
	{Path: "domain.devices.downwardMetrics", Reason: "the host metrics service for guests is not implemented"},
	// Measured with Debian 12's virtiofsd (QEMU 7.2's C daemon, /usr/lib/qemu/virtiofsd) and a
	// QEMU connected to it: in a container shaped like the launcher's (uid 0, every capability
	// dropped, no_new_privs, containerd 1.6's RuntimeDefault seccomp profile) it exits at start
	// on unshare(CLONE_FS) (EPERM: the profile allows unshare only with CAP_SYS_ADMIN). Without
	// seccomp it gets as far as the vhost-user connection and then fails to sandbox itself:
	// chroot(2) (sandbox=chroot) or unshare(CLONE_NEWPID|CLONE_NEWNS) (sandbox=namespace),
	// EPERM; it has no unsandboxed mode. A user namespace is no way round it: the profile
	// refuses unshare(CLONE_NEWUSER), and root without CAP_SETFCAP cannot map uid 0 into one.
	// It shared a directory the guest mounted only with CAP_SYS_CHROOT, CAP_SETPCAP and the file
	// capabilities it keeps (CHOWN, DAC_OVERRIDE, FOWNER, FSETID, SETGID, SETUID, MKNOD,
	// SETFCAP) and a seccomp profile allowing unshare, or as full root.
	{Path: "domain.devices.filesystems", Reason: "QEMU 7.2's virtiofsd (Debian 12's) must sandbox itself with unshare(2) and chroot(2) or new namespaces, which the launcher pod's seccomp profile and dropped capabilities refuse; it has no unsandboxed mode", Alternative: "a persistentVolumeClaim volume as a disk"},
	{Path: "domain.devices.gpus[].claimName", Reason: draReason, Alternative: "deviceName"},
	{Path: "domain.devices.gpus[].requestName", Reason: draReason, Alternative: "deviceName"},
	{Path: "domain.devices.gpus[].virtualGPUOptions", Reason: "mediated devices (vGPUs) and their display are not implemented: a GPU is a whole PCI function passed through"},
	{Path: "domain.devices.hostDevices[].claimName", Reason: draReason, Alternative: "deviceName"},
	{Path: "domain.devices.hostDevices[].requestName", Reason: draReason, Alternative: "deviceName"},
	{Path: "domain.devices.gpus[].tag", Reason: deviceTagReason},
	{Path: "domain.devices.hostDevices[].tag", Reason: deviceTagReason},
	{Path: "domain.devices.panicDevices", Reason: "Kubevisor gives the guest no panic device"},
	{Path: "domain.devices.video", Reason: "the hypervisor driver chooses the graphics device's model", Alternative: "autoattachGraphicsDevice"},
	{Path: "domain.devices.watchdog.diag288", Reason: "diag288 is an s390x watchdog; Kubevisor runs x86_64 guests", Alternative: "i6300esb"},

	// domain.devices.disks[].
	{Path: "domain.devices.disks[].blockSize.matchVolume", Reason: "storage drivers do not report a volume's block size", Alternative: "blockSize.custom"},
	{Path: "domain.devices.disks[].blockSize.custom.discardGranularity", Reason: "the discard granularity is the hypervisor's"},
	{Path: "domain.devices.disks[].changedBlockTracking", Reason: "incremental backups are not implemented"},
	{Path: "domain.devices.disks[].disk.pciAddress", Reason: "the hypervisor driver assigns disks their PCI addresses", Alternative: "bootOrder or serial to find a disk in the guest"},
	{Path: "domain.devices.disks[].lun.reservation", Reason: "SCSI persistent reservations go through qemu-pr-helper, which must run privileged on the node, and Kubevisor does not run it"},
	{Path: "domain.devices.disks[].tag", Reason: deviceTagReason, Alternative: "serial, to find a disk in the guest"},

	// domain.devices.interfaces[].
	{Path: "domain.devices.interfaces[].binding", Reason: "network binding plugins are KubeVirt's; Kubevisor's network drivers are plugins of their own", Alternative: networkBindingAlt},
	{Path: "domain.devices.interfaces[].macvtap", Reason: "the macvtap binding is not implemented by Kubevisor's network driver", Alternative: "bridge"},
	{Path: "domain.devices.interfaces[].passt", Reason: "the passt binding is not implemented by Kubevisor's network driver", Alternative: "masquerade"},
	{Path: "domain.devices.interfaces[].slirp", Reason: "user-mode (slirp) networking is not implemented", Alternative: "masquerade"},
	{Path: "domain.devices.interfaces[].sriov", Reason: "SR-IOV virtual functions are not allocated to VMIs", Alternative: "bridge on a multus network"},
	{Path: "domain.devices.interfaces[].tag", Reason: deviceTagReason, Alternative: "macAddress, to find an interface in the guest"},

	// volumes[].
	{Path: "volumes[].configMap", Reason: objectVolumeReason, Alternative: objectVolumeAlt},
	{Path: "volumes[].containerDisk.imagePullSecret", Reason: pullSecretReason, Alternative: pullSecretAlt},
	{Path: "volumes[].dataVolume", Reason: "needs a data importer (CDI), which Kubevisor does not have", Alternative: "persistentVolumeClaim, or containerDisk"},
	{Path: "volumes[].downwardAPI", Reason: objectVolumeReason, Alternative: objectVolumeAlt},
	{Path: "volumes[].downwardMetrics", Reason: "the host metrics service for guests is not implemented"},
	{Path: "volumes[].memoryDump", Reason: "guest memory dumps are not implemented"},
	{Path: "volumes[].secret", Reason: objectVolumeReason, Alternative: "cloudInitNoCloud secretRef"},
	{Path: "volumes[].serviceAccount", Reason: objectVolumeReason},
	{Path: "volumes[].sysprep", Reason: "Windows sysprep media are not implemented", Alternative: "cloudInitConfigDrive (cloudbase-init)"},
}
