package subresources

import (
	"context"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// +kubebuilder:rbac:groups=kubevisor.io,resources=virtualmachineinstances,verbs=get
// +kubebuilder:rbac:groups="",namespace=kubevisor-system,resources=pods,verbs=list

var (
	vmiResource = v1alpha1.GroupVersion.WithResource(subv1.VirtualMachineInstances).GroupResource()
	vmResource  = v1alpha1.GroupVersion.WithResource(subv1.VirtualMachines).GroupResource()
)

func vmiObject() runtime.Object { return &v1alpha1.VirtualMachineInstance{} }
func vmObject() runtime.Object  { return &v1alpha1.VirtualMachine{} }

// handlers serves the VMI subresources by proxying them to the node handler of the VMI's node.
type handlers struct {
	reader    client.Reader
	namespace string
	selector  labels.Selector
	dialer    *handlerDialer
}

func newHandlers(c Config, r client.Reader) (*handlers, error) {
	sel, err := labels.Parse(c.HandlerSelector)
	if err != nil {
		return nil, fmt.Errorf("handler selector %q: %w", c.HandlerSelector, err)
	}
	return &handlers{reader: r, namespace: c.HandlerNamespace, selector: sel, dialer: newHandlerDialer(c.CertDir, c.DialTimeout)}, nil
}

// stream is a WebSocket subresource (GET): console, vnc, portforward.
func (h *handlers) stream(sub string) *connecter {
	c := &connecter{kind: vmiKind, methods: []string{http.MethodGet}}
	if sub == subv1.SubresourcePortForward {
		c.options = func() runtime.Object { return &subv1.PortForwardOptions{} }
	}
	c.connect = func(ctx context.Context, ns, name string, opts runtime.Object, _ rest.Responder) (http.Handler, error) {
		path := nodeapi.VMIPath(ns, name, sub)
		if pf, ok := opts.(*subv1.PortForwardOptions); ok {
			if pf.Port == 0 {
				return nil, apierrors.NewBadRequest("portforward needs a port: portforward/{port}[/{protocol}]")
			}
			path = nodeapi.PortForwardPath(ns, name, pf.Port, pf.Protocol)
		}
		addr, err := h.locate(ctx, ns, name)
		if err != nil {
			return nil, err
		}
		return h.dialer.streamProxy(addr, path)
	}
	return c
}

// action is a request answered by the handler in one exchange (PUT pause..., GET guestosinfo):
// its status code and body reach the user as they are.
func (h *handlers) action(sub, method string) *connecter {
	return &connecter{kind: vmiKind, methods: []string{method},
		connect: func(ctx context.Context, ns, name string, _ runtime.Object, _ rest.Responder) (http.Handler, error) {
			addr, err := h.locate(ctx, ns, name)
			if err != nil {
				return nil, err
			}
			return h.dialer.actionProxy(addr, nodeapi.VMIPath(ns, name, sub))
		}}
}

// locate finds the VMI ns/name (404 when absent, 409 when not running) and the address
// (IP:port) of its node's handler (503 when there is none ready).
func (h *handlers) locate(ctx context.Context, ns, name string) (string, error) {
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := h.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return "", apierrors.NewNotFound(vmiResource, name)
		}
		return "", apierrors.NewInternalError(fmt.Errorf("get VMI %s/%s: %w", ns, name, err))
	}
	if err := vmiRunning(vmi); err != nil {
		return "", err
	}
	var pods corev1.PodList
	if err := h.reader.List(ctx, &pods, client.InNamespace(h.namespace), client.MatchingLabelsSelector{Selector: h.selector}); err != nil {
		return "", apierrors.NewInternalError(fmt.Errorf("list handler pods: %w", err))
	}
	pod := handlerPod(pods.Items, vmi.Status.NodeName)
	if pod == nil {
		return "", apierrors.NewServiceUnavailable(fmt.Sprintf("no ready node handler (pods %s in %s) on node %s of VMI %s",
			h.selector, h.namespace, vmi.Status.NodeName, name))
	}
	return fmt.Sprintf("%s:%d", pod.Status.PodIP, nodeapi.Port), nil
}

// vmiRunning is nil when vmi has a node and is Running (a paused VMI is Running too), else a
// 409 saying why not.
func vmiRunning(vmi *v1alpha1.VirtualMachineInstance) error {
	switch {
	case vmi.DeletionTimestamp != nil:
		return apierrors.NewConflict(vmiResource, vmi.Name, fmt.Errorf("VMI %s is being deleted", vmi.Name))
	case vmi.Status.Phase != v1alpha1.Running:
		phase := string(vmi.Status.Phase)
		if phase == "" {
			phase = "Pending"
		}
		return apierrors.NewConflict(vmiResource, vmi.Name, fmt.Errorf("VMI %s is not running (phase %s)", vmi.Name, phase))
	case vmi.Status.NodeName == "":
		return apierrors.NewConflict(vmiResource, vmi.Name, fmt.Errorf("VMI %s is not running: it has no node", vmi.Name))
	}
	return nil
}

// handlerPod is the first of pods that runs on node, is Ready, not being deleted and has an IP.
func handlerPod(pods []corev1.Pod, node string) *corev1.Pod {
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName != node || p.DeletionTimestamp != nil || p.Status.PodIP == "" {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return p
			}
		}
	}
	return nil
}
