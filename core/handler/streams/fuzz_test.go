package streams

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// nobody is a handler that runs no VMI: a request that reached any other method of Backend
// would panic on the nil interface.
type nobody struct{ Backend }

func (nobody) Find(string, string) (types.UID, bool) { return "", false }

// dotSegment says whether a path segment is one that path.Join (and so nodeapi.VMIPath) drops;
// no Kubernetes name is one.
func dotSegment(s string) bool { return s == "." || s == ".." }

// checkRoute: what parsePath accepts has every part, and the same route, written again by
// nodeapi.VMIPath for a subresource the endpoint serves, parses the same; what parseForward
// accepts is a port in 1..65535 over tcp, which nodeapi.PortForwardPath carries again.
func checkRoute(t *testing.T, escaped string) {
	rt, err := parsePath(escaped)
	if err != nil {
		return
	}
	if rt.Namespace == "" || rt.Name == "" || rt.Subresource == "" || slices.Contains(rt.Rest, "") {
		t.Fatalf("parsePath(%q) = %+v: an empty part", escaped, rt)
	}
	if _, ok := methods[rt.Subresource]; !ok || dotSegment(rt.Namespace) || dotSegment(rt.Name) || slices.ContainsFunc(rt.Rest, dotSegment) {
		return
	}
	again, err := parsePath(nodeapi.VMIPath(rt.Namespace, rt.Name, rt.Subresource, rt.Rest...))
	if err != nil || !reflect.DeepEqual(again, rt) {
		t.Fatalf("parsePath(%q) = %+v; written again by VMIPath and parsed: %+v, %v", escaped, rt, again, err)
	}
	if rt.Subresource != subv1.SubresourcePortForward {
		return
	}
	fwd, err := parseForward(rt.Rest)
	if err != nil {
		return
	}
	if fwd.Port < 1 || fwd.Port > 65535 || fwd.Protocol != "tcp" {
		t.Fatalf("parseForward(%q) = %+v", rt.Rest, fwd)
	}
	back, err := parsePath(nodeapi.PortForwardPath(rt.Namespace, rt.Name, int32(fwd.Port), fwd.Protocol))
	if err != nil {
		t.Fatalf("PortForwardPath of %+v: %v", fwd, err)
	}
	if f, err := parseForward(back.Rest); err != nil || f != fwd {
		t.Fatalf("parseForward(%q) = %+v; through PortForwardPath again %+v, %v", rt.Rest, fwd, f, err)
	}
}

var fuzzMethods = []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete}

// checkServe sends a request for target to the endpoint of a handler that runs no VMI: the
// answer is 400 (a bad port forward), 404 or 405 (with Allow naming the subresource's method),
// as a JSON Status of that code.
func checkServe(t *testing.T, target, method string) {
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return
	}
	w := httptest.NewRecorder()
	New(Config{}, nobody{}).ServeHTTP(w, &http.Request{Method: method, URL: u, Header: http.Header{}})
	switch w.Code {
	case http.StatusBadRequest, http.StatusNotFound:
	case http.StatusMethodNotAllowed:
		if rt, err := parsePath(u.EscapedPath()); err != nil || w.Header().Get("Allow") != methods[rt.Subresource] {
			t.Fatalf("%s %s: 405 with Allow %q", method, target, w.Header().Get("Allow"))
		}
	default:
		t.Fatalf("%s %s: %d %s", method, target, w.Code, w.Body)
	}
	var st metav1.Status
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || st.Code != int32(w.Code) || st.Message == "" {
		t.Fatalf("%s %s: %d with body %q (%v), not a Status of that code", method, target, w.Code, w.Body, err)
	}
}

// FuzzRoute feeds the endpoint's request parsing (parsePath, parseForward, ServeHTTP's routing)
// escaped paths and a method; the seeds are the paths of nodeapi and of this package's tests.
func FuzzRoute(f *testing.F) {
	for _, p := range []string{ // each with GET and PUT
		nodeapi.VMIPath("ns", "vm1", subv1.SubresourceConsole),
		nodeapi.VMIPath("ns", "vm1", subv1.SubresourceVNC),
		nodeapi.VMIPath("default", "a.b-c", subv1.SubresourceGuestOSInfo),
		nodeapi.PortForwardPath("ns", "vm1", 22, ""),
		nodeapi.PortForwardPath("ns", "vm1", 65535, "TCP"),
		nodeapi.VMIPath("ns", "vm1", subv1.SubresourcePortForward, "53", "udp"),
		nodeapi.VMIPath("ns", "vm1", subv1.SubresourcePortForward, "0"),
		nodeapi.VMIPath("ns", "vm1", subv1.SubresourcePortForward),
		"/v1alpha1/namespaces/ns/virtualmachineinstances/a%2Fb/pause",
		"/v1alpha1/namespaces/ns/virtualmachineinstances/vm1",
		"/v1alpha1/namespaces/ns/virtualmachines/vm1/console",
		"/v1beta1/namespaces/ns/virtualmachineinstances/vm1/console",
		"/v1alpha1/namespaces//virtualmachineinstances/vm1/console",
		"/v1alpha1/namespaces/ns/virtualmachineinstances/vm1/console/",
		"/v1alpha1/namespaces/ns/virtualmachineinstances/%2E%2E/reset",
		"/v1alpha1/namespaces/ns/virtualmachineinstances/vm1/softreboot/x",
		"/v1alpha1/namespaces/ns/virtualmachineinstances/vm1/%zz",
		"/",
		"",
	} {
		for m := range fuzzMethods[:2] {
			f.Add(p, byte(m))
		}
	}
	f.Fuzz(func(t *testing.T, escaped string, m byte) {
		checkRoute(t, escaped)
		checkServe(t, escaped, fuzzMethods[int(m)%len(fuzzMethods)])
	})
}
