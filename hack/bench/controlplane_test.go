package bench

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestRequestKind(t *testing.T) {
	for _, tc := range []struct{ method, url, verb, resource string }{
		{"GET", "/api/v1/namespaces/default/pods?labelSelector=x", "list", "pods"},
		{"GET", "/api/v1/namespaces/default/pods?watch=true&resourceVersion=5", "watch", "pods"},
		{"GET", "/api/v1/namespaces/default/pods/p1", "get", "pods"},
		{"GET", "/api/v1/namespaces/default", "get", "namespaces"},
		{"GET", "/api/v1/nodes", "list", "nodes"},
		{"POST", "/api/v1/namespaces/default/pods", "create", "pods"},
		{"POST", "/api/v1/namespaces/default/pods/p1/binding", "create", "pods/binding"},
		{"PATCH", "/apis/kubevisor.io/v1alpha1/namespaces/default/virtualmachineinstances/v1/status", "patch", "virtualmachineinstances.kubevisor.io/status"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l", "update", "leases.coordination.k8s.io"},
		{"DELETE", "/api/v1/namespaces/default/pods/p1", "delete", "pods"},
		{"DELETE", "/api/v1/namespaces/default/pods", "deletecollection", "pods"},
		{"GET", "/apis/kubevisor.io/v1alpha1/hypervisorclasses", "list", "hypervisorclasses.kubevisor.io"},
		{"GET", "/apis", "get", "discovery"},
		{"GET", "/apis/kubevisor.io/v1alpha1", "get", "discovery"},
		{"GET", "/api/v1", "get", "discovery"},
		{"GET", "/openapi/v3", "get", "discovery"},
	} {
		verb, res := requestKind(httptest.NewRequest(tc.method, tc.url, nil))
		if verb != tc.verb || res != tc.resource {
			t.Errorf("%s %s: %s %s, want %s %s", tc.method, tc.url, verb, res, tc.verb, tc.resource)
		}
	}
}

func TestRequestCounter(t *testing.T) {
	c := newRequestCounter()
	rt := c.wrap(roundTripperFunc(func(*http.Request) (*http.Response, error) { return &http.Response{StatusCode: 200}, nil }))
	for _, u := range []string{"/api/v1/namespaces/d/pods", "/api/v1/namespaces/d/pods", "/api/v1/namespaces/d/pods/p"} {
		if _, err := rt.RoundTrip(httptest.NewRequest("GET", u, nil)); err != nil {
			t.Fatal(err)
		}
	}
	before := map[string]int{"list pods": 1}
	got := diff(c.snapshot(), before)
	if len(got) != 2 || got["list pods"] != 1 || got["get pods"] != 1 || c.total.Load() != 3 {
		t.Fatalf("counts %v (total %d)", got, c.total.Load())
	}
	if v := byVerb(map[string]int{"get pods": 2, "get nodes": 1, "list pods": 4}); v["get"] != 3 || v["list"] != 4 {
		t.Fatalf("byVerb %v", v)
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 20; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    int
		want time.Duration
	}{{50, 10 * time.Millisecond}, {95, 19 * time.Millisecond}, {100, 20 * time.Millisecond}, {1, time.Millisecond}} {
		if got := percentile(d, tc.p); got != tc.want {
			t.Errorf("p%d = %s, want %s", tc.p, got, tc.want)
		}
	}
	if percentile(nil, 50) != 0 {
		t.Error("percentile of nothing")
	}
}
