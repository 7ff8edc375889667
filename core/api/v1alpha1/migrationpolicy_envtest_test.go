package v1alpha1_test

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
)

// TestMigrationPolicyValidation checks against a real API server that the MigrationPolicy CRD
// refuses a negative bandwidth, a completion timeout below 1 and a policy without selectors, each
// with the field's path, and accepts KubeVirt's own values (bandwidth 0, meaning no limit).
func TestMigrationPolicyValidation(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	ctx := context.Background()
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	i64 := func(v int64) *int64 { return &v }
	sel := &v1alpha1.MigrationPolicySelectors{NamespaceSelector: v1alpha1.MigrationLabelSelector{"team": "a"}}

	for _, tc := range []struct {
		name string
		spec v1alpha1.MigrationPolicySpec
		// field is the path the refusal must name; "" means the policy is accepted.
		field string
	}{
		{"valid", v1alpha1.MigrationPolicySpec{BandwidthPerMigration: q("64Mi"), CompletionTimeoutPerGiB: i64(150), Selectors: sel}, ""},
		{"zero-bandwidth", v1alpha1.MigrationPolicySpec{BandwidthPerMigration: q("0Mi"), Selectors: &v1alpha1.MigrationPolicySelectors{}}, ""},
		{"negative-bandwidth", v1alpha1.MigrationPolicySpec{BandwidthPerMigration: q("-1Mi"), Selectors: sel}, "spec.bandwidthPerMigration"},
		{"zero-timeout", v1alpha1.MigrationPolicySpec{CompletionTimeoutPerGiB: i64(0), Selectors: sel}, "spec.completionTimeoutPerGiB"},
		{"no-selectors", v1alpha1.MigrationPolicySpec{AllowPostCopy: new(true)}, "spec.selectors"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mp := &v1alpha1.MigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: tc.name}, Spec: tc.spec}
			err := env.Client.Create(ctx, mp)
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("create: %v", err)
			case tc.field == "":
				return
			case !apierrors.IsInvalid(err):
				t.Fatalf("create: %v, want Invalid naming %s", err, tc.field)
			case !strings.Contains(err.Error(), tc.field):
				t.Errorf("error %q does not name %s", err, tc.field)
			}
		})
	}
}
