package webhook

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kubevisor/kubevisor/core/kubevirtcompat"
)

// unknownFields returns an error for each field of the request's object (as the client sent it:
// AdmissionRequest.Object.Raw) that Kubevisor's API does not have: "not supported by Kubevisor"
// with the reason and the alternative for a field of KubeVirt's API, "unknown field" for
// others. The CRDs keep unknown fields of the VirtualMachineInstanceSpec so that they get here
// (hack/crd-unknown-fields); decoding into the Go types would drop them, and admission refuses
// them so that none is stored. Outside a request (a direct call) there is nothing to check.
func unknownFields(ctx context.Context, kind string) (field.ErrorList, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return nil, nil
	}
	errs, err := kubevirtcompat.CheckObject(kind, req.Object.Raw)
	if err != nil {
		return nil, fmt.Errorf("check fields: %w", err)
	}
	return errs, nil
}

// refuseUnknownFields is unknownFields as the Invalid error admission answers, nil when the object
// has none.
func refuseUnknownFields(ctx context.Context, kind, name string) error {
	errs, err := unknownFields(ctx, kind)
	if err != nil {
		return err
	}
	return invalid(kind, name, errs)
}
