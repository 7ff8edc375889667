package subresources

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/proxy"

	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// handlerDialer reaches node handlers over mutual TLS with the client pair and CA bundle in a
// certificate directory, read again for each request so that rotated files take effect.
type handlerDialer struct {
	certDir     string
	dialTimeout time.Duration
}

func newHandlerDialer(certDir string, dialTimeout time.Duration) *handlerDialer {
	if dialTimeout <= 0 {
		dialTimeout = DefaultHandlerDialLimit
	}
	return &handlerDialer{certDir: certDir, dialTimeout: dialTimeout}
}

// tlsConfig presents client.crt/client.key and trusts ca-bundle.crt for nodeapi.ServerName.
func (d *handlerDialer) tlsConfig() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(filepath.Join(d.certDir, ClientCertFile), filepath.Join(d.certDir, ClientKeyFile))
	if err != nil {
		return nil, fmt.Errorf("handler client certificate: %w", err)
	}
	bundle, err := os.ReadFile(filepath.Join(d.certDir, CABundleFile))
	if err != nil {
		return nil, fmt.Errorf("handler CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return nil, fmt.Errorf("handler CA bundle %s holds no certificate", CABundleFile)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		ServerName:   nodeapi.ServerName,
		RootCAs:      pool,
		Certificates: []tls.Certificate{pair},
		// Upgraded streams are HTTP/1.1.
		NextProtos: []string{"http/1.1"},
	}, nil
}

// transport dials a handler with the dial timeout and mutual TLS.
func (d *handlerDialer) transport() (*http.Transport, error) {
	cfg, err := d.tlsConfig()
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	dialer := &net.Dialer{Timeout: d.dialTimeout}
	return &http.Transport{
		DialContext:           dialer.DialContext,
		TLSClientConfig:       cfg,
		TLSHandshakeTimeout:   d.dialTimeout,
		ResponseHeaderTimeout: time.Minute,
		DisableKeepAlives:     true,
	}, nil
}

// streamProxy proxies a WebSocket request to https://addr/path and then the upgraded
// connection in both directions. A request that is not an upgrade is refused (400).
func (d *handlerDialer) streamProxy(addr, path string) (http.Handler, error) {
	t, err := d.transport()
	if err != nil {
		return nil, err
	}
	loc := &url.URL{Scheme: "https", Host: addr, Path: path}
	h := proxy.NewUpgradeAwareHandler(loc, t, false, true, unreachable{addr: addr})
	return stripCredentials(h), nil
}

// actionProxy sends the request to https://addr/path and passes the handler's status code,
// content type and body back.
func (d *handlerDialer) actionProxy(addr, path string) (http.Handler, error) {
	t, err := d.transport()
	if err != nil {
		return nil, err
	}
	c := &http.Client{Transport: t}
	loc := &url.URL{Scheme: "https", Host: addr, Path: path}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		out, err := http.NewRequestWithContext(req.Context(), req.Method, loc.String(), req.Body)
		if err != nil {
			unreachable{addr: addr}.Error(w, req, err)
			return
		}
		if ct := req.Header.Get("Content-Type"); ct != "" {
			out.Header.Set("Content-Type", ct)
		}
		out.Header.Set("Accept", "application/json")
		resp, err := c.Do(out)
		if err != nil {
			unreachable{addr: addr}.Error(w, req, err)
			return
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); ct != "" {
			w.Header().Set("Content-Type", ct)
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}), nil
}

// stripCredentials drops what authenticated the user here, which the handler must not see.
func stripCredentials(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		req = req.Clone(req.Context())
		for k := range req.Header {
			lk := strings.ToLower(k)
			if lk == "authorization" || lk == "cookie" || strings.HasPrefix(lk, "x-remote-") || strings.HasPrefix(lk, "impersonate-") {
				req.Header.Del(k)
			}
		}
		h.ServeHTTP(w, req)
	})
}

// unreachable answers 503 (504 on a timeout) naming the handler that could not be reached.
type unreachable struct{ addr string }

// Error writes the failure to reach the handler as a Status.
func (u unreachable) Error(w http.ResponseWriter, _ *http.Request, err error) {
	msg := fmt.Sprintf("node handler %s unreachable: %v", u.addr, err)
	status := apierrors.NewServiceUnavailable(msg).ErrStatus
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		status = apierrors.NewTimeoutError(msg, 0).ErrStatus
		status.Code = http.StatusGatewayTimeout
	}
	writeStatus(w, &status)
}
