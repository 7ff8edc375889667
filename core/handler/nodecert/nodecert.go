// Package nodecert obtains and renews this node's certificate for the migration proxy
// (core/handler/migrationproxy) through the Kubernetes CSR API, from kubevisor-api's signer
// nodeapi.NodeSignerName (controlplane/nodecerts).
//
// The key is an ECDSA P-256 key made here, never sent anywhere: the request
// (certificates.k8s.io/v1 CertificateSigningRequest, common name nodeapi.NodeCommonName(node),
// usages digital signature, server auth and client auth, expirationSeconds Config.Lifetime) is
// filed with the handler's own credentials, the pod-bound service account token whose node
// the signer checks against the common name. Once it is signed, Config.Dir gets, each file
// replaced atomically (a rename) and the key before the certificate so that a reader never
// takes a new certificate with an old key (the proxy keeps its last good pair while the files
// do not match):
//
//	ca.crt   the CA bundle, copied from Config.CABundleFile (the ca.crt of the Secret
//	         nodeapi.HandlerCertSecret: the current and the previous CA), and copied again
//	         whenever that file changes, so that a CA rotation does not break migrations
//	tls.key  the key, 0600 (Dir is made 0700; in the DaemonSet an emptyDir in memory)
//	tls.crt  the certificate
//
// The certificate is renewed, with a new key, at two thirds of its lifetime, and whenever the
// one in Dir is missing, not this node's, expired, or no longer chains to the bundle. A
// certificate already in Dir that is still good is kept (a restarted handler files no request).
// Failures (request refused by the API server, denied or failed by the signer, deleted before
// it was signed) are retried with exponential backoff (Config.MinBackoff to Config.MaxBackoff);
// a pending request is waited for as long as it exists.
//
// The requests are named kubevisor-node-<node>-<hash of the key> and not deleted by the
// handler: RBAC cannot narrow delete to one's own requests, and a handler able to delete every
// request of the cluster (kubelets' included) would hold more than it needs. The
// kube-controller-manager's CSR cleaner removes them (issued, denied or failed after an hour,
// pending after a day).
//
// Progress is logged, recorded as events on the Node (NodeCertificateIssued, ...Denied,
// ...Failed), exported as metrics (Config.Registerer):
//
//	kubevisor_node_certificate_ready                          1 while Dir holds a good certificate
//	kubevisor_node_certificate_expiration_timestamp_seconds   its NotAfter (0: none)
//	kubevisor_node_certificate_requests_total{result}         issued, denied, failed, error
//
// and kept in Status. None of it makes the handler unready: VMs run without a node
// certificate, only their migrations to and from the node fail.
package nodecert

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/kubevisor/kubevisor/core/handler/internal/certdir"
	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// The handler files its node's requests and watches them; it neither deletes nor updates them.
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=create;get;list;watch

// Reasons of the events recorded on the Node.
const (
	ReasonIssued = "NodeCertificateIssued"
	ReasonDenied = "NodeCertificateDenied"
	ReasonFailed = "NodeCertificateFailed"
	// eventAction is the action of the events.
	eventAction = "RequestNodeCertificate"
)

// Config says where the certificate goes and how it is requested (kubevisor-handler serve's
// --migration-cert-dir, --node-cert-* flags).
type Config struct {
	// NodeName is this handler's node. Required.
	NodeName string
	// Dir receives tls.crt, tls.key and ca.crt (the migration proxy's CertDir). Required.
	Dir string
	// CABundleFile is the CA bundle copied into Dir as ca.crt. Required.
	CABundleFile string
	// Client files and watches the requests, as the handler's service account. Required.
	Client kubernetes.Interface
	// Lifetime is the lifetime asked for (expirationSeconds, at least 10 minutes); the signer
	// may grant less. nodeapi.NodeCertLifetime when 0.
	Lifetime time.Duration
	// CheckInterval is how often the bundle and the certificate in Dir are looked at. 30s when 0.
	CheckInterval time.Duration
	// BundleWait is how long an issued certificate waits for its CA to be in the bundle (the
	// Secret's copy on the node follows a CA rotation within a minute or two) before the
	// attempt counts as failed. 5 minutes when 0.
	BundleWait time.Duration
	// MinBackoff and MaxBackoff bound the wait before a failed attempt is retried; 5s and 5m
	// when 0.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives the progress; hclog's default when nil.
	Logger hclog.Logger
	// Events, when set, records events on the Node.
	Events recorder.EventRecorder
	// Registerer, when set, gets the metrics.
	Registerer prometheus.Registerer
	// Now returns the current time; time.Now when nil.
	Now func() time.Time
}

