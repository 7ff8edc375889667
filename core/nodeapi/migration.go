package nodeapi

import (
	"strings"
	"time"
)

// The node handlers' migration proxies (core/handler/migrationproxy) carry a migration's streams
// from the source node's handler to the target node's over mutual TLS, each handler presenting
// its own node certificate and checking that the peer's names the node the migration says.
//
// A node certificate is issued by the control plane's CA to one node's handler: common name
// NodeCommonName(node), ExtKeyUsage serverAuth and clientAuth (the same certificate serves the
// target side and dials from the source side). The handler reads it, its key and the CA bundle
// from a directory laid out as a kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt). Unlike
// HandlerCertSecret, which every handler shares, it names one node: a handler holding it can
// speak for that node only.
//
// The handler obtains it through the Kubernetes CSR API (certificates.k8s.io/v1) with the
// signer NodeSignerName (core/handler/nodecert files the request, controlplane/nodecerts in
// kubevisor-api approves and signs it): the request must come from the handler's service
// account (HandlerServiceAccount) with a token bound to a pod on that node, the key never
// leaves the node, and the certificate lives NodeCertMaxLifetime at most.
const (
	// MigrationPort is the handler's migration proxy port.
	MigrationPort = 8187
	// NodeCommonNamePrefix starts the common name of a node certificate; the node's name
	// follows.
	NodeCommonNamePrefix = "kubevisor-node:"
	// NodeSignerName is the signerName of the CertificateSigningRequests of node
	// certificates.
	NodeSignerName = "kubevisor.io/node-migration"
	// HandlerServiceAccount is the service account of the handler DaemonSet, in the install
	// namespace: the only requester whose node certificate requests are approved.
	HandlerServiceAccount = "kubevisor-handler"
	// NodeCertLifetime is the lifetime a handler asks for (expirationSeconds); the signer
	// grants NodeCertMaxLifetime at most.
	NodeCertLifetime    = 24 * time.Hour
	NodeCertMaxLifetime = 24 * time.Hour
)

// NodeCommonName is the common name of node's certificate: "kubevisor-node:" + node.
func NodeCommonName(node string) string { return NodeCommonNamePrefix + node }

// NodeOfCommonName is the node a node certificate's common name names, and whether cn is one.
func NodeOfCommonName(cn string) (string, bool) {
	node, ok := strings.CutPrefix(cn, NodeCommonNamePrefix)
	return node, ok && node != ""
}
