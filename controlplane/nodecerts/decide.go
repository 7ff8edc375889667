// Package nodecerts is kubevisor-api's signer of node certificates: it approves or denies the
// CertificateSigningRequests of signer nodeapi.NodeSignerName and signs the approved ones with
// the control plane's CA, so that each node handler holds a certificate for its own node
// (common name nodeapi.NodeCommonName) and for no other.
//
// A request is approved only when all of these hold (Decide; otherwise it is denied, its
// condition's reason one of the Reason constants and its message saying what was wrong):
//
//   - the requester is the handler's service account (system:serviceaccount:<install
//     namespace>:kubevisor-handler, Signer.Requester);
//   - the requester's token was bound to a pod on a node: the API server copies the token's
//     node into the request's spec.extra["authentication.kubernetes.io/node-name"], and it
//     names the node of the common name. A handler gets a certificate only for the node its
//     pod runs on, and a token of the service account that is not bound to a pod (a
//     long-lived Secret token, a TokenRequest without a pod) gets none;
//   - the subject is the common name nodeapi.NodeCommonName(node) and nothing else, with no
//     DNS, IP, e-mail or URI name;
//   - the usages are exactly digital signature, server auth and client auth;
//   - the key is ECDSA P-256, or RSA of at least 2048 bits, and signed the request.
//
// The certificate carries the common name and those usages only (nothing else of the request
// is copied), is signed by the current CA of kubevisor-api's certificate directory (package
// certs), and lives spec.expirationSeconds, at most Signer.MaxLifetime (default
// nodeapi.NodeCertMaxLifetime), never beyond the CA. A request approved by someone else that
// the rules above refuse is not signed: it gets the condition Failed with the reason.
//
// The handlers trust the CA bundle (current and previous CA) from the Secret
// nodeapi.HandlerCertSecret, which package certs keeps; the certificate in the request's status
// is the node certificate alone.
package nodecerts

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"

	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// Reasons of the conditions the signer sets.
const (
	// ReasonApproved is the reason of the Approved condition.
	ReasonApproved = "KubevisorNodeIdentityVerified"
	// ReasonNotHandler: the requester is not the handler's service account.
	ReasonNotHandler = "RequesterNotHandler"
	// ReasonNotNodeBound: the requester's token names no node.
	ReasonNotNodeBound = "TokenNotBoundToNode"
	// ReasonNodeMismatch: the common name names another node than the requester's token.
	ReasonNodeMismatch = "NodeMismatch"
	// ReasonInvalidRequest: the request does not parse, is not signed by its key, or its
	// common name is not a node's.
	ReasonInvalidRequest = "InvalidRequest"
	// ReasonSubjectNotAllowed: the subject has more than the common name.
	ReasonSubjectNotAllowed = "SubjectNotAllowed"
	// ReasonNamesNotAllowed: the request asks for DNS, IP, e-mail or URI names.
	ReasonNamesNotAllowed = "NamesNotAllowed"
	// ReasonUsagesNotAllowed: the usages are not exactly Usages.
	ReasonUsagesNotAllowed = "UsagesNotAllowed"
	// ReasonKeyNotAllowed: the key is of another type or too small.
	ReasonKeyNotAllowed = "KeyNotAllowed"
	// ReasonSigningFailed is the reason of the Failed condition when the CA could not sign.
	ReasonSigningFailed = "SigningFailed"
)

// Usages are the usages a node certificate request must ask for, no more, no fewer.
var Usages = []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth, certv1.UsageClientAuth}

// ExtKeyUsages are the extended key usages of an issued node certificate.
var ExtKeyUsages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}

// Requester is the user name of the handler's service account in namespace, the only
// requester Decide approves.
func Requester(namespace string) string {
	return serviceaccount.MakeUsername(namespace, nodeapi.HandlerServiceAccount)
}

// Decision is what Decide says of a request.
type Decision struct {
	// Approved says the request is to be approved and signed; otherwise denied.
	Approved bool
	// Reason is ReasonApproved or a denial's Reason constant; Message says why, for people.
	Reason, Message string
	// Node is the node of the certificate (set when Approved).
	Node string
	// PublicKey is the request's key (set when Approved).
	PublicKey crypto.PublicKey
}

