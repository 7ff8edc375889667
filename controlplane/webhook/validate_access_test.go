package webhook

import (
	"encoding/base64"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

func sshKey(secret string, noCloud, configDrive bool) v1alpha1.AccessCredential {
	ssh := &v1alpha1.SSHPublicKeyAccessCredential{Source: v1alpha1.SSHPublicKeyAccessCredentialSource{
		Secret: &v1alpha1.AccessCredentialSecretSource{SecretName: secret},
	}}
	if noCloud {
		ssh.PropagationMethod.NoCloud = &v1alpha1.NoCloudSSHPublicKeyAccessCredentialPropagation{}
	}
	if configDrive {
		ssh.PropagationMethod.ConfigDrive = &v1alpha1.ConfigDriveSSHPublicKeyAccessCredentialPropagation{}
	}
	return v1alpha1.AccessCredential{SSHPublicKey: ssh}
}

// withConfigDrive adds a disk and a ConfigDrive volume "cd".
func withConfigDrive(s *v1alpha1.VirtualMachineInstanceSpec, ci *v1alpha1.CloudInitConfigDriveSource) {
	s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, v1alpha1.Disk{Name: "cd", DiskDevice: v1alpha1.DiskDevice{Disk: &v1alpha1.DiskTarget{Bus: "virtio"}}})
	s.Volumes = append(s.Volumes, v1alpha1.Volume{Name: "cd", VolumeSource: v1alpha1.VolumeSource{CloudInitConfigDrive: ci}})
}

