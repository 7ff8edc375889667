package client

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/wsstream"
)

func TestMessage(t *testing.T) {
	vmi := Action{Command: "kubectl vm", Verb: "pause", Resource: subv1.VirtualMachineInstances, Name: "vm1", Namespace: "ns1"}
	tests := []struct {
		name string
		st   metav1.Status
		a    Action
		want string
	}{
		{"forbidden", metav1.Status{Code: 403, Message: "nope"}, vmi,
			"you (alice) may not pause virtualmachineinstances in namespace ns1: ask for the kubevisor.io:edit role"},
		{"not running", metav1.Status{Code: 409, Message: "VMI vm1 is not running"}, vmi,
			"VMI vm1 is not running: start it with kubectl vm start vm1"},
		{"paused", metav1.Status{Code: 409, Message: "VMI vm1 is paused"}, Action{Command: "vmctl", Verb: "open the console of", Name: "vm1"},
			"VMI vm1 is paused: unpause it with vmctl unpause vmi vm1"},
		{"not implemented", metav1.Status{Code: 501, Message: "driver fake does not offer soft reboot"}, vmi,
			"driver fake does not offer soft reboot"},
		{"unavailable", metav1.Status{Code: 503, Message: "service unavailable"}, vmi,
			"check that kubevisor-api runs"},
		{"not found", metav1.Status{Code: 404, Message: "x"}, Action{Resource: subv1.VirtualMachines, Name: "vm2", Namespace: "ns1"},
			"VM vm2 not found in namespace ns1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Message(tt.st, tt.a, "alice"); !strings.HasPrefix(got, tt.want) && !strings.Contains(got, tt.want) {
				t.Fatalf("Message = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestStatusOfAHandshakeRefusal(t *testing.T) {
	tests := []struct {
		name string
		err  error
		code int32
		msg  string
	}{
		{"status body", &wsstream.HTTPError{StatusCode: 409, Body: []byte(`{"kind":"Status","code":409,"message":"VMI vm1 is not running"}`)}, 409, "VMI vm1 is not running"},
		{"text body", &wsstream.HTTPError{StatusCode: 403, Body: []byte("forbidden\n")}, 403, "forbidden"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, ok := StatusOf(tt.err)
			if !ok || st.Code != tt.code || st.Message != tt.msg {
				t.Fatalf("StatusOf = %+v, %v", st, ok)
			}
		})
	}
	if _, ok := StatusOf(errors.New("dial tcp: refused")); ok {
		t.Fatal("a network error has no status")
	}
	if !IsNotRunning(&wsstream.HTTPError{StatusCode: http.StatusConflict}) {
		t.Fatal("409 is not running")
	}
}
