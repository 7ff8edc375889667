package webhook

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kubevisor/kubevisor/controlplane/evacuation"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// EvictionPath is where the eviction webhook is served.
const EvictionPath = "/validate-v1-pod-eviction"

// The eviction webhook sees every eviction of the cluster (an Eviction has no labels for an
// objectSelector to match) and lets all but launcher pods' through at once. Its failurePolicy
// is Ignore: with Fail, kubevisor-api down (or being drained itself) would refuse every
// eviction of every pod in the cluster, and a drain of the node that runs it could never
// finish. A launcher pod is not left unguarded meanwhile: a VMI whose strategy protects it has
// a PodDisruptionBudget (the evacuation controller's: minAvailable 1, 2 during a migration, so
// that neither of a migration's pods can go), so its eviction is
// refused by the API server as well, 429; only the migration waits until the webhook is back
// and the drain's retry reaches it.
//
// sideEffects NoneOnDryRun: the webhook marks the VMI (its status), except for a dry run.
//
// +kubebuilder:webhook:path=/validate-v1-pod-eviction,mutating=false,failurePolicy=ignore,sideEffects=NoneOnDryRun,groups="",resources=pods/eviction,verbs=create,versions=v1,name=veviction.kubevisor.io,admissionReviewVersions=v1,timeoutSeconds=10

// What the eviction webhook needs: the evicted pod, its VMI, and to mark the VMI.
//
// +kubebuilder:rbac:groups="",resources=pods,verbs=get
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances,verbs=get
// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances/status,verbs=patch

// Eviction answers evictions of launcher pods (pods/eviction) by their VMI's eviction strategy
// (evacuation.Evict): the eviction of a VMI to be live-migrated marks it for evacuation and is
// refused with 429 TooManyRequests, which kubectl drain retries until the pod is gone.
type Eviction struct {
	// Reader reads the pod and the VMI; it should go to the API server (the webhook decides
	// on what the VMI is now, and must not cache every pod of the cluster).
	Reader client.Reader
	// Writer writes the VMI's mark.
	Writer client.Client
	// DefaultStrategy is the cluster's default eviction strategy.
	DefaultStrategy v1alpha1.EvictionStrategy
}

// Handle implements admission.Handler.
func (e *Eviction) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.SubResource != "eviction" {
		return admission.Allowed("")
	}
	pod := &corev1.Pod{}
	switch err := e.Reader.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: req.Name}, pod); {
	case apierrors.IsNotFound(err):
		// The API server refuses the eviction of a pod that is not there itself.
		return admission.Allowed("")
	case err != nil:
		// A pod not read may be a launcher pod whose VMI is being migrated: refused, and
		// retried by the evicting client, rather than left to the budget alone.
		return tooManyRequests(fmt.Sprintf("read pod %s/%s: %v", req.Namespace, req.Name, err))
	}
	uid, name := pod.Labels[v1alpha1.CreatedByLabel], pod.Labels[v1alpha1.VirtualMachineInstanceNameLabel]
	if uid == "" || name == "" {
		return admission.Allowed("")
	}
	vmi := &v1alpha1.VirtualMachineInstance{}
	switch err := e.Reader.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, vmi); {
	case apierrors.IsNotFound(err):
		vmi = nil
	case err != nil:
		return tooManyRequests(fmt.Sprintf("read VMI %s/%s of launcher pod %s: %v", pod.Namespace, name, pod.Name, err))
	case string(vmi.UID) != uid:
		// A VMI of the same name made after the pod's: the pod runs nothing of it.
		vmi = nil
	}
	v := evacuation.Evict(pod, vmi, e.DefaultStrategy)
	if v.Allow {
		return admission.Allowed("")
	}
	if v.Mark != "" && !(req.DryRun != nil && *req.DryRun) {
		if err := evacuation.Mark(ctx, e.Writer, vmi, v.Mark); err != nil {
			return tooManyRequests(fmt.Sprintf("mark VMI %s/%s for evacuation: %v", vmi.Namespace, vmi.Name, err))
		}
	}
	return tooManyRequests(v.Message)
}

// tooManyRequests refuses with 429, which the eviction API's clients (kubectl drain) retry.
func tooManyRequests(msg string) admission.Response {
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{
		Allowed: false,
		Result: &metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusTooManyRequests,
			Reason: metav1.StatusReasonTooManyRequests, Message: msg,
		},
	}}
}
