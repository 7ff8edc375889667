package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/controlplane/certs"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/featuregate"
	"github.com/kubevisor/kubevisor/core/kubevirtcompat"
	"github.com/kubevisor/kubevisor/core/liveconfig"
	"github.com/kubevisor/kubevisor/internal/envtest"
	"github.com/kubevisor/kubevisor/internal/tlstest"
)

// startAPI brings up the API server with manifests/webhook installed and kubevisor-api's
// manager in-process, managing its own certificates: the serving certificate it writes is for
// envtest's local address, and the CA bundle the API server trusts is the one it injects into
// the webhook configurations (replacing envtest's). So a request admitted here went through
// the certificate code as well as the webhooks.
func startAPI(t *testing.T) (client.Client, string) {
	t.Helper()
	a := startAPIServer(t)
	return a.env.Client, a.cfg.CertDir
}

// apiServer is kubevisor-api's manager of startAPIServer with the API server it runs against.
type apiServer struct {
	env *envtest.Env
	cfg Config
}

// startAPIServer is startAPI, with its metrics served on a free port (cfg.MetricsAddr).
func startAPIServer(t *testing.T) *apiServer {
	t.Helper()
	// The webhook port is held from before the API server starts until just before the manager
	// listens on it: envtest's own pick is free only when it picks it, and another test
	// package's server took it during the API server's start (bind: address already in use).
	hold, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	env := envtest.Start(t, envtest.Options{Webhooks: &crenvtest.WebhookInstallOptions{
		Paths:            []string{filepath.Join(envtest.RepoRoot(), "manifests", "webhook")},
		LocalServingHost: "127.0.0.1",
		LocalServingPort: hold.Addr().(*net.TCPAddr).Port,
	}})
	wio := env.Environment.WebhookInstallOptions
	cfg := DefaultConfig()
	cfg.Host, cfg.Port = wio.LocalServingHost, wio.LocalServingPort
	cfg.CertDir = t.TempDir()
	cfg.CertExtraNames = []string{wio.LocalServingHost}
	cfg.MetricsAddr, cfg.HealthAddr = envtest.FreeAddr(t), envtest.FreeAddr(t)
	cfg.SkipNameValidation = true
	// The gates the specs' hostDisk volumes need, in a holder the feature gate spec swaps live.
	if cfg.FeatureGates, err = featuregate.NewSet(featuregate.HostDisk, featuregate.HostDevices); err != nil {
		t.Fatal(err)
	}
	cfg.LiveFeatureGates = featuregate.NewLive(cfg.FeatureGates)
	mgr, err := NewManager(leastPrivileged(t, env), cfg)
	if err != nil {
		t.Fatal(err)
	}
	_ = hold.Close()
	envtest.RunManager(t, mgr)

	c := env.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "vms"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	// The webhooks answer once the server listens and the API server trusts the injected CA.
	deadline := time.Now().Add(60 * time.Second)
	for {
		probe := vmi("probe", minimalSpec())
		err := c.Create(context.Background(), probe, client.DryRunAll)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("webhooks not reachable: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + cfg.HealthAddr + path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", path, resp.Status)
		}
	}
	return &apiServer{env: env, cfg: cfg}
}

// leastPrivileged returns a config for a user granted only the roles in
// manifests/webhook/role.yaml (generated from the +kubebuilder:rbac markers: the ClusterRole, and
// the Role in kubevisor-system, which it creates, for the CA and handler Secrets), so that the
// tests prove the markers are enough.
func leastPrivileged(t *testing.T, env *envtest.Env) *rest.Config {
	t.Helper()
	const user = "kubevisor-api"
	data, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "manifests", "webhook", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(strings.TrimPrefix(string(data), "---\n"), "\n---\n")
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal([]byte(docs[0]), &role); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, doc := range docs[1:] {
		var r rbacv1.Role
		if err := yaml.Unmarshal([]byte(doc), &r); err != nil || r.Kind != "Role" {
			t.Fatalf("manifests/webhook/role.yaml: want a Role after the ClusterRole, got %q (%v)", r.Kind, err)
		}
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.Namespace}}
		binding := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: r.Namespace},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: r.Name},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}
		for _, o := range []client.Object{ns, &r, binding} {
			if err := env.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
	}
	return env.Impersonate(t, user, &role)
}