func (c Config) withDefaults() (Config, error) {
	if c.NodeName == "" || c.Dir == "" || c.CABundleFile == "" || c.Client == nil {
		return c, errors.New("node certificate: the node name, directory, CA bundle file and client are required")
	}
	if c.Lifetime <= 0 {
		c.Lifetime = nodeapi.NodeCertLifetime
	}
	c.Lifetime = max(c.Lifetime, 10*time.Minute) // the API server's minimum expirationSeconds
	if c.CheckInterval <= 0 {
		c.CheckInterval = 30 * time.Second
	}
	if c.BundleWait <= 0 {
		c.BundleWait = 5 * time.Minute
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 5 * time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 5 * time.Minute
	}
	c.MaxBackoff = max(c.MaxBackoff, c.MinBackoff)
	if c.Logger == nil {
		c.Logger = hclog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}

// Status is where the node certificate stands.
type Status struct {
	// Ready says Dir holds a good certificate of this node.
	Ready bool
	// NotAfter is when that certificate expires, and RenewAt when it is renewed.
	NotAfter, RenewAt time.Time
	// Request is the name of the request being waited for, if any.
	Request string
	// Reason says why there is no certificate, or why the last renewal failed; empty when
	// all is well.
	Reason string
}

// Manager keeps this node's certificate in Config.Dir (see the package doc). Run does the work.
type Manager struct {
	cfg     Config
	log     hclog.Logger
	metrics *metrics

	mu       sync.Mutex
	status   Status
	node     *corev1.Node // the regarding object of events, read once
	lastWarn string       // the last warning of warnOnce
}

// warnOnce logs msg with err unless it is the same as the last one.
func (m *Manager) warnOnce(msg string, err error) {
	m.mu.Lock()
	same := m.lastWarn == msg+err.Error()
	m.lastWarn = msg + err.Error()
	m.mu.Unlock()
	if !same {
		m.log.Warn(msg, "error", err)
	}
}

// New returns the manager of cfg.
func New(cfg Config) (*Manager, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Manager{cfg: cfg, log: cfg.Logger, metrics: newMetrics(cfg.Registerer)}, nil
}

// Status returns where the certificate stands.
func (m *Manager) Status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.status
}

func (m *Manager) setStatus(f func(*Status)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(&m.status)
	m.metrics.ready.Set(map[bool]float64{true: 1}[m.status.Ready])
	exp := 0.0
	if m.status.Ready {
		exp = float64(m.status.NotAfter.Unix())
	}
	m.metrics.expiration.Set(exp)
}

