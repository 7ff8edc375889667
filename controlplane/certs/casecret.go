package certs

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The CA Secret. A CA kept in a process's certificate directory dies with the process: the
// next one makes another, and until every party has the new bundle (the API server at once,
// through the injection; the handlers only when the kubelet refreshes their mounted Secret,
// a minute or more) the control plane cannot reach the handlers. A CA kept in a Secret outlives
// every process that uses it: a restarted or upgraded kubevisor-api issues its certificates from
// the same CA, and nobody has to learn a new bundle.
//
// Keys of the Secret (type kubernetes.io/tls):
//
//	tls.crt        the current CA certificate
//	tls.key        its key
//	ca-bundle.crt  the CA bundle: the current CA, and the previous one while it is valid
//
// Who keeps it: kubevisor-operator when it installs (it owns the CA, and renders kubevisor-api
// with --manage-ca=false), otherwise kubevisor-api itself (--manage-ca, the default). Either calls
// EnsureCA; kubevisor-api copies the Secret into its certificate directory (SyncCA) and issues
// its certificates with Options.ExternalCA.
//
// Rotation without dropping a client. EnsureCA replaces the CA once a certificate issued now
// would outlive it (it has less than Options.Lifetime left), and keeps the previous CA in the
// bundle until it expires. Every certificate of the previous CA was issued before the rotation
// with at most Lifetime, so it expires before the previous CA does; with ExternalCA
// kubevisor-api keeps serving such a certificate until it is due, by which time every party has
// had the bundle holding both CAs for a while (kubevisor-api injects it within its check
// interval, a minute; the handlers' Secret carries it from the same check).

// BundleKey is the key of the CA bundle in the CA Secret.
const BundleKey = "ca-bundle.crt"

// DefaultCASecret is the CA Secret of the install namespace.
const DefaultCASecret = "kubevisor-ca"

// The CA Secret, in the install namespace only: create cannot be limited to a name (and is
// granted by secret.go's marker), get and update are.
// +kubebuilder:rbac:groups="",namespace=kubevisor-system,resources=secrets,resourceNames=kubevisor-ca,verbs=get;update

// CASecret names the Secret that holds the CA.
type CASecret struct {
	// Client reads and writes it; better not a cache (one read per check).
	Client client.Client
	// Namespace and Name of the Secret.
	Namespace, Name string
}

