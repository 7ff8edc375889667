// Package client reaches Kubevisor from the command line: the subresource API
// (subresources.kubevisor.io/v1alpha1: actions as PUTs, streams as WebSockets of core/wsstream),
// the kubevisor.io/v1alpha1 objects, and core Kubernetes objects, all with the credentials of one
// client-go rest.Config, so that every kubeconfig auth kind (certificates, tokens, token files,
// exec plugins, basic auth, impersonation) works for streams too.
package client

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/wsstream"
)

// Client is a rest.Config and a namespace, with the clients built from them.
type Client struct {
	// Config is the connection, as loaded from the kubeconfig and flags.
	Config *rest.Config
	// Namespace is the namespace of every named object.
	Namespace string
	// Core is a clientset for core Kubernetes objects (Services, SelfSubjectReviews).
	Core kubernetes.Interface
	rest rest.Interface
}

// New builds the clients of cfg for namespace.
func New(cfg *rest.Config, namespace string) (*Client, error) {
	rc := rest.CopyConfig(cfg)
	rc.APIPath = "/apis"
	rc.NegotiatedSerializer = clientgoscheme.Codecs.WithoutConversion()
	if rc.UserAgent == "" {
		rc.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	r, err := rest.UnversionedRESTClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("build rest client: %w", err)
	}
	// JSON rather than protobuf: a CLI sends few objects, and JSON bodies are readable in -v logs.
	cc := rest.CopyConfig(cfg)
	cc.ContentType = "application/json"
	core, err := kubernetes.NewForConfig(cc)
	if err != nil {
		return nil, fmt.Errorf("build clientset: %w", err)
	}
	return &Client{Config: cfg, Namespace: namespace, Core: core, rest: r}, nil
}

// SubresourcePath is the path of a subresource of the named VM or VMI (resource is
// subv1.VirtualMachines or subv1.VirtualMachineInstances), with extra path segments appended
// (portforward's port).
func (c *Client) SubresourcePath(resource, name, subresource string, extra ...string) string {
	p := path.Join(append([]string{"/apis", subv1.GroupName, subv1.GroupVersion.Version,
		"namespaces", c.Namespace, resource, name, subresource}, extra...)...)
	return p
}

// ObjectPath is the path of a kubevisor.io/v1alpha1 object (resource in plural, lower case);
// an empty name gives the collection.
func (c *Client) ObjectPath(resource, name string) string {
	return path.Join("/apis", v1alpha1.GroupName, v1alpha1.GroupVersion.Version, "namespaces", c.Namespace, resource, name)
}

// VersionPath is where kubevisor-api answers its ServerVersion.
const VersionPath = "/apis/" + subv1.GroupName + "/v1alpha1/version"

// Put runs an action: a PUT of body (nil for none) to the subresource. A refusal is the
// server's error (an *errors.StatusError for a metav1.Status answer); Explain words it.
func (c *Client) Put(ctx context.Context, resource, name, subresource string, body runtime.Object) error {
	req := c.rest.Put().AbsPath(c.SubresourcePath(resource, name, subresource)).SetHeader("Content-Type", "application/json")
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode %s body: %w", subresource, err)
		}
		req = req.Body(data)
	}
	return req.Do(ctx).Error()
}

// GetJSON GETs an absolute path and decodes the JSON answer into out.
func (c *Client) GetJSON(ctx context.Context, absPath string, out any) error {
	res := c.rest.Get().AbsPath(absPath).Do(ctx)
	// Error, unlike Raw, decodes a metav1.Status answer into the error.
	if err := res.Error(); err != nil {
		return err
	}
	data, err := res.Raw()
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode %s: %w", absPath, err)
	}
	return nil
}

// GuestOSInfo GETs the guest's operating system information of the named VMI.
func (c *Client) GuestOSInfo(ctx context.Context, vmi string) (*subv1.GuestOSInfo, error) {
	info := &subv1.GuestOSInfo{}
	if err := c.GetJSON(ctx, c.SubresourcePath(subv1.VirtualMachineInstances, vmi, subv1.SubresourceGuestOSInfo), info); err != nil {
		return nil, err
	}
	return info, nil
}

// ServerVersion GETs kubevisor-api's build.
func (c *Client) ServerVersion(ctx context.Context) (*subv1.ServerVersion, error) {
	v := &subv1.ServerVersion{}
	if err := c.GetJSON(ctx, VersionPath, v); err != nil {
		return nil, err
	}
	return v, nil
}

// VirtualMachine GETs the named VM.
func (c *Client) VirtualMachine(ctx context.Context, name string) (*v1alpha1.VirtualMachine, error) {
	vm := &v1alpha1.VirtualMachine{}
	if err := c.GetJSON(ctx, c.ObjectPath("virtualmachines", name), vm); err != nil {
		return nil, err
	}
	return vm, nil
}

// VirtualMachineInstance GETs the named VMI.
func (c *Client) VirtualMachineInstance(ctx context.Context, name string) (*v1alpha1.VirtualMachineInstance, error) {
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := c.GetJSON(ctx, c.ObjectPath("virtualmachineinstances", name), vmi); err != nil {
		return nil, err
	}
	return vmi, nil
}

// migrations is the resource of VirtualMachineInstanceMigrations.
const migrations = "virtualmachineinstancemigrations"