func vmi(name string, spec *v1alpha1.VirtualMachineInstanceSpec) *v1alpha1.VirtualMachineInstance {
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "vms"},
		Spec:       *spec,
	}
}

// causeAt says whether err is an Invalid API error with a cause at fieldPath whose message has detail.
func causeAt(err error, fieldPath, detail string) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || !apierrors.IsInvalid(err) || status.Status().Details == nil {
		return false
	}
	for _, c := range status.Status().Details.Causes {
		if c.Field == fieldPath && strings.Contains(c.Message, detail) {
			return true
		}
	}
	return false
}

func TestAdmissionThroughAPIServer(t *testing.T) {
	api := startAPIServer(t)
	c, certDir := api.env.Client, api.cfg.CertDir
	ctx := context.Background()

	// The webhook server and the metrics present the serving certificate of the certificate
	// directory, with TLS 1.2 or later.
	bundle, err := os.ReadFile(filepath.Join(certDir, certs.BundleFile))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(bundle)
	webhookAddr := net.JoinHostPort(api.cfg.Host, strconv.Itoa(api.cfg.Port))
	t.Run("the webhook server refuses TLS 1.1", func(t *testing.T) {
		tlstest.RefusesTLS11(t, webhookAddr, &tls.Config{RootCAs: roots})
	})
	t.Run("the metrics refuse TLS 1.1", func(t *testing.T) {
		tlstest.RefusesTLS11(t, api.cfg.MetricsAddr, &tls.Config{RootCAs: roots})
	})
	t.Run("the metrics are served to a scraper's token only", func(t *testing.T) {
		// kubevisor-api runs with its generated roles only: they must let it review tokens.
		if code, body, err := envtest.GetMetrics(api.cfg.MetricsAddr, "", roots); err != nil || code != http.StatusUnauthorized {
			t.Fatalf("no token: %d %v %.200s, want 401", code, err, body)
		}
		if code, body, err := envtest.GetMetrics(api.cfg.MetricsAddr, api.env.ServiceAccountToken(t, "monitoring", "stranger"), roots); err != nil || code != http.StatusForbidden {
			t.Fatalf("a ServiceAccount without the reader role: %d %v %.200s, want 403", code, err, body)
		}
		code, body, err := envtest.GetMetrics(api.cfg.MetricsAddr, api.env.MetricsReaderToken(t, "monitoring", "prometheus"), roots)
		if err != nil || code != http.StatusOK || !strings.Contains(body, "controller_runtime_webhook_requests_total") {
			t.Fatalf("a scraper's token: %d %v %.200s, want 200 with the webhook metrics", code, err, body)
		}
	})

	t.Run("the webhook configurations carry kubevisor-api's CA, not envtest's", func(t *testing.T) {
		bundle, err := os.ReadFile(filepath.Join(certDir, certs.BundleFile))
		if err != nil {
			t.Fatal(err)
		}
		var mwc admissionregistrationv1.MutatingWebhookConfiguration
		if err := c.Get(ctx, client.ObjectKey{Name: DefaultMutatingConfigName}, &mwc); err != nil {
			t.Fatal(err)
		}
		var vwc admissionregistrationv1.ValidatingWebhookConfiguration
		if err := c.Get(ctx, client.ObjectKey{Name: DefaultValidatingConfigName}, &vwc); err != nil {
			t.Fatal(err)
		}
		var got [][]byte
		for _, w := range mwc.Webhooks {
			got = append(got, w.ClientConfig.CABundle)
		}
		for _, w := range vwc.Webhooks {
			got = append(got, w.ClientConfig.CABundle)
		}
		if len(got) != 8 {
			t.Fatalf("%d webhooks, want 3 mutating and 5 validating", len(got))
		}
		for i, b := range got {
			if !bytes.Equal(b, bundle) {
				t.Fatalf("webhook %d has another CA bundle", i)
			}
		}
		// The CA is the one of the CA Secret, which kubevisor-api made (--manage-ca).
		var sec corev1.Secret
		if err := c.Get(ctx, client.ObjectKey{Namespace: DefaultServiceNamespace, Name: certs.DefaultCASecret}, &sec); err != nil {
			t.Fatal(err)
		}
		ca, err := os.ReadFile(filepath.Join(certDir, certs.CAFile))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(ca, sec.Data[corev1.TLSCertKey]) || !bytes.Equal(bundle, sec.Data[certs.BundleKey]) {
			t.Fatal("the certificate directory's CA is not the CA Secret's")
		}
	})

	// The default class is found through the API.
	class := &v1alpha1.HypervisorClass{
		ObjectMeta: metav1.ObjectMeta{Name: "qemu", Annotations: map[string]string{v1alpha1.IsDefaultHypervisorClassAnnotation: "true"}},
		Driver:     "qmp",
	}
	if err := c.Create(ctx, class); err != nil {
		t.Fatal(err)
	}

	t.Run("class parameters are refused, not ignored", func(t *testing.T) {
		err := c.Create(ctx, &v1alpha1.HypervisorClass{
			ObjectMeta: metav1.ObjectMeta{Name: "with-parameters"},
			Driver:     "qmp",
			Parameters: map[string]string{"machine": "q35"},
		})
		if err == nil || !strings.Contains(err.Error(), "parameters") || !strings.Contains(err.Error(), "no hypervisor driver of this release takes class parameters") {
			t.Fatalf("want the class refused at parameters, got %v", err)
		}
	})

	t.Run("what the namespace's Pod Security level would not run is refused, naming the level and why", func(t *testing.T) {
		for _, level := range []string{"restricted", "baseline", "privileged"} {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ps-" + level, Labels: map[string]string{"pod-security.kubernetes.io/enforce": level}}}
			if err := c.Create(ctx, ns); err != nil {
				t.Fatal(err)
			}
		}
		// A class whose launcher keeps capabilities (libvirt's SETUID and SETGID) runs its pods
		// as root: baseline admits them, restricted does not.
		if err := c.Create(ctx, &v1alpha1.HypervisorClass{ObjectMeta: metav1.ObjectMeta{Name: "with-caps"}, Driver: "qmp",
			LauncherCapabilities: []corev1.Capability{"SETUID", "SETGID"}}); err != nil {
			t.Fatal(err)
		}
		in := func(ns string, o client.Object) client.Object { o.SetNamespace(ns); return o }
		withCaps := minimalSpec()
		withCaps.HypervisorClassName = "with-caps"
		hostDisk := minimalSpec()
		hostDisk.Volumes[0].VolumeSource = v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/var/lib/images/root.img", Type: v1alpha1.HostDiskExists}}
		for _, tc := range []struct {
			ns   string
			obj  client.Object
			path string
			want []string // "" accepted
		}{
			// The default class's launcher pods are unprivileged: every level admits them.
			{"ps-restricted", in("ps-restricted", vmi("a", minimalSpec())), "", nil},
			{"ps-baseline", in("ps-baseline", vmi("a", minimalSpec())), "", nil},
			{"ps-privileged", in("ps-privileged", vmi("a", minimalSpec())), "", nil},
			{"ps-restricted", in("ps-restricted", vmi("caps", withCaps)), "spec",
				[]string{`Pod Security "restricted:latest"`, "HypervisorClass with-caps", "runAsNonRoot != true", "unrestricted capabilities", "enforces baseline"}},
			{"ps-baseline", in("ps-baseline", vmi("caps", withCaps)), "", nil},
			// A hostDisk needs a hostPath volume, which neither level admits.
			{"ps-restricted", in("ps-restricted", vmi("hd", hostDisk)), "spec",
				[]string{`Pod Security "restricted:latest"`, `restricted volume type "hostPath"`, "enforces privileged"}},
			{"ps-baseline", in("ps-baseline", vmi("hd", hostDisk)), "spec", []string{`Pod Security "baseline:latest"`, "hostPath volumes", "enforces privileged"}},
			{"ps-restricted", &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ps-restricted"},
				Spec: v1alpha1.VirtualMachineSpec{Running: ptr.To(false), Template: &v1alpha1.VirtualMachineInstanceTemplateSpec{Spec: *hostDisk}}},
				"spec.template.spec", []string{`Pod Security "restricted:latest"`, `restricted volume type "hostPath"`}},
		} {
			err := c.Create(ctx, tc.obj, client.DryRunAll)
			kind := fmt.Sprintf("%T in %s", tc.obj, tc.ns)
			if tc.want == nil {
				if err != nil {
					t.Errorf("%s: %v, want it admitted", kind, err)
				}
				continue
			}
			for _, w := range tc.want {
				if !causeAt(err, tc.path, w) {
					t.Errorf("%s: %v, want Invalid at %s holding %q", kind, err, tc.path, w)
				}
			}
		}
	})

	t.Run("disk without volume is rejected with its field path", func(t *testing.T) {
		s := minimalSpec()
		s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, v1alpha1.Disk{Name: "data"})
		err := c.Create(ctx, vmi("no-volume", s))
		if !causeAt(err, "spec.domain.devices.disks[1].name", "Not found") {
			t.Fatalf("want Invalid at spec.domain.devices.disks[1].name, got %v", err)
		}
		if !strings.Contains(err.Error(), "spec.domain.devices.disks[1].name") {
			t.Fatalf("the message does not name the field: %v", err)
		}
	})

	t.Run("unsupported field is rejected with not supported", func(t *testing.T) {
		s := minimalSpec()
		s.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{CDRom: &v1alpha1.CDRomTarget{Tray: v1alpha1.TrayStateOpen}}
		err := c.Create(ctx, vmi("open-tray", s))
		if !causeAt(err, "spec.domain.devices.disks[0].cdrom.tray", "not supported") {
			t.Fatalf("got %v", err)
		}
	})

	t.Run("a lun on a hostDisk is admitted on scsi; on a containerDisk, with a reservation or with a disk it is refused", func(t *testing.T) {
		s := minimalSpec()
		s.Volumes[0].VolumeSource = v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/dev/sdb", Type: v1alpha1.HostDiskExists}}
		s.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{LUN: &v1alpha1.LunTarget{ReadOnly: true}}
		if err := c.Create(ctx, vmi("lun", s)); err != nil {
			t.Fatal(err)
		}
		var got v1alpha1.VirtualMachineInstance
		if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: "lun"}, &got); err != nil {
			t.Fatal(err)
		}
		if l := got.Spec.Domain.Devices.Disks[0].LUN; l == nil || l.Bus != v1alpha1.DiskBusSCSI || !l.ReadOnly || got.Spec.Domain.Devices.Disks[0].Disk != nil {
			t.Errorf("disk %+v, want a read-only lun on scsi", got.Spec.Domain.Devices.Disks[0])
		}

		s = minimalSpec()
		s.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{LUN: &v1alpha1.LunTarget{}}
		err := c.Create(ctx, vmi("lun-on-containerdisk", s))
		if !causeAt(err, "spec.domain.devices.disks[0].lun", "a lun needs a SCSI block device: only a hostDisk of type Disk can be one") {
			t.Fatalf("got %v", err)
		}

		s = minimalSpec()
		s.Domain.Devices.Disks[0].DiskDevice = v1alpha1.DiskDevice{Disk: &v1alpha1.DiskTarget{}, LUN: &v1alpha1.LunTarget{}}
		if err := c.Create(ctx, vmi("disk-and-lun", s)); err == nil || !strings.Contains(err.Error(), "disk, cdrom and lun are mutually exclusive") {
			t.Fatalf("got %v", err)
		}

		u := object(t, vmiKind, "lun-reservation", `
domain:
  resources: {requests: {memory: 128Mi}}
  devices:
    disks: [{name: root, lun: {bus: scsi, reservation: true}}]
volumes: [{name: root, hostDisk: {path: /dev/sdb, type: Disk}}]
`, "spec")
		err = c.Create(ctx, u, client.FieldValidation(metav1.FieldValidationStrict))
		if !causeAt(err, "spec.domain.devices.disks[0].lun.reservation", "not supported by Kubevisor: SCSI persistent reservations go through qemu-pr-helper") {
			t.Fatalf("got %v", err)
		}
	})

	t.Run("feature gates: a live configuration without HostDisk refuses a hostDisk, with it admits, no restart", func(t *testing.T) {
		// The applier kubevisor-api's live configuration watcher runs, on the manager's holder.
		apply := liveconfig.FeatureGates(api.cfg.LiveFeatureGates, api.cfg.FeatureGates, logr.Discard())
		defer apply(liveconfig.New()) // the flag's again: HostDisk and HostDevices
		s := minimalSpec()
		s.Volumes[0].VolumeSource = v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/var/lib/images/root.img", Type: v1alpha1.HostDiskExists}}
		live := liveconfig.New()
		live.FeatureGates = []string{featuregate.HostDevices, featuregate.LiveMigration}
		apply(live)
		err := c.Create(ctx, vmi("gated-hostdisk", s), client.DryRunAll)
		if !causeAt(err, "spec.volumes[0].hostDisk", "feature gate HostDisk is not enabled (add it to the Kubevisor's spec.configuration.featureGates)") {
			t.Fatalf("HostDisk off: got %v", err)
		}
		live.FeatureGates = append(live.FeatureGates, featuregate.HostDisk)
		apply(live)
		if err := c.Create(ctx, vmi("gated-hostdisk", s), client.DryRunAll); err != nil {
			t.Fatalf("HostDisk on: %v", err)
		}
	})

	t.Run("access credentials and DNS settings are admitted and kept", func(t *testing.T) {
		s := minimalSpec()
		withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config\npackages: [vim]\n"})
		s.AccessCredentials = []v1alpha1.AccessCredential{sshKey("my-keys", true, false)}
		s.DNSPolicy = corev1.DNSNone
		s.DNSConfig = &corev1.PodDNSConfig{Nameservers: []string{"10.96.0.10"}, Searches: []string{"example.org"}}
		if err := c.Create(ctx, vmi("with-keys", s)); err != nil {
			t.Fatal(err)
		}
		var got v1alpha1.VirtualMachineInstance
		if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: "with-keys"}, &got); err != nil {
			t.Fatal(err)
		}
		ac := got.Spec.AccessCredentials
		if len(ac) != 1 || ac[0].SSHPublicKey == nil || ac[0].SSHPublicKey.Source.Secret.SecretName != "my-keys" ||
			ac[0].SSHPublicKey.PropagationMethod.NoCloud == nil {
			t.Errorf("accessCredentials %+v, want my-keys by noCloud", ac)
		}
		if got.Spec.DNSPolicy != corev1.DNSNone || got.Spec.DNSConfig == nil || len(got.Spec.DNSConfig.Nameservers) != 1 {
			t.Errorf("dnsPolicy %q dnsConfig %+v", got.Spec.DNSPolicy, got.Spec.DNSConfig)
		}
	})

	t.Run("access credentials into a script are refused at the volume", func(t *testing.T) {
		s := minimalSpec()
		withCloudInit(s, &v1alpha1.CloudInitNoCloudSource{UserData: "#!/bin/sh\necho hi\n"})
		s.AccessCredentials = []v1alpha1.AccessCredential{sshKey("my-keys", true, false)}
		err := c.Create(ctx, vmi("keys-into-script", s))
		if !causeAt(err, "spec.volumes[1].cloudInitNoCloud.userData", "not cloud-config") {
			t.Fatalf("got %v", err)
		}
	})

	t.Run("DHCP options are admitted and kept, NTP servers in canonical form", func(t *testing.T) {
		s := minimalSpec()
		s.Networks = []v1alpha1.Network{{Name: "pod", NetworkSource: v1alpha1.NetworkSource{Pod: &v1alpha1.PodNetwork{}}}}
		s.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "pod", DHCPOptions: &v1alpha1.DHCPOptions{
			BootFileName: "pxelinux.0", TFTPServerName: "tftp.example.org", NTPServers: []string{"192.0.2.1", "010.0.0.1"},
			PrivateOptions: []v1alpha1.DHCPPrivateOptions{{Option: 224, Value: "a"}},
		}}}
		if err := c.Create(ctx, vmi("with-dhcp-options", s)); err != nil {
			t.Fatal(err)
		}
		var got v1alpha1.VirtualMachineInstance
		if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: "with-dhcp-options"}, &got); err != nil {
			t.Fatal(err)
		}
		o := got.Spec.Domain.Devices.Interfaces[0].DHCPOptions
		if o == nil || o.BootFileName != "pxelinux.0" || o.TFTPServerName != "tftp.example.org" || !slices.Equal(o.NTPServers, []string{"192.0.2.1", "10.0.0.1"}) ||
			len(o.PrivateOptions) != 1 || o.PrivateOptions[0] != (v1alpha1.DHCPPrivateOptions{Option: 224, Value: "a"}) {
			t.Errorf("dhcpOptions %+v", o)
		}
	})

	t.Run("DHCP options out of range are refused with their field paths", func(t *testing.T) {
		s := minimalSpec()
		s.Networks = []v1alpha1.Network{{Name: "pod", NetworkSource: v1alpha1.NetworkSource{Pod: &v1alpha1.PodNetwork{}}}}
		s.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "pod", DHCPOptions: &v1alpha1.DHCPOptions{
			NTPServers: []string{"192.0.2.1", "pool.ntp.org"},
		}}}
		err := c.Create(ctx, vmi("bad-ntp", s))
		if !causeAt(err, "spec.domain.devices.interfaces[0].dhcpOptions.ntpServers[1]", "must be an IPv4 address") {
			t.Fatalf("got %v", err)
		}
		// The CRD's schema refuses a private option code before the webhook sees it.
		s.Domain.Devices.Interfaces[0].DHCPOptions = &v1alpha1.DHCPOptions{PrivateOptions: []v1alpha1.DHCPPrivateOptions{{Option: 100, Value: "x"}}}
		err = c.Create(ctx, vmi("bad-private-option", s))
		if !causeAt(err, "spec.domain.devices.interfaces[0].dhcpOptions.privateOptions[0].option", "224") {
			t.Fatalf("got %v", err)
		}
	})

	t.Run("dnsPolicy None without a nameserver is refused", func(t *testing.T) {
		s := minimalSpec()
		s.DNSPolicy = corev1.DNSNone
		err := c.Create(ctx, vmi("dns-none", s))
		if !causeAt(err, "spec.dnsConfig.nameservers", "when dnsPolicy is None") {
			t.Fatalf("got %v", err)
		}
	})

	var admitted v1alpha1.VirtualMachineInstance
	t.Run("minimal VMI is admitted and defaulted", func(t *testing.T) {
		if err := c.Create(ctx, vmi("minimal", minimalSpec())); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: "minimal"}, &admitted); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(admitted.Finalizers, v1alpha1.TeardownFinalizer) {
			t.Errorf("finalizers %v, want %s added at admission", admitted.Finalizers, v1alpha1.TeardownFinalizer)
		}
		s := admitted.Spec
		if s.Domain.Machine == nil || s.Domain.Machine.Type != "q35" {
			t.Errorf("machine %+v, want q35", s.Domain.Machine)
		}
		if len(s.Networks) != 1 || s.Networks[0].Name != "default" || s.Networks[0].Pod == nil {
			t.Errorf("networks %+v, want the pod network", s.Networks)
		}
		if ifs := s.Domain.Devices.Interfaces; len(ifs) != 1 || ifs[0].Name != "default" || ifs[0].Masquerade == nil {
			t.Errorf("interfaces %+v, want a masquerade interface", ifs)
		}
		if d := s.Domain.Devices.Disks[0]; d.Disk == nil || d.Disk.Bus != v1alpha1.DiskBusVirtio {
			t.Errorf("disk %+v, want bus virtio", d)
		}
		if cpu := s.Domain.CPU; cpu == nil || cpu.Sockets != 1 || cpu.Cores != 1 || cpu.Threads != 1 {
			t.Errorf("cpu %+v, want 1/1/1", cpu)
		}
		if s.HypervisorClassName != "qemu" {
			t.Errorf("hypervisorClassName %q, want the default class qemu", s.HypervisorClassName)
		}
	})

	// The VMI spec's schema keeps unknown fields for admission to refuse them in Kubevisor's
	// words (TestKubeVirtFieldsRefusedThroughAPIServer has KubeVirt's); the rest of the object
	// is the API server's strict field validation's.
	t.Run("unknown field is rejected with its path", func(t *testing.T) {
		for _, tc := range []struct {
			fields []string
			check  func(error) bool
		}{
			{[]string{"spec", "bogus"}, func(err error) bool { return causeAt(err, "spec.bogus", kubevirtcompat.UnknownField) }},
			{[]string{"bogus"}, func(err error) bool { return err != nil && strings.Contains(err.Error(), `unknown field "bogus"`) }},
		} {
			u := &unstructured.Unstructured{}
			obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(vmi("unknown-field", minimalSpec()))
			if err != nil {
				t.Fatal(err)
			}
			u.SetUnstructuredContent(obj)
			u.SetGroupVersionKind(v1alpha1.VirtualMachineInstanceGroupVersionKind)
			if err := unstructured.SetNestedField(u.Object, "yes", tc.fields...); err != nil {
				t.Fatal(err)
			}
			if err := c.Create(ctx, u, client.FieldValidation(metav1.FieldValidationStrict)); !tc.check(err) {
				t.Fatalf("%s: got %v", strings.Join(tc.fields, "."), err)
			}
		}
	})

	t.Run("VMI spec is immutable, metadata is not", func(t *testing.T) {
		cur := admitted.DeepCopy()
		cur.Spec.Domain.Resources.Requests[corev1.ResourceMemory] = resource.MustParse("256Mi")
		err := c.Update(ctx, cur)
		if !causeAt(err, "spec", "immutable") {
			t.Fatalf("want Forbidden at spec, got %v", err)
		}
		cur = admitted.DeepCopy()
		cur.Labels = map[string]string{"team": "a"}
		if err := c.Update(ctx, cur); err != nil {
			t.Fatalf("label update: %v", err)
		}
	})

	t.Run("VM template is defaulted and validated", func(t *testing.T) {
		vm := &v1alpha1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "vms"},
			Spec: v1alpha1.VirtualMachineSpec{
				RunStrategy: ptr.To(v1alpha1.RunStrategyHalted),
				Template:    &v1alpha1.VirtualMachineInstanceTemplateSpec{Spec: *minimalSpec()},
			},
		}
		bad := vm.DeepCopy()
		bad.Name = "vm-bad"
		bad.Spec.Template.Spec.Volumes = append(bad.Spec.Template.Spec.Volumes, v1alpha1.Volume{Name: "unused",
			VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}})
		if err := c.Create(ctx, bad); !causeAt(err, "spec.template.spec.volumes[1].name", "not used") {
			t.Fatalf("want Invalid at spec.template.spec.volumes[1].name, got %v", err)
		}
		if err := c.Create(ctx, vm); err != nil {
			t.Fatal(err)
		}
		if vm.Spec.Template.Spec.Domain.Machine == nil || vm.Spec.Template.Spec.Domain.Machine.Type != "q35" ||
			len(vm.Spec.Template.Spec.Networks) != 1 {
			t.Fatalf("template not defaulted: %+v", vm.Spec.Template.Spec)
		}
	})

	t.Run("replica set template is defaulted and validated", func(t *testing.T) {
		rs := &v1alpha1.VirtualMachineInstanceReplicaSet{
			ObjectMeta: metav1.ObjectMeta{Name: "rs", Namespace: "vms"},
			Spec: v1alpha1.VirtualMachineInstanceReplicaSetSpec{
				Replicas: ptr.To[int32](0),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				Template: &v1alpha1.VirtualMachineInstanceTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "db"}},
					Spec:       *minimalSpec(),
				},
			},
		}
		if err := c.Create(ctx, rs.DeepCopy()); !causeAt(err, "spec.selector", "does not match") {
			t.Fatalf("want Invalid at spec.selector, got %v", err)
		}
		rs.Spec.Template.ObjectMeta.Labels["app"] = "web"
		if err := c.Create(ctx, rs); err != nil {
			t.Fatal(err)
		}
		if s := rs.Spec.Template.Spec; s.HypervisorClassName != "qemu" || len(s.Domain.Devices.Interfaces) != 1 {
			t.Fatalf("template not defaulted: %+v", s)
		}
	})

	t.Run("migration spec is immutable", func(t *testing.T) {
		m := &v1alpha1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{Name: "mig", Namespace: "vms"},
			Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "minimal"},
		}
		if err := c.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		m.Spec.VMIName = "other"
		if err := c.Update(ctx, m); !causeAt(err, "spec", "immutable") {
			t.Fatalf("want Forbidden at spec, got %v", err)
		}
	})
}

// Controller-runtime's components log through its delegating logger, which complains (with a
// stack trace) when no logger is set; the tests assert on behaviour, not on logs.
func init() { ctrllog.SetLogger(logr.Discard()) }