// EnsureCA makes s hold a CA that outlives a certificate issued now with o.Lifetime, making one
// of o.CALifetime when the Secret is missing, holds no CA, or holds one that is due; the bundle
// then keeps the previous CA while it is valid. Only o's lifetimes and Now are used (o.Dir and
// the names may be empty). It returns when the CA is next due, and whether it made a new one. A
// concurrent writer makes the create or update fail; the caller's next check starts again.
func EnsureCA(ctx context.Context, o Options, s CASecret) (renewAt time.Time, rotated bool, err error) {
	o, err = o.lifetimes()
	if err != nil {
		return time.Time{}, false, err
	}
	if s.Client == nil || s.Namespace == "" || s.Name == "" {
		return time.Time{}, false, errors.New("CA secret client, namespace and name are required")
	}
	now := o.Now()
	var sec corev1.Secret
	key := client.ObjectKey{Namespace: s.Namespace, Name: s.Name}
	exists := true
	if err := s.Client.Get(ctx, key, &sec); apierrors.IsNotFound(err) {
		exists = false
	} else if err != nil {
		return time.Time{}, false, fmt.Errorf("get CA secret %s: %w", key, err)
	}
	var ca *keyPair
	if exists {
		ca, _ = parsePair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	}
	if ca != nil && ca.cert.IsCA && !now.Add(o.Lifetime).After(ca.cert.NotAfter) {
		if !bytes.Contains(sec.Data[BundleKey], ca.certPEM) {
			// The bundle lost the current CA (edited by hand): put it back, keeping the rest.
			sec.Data[BundleKey] = joinBundle(ca, parseCerts(sec.Data[BundleKey]), now)
			if err := s.Client.Update(ctx, &sec); err != nil {
				return time.Time{}, false, fmt.Errorf("update CA secret %s: %w", key, err)
			}
		}
		return ca.cert.NotAfter.Add(-o.Lifetime), false, nil
	}

	var previous []*x509.Certificate
	if ca != nil && ca.cert.IsCA {
		previous = append(previous, ca.cert)
	}
	if exists {
		previous = append(previous, parseCerts(sec.Data[BundleKey])...)
	}
	next, err := newCA(now, o.CALifetime)
	if err != nil {
		return time.Time{}, false, err
	}
	data := map[string][]byte{
		corev1.TLSCertKey:       next.certPEM,
		corev1.TLSPrivateKeyKey: next.keyPEM,
		BundleKey:               joinBundle(next, previous, now),
	}
	switch {
	case !exists:
		sec = corev1.Secret{Type: corev1.SecretTypeTLS, Data: data}
		sec.Namespace, sec.Name = s.Namespace, s.Name
		if err := s.Client.Create(ctx, &sec); err != nil {
			return time.Time{}, false, fmt.Errorf("create CA secret %s: %w", key, err)
		}
	case sec.Type != corev1.SecretTypeTLS:
		// The type is immutable: start again with a Secret of the right one (at the next check).
		if err := s.Client.Delete(ctx, &sec, client.Preconditions{UID: &sec.UID, ResourceVersion: &sec.ResourceVersion}); err != nil && !apierrors.IsNotFound(err) {
			return time.Time{}, false, fmt.Errorf("delete CA secret %s of type %q: %w", key, sec.Type, err)
		}
		return time.Time{}, false, fmt.Errorf("CA secret %s was of type %q; deleted, to be made again", key, sec.Type)
	default:
		sec.Data = data
		if err := s.Client.Update(ctx, &sec); err != nil {
			return time.Time{}, false, fmt.Errorf("update CA secret %s: %w", key, err)
		}
	}
	return next.cert.NotAfter.Add(-o.Lifetime), true, nil
}

// SyncCA copies the CA of s into dir (ca.crt, ca.key and ca-bundle.crt, each written only when
// it differs), for Ensure with Options.ExternalCA and for LoadCA. It fails, naming the Secret,
// when the Secret is missing or holds no CA; dir is then left as it was. changed says it wrote
// a new CA.
func SyncCA(ctx context.Context, dir string, s CASecret) (changed bool, err error) {
	key := client.ObjectKey{Namespace: s.Namespace, Name: s.Name}
	var sec corev1.Secret
	if err := s.Client.Get(ctx, key, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return false, fmt.Errorf("CA secret %s not found: it is made by kubevisor-operator, or by kubevisor-api with --manage-ca", key)
		}
		return false, fmt.Errorf("get CA secret %s: %w", key, err)
	}
	ca, err := parsePair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return false, fmt.Errorf("CA secret %s: tls.crt and tls.key: %w", key, err)
	}
	if !ca.cert.IsCA {
		return false, fmt.Errorf("CA secret %s: tls.crt is not a CA certificate", key)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("create certificate directory: %w", err)
	}
	b := sec.Data[BundleKey]
	if !bytes.Contains(b, ca.certPEM) {
		b = append(bytes.Clone(ca.certPEM), b...)
	}
	// The bundle first, then the key, then the certificate: a reader that sees the new CA
	// already trusts it, and LoadCA refuses a half-written pair.
	if err := writeIfDiffers(filepath.Join(dir, BundleFile), b, 0o644); err != nil {
		return false, err
	}
	if old, _ := readPair(filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile)); old != nil && old.cert.Equal(ca.cert) {
		return false, nil
	}
	if err := writeAtomic(filepath.Join(dir, CAKeyFile), ca.keyPEM, 0o600); err != nil {
		return false, err
	}
	if err := writeAtomic(filepath.Join(dir, CAFile), ca.certPEM, 0o644); err != nil {
		return false, err
	}
	return true, nil
}

// writeIfDiffers replaces path with data (writeAtomic) unless it holds data already.
func writeIfDiffers(path string, data []byte, mode os.FileMode) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return writeAtomic(path, data, mode)
}
