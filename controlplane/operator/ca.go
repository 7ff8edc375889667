package operator

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/controlplane/certs"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// The operator owns the control plane's CA: it keeps it in the Secret certs.DefaultCASecret of
// kubevisor-system (certs.EnsureCA: made before the first kubevisor-api starts, renewed before a
// certificate issued from it could outlive it, the previous CA kept in the bundle while valid),
// and renders kubevisor-api with --manage-ca=false. kubevisor-api issues every certificate from
// it (its serving certificate, its client certificate, the handlers' serving certificate and
// their node certificates), so a restarted or upgraded kubevisor-api issues from the same CA and
// no party must learn a new bundle. The Secret goes at uninstall.
//
// Create cannot be limited to a name; get, update and delete are.
// +kubebuilder:rbac:groups="",namespace=kubevisor-system,resources=secrets,verbs=create
// +kubebuilder:rbac:groups="",namespace=kubevisor-system,resources=secrets,resourceNames=kubevisor-ca,verbs=get;update;delete

// caOptions are the lifetimes of spec's certificateRotateStrategy, as kubevisor-api is given
// them (certFlags): the CA must outlive the certificates kubevisor-api issues from it.
func caOptions(spec *v1alpha1.KubevisorSpec) certs.Options {
	var o certs.Options
	if c := spec.CertificateRotateStrategy; c != nil && c.SelfSigned != nil {
		ss := c.SelfSigned
		if ss.CertDuration != nil {
			o.Lifetime = ss.CertDuration.Duration
		}
		if ss.RenewBefore != nil {
			o.RenewBefore = ss.RenewBefore.Duration
		}
		if ss.CADuration != nil {
			o.CALifetime = ss.CADuration.Duration
		}
	}
	return o
}

// ensureCA keeps the CA Secret for spec and says when to look at it again.
func (r *Reconciler) ensureCA(ctx context.Context, spec *v1alpha1.KubevisorSpec) (time.Duration, error) {
	renewAt, rotated, err := certs.EnsureCA(ctx, caOptions(spec), r.caSecret())
	if err != nil {
		return 0, err
	}
	if rotated {
		r.log(ctx).Info("made a new CA", "secret", Namespace+"/"+certs.DefaultCASecret, "due", renewAt)
	}
	return max(time.Until(renewAt), time.Second), nil
}

func (r *Reconciler) caSecret() certs.CASecret {
	return certs.CASecret{Client: r.Client, Namespace: Namespace, Name: certs.DefaultCASecret}
}

// deleteCA removes the CA Secret (at uninstall).
func (r *Reconciler) deleteCA(ctx context.Context) error {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: certs.DefaultCASecret}}
	if err := r.Client.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the CA secret: %w", err)
	}
	return nil
}
