package nodecerts

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/utils/ptr"

	"github.com/kubevisor/kubevisor/core/nodeapi"
)

var handlerSA = Requester("kubevisor-system")

// requestPEM is a PEM certificate request of tmpl signed by key.
func requestPEM(t *testing.T, tmpl *x509.CertificateRequest, key crypto.Signer) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func p256(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// nodeCSR is the request a handler on node files for node cn, as core/handler/nodecert does.
func nodeCSR(t *testing.T, tokenNode, cnNode string, edit func(*x509.CertificateRequest, *certv1.CertificateSigningRequestSpec) crypto.Signer) *certv1.CertificateSigningRequest {
	t.Helper()
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: nodeapi.NodeCommonName(cnNode)}}
	spec := certv1.CertificateSigningRequestSpec{
		SignerName: nodeapi.NodeSignerName,
		Username:   handlerSA,
		Groups:     []string{"system:serviceaccounts", "system:serviceaccounts:kubevisor-system", "system:authenticated"},
		Usages:     []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth, certv1.UsageClientAuth},
		Extra: map[string]certv1.ExtraValue{
			serviceaccount.NodeNameKey:             {tokenNode},
			serviceaccount.PodNameKey:              {"kubevisor-handler-abcde"},
			"authentication.kubernetes.io/pod-uid": {"0e1f"},
		},
	}
	var key crypto.Signer = p256(t)
	if edit != nil {
		if k := edit(tmpl, &spec); k != nil {
			key = k
		}
	}
	if spec.Request == nil {
		spec.Request = requestPEM(t, tmpl, key)
	}
	return &certv1.CertificateSigningRequest{Spec: spec}
}

