package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/nodeapi"
	"github.com/kubevisor/kubevisor/core/wsstream"
)

// streamPath is one way to a VMI's streams: through the API server (what vmctl dials) or
// straight to the node handler's stream endpoint.
type streamPath struct {
	name string
	dial func(ctx context.Context, sub string) (net.Conn, error)
}

// subresourceURL is the WebSocket URL of a VMI's stream subresource on the API server at
// host (a rest.Config's Host: "https://10.0.0.1:6443", with or without a path prefix).
func subresourceURL(host, namespace, name, sub string) (string, error) {
	if host == "" {
		return "", errors.New("no API server address in the kubeconfig")
	}
	u, err := url.Parse(host)
	if err != nil || u.Host == "" {
		// "10.0.0.1:6443" without a scheme, as a rest.Config may hold it.
		if u, err = url.Parse("https://" + host); err != nil {
			return "", fmt.Errorf("API server address %q: %w", host, err)
		}
	}
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	case "http":
		u.Scheme = "ws"
	default:
		return "", fmt.Errorf("API server address %q: scheme %q, want https or http", host, u.Scheme)
	}
	u.Path = path.Join("/", u.Path, "apis", subv1.GroupName, subv1.GroupVersion.Version, "namespaces",
		url.PathEscape(namespace), subv1.VirtualMachineInstances, url.PathEscape(name), sub)
	u.RawQuery = ""
	return u.String(), nil
}

// errCaptured stops the capturing round trip: no request is sent.
var errCaptured = errors.New("headers captured")

type headerCapture struct{ h http.Header }

func (c *headerCapture) RoundTrip(r *http.Request) (*http.Response, error) {
	c.h = r.Header.Clone()
	return nil, errCaptured
}

// authHeaders are the headers client-go would send to the API server for rc (bearer token,
// token file, basic auth, impersonation, user agent); client certificates are in its TLS
// configuration instead.
func authHeaders(rc *rest.Config) (http.Header, error) {
	capture := &headerCapture{}
	rt, err := rest.HTTPWrappersForConfig(rc, capture)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig credentials: %w", err)
	}
	req, err := http.NewRequest(http.MethodGet, "https://kubernetes.invalid/", nil)
	if err != nil {
		return nil, err
	}
	if _, err := rt.RoundTrip(req); err != nil && !errors.Is(err, errCaptured) {
		return nil, fmt.Errorf("kubeconfig credentials: %w", err)
	}
	if capture.h == nil {
		return http.Header{}, nil
	}
	return capture.h, nil
}

// apiPath dials the VMI's streams through the API server with the kubeconfig's credentials,
// as vmctl does: the aggregated subresource API, which kubevisor-api proxies to the handler.
func apiPath(rc *rest.Config, namespace, name string) (streamPath, error) {
	tlsCfg, err := rest.TLSConfigFor(rc)
	if err != nil {
		return streamPath{}, fmt.Errorf("kubeconfig TLS: %w", err)
	}
	if _, err := subresourceURL(rc.Host, namespace, name, subv1.SubresourceConsole); err != nil {
		return streamPath{}, err
	}
	header, err := authHeaders(rc)
	if err != nil {
		return streamPath{}, err
	}
	return streamPath{
		name: "API server (vmctl's path)",
		dial: func(ctx context.Context, sub string) (net.Conn, error) {
			u, err := subresourceURL(rc.Host, namespace, name, sub)
			if err != nil {
				return nil, err
			}
			c, err := wsstream.Dial(ctx, u, wsstream.DialOptions{TLS: tlsCfg, Header: header})
			if err != nil {
				return nil, fmt.Errorf("%s through the API server: %w", sub, err)
			}
			return c, nil
		},
	}, nil
}

// nodePath dials the VMI's streams at the handler's stream endpoint (addr, host:port) with
// kubevisor-api's client certificate: the in-node path without the API server and
// kubevisor-api.
func nodePath(tlsCfg *tls.Config, addr, namespace, name string) streamPath {
	return streamPath{
		name: "node handler (" + addr + ")",
		dial: func(ctx context.Context, sub string) (net.Conn, error) {
			u := (&url.URL{Scheme: "wss", Host: addr, Path: nodeapi.VMIPath(namespace, name, sub)}).String()
			c, err := wsstream.Dial(ctx, u, wsstream.DialOptions{TLS: tlsCfg})
			if err != nil {
				return nil, fmt.Errorf("%s at the handler %s: %w", sub, addr, err)
			}
			return c, nil
		},
	}
}

// Files of kubevisor-api's certificate directory (its --cert-dir, controlplane/certs' layout)
// that the node path uses.
const (
	apiClientCert = "client.crt"
	apiClientKey  = "client.key"
	apiCABundle   = "ca-bundle.crt"
	// apiCertVolume is kubevisor-api's emptyDir of that directory (manifests/install/api.yaml).
	apiCertVolume = "certs"
)

// nodeTLS is the TLS configuration of kubevisor-api towards the handlers, from its
// certificate directory: its client certificate, and the CA bundle the handler's serving
// certificate (for nodeapi.ServerName) chains to.
func nodeTLS(dir string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, apiClientCert), filepath.Join(dir, apiClientKey))
	if err != nil {
		return nil, fmt.Errorf("kubevisor-api's client certificate: %w", err)
	}
	bundle, err := os.ReadFile(filepath.Join(dir, apiCABundle))
	if err != nil {
		return nil, fmt.Errorf("kubevisor-api's CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return nil, fmt.Errorf("no certificate in %s", filepath.Join(dir, apiCABundle))
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ServerName:   nodeapi.ServerName,
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// podVolumeDir is where the kubelet keeps a pod's emptyDir volume on its node.
func podVolumeDir(kubeletRoot, podUID, volume string) string {
	return filepath.Join(kubeletRoot, "pods", podUID, "volumes", "kubernetes.io~empty-dir", volume)
}

// chunk is what one Read of a stream returned, and when.
type chunk struct {
	at time.Time
	b  []byte
}

// tapped reads a stream in a goroutine of its own, stamping each chunk with its arrival, so
// that a stream that is not being measured is drained and never holds the guest's output up.
type tapped struct {
	conn   net.Conn
	chunks chan chunk
	done   chan struct{}
	err    error // once done is closed
}

func tap(c net.Conn) *tapped {
	t := &tapped{conn: c, chunks: make(chan chunk, 1<<14), done: make(chan struct{})}
	go func() {
		defer close(t.done)
		buf := make([]byte, 32<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				t.chunks <- chunk{at: time.Now(), b: bytes.Clone(buf[:n])}
			}
			if err != nil {
				t.err = err
				return
			}
		}
	}()
	return t
}

// drain drops what arrived so far.
func (t *tapped) drain() {
	for {
		select {
		case <-t.chunks:
		default:
			return
		}
	}
}

// waitFor reads chunks until what arrived since the call holds one of wants, and returns the
// arrival of the chunk that completed it.
func (t *tapped) waitFor(ctx context.Context, timeout time.Duration, wants ...[]byte) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var seen []byte
	for {
		select {
		case c := <-t.chunks:
			seen = append(seen, c.b...)
			for _, w := range wants {
				if bytes.Contains(seen, w) {
					return c.at, nil
				}
			}
			if len(seen) > 1<<20 {
				seen = seen[len(seen)-1<<16:]
			}
		case <-t.done:
			if len(t.chunks) > 0 {
				continue // what came before the end first
			}
			return time.Time{}, fmt.Errorf("stream ended: %w", t.err)
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("waiting for %q: %w; last output %q", wants, ctx.Err(), lastBytes(seen, 200))
		}
	}
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
