// Package subresources is kubevisor-api's aggregated API server, subresources.kubevisor.io/v1alpha1:
// the streams (console, vnc, portforward) and actions (pause, start, stop, migrate...) of
// VirtualMachineInstances and VirtualMachines, whose objects live in kubevisor.io/v1alpha1.
//
// It is a k8s.io/apiserver generic server: requests are authenticated by delegation to the
// cluster's API server (request-header client certificates from the aggregator, checked against
// kube-system/extension-apiserver-authentication, then client certificates, then TokenReview)
// and authorized with a SubjectAccessReview of the subresource (get virtualmachineinstances/console,
// update virtualmachines/start in group subresources.kubevisor.io), as KubeVirt's are. The
// writes an allowed request causes (a VM's runStrategy, a migration, a VMI deletion) are made by
// kubevisor-api's own service account, not as the user; VMI streams and actions are proxied to
// the node handler of the VMI's node (core/nodeapi) over mutual TLS.
package subresources

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	goruntime "runtime"

	restful "github.com/emicklei/go-restful/v3"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericfilters "k8s.io/apiserver/pkg/server/filters"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/util/compatibility"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
)

// VersionPath answers the server's ServerVersion. Its path parses as the resource "version" of
// the group; it is allowed to every authenticated user (as /version is on the cluster's API
// server) without a SubjectAccessReview, so it needs no RBAC rule.
const VersionPath = "/apis/" + subv1.GroupName + "/v1alpha1/version"

// GitVersion is kubevisor-api's version in the ServerVersion answer; the build sets it with -ldflags -X.
var GitVersion = "v0.0.0-dev"

// Clients are what the server reads and writes the cluster with: Reader reads straight from the
// API server (a subresource request must see the current VMI), Writer writes as kubevisor-api.
type Clients struct {
	Reader client.Reader
	Writer client.Client
}

// Server is the prepared aggregated API server; Start runs it.
type Server struct {
	generic *genericapiserver.GenericAPIServer
}

// NewServer assembles the server for c: secure serving with the serving pair in c.CertDir,
// delegated authentication and authorization through c.Kubeconfig (in-cluster when empty), and
// the subresources.kubevisor.io/v1alpha1 group backed by cl.
func NewServer(c Config, cl Clients) (*Server, error) {
	scheme, err := newScheme()
	if err != nil {
		return nil, err
	}
	codecs := serializerFor(scheme)

	gc := genericapiserver.NewConfig(codecs)
	gc.EffectiveVersion = compatibility.DefaultBuildEffectiveVersion()
	// Streams outlive the request timeout; their end is the user's or the handler's.
	gc.LongRunningFunc = genericfilters.BasicLongRunningRequestCheck(sets.NewString("watch"),
		sets.NewString(subv1.SubresourceConsole, subv1.SubresourceVNC, subv1.SubresourcePortForward))
	// OpenAPI v3 only, and coarse (openapi.go); the generic server cannot install a group without it.
	gc.OpenAPIConfig, gc.OpenAPIV3Config = nil, openAPIV3Config(scheme)

	serving := genericoptions.NewSecureServingOptions().WithLoopback()
	serving.BindPort = c.Port
	if c.BindAddress != "" {
		if serving.BindAddress = net.ParseIP(c.BindAddress); serving.BindAddress == nil {
			return nil, fmt.Errorf("bind address %q is not an IP address", c.BindAddress)
		}
	}
	serving.Listener = c.Listener
	// The generic server's floor is TLS 1.2 already; said here so that it stays so.
	serving.MinTLSVersion = "VersionTLS12"
	serving.ServerCert.CertKey = genericoptions.CertKey{
		CertFile: filepath.Join(c.CertDir, ServingCertFile),
		KeyFile:  filepath.Join(c.CertDir, ServingKeyFile),
	}
	if err := serving.ApplyTo(&gc.SecureServing, &gc.LoopbackClientConfig); err != nil {
		return nil, fmt.Errorf("secure serving: %w", err)
	}

	authn := genericoptions.NewDelegatingAuthenticationOptions()
	authn.RemoteKubeConfigFile = c.Kubeconfig
	if err := authn.ApplyTo(&gc.Authentication, gc.SecureServing, nil); err != nil {
		return nil, fmt.Errorf("delegated authentication: %w", err)
	}
	authz := genericoptions.NewDelegatingAuthorizationOptions()
	authz.RemoteKubeConfigFile = c.Kubeconfig
	// The health probes (the defaults of AlwaysAllowPaths) stay open to anonymous requests.
	gc.Authentication.Authenticator = rejectAnonymous(gc.Authentication.Authenticator, append([]string(nil), authz.AlwaysAllowPaths...))
	if err := authz.ApplyTo(&gc.Authorization); err != nil {
		return nil, fmt.Errorf("delegated authorization: %w", err)
	}
	gc.Authorization.Authorizer = allowVersion(gc.Authorization.Authorizer)

	generic, err := gc.Complete(nil).New("kubevisor-api", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, fmt.Errorf("generic API server: %w", err)
	}
	handlers, err := newHandlers(c, cl.Reader)
	if err != nil {
		return nil, err
	}
	group := genericapiserver.NewDefaultAPIGroupInfo(subv1.GroupName, scheme, runtime.NewParameterCodec(scheme), codecs)
	group.VersionedResourcesStorageMap[subv1.GroupVersion.Version] = storages(handlers, &vmActions{reader: cl.Reader, writer: cl.Writer})
	if err := generic.InstallAPIGroup(&group); err != nil {
		return nil, fmt.Errorf("install %s: %w", subv1.GroupVersion, err)
	}
	if err := installVersion(generic); err != nil {
		return nil, err
	}
	return &Server{generic: generic}, nil
}