func TestDecide(t *testing.T) {
	rsa1024, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	rsa2048, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	type edit = func(*x509.CertificateRequest, *certv1.CertificateSigningRequestSpec) crypto.Signer
	for _, tc := range []struct {
		name       string
		tokenNode  string
		cnNode     string
		edit       edit
		wantReason string
		wantInMsg  string
	}{
		{name: "the handler of node-a for node-a", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonApproved},
		{name: "usages in another order", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonApproved,
			edit: func(_ *x509.CertificateRequest, s *certv1.CertificateSigningRequestSpec) crypto.Signer {
				s.Usages = []certv1.KeyUsage{certv1.UsageClientAuth, certv1.UsageServerAuth, certv1.UsageDigitalSignature}
				return nil
			}},
		{name: "RSA 2048", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonApproved,
			edit: func(*x509.CertificateRequest, *certv1.CertificateSigningRequestSpec) crypto.Signer { return rsa2048 }},
		{name: "the handler of node-a for node-b", tokenNode: "node-a", cnNode: "node-b", wantReason: ReasonNodeMismatch,
			wantInMsg: `pod runs on node "node-a"`},
		{name: "another service account", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonNotHandler,
			edit: func(_ *x509.CertificateRequest, s *certv1.CertificateSigningRequestSpec) crypto.Signer {
				s.Username = serviceaccount.MakeUsername("default", "kubevisor-handler")
				return nil
			}, wantInMsg: "system:serviceaccount:default:kubevisor-handler"},
		{name: "a user", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonNotHandler,
			edit: func(_ *x509.CertificateRequest, s *certv1.CertificateSigningRequestSpec) crypto.Signer {
				s.Username = "system:node:node-a"
				return nil
			}},
		{name: "a token bound to no pod", cnNode: "node-a", wantReason: ReasonNotNodeBound,
			edit: func(_ *x509.CertificateRequest, s *certv1.CertificateSigningRequestSpec) crypto.Signer {
				s.Extra = nil
				return nil
			}},
		{name: "two node names", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonNotNodeBound,
			edit: func(_ *x509.CertificateRequest, s *certv1.CertificateSigningRequestSpec) crypto.Signer {
				s.Extra[serviceaccount.NodeNameKey] = certv1.ExtraValue{"node-a", "node-b"}
				return nil
			}},
		{name: "not a node common name", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonInvalidRequest,
			edit: func(r *x509.CertificateRequest, _ *certv1.CertificateSigningRequestSpec) crypto.Signer {
				r.Subject.CommonName = "system:node:node-a"
				return nil
			}},
		{name: "an empty node", tokenNode: "node-a", cnNode: "", wantReason: ReasonInvalidRequest},
		{name: "an organization", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonSubjectNotAllowed,
			edit: func(r *x509.CertificateRequest, _ *certv1.CertificateSigningRequestSpec) crypto.Signer {
				r.Subject.Organization = []string{"system:masters"}
				return nil
			}},
		{name: "a DNS name", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonNamesNotAllowed,
			edit: func(r *x509.CertificateRequest, _ *certv1.CertificateSigningRequestSpec) crypto.Signer {
				r.DNSNames = []string{"kubevisor-api.kubevisor-system.svc"}
				return nil
			}},
		{name: "an IP address", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonNamesNotAllowed,
			edit: func(r *x509.CertificateRequest, _ *certv1.CertificateSigningRequestSpec) crypto.Signer {
				r.IPAddresses = []net.IP{net.ParseIP("10.0.0.1")}
				return nil
			}},
		{name: "client auth only", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonUsagesNotAllowed,
			edit: func(_ *x509.CertificateRequest, s *certv1.CertificateSigningRequestSpec) crypto.Signer {
				s.Usages = []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}
				return nil
			}},
		{name: "code signing too", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonUsagesNotAllowed,
			edit: func(_ *x509.CertificateRequest, s *certv1.CertificateSigningRequestSpec) crypto.Signer {
				s.Usages = append(s.Usages, certv1.UsageCodeSigning)
				return nil
			}},
		{name: "a usage twice", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonUsagesNotAllowed,
			edit: func(_ *x509.CertificateRequest, s *certv1.CertificateSigningRequestSpec) crypto.Signer {
				s.Usages = []certv1.KeyUsage{certv1.UsageServerAuth, certv1.UsageServerAuth, certv1.UsageClientAuth}
				return nil
			}},
		{name: "RSA 1024", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonKeyNotAllowed, wantInMsg: "1024 bits",
			edit: func(*x509.CertificateRequest, *certv1.CertificateSigningRequestSpec) crypto.Signer { return rsa1024 }},
		{name: "ECDSA P-384", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonKeyNotAllowed, wantInMsg: "P-384",
			edit: func(*x509.CertificateRequest, *certv1.CertificateSigningRequestSpec) crypto.Signer { return p384 }},
		{name: "Ed25519", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonKeyNotAllowed,
			edit: func(*x509.CertificateRequest, *certv1.CertificateSigningRequestSpec) crypto.Signer { return ed }},
		{name: "not PEM", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonInvalidRequest,
			edit: func(_ *x509.CertificateRequest, s *certv1.CertificateSigningRequestSpec) crypto.Signer {
				s.Request = []byte("hello")
				return nil
			}},
		{name: "a signature of another key", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonInvalidRequest, wantInMsg: "not signed by its key",
			edit: func(r *x509.CertificateRequest, s *certv1.CertificateSigningRequestSpec) crypto.Signer {
				// The request of one key with the public key of another spliced in: its
				// signature no longer verifies.
				a, b := p256(t), p256(t)
				derA, _ := x509.CreateCertificateRequest(rand.Reader, r, a)
				pa, _ := x509.MarshalPKIXPublicKey(&a.PublicKey)
				pb, _ := x509.MarshalPKIXPublicKey(&b.PublicKey)
				spliced := strings.Replace(string(derA), string(pa), string(pb), 1)
				s.Request = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte(spliced)})
				return nil
			}},
		{name: "another signer", tokenNode: "node-a", cnNode: "node-a", wantReason: ReasonInvalidRequest,
			edit: func(_ *x509.CertificateRequest, s *certv1.CertificateSigningRequestSpec) crypto.Signer {
				s.SignerName = "kubernetes.io/kube-apiserver-client"
				return nil
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			csr := nodeCSR(t, tc.tokenNode, tc.cnNode, tc.edit)
			d := Decide(csr, handlerSA)
			if d.Reason != tc.wantReason || d.Approved != (tc.wantReason == ReasonApproved) {
				t.Fatalf("Decide = approved %v, %s: %s; want %s", d.Approved, d.Reason, d.Message, tc.wantReason)
			}
			if d.Message == "" || !strings.Contains(d.Message, tc.wantInMsg) {
				t.Errorf("message %q, want one containing %q", d.Message, tc.wantInMsg)
			}
			if d.Approved && (d.Node != tc.cnNode || d.PublicKey == nil) {
				t.Errorf("approved for node %q key %v, want %q and the request's key", d.Node, d.PublicKey, tc.cnNode)
			}
			// The same request, the same answer.
			if again := Decide(csr, handlerSA); again.Reason != d.Reason || again.Message != d.Message {
				t.Errorf("second Decide = %s %q", again.Reason, again.Message)
			}
		})
	}
}

func TestLifetime(t *testing.T) {
	csr := &certv1.CertificateSigningRequest{}
	for _, tc := range []struct {
		seconds *int32
		want    time.Duration
	}{
		{nil, 24 * time.Hour},
		{ptr.To[int32](3600), time.Hour},
		{ptr.To[int32](7 * 24 * 3600), 24 * time.Hour},
		{ptr.To[int32](0), 24 * time.Hour},
	} {
		csr.Spec.ExpirationSeconds = tc.seconds
		if got := Lifetime(csr, 24*time.Hour); got != tc.want {
			t.Errorf("Lifetime(expirationSeconds %v) = %s, want %s", ptr.Deref(tc.seconds, -1), got, tc.want)
		}
	}
}
