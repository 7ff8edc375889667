package streams

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kubevisor/kubevisor/core/handler/internal/certdir"
	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// Server is the stream endpoint of one node handler.
type Server struct {
	cfg      Config
	b        Backend
	log      hclog.Logger
	certs    *certdir.Store
	consoles consoles

	mu   sync.Mutex
	addr net.Addr
}

// New returns the endpoint serving b with cfg.
func New(cfg Config, b Backend) *Server {
	cfg = cfg.withDefaults()
	s := &Server{cfg: cfg, b: b, log: cfg.Logger}
	s.certs = &certdir.Store{Dir: cfg.CertDir, OnLoadErr: func(err error) {
		s.log.Warn("stream endpoint certificates not (re)loaded; the last good ones, if any, stay", "dir", cfg.CertDir, "error", err)
	}}
	return s
}

// Run serves the endpoint on Config.Addr until ctx is done. Until the certificate files exist
// in Config.CertDir it does not listen: it logs that it waits, looks for them every
// Config.CertPoll, and starts serving once they are there (the handler runs its VMIs meanwhile).
// A disabled endpoint (Config.Enabled) returns nil at once.
func (s *Server) Run(ctx context.Context) error {
	if !s.cfg.Enabled() {
		return nil
	}
	if !s.waitForCerts(ctx) {
		return nil
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("stream endpoint: %w", err)
	}
	return s.Serve(ctx, ln)
}

// waitForCerts returns once the certificates load (true), or ctx is done (false).
func (s *Server) waitForCerts(ctx context.Context) bool {
	logged := false
	for {
		_, _, err := s.certs.Load()
		if err == nil {
			if logged {
				s.log.Info("stream endpoint certificates found", "dir", s.cfg.CertDir)
			}
			return true
		}
		if !logged {
			s.log.Warn("stream endpoint not served until its certificates exist (kubevisor-api writes them into the Secret "+nodeapi.HandlerCertSecret+"); VMIs run meanwhile, without console, VNC, port-forward or actions",
				"addr", s.cfg.Addr, "dir", s.cfg.CertDir, "error", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(s.cfg.CertPoll):
		}
	}
}

// Serve serves the endpoint with mutual TLS on ln until ctx is done, then closes ln and every
// stream. It returns nil then.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.mu.Lock()
	s.addr = ln.Addr()
	s.mu.Unlock()
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		// Streams outlive a request: the request contexts, and with them the streams, end with
		// ctx (Shutdown does not close hijacked connections).
		BaseContext: func(net.Listener) context.Context { return ctx },
		ErrorLog:    s.log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
		// HTTP/1.1 only: a WebSocket upgrade needs it.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	defer stop()
	s.log.Info("stream endpoint serving", "addr", ln.Addr().String(), "client", s.cfg.ClientName)
	err := srv.Serve(tls.NewListener(ln, tlsConfig(s.certs, s.cfg.ClientName)))
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("stream endpoint: %w", err)
}

// Addr is the address being served, nil before Serve.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}