// Run keeps the certificate until ctx ends, and returns nil then. It fails only when Dir
// cannot be made.
func (m *Manager) Run(ctx context.Context) error {
	if err := os.MkdirAll(m.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("node certificate directory: %w", err)
	}
	if err := os.Chmod(m.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("node certificate directory: %w", err)
	}
	m.log.Info("keeping this node's certificate through the CSR API", "dir", m.cfg.Dir, "signer", nodeapi.NodeSignerName,
		"commonName", nodeapi.NodeCommonName(m.cfg.NodeName), "caBundle", m.cfg.CABundleFile)
	backoff := m.cfg.MinBackoff
	for {
		wait, err := m.check(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			m.setStatus(func(s *Status) { s.Reason = err.Error(); s.Request = "" })
			m.log.Warn("no new node certificate; retrying", "retryIn", backoff.String(), "error", err)
			wait = backoff
			backoff = min(2*backoff, m.cfg.MaxBackoff)
		default:
			backoff = m.cfg.MinBackoff
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// check copies the bundle, and requests a certificate when the one in Dir is not good or is
// due. It returns how long to wait before the next check.
func (m *Manager) check(ctx context.Context) (time.Duration, error) {
	bundle, err := m.syncBundle()
	if err != nil {
		m.setStatus(func(s *Status) { s.Reason = err.Error() })
		m.warnOnce("waiting for the CA bundle (the Secret "+nodeapi.HandlerCertSecret+", written by kubevisor-api) before requesting this node's certificate", err)
		return m.cfg.CheckInterval, nil
	}
	now := m.cfg.Now()
	cur, curErr := m.current(bundle, now)
	if curErr == nil {
		renewAt := renewTime(cur)
		m.setStatus(func(s *Status) {
			if !s.Ready || !s.NotAfter.Equal(cur.NotAfter) {
				s.Reason = ""
			}
			s.Ready, s.NotAfter, s.RenewAt = true, cur.NotAfter, renewAt
		})
		if now.Before(renewAt) {
			return min(renewAt.Sub(now), m.cfg.CheckInterval), nil
		}
		m.log.Info("renewing this node's certificate", "notAfter", cur.NotAfter, "renewAt", renewAt)
	} else {
		m.setStatus(func(s *Status) { s.Ready = false; s.Reason = curErr.Error() })
		m.log.Info("requesting a certificate for this node", "reason", curErr.Error())
	}
	if err := m.renew(ctx); err != nil {
		return 0, err
	}
	return 0, nil
}

// syncBundle copies the CA bundle into Dir when it differs, and returns it.
func (m *Manager) syncBundle() ([]byte, error) {
	bundle, err := os.ReadFile(m.cfg.CABundleFile)
	if err != nil {
		return nil, fmt.Errorf("CA bundle: %w", err)
	}
	if len(parseCerts(bundle)) == 0 {
		return nil, fmt.Errorf("CA bundle %s: no PEM certificate in it", m.cfg.CABundleFile)
	}
	path := filepath.Join(m.cfg.Dir, certdir.CAFile)
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, bundle) {
		return bundle, nil
	}
	if err := writeAtomic(path, bundle, 0o644); err != nil {
		return nil, err
	}
	m.log.Info("CA bundle copied", "from", m.cfg.CABundleFile, "to", path, "cas", len(parseCerts(bundle)))
	return bundle, nil
}

// current is the certificate in Dir when it is good: its key's, this node's, for server and
// client auth, valid now, and chaining to bundle.
func (m *Manager) current(bundle []byte, now time.Time) (*x509.Certificate, error) {
	crt, err1 := os.ReadFile(filepath.Join(m.cfg.Dir, certdir.CertFile))
	key, err2 := os.ReadFile(filepath.Join(m.cfg.Dir, certdir.KeyFile))
	if err := errors.Join(err1, err2); err != nil {
		if errors.Is(err1, os.ErrNotExist) && errors.Is(err2, os.ErrNotExist) {
			return nil, errors.New("no certificate yet")
		}
		return nil, fmt.Errorf("read the certificate: %w", err)
	}
	keyBlock, _ := pem.Decode(key)
	if keyBlock == nil {
		return nil, errors.New("the key in the directory is not PEM")
	}
	k, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse the key: %w", err)
	}
	return m.verify(crt, &k.PublicKey, bundle, now)
}

// verify parses certPEM and checks it is for pub and this node, for server and client auth,
// valid now and chaining to bundle.
func (m *Manager) verify(certPEM []byte, pub *ecdsa.PublicKey, bundle []byte, now time.Time) (*x509.Certificate, error) {
	certs := parseCerts(certPEM)
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	c := certs[0]
	if cpub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || !cpub.Equal(pub) {
		return nil, errors.New("the certificate is not for the key")
	}
	if want := nodeapi.NodeCommonName(m.cfg.NodeName); c.Subject.CommonName != want {
		return nil, fmt.Errorf("the certificate is for %q, not %q", c.Subject.CommonName, want)
	}
	pool := x509.NewCertPool()
	for _, ca := range parseCerts(bundle) {
		pool.AddCert(ca)
	}
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			return nil, fmt.Errorf("the certificate (issuer %q, valid until %s) does not verify against the CA bundle: %w: %w",
				c.Issuer.CommonName, c.NotAfter.UTC().Format(time.RFC3339), errUntrusted, err)
		}
	}
	return c, nil
}

