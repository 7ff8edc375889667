package certs

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// SecretCAKey is the key of a certificate Secret that holds the CA bundle (tls.crt and tls.key
// are corev1.TLSCertKey and corev1.TLSPrivateKeyKey).
const SecretCAKey = "ca.crt"

// SecretCert is a kubernetes.io/tls Secret in which EnsureSecret keeps a serving certificate
// issued by the CA of the certificate directory, for a component that has no CA of its own.
type SecretCert struct {
	// Client reads and writes the Secret; it should not be a cache (the Secret is read once per
	// check, and a cache would watch every Secret).
	Client client.Client
	// Namespace and Name of the Secret.
	Namespace, Name string
	// ServerName is the DNS name of the certificate (nodeapi.ServerName for the handlers).
	ServerName string
}

// The handlers' certificate Secret, in the install namespace only; create cannot be limited to
// a name, get/update/delete are.
// +kubebuilder:rbac:groups="",namespace=kubevisor-system,resources=secrets,verbs=create
// +kubebuilder:rbac:groups="",namespace=kubevisor-system,resources=secrets,resourceNames=kubevisor-handler-certs,verbs=get;update;delete

// EnsureSecret makes s's Secret hold, in tls.crt and tls.key, a serving certificate for
// s.ServerName signed by the current CA of st (st from Ensure with o) with more than
// o.RenewBefore left, and in ca.crt st.Bundle. It issues a new certificate when the Secret is
// missing, holds something else, is for another name, is due, or was signed by a previous CA
// (so after every CA rotation; whoever dials the certificate trusts the bundle, which already
// holds the new CA). It writes only what differs; a Secret of another type is replaced, since
// the type cannot change. It returns when the certificate is due for renewal, and whether it
// wrote a new one.
func EnsureSecret(ctx context.Context, o Options, st State, s SecretCert) (renewAt time.Time, rotated bool, err error) {
	o, err = o.withDefaults()
	if err != nil {
		return time.Time{}, false, err
	}
	if st.ca == nil {
		return time.Time{}, false, errors.New("no CA: the state must come from Ensure")
	}
	if s.Client == nil || s.Name == "" || s.Namespace == "" || s.ServerName == "" {
		return time.Time{}, false, errors.New("secret client, namespace, name and server name are required")
	}
	now := o.Now()
	spec := leafSpec{commonName: s.ServerName, names: []string{s.ServerName}, usage: x509.ExtKeyUsageServerAuth}

	var sec corev1.Secret
	key := client.ObjectKey{Namespace: s.Namespace, Name: s.Name}
	exists := true
	if err := s.Client.Get(ctx, key, &sec); apierrors.IsNotFound(err) {
		exists = false
	} else if err != nil {
		return time.Time{}, false, fmt.Errorf("get: %w", err)
	}
	if exists && sec.Type != corev1.SecretTypeTLS {
		// The type is immutable: start again with a Secret of the right one.
		if err := s.Client.Delete(ctx, &sec, client.Preconditions{UID: &sec.UID, ResourceVersion: &sec.ResourceVersion}); err != nil && !apierrors.IsNotFound(err) {
			return time.Time{}, false, fmt.Errorf("delete secret of type %q: %w", sec.Type, err)
		}
		exists = false
	}

	var leaf *keyPair
	if exists {
		leaf, _ = parsePair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	}
	data := map[string][]byte{}
	if exists {
		data = maps.Clone(sec.Data)
	}
	if !validLeaf(leaf, spec, []*x509.Certificate{st.ca.cert}, o.RenewBefore, now) {
		if leaf, err = newLeaf(st.ca, now, o.Lifetime, spec); err != nil {
			return time.Time{}, false, err
		}
		data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey] = leaf.certPEM, leaf.keyPEM
		rotated = true
	}
	data[SecretCAKey] = bytes.Clone(st.Bundle)
	renewAt = leaf.cert.NotAfter.Add(-o.RenewBefore)

	if !exists {
		sec = corev1.Secret{Type: corev1.SecretTypeTLS, Data: data}
		sec.Namespace, sec.Name = s.Namespace, s.Name
		sec.Labels = map[string]string{"app.kubernetes.io/managed-by": "kubevisor-api"}
		if err := s.Client.Create(ctx, &sec); err != nil {
			// A conflict (created meanwhile, or the delete not yet done) is retried at the next check.
			return time.Time{}, false, fmt.Errorf("create: %w", err)
		}
		return renewAt, true, nil
	}
	if maps.EqualFunc(data, sec.Data, bytes.Equal) {
		return renewAt, false, nil
	}
	// Update with the resourceVersion read: a concurrent writer makes this fail and the next
	// check start again.
	sec.Data = data
	if err := s.Client.Update(ctx, &sec); err != nil {
		return time.Time{}, false, fmt.Errorf("update: %w", err)
	}
	return renewAt, rotated, nil
}
