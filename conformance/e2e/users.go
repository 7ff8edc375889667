package e2e

import (
	"context"
	"fmt"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// ServiceAccount creates a ServiceAccount in the spec's namespace.
func (f *Framework) ServiceAccount(ctx context.Context, name string) *corev1.ServiceAccount {
	GinkgoHelper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.Namespace}}
	Expect(f.Client.Create(ctx, sa)).To(Succeed())
	return sa
}

// BindClusterRole binds a ClusterRole to the ServiceAccount in the spec's namespace (a
// RoleBinding: the role's rules apply in this namespace only).
func (f *Framework) BindClusterRole(ctx context.Context, sa *corev1.ServiceAccount, clusterRole string) {
	GinkgoHelper()
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{GenerateName: sa.Name + "-", Namespace: f.Namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}},
	}
	Expect(f.Client.Create(ctx, rb)).To(Succeed())
}

// KubeconfigFor writes a kubeconfig that reaches the suite's cluster as the ServiceAccount,
// with a token from the TokenRequest API, and returns its path (in the spec's temporary
// directory).
func (f *Framework) KubeconfigFor(ctx context.Context, sa *corev1.ServiceAccount) string {
	GinkgoHelper()
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	Expect(f.Client.SubResource("token").Create(ctx, sa, tr)).To(Succeed())
	Expect(tr.Status.Token).NotTo(BeEmpty())
	rc, err := restConfig(Cfg.Kubeconfig)
	Expect(err).NotTo(HaveOccurred())
	path := filepath.Join(GinkgoT().TempDir(), sa.Name+".kubeconfig")
	Expect(clientcmd.WriteToFile(tokenKubeconfig(rc, sa.Name, tr.Status.Token, f.Namespace), path)).To(Succeed())
	return path
}

// restConfig loads a kubeconfig ("" : $KUBECONFIG or ~/.kube/config).
func restConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return rc, nil
}

// tokenKubeconfig is a kubeconfig for the server of rc (its address and how it is trusted)
// with a bearer token as the only credential, in namespace.
func tokenKubeconfig(rc *rest.Config, user, token, namespace string) clientcmdapi.Config {
	cluster := clientcmdapi.NewCluster()
	cluster.Server = rc.Host
	cluster.CertificateAuthorityData = rc.CAData
	cluster.CertificateAuthority = rc.CAFile
	cluster.InsecureSkipTLSVerify = rc.Insecure
	cluster.TLSServerName = rc.ServerName
	auth := clientcmdapi.NewAuthInfo()
	auth.Token = token
	kctx := clientcmdapi.NewContext()
	kctx.Cluster, kctx.AuthInfo, kctx.Namespace = "e2e", user, namespace
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = cluster
	cfg.AuthInfos[user] = auth
	cfg.Contexts[user] = kctx
	cfg.CurrentContext = user
	return *cfg
}
