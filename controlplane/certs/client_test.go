package certs

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// verifyClient checks that the client certificate is for nodeapi.ClientName and chains, for
// client authentication, to the bundle in the directory.
func verifyClient(t *testing.T, dir string, at time.Time) *x509.Certificate {
	t.Helper()
	bundle, err := os.ReadFile(filepath.Join(dir, BundleFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	cert := readCert(t, filepath.Join(dir, ClientCertFile))
	if cert.Subject.CommonName != nodeapi.ClientName {
		t.Fatalf("client certificate for %q, want %q", cert.Subject.CommonName, nodeapi.ClientName)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("client certificate does not verify for client auth: %v", err)
	}
	// Not usable as a server certificate.
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: at}); err == nil {
		t.Fatal("client certificate verifies for server auth")
	}
	if _, err := tls.LoadX509KeyPair(filepath.Join(dir, ClientCertFile), filepath.Join(dir, ClientKeyFile)); err != nil {
		t.Fatalf("client certificate and key: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, ClientKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("client key file mode: %v %v", fi.Mode(), err)
	}
	return cert
}

func clientOptions(dir string, now func() time.Time) Options {
	o := testOptions(dir, now)
	o.ClientName = nodeapi.ClientName
	return o
}

func TestEnsureClientIssuesAndRenews(t *testing.T) {
	dir := t.TempDir()
	clk := &clock{t: time.Now()}
	o := clientOptions(dir, clk.Now)
	st, err := Ensure(o)
	if err != nil || !st.ClientRotated {
		t.Fatalf("first Ensure: %+v %v, want a client certificate", st, err)
	}
	first := verifyClient(t, dir, clk.Now())
	if want := first.NotAfter.Add(-o.RenewBefore); !st.RenewAt.Equal(earlier(want, st.NotAfter.Add(-o.RenewBefore))) {
		t.Errorf("RenewAt %s does not account for the client certificate due at %s", st.RenewAt, want)
	}

	clk.Add(30 * time.Minute)
	if st, err = Ensure(o); err != nil || st.ClientRotated {
		t.Fatalf("second Ensure: %+v %v, want the client certificate kept", st, err)
	}
	clk.Add(15 * time.Minute) // inside the 20-minute margin of a 1-hour certificate
	if st, err = Ensure(o); err != nil || !st.ClientRotated || st.CARotated {
		t.Fatalf("third Ensure: %+v %v, want a new client certificate of the same CA", st, err)
	}
	if got := verifyClient(t, dir, clk.Now()); got.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("client certificate not renewed")
	}

	// Another common name, or garbage: a new certificate.
	o.ClientName = "someone-else"
	if st, err = Ensure(o); err != nil || !st.ClientRotated {
		t.Fatalf("Ensure with another client name: %+v %v", st, err)
	}
	o.ClientName = nodeapi.ClientName
	if err := os.WriteFile(filepath.Join(dir, ClientKeyFile), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err = Ensure(o); err != nil || !st.ClientRotated {
		t.Fatalf("Ensure over a garbage key: %+v %v", st, err)
	}
	verifyClient(t, dir, clk.Now())

	// Without a client name, no client certificate.
	bare := t.TempDir()
	if st, err := Ensure(testOptions(bare, clk.Now)); err != nil || st.ClientRotated {
		t.Fatalf("Ensure without a client name: %+v %v", st, err)
	}
	if _, err := os.Stat(filepath.Join(bare, ClientCertFile)); !os.IsNotExist(err) {
		t.Fatalf("client certificate written without a client name: %v", err)
	}
}

// TestEnsureClientAcrossCARotation: a client certificate with time left stays on the previous
// CA when the CA changes (the servers' bundle may not hold the new one yet), keeps verifying
// against the new bundle, and its renewal comes from the new CA.
func TestEnsureClientAcrossCARotation(t *testing.T) {
	dir := t.TempDir()
	clk := &clock{t: time.Now()}
	o := clientOptions(dir, clk.Now) // certificates 1h (renewed 20m before), CA 3h (renewed 1h before)
	if _, err := Ensure(o); err != nil {
		t.Fatal(err)
	}
	oldCA := readCert(t, filepath.Join(dir, CAFile))
	clk.Add(time.Hour + 50*time.Minute)
	if st, err := Ensure(o); err != nil || !st.ClientRotated || st.CARotated {
		t.Fatalf("Ensure at 1h50m: %+v %v, want a new client certificate of the first CA", st, err)
	}
	kept := readCert(t, filepath.Join(dir, ClientCertFile))

	clk.Add(20 * time.Minute) // 2h10m: the CA would not outlive a new certificate
	st, err := Ensure(o)
	if err != nil || !st.CARotated || st.ClientRotated {
		t.Fatalf("Ensure at 2h10m: %+v %v, want a new CA and the client certificate kept", st, err)
	}
	if got := readCert(t, filepath.Join(dir, ClientCertFile)); got.SerialNumber.Cmp(kept.SerialNumber) != 0 || got.CheckSignatureFrom(oldCA) != nil {
		t.Fatal("client certificate replaced at the CA rotation")
	}
	verifyClient(t, dir, clk.Now())

	clk.Add(25 * time.Minute) // the kept certificate is due
	if st, err = Ensure(o); err != nil || !st.ClientRotated {
		t.Fatalf("Ensure at 2h35m: %+v %v, want a new client certificate", st, err)
	}
	newCA := readCert(t, filepath.Join(dir, CAFile))
	if got := verifyClient(t, dir, clk.Now()); got.CheckSignatureFrom(newCA) != nil {
		t.Fatal("renewed client certificate is not from the new CA")
	}
}
