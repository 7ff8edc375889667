package webhook

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"

	"github.com/kubevisor/kubevisor/controlplane/launcherpod"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// Pod Security: a VMI runs in a launcher pod of its namespace, which the API server's Pod
// Security admission checks against the namespace's enforced level
// (pod-security.kubernetes.io/enforce, and -enforce-version). A VMI whose launcher pod that level
// refuses would never run; the user would learn why only from the VMI controller's
// LauncherPodCreated condition. So the validating webhooks build the launcher pod the VMI
// controller would build (launcherpod.Build, with its defaults: what Pod Security looks at does
// not depend on the controller's flags) and evaluate it with Pod Security's own checks
// (k8s.io/pod-security-admission/policy), refusing the VMI, or the VM or replica set whose
// template it is, with every violation named.
//
// What the webhook cannot see: a cluster whose Pod Security admission configuration exempts
// kubevisor-controller's ServiceAccount, or sets other defaults than privileged for namespaces
// without the label. There, kubevisor-api's --check-pod-security=false turns the check off.
//
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get

// podSecurityEvaluator evaluates pods with Pod Security's checks of this release.
var podSecurityEvaluator = func() policy.Evaluator {
	e, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		panic(fmt.Sprintf("pod security checks: %v", err))
	}
	return e
}()

// podSecurity refuses spec, a VMI's spec (or a template's) in namespace, when the namespace's
// enforced Pod Security level refuses its launcher pod: one Forbidden error at path naming the
// level and each violation. It checks nothing when the check is off, the namespace enforces
// privileged (or nothing), or the VMI's class is not there yet (the VMI controller says so).
func (a *Admission) podSecurity(ctx context.Context, namespace, name string, spec *v1alpha1.VirtualMachineInstanceSpec, path *field.Path) (field.ErrorList, error) {
	if !a.CheckPodSecurity || a.Reader == nil || namespace == "" {
		return nil, nil
	}
	var ns corev1.Namespace
	if err := a.Reader.Get(ctx, types.NamespacedName{Name: namespace}, &ns); err != nil {
		return nil, fmt.Errorf("get namespace %s for its Pod Security level: %w", namespace, err)
	}
	pol, _ := psaapi.PolicyToEvaluate(ns.Labels, psaapi.Policy{Enforce: psaapi.LevelVersion{Level: psaapi.LevelPrivileged, Version: psaapi.LatestVersion()}})
	if pol.Enforce.Level == psaapi.LevelPrivileged {
		return nil, nil
	}
	className := spec.HypervisorClassName
	if className == "" {
		return nil, nil
	}
	var class v1alpha1.HypervisorClass
	if err := a.Reader.Get(ctx, types.NamespacedName{Name: className}, &class); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("get hypervisor class %s: %w", className, err)
	}
	vmi := &v1alpha1.VirtualMachineInstance{Spec: *spec.DeepCopy()}
	vmi.Namespace, vmi.Name, vmi.UID = namespace, name, "00000000-0000-0000-0000-000000000000"
	if vmi.Name == "" {
		vmi.Name = "vmi"
	}
	pod, err := launcherpod.Build(vmi, &class, launcherpod.Config{LauncherImage: "kubevisor-launcher"})
	if err != nil {
		return nil, nil // the VMI controller reports what keeps it from building the pod
	}
	return launcherPodForbidden(pol.Enforce, namespace, &class, pod, path), nil
}

// launcherPodForbidden is the Forbidden error at path when level refuses pod, nil when it admits
// it.
func launcherPodForbidden(level psaapi.LevelVersion, namespace string, class *v1alpha1.HypervisorClass, pod *corev1.Pod, path *field.Path) field.ErrorList {
	res := policy.AggregateCheckResults(podSecurityEvaluator.EvaluatePod(level, &pod.ObjectMeta, &pod.Spec))
	if res.Allowed {
		return nil
	}
	var why []string
	for i, r := range res.ForbiddenReasons {
		if d := res.ForbiddenDetails[i]; d != "" {
			r += " (" + d + ")"
		}
		why = append(why, r)
	}
	// The least level that runs it: baseline does what restricted refuses of a class whose
	// launcher keeps capabilities; a hostPath (hostDisk) needs privileged.
	least := psaapi.LevelPrivileged
	if level.Level == psaapi.LevelRestricted {
		baseline := psaapi.LevelVersion{Level: psaapi.LevelBaseline, Version: level.Version}
		if policy.AggregateCheckResults(podSecurityEvaluator.EvaluatePod(baseline, &pod.ObjectMeta, &pod.Spec)).Allowed {
			least = psaapi.LevelBaseline
		}
	}
	return field.ErrorList{field.Forbidden(path, fmt.Sprintf(
		"namespace %s enforces Pod Security %q, which refuses the launcher pod of this VMI (HypervisorClass %s, driver %s): %s; run it in a namespace that enforces %s",
		namespace, level.String(), class.Name, class.Driver, strings.Join(why, ", "), least))}
}
