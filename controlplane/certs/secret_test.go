package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/kubevisor/kubevisor/core/nodeapi"
)

func fakeClient(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
}

func handlerSecret(c client.Client) SecretCert {
	return SecretCert{Client: c, Namespace: "kubevisor-system", Name: nodeapi.HandlerCertSecret, ServerName: nodeapi.ServerName}
}

func getSecret(t *testing.T, c client.Client) *corev1.Secret {
	t.Helper()
	var s corev1.Secret
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "kubevisor-system", Name: nodeapi.HandlerCertSecret}, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// verifyHandler checks that the Secret's certificate verifies for nodeapi.ServerName against
// the directory's bundle (what kubevisor-api trusts), and that ca.crt is that bundle.
func verifyHandler(t *testing.T, dir string, s *corev1.Secret, at time.Time) *x509.Certificate {
	t.Helper()
	if s.Type != corev1.SecretTypeTLS {
		t.Fatalf("secret type %q", s.Type)
	}
	bundle, err := os.ReadFile(filepath.Join(dir, BundleFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s.Data[SecretCAKey], bundle) {
		t.Fatal("ca.crt is not the CA bundle")
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	pair, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatalf("tls.crt and tls.key: %v", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: nodeapi.ServerName, Roots: pool, CurrentTime: at}); err != nil {
		t.Fatalf("handler certificate does not verify for %s: %v", nodeapi.ServerName, err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Fatal("handler certificate verifies for client auth")
	}
	return cert
}

func TestEnsureSecretIssuesRenewsAndFollowsTheCA(t *testing.T) {
	dir := t.TempDir()
	clk := &clock{t: time.Now()}
	o := clientOptions(dir, clk.Now)
	c := fakeClient(t)
	ctx := context.Background()
	sc := handlerSecret(c)

	ensure := func(wantRotated bool) (*corev1.Secret, time.Time) {
		t.Helper()
		st, err := Ensure(o)
		if err != nil {
			t.Fatal(err)
		}
		renewAt, rotated, err := EnsureSecret(ctx, o, st, sc)
		if err != nil {
			t.Fatal(err)
		}
		if rotated != wantRotated {
			t.Fatalf("at %s: rotated %v, want %v", clk.Now(), rotated, wantRotated)
		}
		return getSecret(t, c), renewAt
	}

	s, renewAt := ensure(true) // created
	first := verifyHandler(t, dir, s, clk.Now())
	if want := first.NotAfter.Add(-o.RenewBefore); !renewAt.Equal(want) {
		t.Errorf("renewAt %s, want %s", renewAt, want)
	}
	rv := s.ResourceVersion

	clk.Add(30 * time.Minute)
	if s, _ = ensure(false); s.ResourceVersion != rv {
		t.Error("an unchanged Secret was written")
	}

	clk.Add(15 * time.Minute) // due
	s, _ = ensure(true)
	if got := verifyHandler(t, dir, s, clk.Now()); got.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("handler certificate not renewed")
	}

	// The CA rotation (at 2h10m): a certificate of the new CA, and both CAs in ca.crt.
	clk.Add(85 * time.Minute)
	if _, rotated, err := EnsureSecret(ctx, o, mustEnsure(t, o), sc); err != nil || !rotated {
		t.Fatalf("EnsureSecret at the CA rotation: %v %v", rotated, err)
	}
	s = getSecret(t, c)
	newCA := readCert(t, filepath.Join(dir, CAFile))
	if got := verifyHandler(t, dir, s, clk.Now()); got.CheckSignatureFrom(newCA) != nil {
		t.Fatal("handler certificate not from the new CA after the rotation")
	}
	if n := len(parseCerts(s.Data[SecretCAKey])); n != 2 {
		t.Fatalf("ca.crt has %d CAs during the overlap, want 2", n)
	}

	// Renewed again at 2h55m (the old CA still in the bundle); at 3h05m the old CA has expired
	// and leaves the bundle: ca.crt follows, the certificate stays.
	clk.Add(45 * time.Minute)
	s, _ = ensure(true)
	if n := len(parseCerts(s.Data[SecretCAKey])); n != 2 {
		t.Fatalf("ca.crt has %d CAs before the old one expired, want 2", n)
	}
	clk.Add(10 * time.Minute)
	serial := readSecretCert(t, s).SerialNumber
	s, _ = ensure(false)
	if n := len(parseCerts(s.Data[SecretCAKey])); n != 1 {
		t.Fatalf("ca.crt has %d CAs after the old one expired, want 1", n)
	}
	if readSecretCert(t, s).SerialNumber.Cmp(serial) != 0 {
		t.Fatal("certificate replaced when only the bundle changed")
	}
}

func mustEnsure(t *testing.T, o Options) State {
	t.Helper()
	st, err := Ensure(o)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func readSecretCert(t *testing.T, s *corev1.Secret) *x509.Certificate {
	t.Helper()
	certs := parseCerts(s.Data[corev1.TLSCertKey])
	if len(certs) == 0 {
		t.Fatal("no certificate in tls.crt")
	}
	return certs[0]
}

// TestEnsureSecretReplacesWrongContent: whatever the Secret held that is not a valid
// certificate of the CA for the name is replaced, keys it has besides are kept, and a Secret of
// another type is recreated as kubernetes.io/tls.
func TestEnsureSecretReplacesWrongContent(t *testing.T) {
	dir := t.TempDir()
	o := clientOptions(dir, nil)
	st := mustEnsure(t, o)
	other, err := newLeaf(st.ca, time.Now(), time.Hour, leafSpec{commonName: "x", names: []string{"other.example"}, usage: x509.ExtKeyUsageServerAuth})
	if err != nil {
		t.Fatal(err)
	}
	foreignCA, err := newCA(time.Now(), 3*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := newLeaf(foreignCA, time.Now(), time.Hour, leafSpec{commonName: nodeapi.ServerName, names: []string{nodeapi.ServerName}, usage: x509.ExtKeyUsageServerAuth})
	if err != nil {
		t.Fatal(err)
	}
	client, err := newLeaf(st.ca, time.Now(), time.Hour, leafSpec{commonName: nodeapi.ServerName, names: []string{nodeapi.ServerName}, usage: x509.ExtKeyUsageClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	meta := metav1.ObjectMeta{Namespace: "kubevisor-system", Name: nodeapi.HandlerCertSecret}
	for name, sec := range map[string]*corev1.Secret{
		"garbage":      {ObjectMeta: meta, Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": []byte("x"), "tls.key": []byte("y"), "extra": []byte("kept")}},
		"other name":   {ObjectMeta: meta, Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": other.certPEM, "tls.key": other.keyPEM, "extra": []byte("kept")}},
		"other CA":     {ObjectMeta: meta, Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": foreign.certPEM, "tls.key": foreign.keyPEM, "extra": []byte("kept")}},
		"client usage": {ObjectMeta: meta, Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": client.certPEM, "tls.key": client.keyPEM, "extra": []byte("kept")}},
		"mismatch":     {ObjectMeta: meta, Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": other.certPEM, "tls.key": foreign.keyPEM, "extra": []byte("kept")}},
		"type opaque":  {ObjectMeta: meta, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"tls.crt": foreign.certPEM}},
		"type untyped": {ObjectMeta: meta, Data: map[string][]byte{}},
	} {
		t.Run(name, func(t *testing.T) {
			c := fakeClient(t, sec)
			if _, rotated, err := EnsureSecret(context.Background(), o, st, handlerSecret(c)); err != nil || !rotated {
				t.Fatalf("rotated %v, err %v", rotated, err)
			}
			got := getSecret(t, c)
			verifyHandler(t, dir, got, time.Now())
			if sec.Type == corev1.SecretTypeTLS && string(got.Data["extra"]) != "kept" {
				t.Error("a key besides the certificate's was dropped")
			}
		})
	}
}

func TestEnsureSecretRefused(t *testing.T) {
	o := clientOptions(t.TempDir(), nil)
	c := fakeClient(t)
	if _, _, err := EnsureSecret(context.Background(), o, State{}, handlerSecret(c)); err == nil {
		t.Error("EnsureSecret accepted a State not from Ensure")
	}
	st := mustEnsure(t, o)
	if _, _, err := EnsureSecret(context.Background(), o, st, SecretCert{Client: c, Namespace: "ns", Name: "n"}); err == nil {
		t.Error("EnsureSecret accepted no server name")
	}
}

// TestMutualTLSWithTheIssuedCertificates plays both sides of the handler's stream endpoint
// with what the package wrote: a server with the Secret's tls.crt/tls.key that requires a
// client certificate chaining to the Secret's ca.crt, dialed by kubevisor-api with client.crt
// and ca-bundle.crt for nodeapi.ServerName. It holds before and right after a CA rotation
// (the handler still on its old Secret, the client on its kept certificate; then the handler
// on the new Secret), and a certificate of another CA is refused.
func TestMutualTLSWithTheIssuedCertificates(t *testing.T) {
	dir := t.TempDir()
	clk := &clock{t: time.Now()}
	o := clientOptions(dir, clk.Now)
	c := fakeClient(t)
	ctx := context.Background()
	sync := func() *corev1.Secret {
		t.Helper()
		if _, _, err := EnsureSecret(ctx, o, mustEnsure(t, o), handlerSecret(c)); err != nil {
			t.Fatal(err)
		}
		return getSecret(t, c)
	}
	handshake := func(s *corev1.Secret, clientCert tls.Certificate) error {
		t.Helper()
		serverPair, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
		if err != nil {
			t.Fatal(err)
		}
		clientCAs := x509.NewCertPool()
		clientCAs.AppendCertsFromPEM(s.Data[SecretCAKey])
		bundle, err := os.ReadFile(filepath.Join(dir, BundleFile))
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(bundle)
		now := clk.Now
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		srv := tls.Server(a, &tls.Config{Certificates: []tls.Certificate{serverPair}, ClientCAs: clientCAs,
			ClientAuth: tls.RequireAndVerifyClientCert, Time: now})
		cl := tls.Client(b, &tls.Config{Certificates: []tls.Certificate{clientCert}, RootCAs: roots,
			ServerName: nodeapi.ServerName, Time: now})
		errc := make(chan error, 1)
		go func() {
			err := srv.Handshake()
			if err == nil {
				_, err = io.WriteString(srv, "ok")
			}
			a.Close()
			errc <- err
		}()
		err = cl.Handshake()
		if err == nil {
			_, err = io.ReadAll(cl)
		}
		b.Close()
		if serr := <-errc; serr != nil {
			return serr
		}
		return err
	}
	clientPair := func() tls.Certificate {
		t.Helper()
		p, err := tls.LoadX509KeyPair(filepath.Join(dir, ClientCertFile), filepath.Join(dir, ClientKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	s := sync()
	if err := handshake(s, clientPair()); err != nil {
		t.Fatalf("mutual TLS: %v", err)
	}

	clk.Add(time.Hour + 50*time.Minute) // renew the client certificate on the first CA
	old := sync()
	clk.Add(20 * time.Minute) // CA rotation
	s = sync()
	if readSecretCert(t, s).SerialNumber.Cmp(readSecretCert(t, old).SerialNumber) == 0 {
		t.Fatal("handler certificate not reissued at the CA rotation")
	}
	if err := handshake(old, clientPair()); err != nil {
		t.Fatalf("mutual TLS with the handler still on its previous Secret: %v", err)
	}
	if err := handshake(s, clientPair()); err != nil {
		t.Fatalf("mutual TLS with the handler on the new Secret: %v", err)
	}

	foreignCA, err := newCA(clk.Now(), 3*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := newLeaf(foreignCA, clk.Now(), time.Hour, leafSpec{commonName: nodeapi.ClientName, usage: x509.ExtKeyUsageClientAuth})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(foreign.certPEM, foreign.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(s, pair); err == nil {
		t.Fatal("the handler side accepted a client certificate of another CA")
	}
}
