// Package nodeapi is the contract between kubevisor-api and the node handlers: the HTTPS
// endpoint each handler serves for the streams and actions of the VMIs on its node, its
// paths, and the certificate names both sides check.
//
// Transport: HTTPS on the handler pod's IP, port Port, mutual TLS. Both certificates come from
// the control plane's CA (kubevisor-api keeps it and writes the handler's certificate into the
// Secret HandlerCertSecret). The handler presents a serving certificate for ServerName and
// accepts only a client certificate of that CA whose common name is ClientName; kubevisor-api
// verifies the handler's certificate for ServerName. Nothing on the port answers without the
// client certificate.
//
// Paths, for the VMI NS/NAME on this node (the handler answers 404 for a VMI it does not run):
//
//	GET  /v1alpha1/namespaces/NS/virtualmachineinstances/NAME/console          WebSocket (core/wsstream)
//	GET  /v1alpha1/namespaces/NS/virtualmachineinstances/NAME/vnc              WebSocket
//	GET  /v1alpha1/namespaces/NS/virtualmachineinstances/NAME/portforward/PORT[/PROTO] WebSocket
//	PUT  /v1alpha1/namespaces/NS/virtualmachineinstances/NAME/{pause,unpause,softreboot,reset}
//	GET  /v1alpha1/namespaces/NS/virtualmachineinstances/NAME/guestosinfo      JSON GuestOSInfo
//
// Errors are a JSON metav1.Status with the HTTP code: 404 (no such VMI on this node), 409 (the
// VMI is not in a state for it: not running, already paused), 501 (the VMI's driver does not
// declare the ability, the message naming it), 500 (the driver failed).
package nodeapi

import (
	"fmt"
	"net/url"
	"path"
)

const (
	// Port is the handler's stream port.
	Port = 8186
	// ServerName is the DNS name in the handler's serving certificate, which kubevisor-api
	// checks whatever address it dials.
	ServerName = "kubevisor-handler.kubevisor-system.svc"
	// ClientName is the common name of kubevisor-api's client certificate, the only client
	// the handler accepts.
	ClientName = "kubevisor-api"
	// HandlerCertSecret (in the install namespace) holds the handler's tls.crt and tls.key
	// and, in ca.crt, the CA bundle that client certificates must chain to.
	HandlerCertSecret = "kubevisor-handler-certs"
	// Prefix starts every path.
	Prefix = "/v1alpha1"
	// ConsoleTakenOver is the last output of a console session that another session of the
	// same VMI took over: one interactive console per VMI, the newest wins, and the old one is
	// closed after this line (a client that follows the console stops following on it).
	ConsoleTakenOver = "\r\n[kubevisor: console taken over by another session]\r\n"
)

// VMIPath is the path of a VMI's subresource on the handler: VMIPath("ns", "vm1", "portforward",
// "80", "tcp") is /v1alpha1/namespaces/ns/virtualmachineinstances/vm1/portforward/80/tcp.
func VMIPath(namespace, name, subresource string, rest ...string) string {
	parts := []string{Prefix, "namespaces", url.PathEscape(namespace), "virtualmachineinstances",
		url.PathEscape(name), subresource}
	for _, r := range rest {
		parts = append(parts, url.PathEscape(r))
	}
	return path.Join(parts...)
}

// PortForwardPath is VMIPath for portforward to port (protocol "tcp" when empty).
func PortForwardPath(namespace, name string, port int32, protocol string) string {
	if protocol == "" {
		protocol = "tcp"
	}
	return VMIPath(namespace, name, "portforward", fmt.Sprint(port), protocol)
}