// CreateMigration POSTs m (with generateName) and returns the migration the API server made;
// dryRun only validates it.
func (c *Client) CreateMigration(ctx context.Context, m *v1alpha1.VirtualMachineInstanceMigration, dryRun bool) (*v1alpha1.VirtualMachineInstanceMigration, error) {
	m.APIVersion, m.Kind = v1alpha1.GroupVersion.String(), "VirtualMachineInstanceMigration"
	data, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode migration: %w", err)
	}
	req := c.rest.Post().AbsPath(c.ObjectPath(migrations, "")).SetHeader("Content-Type", "application/json").Body(data)
	if dryRun {
		req = req.Param("dryRun", "All")
	}
	res := req.Do(ctx)
	if err := res.Error(); err != nil {
		return nil, err
	}
	raw, err := res.Raw()
	if err != nil {
		return nil, err
	}
	out := &v1alpha1.VirtualMachineInstanceMigration{}
	if err := json.Unmarshal(raw, out); err != nil {
		return nil, fmt.Errorf("decode migration: %w", err)
	}
	return out, nil
}

// Migration GETs the named VirtualMachineInstanceMigration.
func (c *Client) Migration(ctx context.Context, name string) (*v1alpha1.VirtualMachineInstanceMigration, error) {
	m := &v1alpha1.VirtualMachineInstanceMigration{}
	if err := c.GetJSON(ctx, c.ObjectPath(migrations, name), m); err != nil {
		return nil, err
	}
	return m, nil
}

// Migrations lists the VirtualMachineInstanceMigrations of the namespace.
func (c *Client) Migrations(ctx context.Context) ([]v1alpha1.VirtualMachineInstanceMigration, error) {
	var list v1alpha1.VirtualMachineInstanceMigrationList
	if err := c.GetJSON(ctx, c.ObjectPath(migrations, ""), &list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// DeleteMigration DELETEs the named VirtualMachineInstanceMigration, of that UID only.
func (c *Client) DeleteMigration(ctx context.Context, name string, uid string) error {
	body := fmt.Sprintf(`{"apiVersion":"v1","kind":"DeleteOptions","preconditions":{"uid":%q}}`, uid)
	return c.rest.Delete().AbsPath(c.ObjectPath(migrations, name)).SetHeader("Content-Type", "application/json").
		Body([]byte(body)).Do(ctx).Error()
}

// Names lists the names of the objects of resource (virtualmachines or virtualmachineinstances)
// in the namespace; shell completion uses it.
func (c *Client) Names(ctx context.Context, resource string) ([]string, error) {
	var list struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := c.GetJSON(ctx, c.ObjectPath(resource, ""), &list); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(list.Items))
	for _, it := range list.Items {
		names = append(names, it.Metadata.Name)
	}
	return names, nil
}

// Dial opens a stream (console, vnc, portforward) of the named VMI as a net.Conn. A refused
// handshake is a *wsstream.HTTPError; Explain words it.
func (c *Client) Dial(ctx context.Context, vmi, subresource string, extra ...string) (net.Conn, error) {
	u, err := c.serverURL(c.SubresourcePath(subv1.VirtualMachineInstances, vmi, subresource, extra...))
	if err != nil {
		return nil, err
	}
	opts, err := c.dialOptions(u)
	if err != nil {
		return nil, err
	}
	ws := *u
	ws.Scheme = map[string]string{"https": "wss", "http": "ws"}[u.Scheme]
	return wsstream.Dial(ctx, ws.String(), opts)
}

// serverURL is the http(s):// URL of an absolute API path on the configured server.
func (c *Client) serverURL(absPath string) (*url.URL, error) {
	host := c.Config.Host
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	u, err := url.Parse(host)
	if err != nil {
		return nil, fmt.Errorf("parse server %q: %w", c.Config.Host, err)
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return nil, fmt.Errorf("server %q: scheme %q is neither http nor https", c.Config.Host, u.Scheme)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + absPath
	return u, nil
}

// dialOptions are the TLS configuration and the headers of the configuration's transport: the
// request headers its round-tripper wrappers (bearer token, token file, exec plugin, basic auth,
// impersonation, user agent) add, caught on a request that goes nowhere.
func (c *Client) dialOptions(u *url.URL) (wsstream.DialOptions, error) {
	tlsCfg, err := rest.TLSConfigFor(c.Config)
	if err != nil {
		return wsstream.DialOptions{}, fmt.Errorf("tls config: %w", err)
	}
	if tlsCfg == nil && u.Scheme == "https" {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	catcher := &headerCatcher{}
	rt, err := rest.HTTPWrappersForConfig(c.Config, catcher)
	if err != nil {
		return wsstream.DialOptions{}, fmt.Errorf("auth wrappers: %w", err)
	}
	req, err := http.NewRequest(http.MethodGet, u.String(), nil)
	if err != nil {
		return wsstream.DialOptions{}, err
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return wsstream.DialOptions{}, fmt.Errorf("credentials: %w", err)
	}
	resp.Body.Close()
	proxy := c.Config.Proxy
	if proxy == nil {
		proxy = http.ProxyFromEnvironment
	}
	return wsstream.DialOptions{TLS: tlsCfg, Header: catcher.header, Proxy: proxy}, nil
}

// headerCatcher is the innermost round tripper of dialOptions: it keeps the headers of the
// request it is given and answers 200 without sending anything.
type headerCatcher struct{ header http.Header }

func (h *headerCatcher) RoundTrip(req *http.Request) (*http.Response, error) {
	h.header = req.Header.Clone()
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Header: http.Header{}, Request: req}, nil
}