// storages is the group's REST storage: the parents, which serve nothing themselves (the
// objects live in kubevisor.io), and a Connecter per subresource.
func storages(h *handlers, vm *vmActions) map[string]rest.Storage {
	vmi, vmo := subv1.VirtualMachineInstances, subv1.VirtualMachines
	m := map[string]rest.Storage{vmi: parent{kind: vmiKind}, vmo: parent{kind: vmKind}}
	for _, s := range []string{subv1.SubresourceConsole, subv1.SubresourceVNC, subv1.SubresourcePortForward} {
		m[vmi+"/"+s] = h.stream(s)
	}
	for _, s := range []string{subv1.SubresourcePause, subv1.SubresourceUnpause, subv1.SubresourceSoftReboot, subv1.SubresourceReset} {
		m[vmi+"/"+s] = h.action(s, http.MethodPut)
	}
	m[vmi+"/"+subv1.SubresourceGuestOSInfo] = h.action(subv1.SubresourceGuestOSInfo, http.MethodGet)
	for s, do := range vm.all() {
		m[vmo+"/"+s] = vm.connecter(do)
	}
	return m
}

// installVersion adds the route of VersionPath to the group's web service.
func installVersion(g *genericapiserver.GenericAPIServer) error {
	root := "/apis/" + subv1.GroupVersion.String()
	for _, ws := range g.Handler.GoRestfulContainer.RegisteredWebServices() {
		if ws.RootPath() != root {
			continue
		}
		ws.Route(ws.GET("/version").To(func(_ *restful.Request, resp *restful.Response) {
			_ = resp.WriteAsJson(serverVersion())
		}).Operation("readServerVersion").Doc("kubevisor-api's version").Returns(http.StatusOK, "OK", subv1.ServerVersion{}))
		return nil
	}
	return errors.New("no web service for " + root)
}

func serverVersion() *subv1.ServerVersion {
	return &subv1.ServerVersion{
		TypeMeta:   metaTypeOf("ServerVersion"),
		GitVersion: GitVersion,
		GoVersion:  goruntime.Version(),
		Platform:   goruntime.GOOS + "/" + goruntime.GOARCH,
	}
}

// Start serves until ctx ends, then shuts the server down.
func (s *Server) Start(ctx context.Context) error {
	return s.generic.PrepareRun().RunWithContext(ctx)
}

// NeedLeaderElection is false: every replica serves.
func (s *Server) NeedLeaderElection() bool { return false }

var _ manager.LeaderElectionRunnable = (*Server)(nil)

// AddToManager builds the server for c with mgr's clients (reads straight from the API server,
// not the cache) and adds it to mgr, so that it runs beside the webhooks.
func AddToManager(mgr manager.Manager, c Config) error {
	s, err := NewServer(c, Clients{Reader: mgr.GetAPIReader(), Writer: mgr.GetClient()})
	if err != nil {
		return fmt.Errorf("subresource API server: %w", err)
	}
	return mgr.Add(s)
}
