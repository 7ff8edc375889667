package certs

import (
	"bytes"
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func caSecretOf(c client.Client) CASecret {
	return CASecret{Client: c, Namespace: "kubevisor-system", Name: DefaultCASecret}
}

func getCASecret(t *testing.T, c client.Client) *corev1.Secret {
	t.Helper()
	var s corev1.Secret
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "kubevisor-system", Name: DefaultCASecret}, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// externalOptions are testOptions for a process that takes its CA from the Secret.
func externalOptions(dir string, now func() time.Time) Options {
	o := clientOptions(dir, now)
	o.ExternalCA = true
	return o
}

// TestCASecretOutlivesTheProcess: two processes with their own certificate directories (a pod
// and the one that replaces it) issue from the one CA of the Secret, so a client given the
// first one's bundle trusts the second one's certificates.
func TestCASecretOutlivesTheProcess(t *testing.T) {
	ctx := context.Background()
	c := fakeClient(t)
	clk := &clock{t: time.Now()}
	s := caSecretOf(c)

	renewAt, rotated, err := EnsureCA(ctx, externalOptions("", clk.Now), s)
	if err != nil || !rotated {
		t.Fatalf("first EnsureCA: rotated %v, err %v; want a new CA", rotated, err)
	}
	// The CA (3h) is due once a certificate issued then (1h) would outlive it.
	ca := parseCerts(getCASecret(t, c).Data[corev1.TLSCertKey])[0]
	if want := ca.NotAfter.Add(-time.Hour); !renewAt.Equal(want) {
		t.Errorf("renewAt %s, want %s", renewAt, want)
	}
	if _, rotated, err := EnsureCA(ctx, externalOptions("", clk.Now), s); err != nil || rotated {
		t.Fatalf("second EnsureCA: rotated %v, err %v; want the CA kept", rotated, err)
	}

	var bundles [][]byte
	for _, dir := range []string{t.TempDir(), t.TempDir()} {
		if changed, err := SyncCA(ctx, dir, s); err != nil || !changed {
			t.Fatalf("SyncCA into an empty directory: changed %v, err %v", changed, err)
		}
		if changed, err := SyncCA(ctx, dir, s); err != nil || changed {
			t.Fatalf("SyncCA again: changed %v, err %v; want nothing written", changed, err)
		}
		st, err := Ensure(externalOptions(dir, clk.Now))
		if err != nil {
			t.Fatal(err)
		}
		if st.CARotated {
			t.Error("Ensure with an external CA made one")
		}
		for _, f := range []string{CertFile, ClientCertFile} {
			if err := readCert(t, filepath.Join(dir, f)).CheckSignatureFrom(ca); err != nil {
				t.Errorf("%s is not signed by the Secret's CA: %v", f, err)
			}
		}
		bundles = append(bundles, st.Bundle)
	}
	if !bytes.Equal(bundles[0], bundles[1]) {
		t.Fatal("the two processes have different CA bundles")
	}
}

// TestCASecretRotationKeepsClients walks a CA through its rotation: the new CA enters the
// bundle next to the previous one, the serving certificate of the previous CA is kept until it
// is due (every party has the new bundle by then), and the next one is of the new CA.
func TestCASecretRotationKeepsClients(t *testing.T) {
	ctx := context.Background()
	c := fakeClient(t)
	clk := &clock{t: time.Now()}
	s := caSecretOf(c)
	dir := t.TempDir()
	o := externalOptions(dir, clk.Now)
	if _, _, err := EnsureCA(ctx, o, s); err != nil {
		t.Fatal(err)
	}
	if _, err := SyncCA(ctx, dir, s); err != nil {
		t.Fatal(err)
	}
	mustEnsure(t, o)
	oldCA := readCert(t, filepath.Join(dir, CAFile))

	// At 2h10m the CA has 50m left, less than a certificate's hour. The serving certificate
	// was due: it is renewed from the CA the directory has, the old one (and ends with it).
	clk.Add(2*time.Hour + 10*time.Minute)
	mustEnsure(t, o)
	servingBefore := readCert(t, filepath.Join(dir, CertFile))
	if servingBefore.CheckSignatureFrom(oldCA) != nil {
		t.Fatal("before the CA rotation the serving certificate is not of the current CA")
	}
	_, rotated, err := EnsureCA(ctx, o, s)
	if err != nil || !rotated {
		t.Fatalf("EnsureCA with 50m left: rotated %v, err %v; want a new CA", rotated, err)
	}
	if changed, err := SyncCA(ctx, dir, s); err != nil || !changed {
		t.Fatalf("SyncCA after the rotation: changed %v, err %v", changed, err)
	}
	newCA := readCert(t, filepath.Join(dir, CAFile))
	if newCA.Equal(oldCA) {
		t.Fatal("the directory still has the old CA")
	}
	st := mustEnsure(t, o)
	pool := x509.NewCertPool()
	for _, ca := range parseCerts(st.Bundle) {
		pool.AddCert(ca)
	}
	if n := len(parseCerts(st.Bundle)); n != 2 {
		t.Fatalf("bundle has %d CAs, want the new and the previous", n)
	}
	serving := readCert(t, filepath.Join(dir, CertFile))
	if !serving.Equal(servingBefore) {
		t.Fatal("the serving certificate of the previous CA was replaced before it was due")
	}
	if serving.NotAfter.After(oldCA.NotAfter) {
		t.Fatalf("a certificate of the previous CA outlives it: %s > %s", serving.NotAfter, oldCA.NotAfter)
	}
	if _, err := serving.Verify(x509.VerifyOptions{Roots: pool, DNSName: "kubevisor-api.kubevisor-system.svc", CurrentTime: clk.Now()}); err != nil {
		t.Fatalf("the new bundle does not verify the kept certificate: %v", err)
	}

	// Once it is due, the serving certificate is issued by the new CA.
	clk.Add(time.Hour)
	mustEnsure(t, o)
	if err := readCert(t, filepath.Join(dir, CertFile)).CheckSignatureFrom(newCA); err != nil {
		t.Fatalf("the renewed serving certificate is not of the new CA: %v", err)
	}
	// Once the previous CA expired it leaves the bundle at the next rotation check.
	clk.Add(2 * time.Hour)
	if _, _, err := EnsureCA(ctx, o, s); err != nil {
		t.Fatal(err)
	}
	for _, ca := range parseCerts(getCASecret(t, c).Data[BundleKey]) {
		if ca.Equal(oldCA) {
			t.Fatal("the expired CA is still in the bundle")
		}
	}
}

func TestCASecretBadInput(t *testing.T) {
	ctx := context.Background()
	clk := &clock{t: time.Now()}

	t.Run("missing secret names it", func(t *testing.T) {
		_, err := SyncCA(ctx, t.TempDir(), caSecretOf(fakeClient(t)))
		if err == nil || !strings.Contains(err.Error(), "kubevisor-system/kubevisor-ca not found") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a secret without a CA is refused and the directory kept", func(t *testing.T) {
		c := fakeClient(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kubevisor-system", Name: DefaultCASecret},
			Type: corev1.SecretTypeTLS, Data: map[string][]byte{corev1.TLSCertKey: []byte("junk"), corev1.TLSPrivateKeyKey: []byte("junk")}})
		dir := t.TempDir()
		_, err := SyncCA(ctx, dir, caSecretOf(c))
		if err == nil || !strings.Contains(err.Error(), "tls.crt and tls.key") {
			t.Fatalf("got %v", err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Fatalf("the directory got %d files", len(entries))
		}
		// EnsureCA replaces what holds no CA.
		if _, rotated, err := EnsureCA(ctx, externalOptions("", clk.Now), caSecretOf(c)); err != nil || !rotated {
			t.Fatalf("EnsureCA over junk: rotated %v, err %v", rotated, err)
		}
		if _, err := SyncCA(ctx, dir, caSecretOf(c)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a secret of another type is deleted, then made again", func(t *testing.T) {
		c := fakeClient(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kubevisor-system", Name: DefaultCASecret},
			Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"x": []byte("y")}})
		if _, _, err := EnsureCA(ctx, externalOptions("", clk.Now), caSecretOf(c)); err == nil || !strings.Contains(err.Error(), `of type "Opaque"`) {
			t.Fatalf("got %v", err)
		}
		if _, rotated, err := EnsureCA(ctx, externalOptions("", clk.Now), caSecretOf(c)); err != nil || !rotated {
			t.Fatalf("second EnsureCA: rotated %v, err %v", rotated, err)
		}
		if getCASecret(t, c).Type != corev1.SecretTypeTLS {
			t.Fatal("not a kubernetes.io/tls Secret")
		}
	})
	t.Run("an external CA must be there", func(t *testing.T) {
		_, err := Ensure(externalOptions(t.TempDir(), clk.Now))
		if err == nil || !strings.Contains(err.Error(), "no valid CA in") {
			t.Fatalf("got %v", err)
		}
	})
}
