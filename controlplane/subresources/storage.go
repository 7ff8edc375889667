package subresources

import (
	"context"
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
)

// parent is the storage of virtualmachineinstances and virtualmachines in this group: it
// serves no verb (the objects are kubevisor.io's); the generic installer needs it to hang the
// subresources on.
type parent struct {
	kind schema.GroupVersionKind
}

var (
	_ rest.Storage = parent{}
	_ rest.Scoper  = parent{}

	_ rest.SingularNameProvider = parent{}
)

// New returns an empty object of the parent's kind.
func (p parent) New() runtime.Object { return newOf(p.kind) }

// Destroy releases nothing.
func (parent) Destroy() {}

// NamespaceScoped is true: VMIs and VMs are namespaced.
func (parent) NamespaceScoped() bool { return true }

// GetSingularName is the lowercase kind, as discovery lists it.
func (p parent) GetSingularName() string { return strings.ToLower(p.kind.Kind) }

// connectFunc serves one subresource request on the object namespace/name; opts are the decoded
// connect options (nil for subresources that have none).
type connectFunc func(ctx context.Context, namespace, name string, opts runtime.Object, r rest.Responder) (http.Handler, error)

// connecter is a subresource as a rest.Connecter: the generic server authenticates and
// authorizes the request (verb get for GET, update for PUT), decodes the options, and hands
// the request to the handler connect returns.
type connecter struct {
	kind    schema.GroupVersionKind
	methods []string
	// options, when set, makes the subresource take options and a path tail (portforward).
	options func() runtime.Object
	connect connectFunc
}

var (
	_ rest.Connecter = (*connecter)(nil)
	_ rest.Scoper    = (*connecter)(nil)
)

// New returns an empty object of the parent's kind.
func (c *connecter) New() runtime.Object { return newOf(c.kind) }

// Destroy releases nothing.
func (*connecter) Destroy() {}

// NamespaceScoped is true.
func (*connecter) NamespaceScoped() bool { return true }

// ConnectMethods are the subresource's HTTP methods.
func (c *connecter) ConnectMethods() []string { return c.methods }

// NewConnectOptions is the options object and, for one that takes a path tail, the key the
// tail is decoded under.
func (c *connecter) NewConnectOptions() (runtime.Object, bool, string) {
	if c.options == nil {
		return nil, false, ""
	}
	return c.options(), true, subpathKey
}

// Connect serves the request on the object name in the request's namespace.
func (c *connecter) Connect(ctx context.Context, name string, opts runtime.Object, r rest.Responder) (http.Handler, error) {
	return c.connect(ctx, genericapirequest.NamespaceValue(ctx), name, opts, r)
}

func newOf(kind schema.GroupVersionKind) runtime.Object {
	if kind == vmKind {
		return vmObject()
	}
	return vmiObject()
}
