package streams

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevisor/kubevisor/core/nodeapi"
)

func TestParsePath(t *testing.T) {
	for _, c := range []struct {
		path string
		want route
		ok   bool
	}{
		{nodeapi.VMIPath("ns", "vm1", "console"), route{Namespace: "ns", Name: "vm1", Subresource: "console", Rest: []string{}}, true},
		{nodeapi.PortForwardPath("ns", "vm1", 22, ""), route{Namespace: "ns", Name: "vm1", Subresource: "portforward", Rest: []string{"22", "tcp"}}, true},
		{"/v1alpha1/namespaces/ns/virtualmachineinstances/a%2Fb/pause", route{Namespace: "ns", Name: "a/b", Subresource: "pause", Rest: []string{}}, true},
		{"/v1alpha1/namespaces/ns/virtualmachineinstances/vm1", route{}, false},
		{"/v1alpha1/namespaces/ns/virtualmachines/vm1/console", route{}, false},
		{"/v1beta1/namespaces/ns/virtualmachineinstances/vm1/console", route{}, false},
		{"/v1alpha1/namespaces//virtualmachineinstances/vm1/console", route{}, false},
		{"/v1alpha1/namespaces/ns/virtualmachineinstances/vm1/console/", route{}, false},
		{"/", route{}, false},
	} {
		got, err := parsePath(c.path)
		if (err == nil) != c.ok || (c.ok && !reflect.DeepEqual(got, c.want)) {
			t.Errorf("parsePath(%q) = %+v, %v; want %+v, ok %v", c.path, got, err, c.want, c.ok)
		}
	}
}

func TestParseForward(t *testing.T) {
	for _, c := range []struct {
		rest []string
		want forward
		ok   bool
	}{
		{[]string{"22"}, forward{22, "tcp"}, true},
		{[]string{"1", "tcp"}, forward{1, "tcp"}, true},
		{[]string{"65535", "TCP"}, forward{65535, "tcp"}, true},
		{[]string{"0"}, forward{}, false},
		{[]string{"65536"}, forward{}, false},
		{[]string{"-1"}, forward{}, false},
		{[]string{"ssh"}, forward{}, false},
		{[]string{"53", "udp"}, forward{}, false},
		{[]string{}, forward{}, false},
		{[]string{"22", "tcp", "x"}, forward{}, false},
	} {
		got, err := parseForward(c.rest)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseForward(%q) = %+v, %v; want %+v, ok %v", c.rest, got, err, c.want, c.ok)
		}
	}
}

func TestHTTPCodeAndMessage(t *testing.T) {
	for _, c := range []struct {
		err  error
		code int
		msg  string
	}{
		{status.Error(codes.NotFound, "VMI x does not run on this node"), http.StatusNotFound, "VMI x does not run on this node"},
		{fmt.Errorf("pause: %w", status.Error(codes.FailedPrecondition, "the VMI's VM is paused")), http.StatusConflict, "pause: the VMI's VM is paused"},
		{status.Error(codes.Unimplemented, `hypervisor driver "x" does not offer a VNC display`), http.StatusNotImplemented, `hypervisor driver "x" does not offer a VNC display`},
		{status.Error(codes.InvalidArgument, "port"), http.StatusBadRequest, "port"},
		{status.Error(codes.Unavailable, "dial guest: refused"), http.StatusBadGateway, "dial guest: refused"},
		{fmt.Errorf("reset: %w", status.Error(codes.Internal, "qmp: broken")), http.StatusInternalServerError, "reset: qmp: broken"},
		{errors.New("no hypervisor driver is loaded"), http.StatusInternalServerError, "no hypervisor driver is loaded"},
	} {
		if got := httpCode(c.err); got != c.code {
			t.Errorf("httpCode(%v) = %d, want %d", c.err, got, c.code)
		}
		if got := message(c.err); got != c.msg {
			t.Errorf("message(%v) = %q, want %q", c.err, got, c.msg)
		}
	}
}