func deny(reason, format string, args ...any) Decision {
	return Decision{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Decide says whether csr, a request of signer nodeapi.NodeSignerName, is to be approved: it
// checks the requester (requester, Requester of the install namespace), the node its token
// names, the subject, the names, the usages and the key, in that order, and the first that
// fails is the denial's reason. It is pure: the same request gets the same answer.
func Decide(csr *certv1.CertificateSigningRequest, requester string) Decision {
	spec := csr.Spec
	if spec.SignerName != nodeapi.NodeSignerName {
		return deny(ReasonInvalidRequest, "signer %q is not %s", spec.SignerName, nodeapi.NodeSignerName)
	}
	if spec.Username != requester {
		return deny(ReasonNotHandler, "requested by %q: only %s may request node certificates", spec.Username, requester)
	}
	tokenNodes := spec.Extra[serviceaccount.NodeNameKey]
	if len(tokenNodes) != 1 || tokenNodes[0] == "" {
		return deny(ReasonNotNodeBound, "the requester's token is not bound to a pod on a node (no single %s in spec.extra: %q)", serviceaccount.NodeNameKey, []string(tokenNodes))
	}
	tokenNode := tokenNodes[0]

	block, rest := pem.Decode(spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" || len(strings.TrimSpace(string(rest))) != 0 {
		return deny(ReasonInvalidRequest, "spec.request is not one PEM CERTIFICATE REQUEST")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return deny(ReasonInvalidRequest, "parse the request: %v", err)
	}
	if err := req.CheckSignature(); err != nil {
		return deny(ReasonInvalidRequest, "the request is not signed by its key: %v", err)
	}
	node, ok := nodeapi.NodeOfCommonName(req.Subject.CommonName)
	if !ok {
		return deny(ReasonInvalidRequest, "common name %q is not a node certificate's (%s<node>)", req.Subject.CommonName, nodeapi.NodeCommonNamePrefix)
	}
	if node != tokenNode {
		return deny(ReasonNodeMismatch, "common name %q names node %q, and the requester's pod runs on node %q", req.Subject.CommonName, node, tokenNode)
	}
	if n := len(req.Subject.Names); n != 1 {
		return deny(ReasonSubjectNotAllowed, "subject %q: only the common name is allowed", req.Subject.String())
	}
	if len(req.DNSNames)+len(req.IPAddresses)+len(req.EmailAddresses)+len(req.URIs) > 0 {
		return deny(ReasonNamesNotAllowed, "names %v %v %v %v: a node certificate carries none", req.DNSNames, req.IPAddresses, req.EmailAddresses, req.URIs)
	}
	if !sameUsages(spec.Usages, Usages) {
		return deny(ReasonUsagesNotAllowed, "usages %q: want exactly %q", spec.Usages, Usages)
	}
	if err := allowedKey(req.PublicKey); err != nil {
		return deny(ReasonKeyNotAllowed, "%v", err)
	}
	return Decision{
		Approved: true, Reason: ReasonApproved, Node: node, PublicKey: req.PublicKey,
		Message: fmt.Sprintf("node certificate of node %q requested by %s from a pod on that node", node, spec.Username),
	}
}

// sameUsages says got holds exactly want's usages (in any order, each once).
func sameUsages(got, want []certv1.KeyUsage) bool {
	if len(got) != len(want) {
		return false
	}
	for _, u := range want {
		if !slices.Contains(got, u) {
			return false
		}
	}
	return true
}

// allowedKey accepts ECDSA P-256 and RSA of 2048 bits or more.
func allowedKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve == elliptic.P256() {
			return nil
		}
		return fmt.Errorf("ECDSA key on curve %s: want P-256", k.Curve.Params().Name)
	case *rsa.PublicKey:
		if k.N.BitLen() >= 2048 {
			return nil
		}
		return fmt.Errorf("RSA key of %d bits: want 2048 or more", k.N.BitLen())
	default:
		return fmt.Errorf("key of type %T: want ECDSA P-256, or RSA of 2048 bits or more", pub)
	}
}

// Lifetime is how long csr's certificate lives: spec.expirationSeconds, at most max (and max
// when unset).
func Lifetime(csr *certv1.CertificateSigningRequest, max time.Duration) time.Duration {
	if s := csr.Spec.ExpirationSeconds; s != nil && *s > 0 {
		if d := time.Duration(*s) * time.Second; d < max {
			return d
		}
	}
	return max
}
