package handler

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// secretResolver is a MapResolver that knows secrets by name.
type secretResolver struct {
	MapResolver
	secrets map[string]map[string][]byte
}

func (r secretResolver) Secret(_ context.Context, _ *v1alpha1.VirtualMachineInstance, name string) (map[string][]byte, error) {
	if s, ok := r.secrets[name]; ok {
		return s, nil
	}
	return nil, fmt.Errorf("secret %q: %w", name, errNotFound)
}

func sshCredential(secret string, configDrive bool) v1alpha1.AccessCredential {
	ssh := &v1alpha1.SSHPublicKeyAccessCredential{Source: v1alpha1.SSHPublicKeyAccessCredentialSource{
		Secret: &v1alpha1.AccessCredentialSecretSource{SecretName: secret},
	}}
	if configDrive {
		ssh.PropagationMethod.ConfigDrive = &v1alpha1.ConfigDriveSSHPublicKeyAccessCredentialPropagation{}
	} else {
		ssh.PropagationMethod.NoCloud = &v1alpha1.NoCloudSSHPublicKeyAccessCredentialPropagation{}
	}
	return v1alpha1.AccessCredential{SSHPublicKey: ssh}
}

const (
	keyA = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA alice@example"
	keyB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB bob@example"
	keyC = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC carol@example"
)

// TestMakePlanAccessCredentials: the keys of each credential's Secret end up in the
// ssh_authorized_keys of the user data of the cloud-init volume its propagation method names,
// user data inline or from a Secret, and nowhere else.
func TestMakePlanAccessCredentials(t *testing.T) {
	r := secretResolver{secrets: map[string]map[string][]byte{
		"alice":    {"key": []byte(keyA + "\n")},
		"team":     {"b": []byte(keyB), "c": []byte("# carol\n" + keyC + "\n")},
		"userdata": {"userdata": []byte("#cloud-config\nssh_authorized_keys:\n  - " + keyA + "\n")},
	}}
	vmi := testVMI("demo", "uid-access", "/images/root.qcow2")
	vmi.Spec.Volumes[1].CloudInitNoCloud.UserData = "#cloud-config\npackages: [vim]\n"
	vmi.Spec.Domain.Devices.Disks = append(vmi.Spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "cd", DiskDevice: v1alpha1.DiskDevice{CDRom: &v1alpha1.CDRomTarget{Bus: v1alpha1.DiskBusSCSI}}})
	vmi.Spec.Volumes = append(vmi.Spec.Volumes, v1alpha1.Volume{Name: "cd", VolumeSource: v1alpha1.VolumeSource{CloudInitConfigDrive: &v1alpha1.CloudInitConfigDriveSource{
		UserDataSecretRef: &corev1.LocalObjectReference{Name: "userdata"},
	}}})
	vmi.Spec.AccessCredentials = []v1alpha1.AccessCredential{
		sshCredential("alice", false), sshCredential("team", false), sshCredential("team", true),
	}
	p, err := makePlan(context.Background(), vmi, r)
	if err != nil {
		t.Fatalf("makePlan: %v", err)
	}
	userData := map[string]string{}
	for _, v := range p.volumes {
		if ci := v.GetCloudInitNoCloud(); ci != nil {
			userData[v.Name] = string(ci.GetUserData())
		}
		if ci := v.GetCloudInitConfigDrive(); ci != nil {
			userData[v.Name] = string(ci.GetUserData())
		}
	}
	want := map[string]string{
		"cloudinitdisk": "#cloud-config\npackages: [vim]\nssh_authorized_keys:\n  - " + keyA + "\n  - " + keyB + "\n  - " + keyC + "\n",
		// alice's key was there already; team's two are added once.
		"cd": "#cloud-config\nssh_authorized_keys:\n  - " + keyA + "\n  - " + keyB + "\n  - " + keyC + "\n",
	}
	for name, w := range want {
		if userData[name] != w {
			t.Errorf("user data of %s:\n%s\nwant:\n%s", name, userData[name], w)
		}
	}
}

func TestMakePlanAccessCredentialsRejects(t *testing.T) {
	secrets := map[string]map[string][]byte{
		"keys":   {"k": []byte(keyA)},
		"empty":  {"k": []byte("# none yet\n")},
		"script": {"userData": []byte("#!/bin/sh\necho " + keyB + "\n")},
	}
	for _, tc := range []struct {
		name   string
		change func(*v1alpha1.VirtualMachineInstance)
		want   string
	}{
		{"no such secret", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.AccessCredentials = []v1alpha1.AccessCredential{sshCredential("nope", false)}
		}, `spec.accessCredentials[0].sshPublicKey.source.secret.secretName: secret "nope": not found`},
		{"secret without keys", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.AccessCredentials = []v1alpha1.AccessCredential{sshCredential("empty", false)}
		}, `spec.accessCredentials[0].sshPublicKey.source.secret.secretName: secret "empty" holds no SSH public key`},
		{"user data from a secret is a script", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Volumes[1].CloudInitNoCloud = &v1alpha1.CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: "script"}}
			v.Spec.AccessCredentials = []v1alpha1.AccessCredential{sshCredential("keys", false)}
		}, "spec.volumes[1].cloudInitNoCloud.userData: accessCredentials: user data is not cloud-config"},
		{"no volume of the kind", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.AccessCredentials = []v1alpha1.AccessCredential{sshCredential("keys", true)}
		}, "spec.accessCredentials: SSH keys propagated by configDrive need a cloudInitConfigDrive volume"},
		{"two propagation methods", func(v *v1alpha1.VirtualMachineInstance) {
			ac := sshCredential("keys", false)
			ac.SSHPublicKey.PropagationMethod.ConfigDrive = &v1alpha1.ConfigDriveSSHPublicKeyAccessCredentialPropagation{}
			v.Spec.AccessCredentials = []v1alpha1.AccessCredential{ac}
		}, "spec.accessCredentials[0].sshPublicKey.propagationMethod: exactly one of noCloud and configDrive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vmi := testVMI("demo", "uid-access", "/images/root.qcow2")
			tc.change(vmi)
			_, err := makePlan(context.Background(), vmi, secretResolver{secrets: secrets})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("makePlan: %v, want an error with %q", err, tc.want)
			}
			// An error names a secret, never its data.
			for _, k := range []string{keyA, keyB, "AAAA"} {
				if strings.Contains(err.Error(), k) {
					t.Errorf("error shows secret data %q: %v", k, err)
				}
			}
		})
	}
}

// Without access credentials the user data is passed on byte for byte (a script too).
func TestMakePlanNoAccessCredentialsKeepsUserData(t *testing.T) {
	vmi := testVMI("demo", "uid-access", "/images/root.qcow2")
	vmi.Spec.Volumes[1].CloudInitNoCloud.UserData = "#!/bin/sh\necho hi\n"
	p, err := makePlan(context.Background(), vmi, MapResolver{})
	if err != nil {
		t.Fatal(err)
	}
	var got *storagev1.CloudInit
	for _, v := range p.volumes {
		if ci := v.GetCloudInitNoCloud(); ci != nil {
			got = ci
		}
	}
	if got == nil || string(got.GetUserData()) != "#!/bin/sh\necho hi\n" {
		t.Errorf("user data = %q", got.GetUserData())
	}
}
