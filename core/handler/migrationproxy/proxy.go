package migrationproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubevisor/kubevisor/core/handler/internal/certdir"
	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// Config is the proxy's configuration (the --migration-* flags of kubevisor-handler serve).
type Config struct {
	// NodeName is this handler's node: its certificate must name it
	// (nodeapi.NodeCommonName). Required.
	NodeName string
	// Addr is the listen address of the target side (DefaultAddr); "" or "0" disables the
	// proxy, both sides.
	Addr string
	// CertDir holds this node's certificate (tls.crt, tls.key) and the CA bundle (ca.crt),
	// read again when they change. Until they exist, and name NodeName, the port is not served
	// and Incoming and Outgoing fail.
	CertDir string
	// CertPoll is how often the files are looked for until they are there. Default: 5s.
	CertPoll time.Duration
	// HandshakeTimeout bounds a TLS handshake, either side. Default: 10s.
	HandshakeTimeout time.Duration
	// DialTimeout bounds the source's dial of the target, and the target's of its VM's
	// socket. Default: 10s.
	DialTimeout time.Duration
	// MaxConnsPerMigration is how many connections one migration may have at once on one side.
	// Default: 8.
	MaxConnsPerMigration int
	// MaxPendingHandshakes is how many handshakes the port runs at once. Default: 32.
	MaxPendingHandshakes int
	// Logger receives the proxy's logs. Default: hclog's default logger.
	Logger hclog.Logger
	// Registerer, when set, gets the proxy's metrics (the handler's metrics registry).
	Registerer prometheus.Registerer
}

// DefaultAddr is the listen address of the target side: nodeapi.MigrationPort on every address.
var DefaultAddr = net.JoinHostPort("", strconv.Itoa(nodeapi.MigrationPort))

// Enabled reports whether the configuration runs the proxy.
func (c Config) Enabled() bool { return c.Addr != "" && c.Addr != "0" }

