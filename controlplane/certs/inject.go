package certs

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// InjectCABundle sets clientConfig.caBundle of every webhook of the named
// MutatingWebhookConfiguration and ValidatingWebhookConfiguration (an empty name skips that
// kind) to bundle. A configuration that does not exist is an error: the webhooks would not be
// called, and the installation is broken. Writes are merge patches with the resourceVersion,
// retried on conflict, and skipped when nothing changes.
func InjectCABundle(ctx context.Context, c client.Client, mutatingName, validatingName string, bundle []byte) error {
	if mutatingName != "" {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var cfg admissionregistrationv1.MutatingWebhookConfiguration
			if err := c.Get(ctx, client.ObjectKey{Name: mutatingName}, &cfg); err != nil {
				return err
			}
			orig := cfg.DeepCopy()
			changed := false
			for i := range cfg.Webhooks {
				changed = setBundle(&cfg.Webhooks[i].ClientConfig, bundle) || changed
			}
			if !changed {
				return nil
			}
			return c.Patch(ctx, &cfg, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
		})
		if err != nil {
			return fmt.Errorf("mutating webhook configuration %q: %w", mutatingName, describe(err))
		}
	}
	if validatingName != "" {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var cfg admissionregistrationv1.ValidatingWebhookConfiguration
			if err := c.Get(ctx, client.ObjectKey{Name: validatingName}, &cfg); err != nil {
				return err
			}
			orig := cfg.DeepCopy()
			changed := false
			for i := range cfg.Webhooks {
				changed = setBundle(&cfg.Webhooks[i].ClientConfig, bundle) || changed
			}
			if !changed {
				return nil
			}
			return c.Patch(ctx, &cfg, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
		})
		if err != nil {
			return fmt.Errorf("validating webhook configuration %q: %w", validatingName, describe(err))
		}
	}
	return nil
}

// APIServiceGVK is the kind of an aggregated API's registration. The APIService is handled as
// unstructured, which spares the module the aggregator's types for one field.
var APIServiceGVK = schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"}

// +kubebuilder:rbac:groups=apiregistration.k8s.io,resources=apiservices,resourceNames=v1alpha1.subresources.kubevisor.io,verbs=get;patch

// InjectAPIServiceCABundle sets spec.caBundle of the named APIService to bundle, with which
// the API server verifies the aggregated API's serving certificate. A missing APIService is an
// error; the write is a merge patch with the resourceVersion, retried on conflict, and skipped
// when nothing changes.
func InjectAPIServiceCABundle(ctx context.Context, c client.Client, name string, bundle []byte) error {
	want := base64.StdEncoding.EncodeToString(bundle)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc := &unstructured.Unstructured{}
		svc.SetGroupVersionKind(APIServiceGVK)
		if err := c.Get(ctx, client.ObjectKey{Name: name}, svc); err != nil {
			return err
		}
		if got, _, _ := unstructured.NestedString(svc.Object, "spec", "caBundle"); got == want {
			return nil
		}
		orig := svc.DeepCopy()
		if err := unstructured.SetNestedField(svc.Object, want, "spec", "caBundle"); err != nil {
			return err
		}
		return c.Patch(ctx, svc, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
	})
	if err != nil {
		return fmt.Errorf("APIService %q: %w", name, describe(err))
	}
	return nil
}

func setBundle(cc *admissionregistrationv1.WebhookClientConfig, bundle []byte) bool {
	if bytes.Equal(cc.CABundle, bundle) {
		return false
	}
	cc.CABundle = bytes.Clone(bundle)
	return true
}

func describe(err error) error {
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("not found (install manifests/install first): %w", err)
	}
	return err
}
