package webhook

import (
	"context"
	"errors"
	"net/http"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// An eviction whose pod the webhook cannot read is refused with 429 (the client retries),
// unless the pod does not exist: the pod may be the source of a migration.
func TestEvictionPodReadError(t *testing.T) {
	for _, c := range []struct {
		name    string
		err     error
		allowed bool
	}{
		{name: "not found: allowed", err: apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "p"), allowed: true},
		{name: "read failed: 429", err: errors.New("etcdserver: request timed out")},
	} {
		t.Run(c.name, func(t *testing.T) {
			reader := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
				Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
					return c.err
				},
			}).Build()
			e := &Eviction{Reader: reader, Writer: reader}
			resp := e.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
				SubResource: "eviction", Namespace: "ns", Name: "p", Operation: admissionv1.Create,
			}})
			if resp.Allowed != c.allowed {
				t.Fatalf("allowed %v, want %v (%+v)", resp.Allowed, c.allowed, resp.Result)
			}
			if !c.allowed && (resp.Result == nil || resp.Result.Code != http.StatusTooManyRequests) {
				t.Errorf("result %+v, want 429", resp.Result)
			}
		})
	}
}
