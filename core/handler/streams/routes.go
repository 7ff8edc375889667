package streams

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// route is a parsed endpoint path: the VMI, its subresource and what follows it.
type route struct {
	Namespace, Name, Subresource string
	Rest                         []string
}

// parsePath reads a path of nodeapi.VMIPath's form (escaped, as in the request line). It fails
// for any other path.
func parsePath(escaped string) (route, error) {
	parts := strings.Split(strings.TrimPrefix(escaped, "/"), "/")
	prefix := strings.TrimPrefix(nodeapi.Prefix, "/")
	if len(parts) < 6 || parts[0] != prefix || parts[1] != "namespaces" || parts[3] != subv1.VirtualMachineInstances {
		return route{}, fmt.Errorf("no such path %q", escaped)
	}
	for i, p := range parts {
		u, err := url.PathUnescape(p)
		if err != nil || u == "" {
			return route{}, fmt.Errorf("no such path %q", escaped)
		}
		parts[i] = u
	}
	return route{Namespace: parts[2], Name: parts[4], Subresource: parts[5], Rest: parts[6:]}, nil
}

// forward is a port forward's target.
type forward struct {
	Port     int
	Protocol string
}

// parseForward reads the PORT[/PROTO] of a portforward path: a port in 1..65535 and tcp (the
// default), the only protocol served.
func parseForward(rest []string) (forward, error) {
	if len(rest) < 1 || len(rest) > 2 {
		return forward{}, fmt.Errorf("portforward needs a port: portforward/PORT[/PROTOCOL]")
	}
	port, err := strconv.Atoi(rest[0])
	if err != nil || port < 1 || port > 65535 {
		return forward{}, fmt.Errorf("port %q is not a number in 1..65535", rest[0])
	}
	f := forward{Port: port, Protocol: "tcp"}
	if len(rest) == 2 {
		f.Protocol = strings.ToLower(rest[1])
	}
	if f.Protocol != "tcp" {
		return forward{}, fmt.Errorf("protocol %q is not supported: only tcp is forwarded", rest[1])
	}
	return f, nil
}

// methods are the HTTP method of each subresource.
var methods = map[string]string{
	subv1.SubresourceConsole:     http.MethodGet,
	subv1.SubresourceVNC:         http.MethodGet,
	subv1.SubresourcePortForward: http.MethodGet,
	subv1.SubresourceGuestOSInfo: http.MethodGet,
	subv1.SubresourcePause:       http.MethodPut,
	subv1.SubresourceUnpause:     http.MethodPut,
	subv1.SubresourceReset:       http.MethodPut,
	subv1.SubresourceSoftReboot:  http.MethodPut,
}

// ServeHTTP serves the endpoint's paths (nodeapi), without TLS: Run and Serve put it behind
// mutual TLS.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt, err := parsePath(r.URL.EscapedPath())
	if err != nil {
		writeStatus(w, http.StatusNotFound, err.Error())
		return
	}
	method, ok := methods[rt.Subresource]
	if !ok || (len(rt.Rest) > 0 && rt.Subresource != subv1.SubresourcePortForward) {
		writeStatus(w, http.StatusNotFound, fmt.Sprintf("no subresource %q of virtualmachineinstances", strings.Join(append([]string{rt.Subresource}, rt.Rest...), "/")))
		return
	}
	if r.Method != method {
		w.Header().Set("Allow", method)
		writeStatus(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s takes %s, not %s", rt.Subresource, method, r.Method))
		return
	}
	var fwd forward
	if rt.Subresource == subv1.SubresourcePortForward {
		if fwd, err = parseForward(rt.Rest); err != nil {
			writeStatus(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	uid, ok := s.b.Find(rt.Namespace, rt.Name)
	if !ok {
		writeStatus(w, http.StatusNotFound, fmt.Sprintf("virtualmachineinstance %s/%s does not run on this node", rt.Namespace, rt.Name))
		return
	}
	v := vmiRequest{uid: uid, namespace: rt.Namespace, name: rt.Name}
	switch rt.Subresource {
	case subv1.SubresourceConsole:
		s.console(w, r, v)
	case subv1.SubresourceVNC:
		s.vnc(w, r, v)
	case subv1.SubresourcePortForward:
		s.portForward(w, r, v, fwd.Port)
	case subv1.SubresourceGuestOSInfo:
		s.guestOSInfo(w, r, v)
	default:
		s.action(w, r, v, rt.Subresource)
	}
}