// TestValidateAccessCredentialsAndDNS has one row per rule of accessCredentials, dnsPolicy and
// dnsConfig (empty field: accepted).
func TestValidateAccessCredentialsAndDNS(t *testing.T) {
	tests := []struct {
		name   string
		change func(s *v1alpha1.VirtualMachineInstanceSpec)
		field  string
		detail string
	}{
		{name: "noCloud keys into cloud-config", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config\nusers: [root]\n"})
			s.AccessCredentials = []v1alpha1.AccessCredential{sshKey("keys", true, false)}
		}},
		{name: "noCloud keys beside network data only", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{NetworkData: "version: 2\n"})
			s.AccessCredentials = []v1alpha1.AccessCredential{sshKey("keys", true, false)}
		}},
		{name: "noCloud keys with user data in a Secret (checked on the node)", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: "ud"}})
			s.AccessCredentials = []v1alpha1.AccessCredential{sshKey("keys", true, false)}
		}},
		{name: "configDrive keys into base64 cloud-config", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			withConfigDrive(s, &v1alpha1.CloudInitConfigDriveSource{UserDataBase64: base64.StdEncoding.EncodeToString([]byte("#cloud-config\n"))})
			s.AccessCredentials = []v1alpha1.AccessCredential{sshKey("keys", false, true)}
		}},
		{name: "keys into a script", field: "spec.volumes[1].cloudInitNoCloud.userData", detail: "not cloud-config",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserData: "#!/bin/sh\necho hi\n"})
				s.AccessCredentials = []v1alpha1.AccessCredential{sshKey("keys", true, false)}
			}},
		{name: "keys into a cloud-config whose keys are not a list", field: "spec.volumes[1].cloudInitNoCloud.userData", detail: "not a list",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config\nssh_authorized_keys: one\n"})
				s.AccessCredentials = []v1alpha1.AccessCredential{sshKey("keys", true, false)}
			}},
		{name: "noCloud without a cloudInitNoCloud volume", field: "spec.accessCredentials[0].sshPublicKey.propagationMethod.noCloud", detail: "needs a cloudInitNoCloud volume",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				withConfigDrive(s, &v1alpha1.CloudInitConfigDriveSource{UserData: "#cloud-config\n"})
				s.AccessCredentials = []v1alpha1.AccessCredential{sshKey("keys", true, false)}
			}},
		{name: "configDrive without a cloudInitConfigDrive volume", field: "spec.accessCredentials[1].sshPublicKey.propagationMethod.configDrive", detail: "needs a cloudInitConfigDrive volume",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config\n"})
				s.AccessCredentials = []v1alpha1.AccessCredential{sshKey("keys", true, false), sshKey("keys", false, true)}
			}},
		{name: "no propagation method", field: "spec.accessCredentials[0].sshPublicKey.propagationMethod", detail: "one of noCloud and configDrive",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config\n"})
				s.AccessCredentials = []v1alpha1.AccessCredential{sshKey("keys", false, false)}
			}},
		{name: "two propagation methods", field: "spec.accessCredentials[0].sshPublicKey.propagationMethod", detail: "only one of",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config\n"})
				s.AccessCredentials = []v1alpha1.AccessCredential{sshKey("keys", true, true)}
			}},
		{name: "no secret", field: "spec.accessCredentials[0].sshPublicKey.source.secret", detail: "Required",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config\n"})
				ac := sshKey("keys", true, false)
				ac.SSHPublicKey.Source.Secret = nil
				s.AccessCredentials = []v1alpha1.AccessCredential{ac}
			}},
		{name: "secret name not a name", field: "spec.accessCredentials[0].sshPublicKey.source.secret.secretName", detail: "RFC 1123",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config\n"})
				s.AccessCredentials = []v1alpha1.AccessCredential{sshKey("My Keys", true, false)}
			}},
		{name: "credential without sshPublicKey", field: "spec.accessCredentials[0].sshPublicKey", detail: "Required",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.AccessCredentials = []v1alpha1.AccessCredential{{}}
			}},

		{name: "dns policy and config", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.DNSPolicy = corev1.DNSNone
			s.DNSConfig = &corev1.PodDNSConfig{Nameservers: []string{"10.0.0.10", "fd00::a"}, Searches: []string{"svc.cluster.local", "example.org.", "."},
				Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptrTo("2")}}}
		}},
		{name: "dns config with the default policy", change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.DNSConfig = &corev1.PodDNSConfig{Searches: []string{"example.org"}}
		}},
		{name: "unknown dns policy", field: "spec.dnsPolicy", detail: "Unsupported value",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.DNSPolicy = "ClusterLast" }},
		{name: "policy None without nameservers", field: "spec.dnsConfig.nameservers", detail: "when dnsPolicy is None",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.DNSPolicy = corev1.DNSNone
				s.DNSConfig = &corev1.PodDNSConfig{Searches: []string{"example.org"}}
			}},
		{name: "policy None without config", field: "spec.dnsConfig.nameservers", detail: "when dnsPolicy is None",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) { s.DNSPolicy = corev1.DNSNone }},
		{name: "four nameservers", field: "spec.dnsConfig.nameservers", detail: "more than 3 nameservers",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.DNSConfig = &corev1.PodDNSConfig{Nameservers: []string{"1.1.1.1", "1.0.0.1", "8.8.8.8", "8.8.4.4"}}
			}},
		{name: "nameserver not an IP", field: "spec.dnsConfig.nameservers[1]", detail: "valid IP address",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.DNSConfig = &corev1.PodDNSConfig{Nameservers: []string{"1.1.1.1", "dns.example.org"}}
			}},
		{name: "search not a domain", field: "spec.dnsConfig.searches[0]", detail: "RFC 1123",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.DNSConfig = &corev1.PodDNSConfig{Searches: []string{"Not_A_Domain"}}
			}},
		{name: "too many searches", field: "spec.dnsConfig.searches", detail: "more than 32 search paths",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.DNSConfig = &corev1.PodDNSConfig{Searches: strings.Split(strings.Repeat("a.example,", 33)[:10*33-1], ",")}
			}},
		{name: "search list too long", field: "spec.dnsConfig.searches", detail: "more than 2048 characters",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				long := strings.Repeat("a", 60) + "." + strings.Repeat("b", 60) + "." + strings.Repeat("c", 60) + "." + strings.Repeat("d", 60)
				s.DNSConfig = &corev1.PodDNSConfig{Searches: []string{long, long, long, long, long, long, long, long, long}}
			}},
		{name: "option without a name", field: "spec.dnsConfig.options[0].name", detail: "Required",
			change: func(s *v1alpha1.VirtualMachineInstanceSpec) {
				s.DNSConfig = &corev1.PodDNSConfig{Options: []corev1.PodDNSConfigOption{{Value: ptrTo("1")}}}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := validSpec()
			tt.change(s)
			assertErrs(t, Validate(s, field.NewPath("spec")), tt.field, tt.detail)
		})
	}
}

func ptrTo[T any](v T) *T { return &v }