// errUntrusted: a certificate does not verify against the CA bundle (which may be about to
// receive its CA).
var errUntrusted = errors.New("not trusted")

// renewTime is two thirds into c's lifetime.
func renewTime(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

// renew requests a certificate for a new key, waits for it, and writes both into Dir.
func (m *Manager) renew(ctx context.Context) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: nodeapi.NodeCommonName(m.cfg.NodeName)},
	}, key)
	if err != nil {
		return fmt.Errorf("certificate request: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return fmt.Errorf("marshal public key: %w", err)
	}
	csr := &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{
			Name:   RequestName(m.cfg.NodeName, pubDER),
			Labels: map[string]string{"app.kubernetes.io/managed-by": "kubevisor-handler"},
		},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:           pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName:        nodeapi.NodeSignerName,
			Usages:            []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth, certv1.UsageClientAuth},
			ExpirationSeconds: ptrTo(int32(m.cfg.Lifetime / time.Second)),
		},
	}
	csrs := m.cfg.Client.CertificatesV1().CertificateSigningRequests()
	created, err := csrs.Create(ctx, csr, metav1.CreateOptions{})
	if err != nil {
		m.metrics.requests.WithLabelValues("error").Inc()
		m.event(ctx, corev1.EventTypeWarning, ReasonFailed, "file certificate request %s: %v", csr.Name, err)
		return fmt.Errorf("file certificate request %s: %w", csr.Name, err)
	}
	m.log.Info("certificate request filed; waiting for kubevisor-api to sign it", "csr", created.Name, "signer", nodeapi.NodeSignerName)
	m.setStatus(func(s *Status) { s.Request = created.Name })
	certPEM, err := m.wait(ctx, created)
	if err != nil {
		return err
	}
	cert, err := m.waitForBundle(ctx, certPEM, &key.PublicKey)
	if err != nil {
		m.metrics.requests.WithLabelValues("error").Inc()
		m.event(ctx, corev1.EventTypeWarning, ReasonFailed, "certificate of request %s not installed: %v", created.Name, err)
		return fmt.Errorf("certificate of request %s: %w", created.Name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("marshal key: %w", err)
	}
	// The key first: the proxy keeps its last good pair while the files do not match.
	if err := writeAtomic(filepath.Join(m.cfg.Dir, certdir.KeyFile), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(m.cfg.Dir, certdir.CertFile), certPEM, 0o644); err != nil {
		return err
	}
	m.metrics.requests.WithLabelValues("issued").Inc()
	renewAt := renewTime(cert)
	m.setStatus(func(s *Status) {
		*s = Status{Ready: true, NotAfter: cert.NotAfter, RenewAt: renewAt}
	})
	m.log.Info("node certificate installed", "csr", created.Name, "dir", m.cfg.Dir, "notAfter", cert.NotAfter, "renewAt", renewAt,
		"issuer", cert.Issuer.CommonName)
	m.event(ctx, corev1.EventTypeNormal, ReasonIssued, "certificate %s for the migration proxy issued by request %s, valid until %s",
		cert.Subject.CommonName, created.Name, cert.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// errDenied is a request's Denied or Failed condition.
type errDenied struct {
	name string
	cond certv1.CertificateSigningRequestCondition
}

func (e *errDenied) Error() string {
	return fmt.Sprintf("certificate request %s %s: %s: %s", e.name, map[certv1.RequestConditionType]string{
		certv1.CertificateDenied: "denied", certv1.CertificateFailed: "failed"}[e.cond.Type], e.cond.Reason, e.cond.Message)
}

// wait returns the certificate of the request once it is issued, or an error once it is
// denied, failed or deleted.
func (m *Manager) wait(ctx context.Context, csr *certv1.CertificateSigningRequest) ([]byte, error) {
	csrs := m.cfg.Client.CertificatesV1().CertificateSigningRequests()
	logged, filed := false, m.cfg.Now()
	for {
		got, err := csrs.Get(ctx, csr.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			m.metrics.requests.WithLabelValues("error").Inc()
			return nil, fmt.Errorf("certificate request %s was deleted before it was signed", csr.Name)
		}
		if err == nil {
			if cert, done, err := m.outcome(ctx, got); done {
				return cert, err
			}
			if !logged && m.cfg.Now().Sub(filed) > m.cfg.CheckInterval {
				m.log.Warn("certificate request not signed yet: is kubevisor-api running?", "csr", got.Name, "signer", nodeapi.NodeSignerName)
				m.setStatus(func(s *Status) {
					s.Reason = fmt.Sprintf("certificate request %s pending: not approved and signed by %s yet", got.Name, nodeapi.NodeSignerName)
				})
				logged = true
			}
		}
		// Watch from what was read; a watch that ends (or could not start) is started again
		// after a Get, at most every CheckInterval.
		opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", csr.Name).String(),
			TimeoutSeconds: ptrTo(int64(max(m.cfg.CheckInterval/time.Second, 1)))}
		if err == nil {
			opts.ResourceVersion = got.ResourceVersion
		}
		// The watch is bounded on this side too, in case the server does not end it.
		wctx, cancel := context.WithTimeout(ctx, 2*m.cfg.CheckInterval)
		w, werr := csrs.Watch(wctx, opts)
		if werr != nil {
			cancel()
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(m.cfg.CheckInterval):
			}
			continue
		}
		cert, done, err := m.watchOutcome(wctx, w, csr.Name)
		w.Stop()
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if done {
			return cert, errors.Join(err, ctx.Err())
		}
	}
}