func (c Config) withDefaults() Config {
	if c.CertPoll <= 0 {
		c.CertPoll = 5 * time.Second
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.MaxConnsPerMigration <= 0 {
		c.MaxConnsPerMigration = 8
	}
	if c.MaxPendingHandshakes <= 0 {
		c.MaxPendingHandshakes = 32
	}
	if c.Logger == nil {
		c.Logger = hclog.Default()
	}
	return c
}

// Errors of Incoming and Outgoing, for the caller to classify (errors.Is).
var (
	// ErrDisabled: the proxy is not configured (Config.Addr), or its Run has ended.
	ErrDisabled = errors.New("the migration proxy is not running on this node")
	// ErrNoCertificate: the node certificate is missing, unreadable or not this node's.
	ErrNoCertificate = errors.New("no node certificate for the migration proxy")
	// ErrExists: the migration already has this side on this node.
	ErrExists = errors.New("the migration is already proxied on this node")
	// ErrInvalid: the spec is not valid.
	ErrInvalid = errors.New("invalid migration proxy spec")
)

// Proxy is the migration proxy of one node handler: the target side (Incoming) on its port,
// the source side (Outgoing) on unix sockets.
type Proxy struct {
	cfg     Config
	log     hclog.Logger
	certs   *certdir.Store
	metrics *metrics
	pending chan struct{} // a token per handshake running on the port

	mu       sync.Mutex
	addr     net.Addr
	running  bool // Run or Serve is serving the port
	ended    bool // Run or Serve has ended
	incoming map[string]*Migration
	outgoing map[string]*Migration
}

// New returns the proxy of cfg; Run serves it.
func New(cfg Config) (*Proxy, error) {
	if cfg.NodeName == "" {
		return nil, fmt.Errorf("%w: the node name is required", ErrInvalid)
	}
	cfg = cfg.withDefaults()
	p := &Proxy{
		cfg: cfg, log: cfg.Logger, metrics: newMetrics(cfg.Registerer),
		pending:  make(chan struct{}, cfg.MaxPendingHandshakes),
		incoming: map[string]*Migration{}, outgoing: map[string]*Migration{},
	}
	p.certs = &certdir.Store{Dir: cfg.CertDir, OnLoadErr: func(err error) {
		p.log.Warn("migration proxy certificates not (re)loaded; the last good ones, if any, stay", "dir", cfg.CertDir, "error", err)
	}}
	return p, nil
}

// Run serves the proxy on Config.Addr until ctx is done. Until this node's certificate is in
// Config.CertDir it does not listen: it logs that it waits and looks again every
// Config.CertPoll. A disabled proxy (Config.Enabled) returns nil at once.
func (p *Proxy) Run(ctx context.Context) error {
	if !p.cfg.Enabled() {
		return nil
	}
	if !p.waitForCerts(ctx) {
		p.end()
		return nil
	}
	ln, err := net.Listen("tcp", p.cfg.Addr)
	if err != nil {
		p.end()
		return fmt.Errorf("migration proxy: %w", err)
	}
	return p.Serve(ctx, ln)
}

// WaitServing returns nil once the proxy serves its port, at once when it does. While it waits
// for this node's certificate (a handler pod that just started gets its node certificate a
// few seconds later) it waits, until ctx is done. It returns ErrDisabled when the proxy is not
// configured or has ended, and ErrDisabled wrapped with ctx's error when ctx ends first.
func (p *Proxy) WaitServing(ctx context.Context) error {
	if !p.cfg.Enabled() {
		return ErrDisabled
	}
	for {
		p.mu.Lock()
		running, ended := p.running, p.ended
		p.mu.Unlock()
		switch {
		case running:
			return nil
		case ended:
			return ErrDisabled
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: not serving yet (%v)", ErrDisabled, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitForCerts returns once this node's certificate loads (true), or ctx is done (false).
func (p *Proxy) waitForCerts(ctx context.Context) bool {
	logged := false
	for {
		_, err := p.credentials()
		if err == nil {
			if logged {
				p.log.Info("migration proxy certificates found", "dir", p.cfg.CertDir)
			}
			return true
		}
		if !logged {
			p.log.Warn("migration proxy not served until this node's certificate is there; migrations to and from this node fail meanwhile",
				"addr", p.cfg.Addr, "dir", p.cfg.CertDir, "error", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(p.cfg.CertPoll):
		}
	}
}

// Serve serves the target side on ln until ctx is done, then closes ln and every migration. It
// returns nil then.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	p.mu.Lock()
	if p.ended {
		p.mu.Unlock()
		ln.Close()
		return ErrDisabled
	}
	p.addr, p.running = ln.Addr(), true
	p.mu.Unlock()
	// On the way out: the migrations closed first (their connections with them), then the
	// connections' goroutines waited for.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer p.end()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	p.log.Info("migration proxy serving", "addr", ln.Addr().String(), "node", p.cfg.NodeName)
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("migration proxy: %w", err)
		}
		select {
		case p.pending <- struct{}{}:
		default:
			p.log.Warn("migration connection refused: too many handshakes at once", "remote", conn.RemoteAddr().String(), "limit", p.cfg.MaxPendingHandshakes)
			p.metrics.refused(sideTarget)
			conn.Close()
			continue
		}
		wg.Go(func() { p.serveConn(ctx, conn) })
	}
}

// end marks the proxy ended and closes every migration.
func (p *Proxy) end() {
	p.mu.Lock()
	p.running, p.ended = false, true
	var all []*Migration
	for _, m := range p.incoming {
		all = append(all, m)
	}
	for _, m := range p.outgoing {
		all = append(all, m)
	}
	p.mu.Unlock()
	for _, m := range all {
		m.Close()
	}
}

// Addr is the address of the target side, nil until it is served.
func (p *Proxy) Addr() net.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// credentials returns this node's certificate, checked to name this node and to be valid now,
// with the CA pool.
func (p *Proxy) credentials() (creds, error) {
	cert, pool, err := p.certs.Load()
	if cert == nil {
		return creds{}, fmt.Errorf("%w in %s: %w", ErrNoCertificate, p.cfg.CertDir, err)
	}
	leaf := cert.Leaf
	if want := nodeapi.NodeCommonName(p.cfg.NodeName); leaf.Subject.CommonName != want {
		return creds{}, fmt.Errorf("%w: the certificate in %s is for %q, not %q", ErrNoCertificate, p.cfg.CertDir, leaf.Subject.CommonName, want)
	}
	if now := time.Now(); now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return creds{}, fmt.Errorf("%w: the certificate in %s is valid from %s to %s, not now", ErrNoCertificate, p.cfg.CertDir, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return creds{cert: cert, pool: pool}, nil
}

// register adds m to the migrations of its side, unless the proxy is not running or the side
// has m's id.
func (p *Proxy) register(m *Migration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		return ErrDisabled
	}
	side := p.outgoing
	if m.side == sideTarget {
		side = p.incoming
	}
	if _, ok := side[m.id]; ok {
		return fmt.Errorf("%w: %s side of %s", ErrExists, m.side, m.id)
	}
	side[m.id] = m
	return nil
}

// unregister removes m from its side.
func (p *Proxy) unregister(m *Migration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	side := p.outgoing
	if m.side == sideTarget {
		side = p.incoming
	}
	if side[m.id] == m {
		delete(side, m.id)
	}
}

// incomingMigration is the open Incoming migration id, or nil.
func (p *Proxy) incomingMigration(id string) *Migration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.incoming[id]
}
