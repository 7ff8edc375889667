package nodeapi

import "strings"

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
const (
	// MigrationPort is the handler's migration proxy port.
	MigrationPort = 8187
	// NodeCommonNamePrefix starts the common name of a node certificate; the node's name
	// follows.
	NodeCommonNamePrefix = "kubevisor-node:"
)

// NodeCommonName is the common name of node's certificate: "kubevisor-node:" + node.
func NodeCommonName(node string) string { return NodeCommonNamePrefix + node }

// NodeOfCommonName is the node a node certificate's common name names, and whether cn is one.
func NodeOfCommonName(cn string) (string, bool) {
	node, ok := strings.CutPrefix(cn, NodeCommonNamePrefix)
	return node, ok && node != ""
}