// watchOutcome follows w until the request's outcome, or the watch's or ctx's end (done
// false).
func (m *Manager) watchOutcome(ctx context.Context, w watch.Interface, name string) (cert []byte, done bool, err error) {
	for {
		select {
		case <-ctx.Done():
			return nil, false, nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, false, nil
			}
			got, isCSR := ev.Object.(*certv1.CertificateSigningRequest)
			// The field selector names the request; checked again all the same.
			isCSR = isCSR && got.Name == name
			switch {
			case ev.Type == watch.Deleted && isCSR:
				m.metrics.requests.WithLabelValues("error").Inc()
				return nil, true, fmt.Errorf("certificate request %s was deleted before it was signed", got.Name)
			case (ev.Type == watch.Added || ev.Type == watch.Modified) && isCSR:
				if cert, done, err := m.outcome(ctx, got); done {
					return cert, true, err
				}
			case ev.Type == watch.Error:
				return nil, false, nil
			}
		}
	}
}

// outcome is the request's certificate, or its denial or failure; done false while pending.
func (m *Manager) outcome(ctx context.Context, csr *certv1.CertificateSigningRequest) (cert []byte, done bool, err error) {
	for _, c := range csr.Status.Conditions {
		if (c.Type == certv1.CertificateDenied || c.Type == certv1.CertificateFailed) && c.Status == corev1.ConditionTrue {
			e := &errDenied{name: csr.Name, cond: c}
			result, reason := "denied", ReasonDenied
			if c.Type == certv1.CertificateFailed {
				result, reason = "failed", ReasonFailed
			}
			m.metrics.requests.WithLabelValues(result).Inc()
			m.log.Error("certificate request refused", "csr", csr.Name, "condition", string(c.Type), "reason", c.Reason, "message", c.Message)
			m.event(ctx, corev1.EventTypeWarning, reason, "%s", e.Error())
			return nil, true, e
		}
	}
	if len(csr.Status.Certificate) > 0 {
		return csr.Status.Certificate, true, nil
	}
	return nil, false, nil
}

