package nodecerts

import (
	"context"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/kubevisor/kubevisor/controlplane/certs"
	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// The signer reads the requests of every signer (RBAC cannot narrow a list to one signerName;
// the cache asks for NodeSignerName's only), approves or denies them, and signs them: approve
// and sign are granted for its own signer name only, so it cannot approve or sign another
// signer's requests even if it tried.
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval;certificatesigningrequests/status,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,resourceNames=kubevisor.io/node-migration,verbs=approve;sign

// Signer approves, denies and signs the CertificateSigningRequests of nodeapi.NodeSignerName
// (see the package doc). It is a controller-runtime reconciler of those requests.
type Signer struct {
	// Client reads the requests (the manager's cache, narrowed by CacheByObject) and writes
	// their approval and status.
	Client client.Client
	// CertDir is kubevisor-api's certificate directory, whose current CA signs (certs.LoadCA).
	CertDir string
	// Requester is the only requester approved (Requester of the install namespace).
	Requester string
	// MaxLifetime bounds a certificate's lifetime; nodeapi.NodeCertMaxLifetime when 0.
	MaxLifetime time.Duration
	// Now returns the current time; time.Now when nil.
	Now func() time.Time
}

// CacheByObject narrows a manager's cache of CertificateSigningRequests to those of
// nodeapi.NodeSignerName (the API server filters on spec.signerName).
func CacheByObject() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&certv1.CertificateSigningRequest{}: {Field: fields.OneTermEqualSelector("spec.signerName", nodeapi.NodeSignerName)},
	}
}

// SetupWithManager registers the signer with mgr, whose cache should be narrowed with
// CacheByObject.
func (s *Signer) SetupWithManager(mgr ctrl.Manager) error {
	if s.Requester == "" || s.CertDir == "" {
		return errors.New("node certificate signer: the requester and the certificate directory are required")
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodecerts").
		For(&certv1.CertificateSigningRequest{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			csr, ok := o.(*certv1.CertificateSigningRequest)
			return ok && csr.Spec.SignerName == nodeapi.NodeSignerName
		}))).
		Complete(s)
}

// Reconcile decides a pending request (approves or denies it) and signs an approved one that
// has no certificate yet. A request that is denied, failed or issued is left alone.
func (s *Signer) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	var csr certv1.CertificateSigningRequest
	if err := s.Client.Get(ctx, req.NamespacedName, &csr); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if csr.Spec.SignerName != nodeapi.NodeSignerName || len(csr.Status.Certificate) > 0 ||
		hasCondition(&csr, certv1.CertificateDenied) || hasCondition(&csr, certv1.CertificateFailed) {
		return ctrl.Result{}, nil
	}
	now := s.now()
	d := Decide(&csr, s.Requester)
	if !hasCondition(&csr, certv1.CertificateApproved) {
		typ := certv1.CertificateApproved
		if !d.Approved {
			typ = certv1.CertificateDenied
		}
		csr.Status.Conditions = append(csr.Status.Conditions, condition(typ, d.Reason, d.Message, now))
		if err := s.Client.SubResource("approval").Update(ctx, &csr); err != nil {
			return ctrl.Result{}, fmt.Errorf("%s %s: %w", map[bool]string{true: "approve", false: "deny"}[d.Approved], csr.Name, err)
		}
		log.Info("node certificate request "+map[bool]string{true: "approved", false: "denied"}[d.Approved],
			"csr", csr.Name, "requester", csr.Spec.Username, "reason", d.Reason, "message", d.Message)
		if !d.Approved {
			return ctrl.Result{}, nil
		}
	} else if !d.Approved {
		// Approved by someone else, and not a request this signer would approve: not signed.
		return ctrl.Result{}, s.fail(ctx, &csr, d.Reason, "approved, but not signed: "+d.Message, now)
	}

	ca, err := certs.LoadCA(s.CertDir)
	if err != nil {
		// No CA yet, or one half rotated: retried with backoff.
		return ctrl.Result{}, fmt.Errorf("sign %s: %w", csr.Name, err)
	}
	maxLife := s.MaxLifetime
	if maxLife <= 0 {
		maxLife = nodeapi.NodeCertMaxLifetime
	}
	cert, err := ca.Issue(d.PublicKey, pkix.Name{CommonName: nodeapi.NodeCommonName(d.Node)}, ExtKeyUsages, Lifetime(&csr, maxLife), now)
	if err != nil {
		return ctrl.Result{}, s.fail(ctx, &csr, ReasonSigningFailed, err.Error(), now)
	}
	csr.Status.Certificate = cert
	if err := s.Client.Status().Update(ctx, &csr); err != nil {
		return ctrl.Result{}, fmt.Errorf("sign %s: %w", csr.Name, err)
	}
	log.Info("node certificate issued", "csr", csr.Name, "node", d.Node, "lifetime", Lifetime(&csr, maxLife).String())
	return ctrl.Result{}, nil
}

// fail sets the Failed condition (the request is not signed, and not looked at again).
func (s *Signer) fail(ctx context.Context, csr *certv1.CertificateSigningRequest, reason, message string, now time.Time) error {
	csr.Status.Conditions = append(csr.Status.Conditions, condition(certv1.CertificateFailed, reason, message, now))
	if err := s.Client.Status().Update(ctx, csr); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("mark %s failed: %w", csr.Name, err)
	}
	ctrl.LoggerFrom(ctx).Info("node certificate request failed", "csr", csr.Name, "reason", reason, "message", message)
	return nil
}

func (s *Signer) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func condition(typ certv1.RequestConditionType, reason, message string, now time.Time) certv1.CertificateSigningRequestCondition {
	return certv1.CertificateSigningRequestCondition{
		Type: typ, Status: corev1.ConditionTrue, Reason: reason, Message: message,
		LastUpdateTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now),
	}
}

func hasCondition(csr *certv1.CertificateSigningRequest, typ certv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == typ && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