// waitForBundle verifies an issued certificate, waiting up to BundleWait for its CA to reach
// the bundle (a CA rotated a moment ago).
func (m *Manager) waitForBundle(ctx context.Context, certPEM []byte, pub *ecdsa.PublicKey) (*x509.Certificate, error) {
	deadline := m.cfg.Now().Add(m.cfg.BundleWait)
	logged := false
	for {
		bundle, err := m.syncBundle()
		if err == nil {
			var cert *x509.Certificate
			if cert, err = m.verify(certPEM, pub, bundle, m.cfg.Now()); err == nil {
				return cert, nil
			}
		}
		if !errors.Is(err, errUntrusted) && !errors.Is(err, os.ErrNotExist) || !m.cfg.Now().Before(deadline) {
			return nil, err
		}
		if !logged {
			m.log.Warn("issued certificate does not verify against the CA bundle yet; waiting for the bundle", "error", err, "upTo", m.cfg.BundleWait.String())
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(min(m.cfg.CheckInterval, 5*time.Second)):
		}
	}
}

// event records an event on the Node, when there is a recorder.
func (m *Manager) event(ctx context.Context, eventType, reason, note string, args ...any) {
	if m.cfg.Events == nil {
		return
	}
	m.mu.Lock()
	node := m.node
	m.mu.Unlock()
	if node == nil {
		n, err := m.cfg.Client.CoreV1().Nodes().Get(ctx, m.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			// An event without the Node's UID still names it.
			n = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: m.cfg.NodeName}}
		} else {
			m.mu.Lock()
			m.node = n
			m.mu.Unlock()
		}
		node = n
	}
	m.cfg.Events.Eventf(node, nil, eventType, reason, eventAction, note, args...)
}

// RequestName is the name of the request for a key (its PKIX DER): kubevisor-node-<node>-<the
// key's SHA-256, 16 hex digits>, the node cut so that the name fits 253 characters.
func RequestName(node string, pubDER []byte) string {
	sum := sha256.Sum256(pubDER)
	const prefix, max = "kubevisor-node-", 253
	suffix := "-" + hex.EncodeToString(sum[:8])
	if room := max - len(prefix) - len(suffix); len(node) > room {
		node = node[:room]
	}
	return prefix + node + suffix
}

func parseCerts(data []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil && b.Type == "CERTIFICATE" {
			out = append(out, c)
		}
	}
}

// writeAtomic replaces path with data through a rename in its directory.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := errors.Join(tmp.Sync(), tmp.Close()); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func ptrTo[T any](v T) *T { return &v }

// metrics are the manager's Prometheus metrics.
type metrics struct {
	ready, expiration prometheus.Gauge
	requests          *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		ready: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kubevisor_node_certificate_ready",
			Help: "1 while the migration proxy's node certificate directory holds a good certificate of this node, else 0."}),
		expiration: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kubevisor_node_certificate_expiration_timestamp_seconds",
			Help: "When this node's certificate expires (Unix seconds); 0 while there is none."}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kubevisor_node_certificate_requests_total",
			Help: "Node certificate requests by outcome: issued, denied, failed (by the signer), error (not filed, deleted, not installed)."},
			[]string{"result"}),
	}
	if reg != nil {
		m.ready, m.expiration = register(reg, m.ready), register(reg, m.expiration)
		m.requests = register(reg, m.requests)
	}
	for _, r := range []string{"issued", "denied", "failed", "error"} {
		m.requests.WithLabelValues(r)
	}
	return m
}

// register registers c with reg; a metric already registered (a second manager in one
// process, tests) is shared.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}
