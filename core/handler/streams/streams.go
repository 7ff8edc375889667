// Package streams is the node handler's stream endpoint of core/nodeapi: HTTPS with mutual TLS
// on nodeapi.Port, serving the consoles, displays and port forwards of the VMIs this handler
// runs as WebSockets (core/wsstream), and their actions (pause, unpause, reset, softreboot) and
// guestosinfo, for kubevisor-api alone.
//
// A VMI has one interactive console session at a time: a new console stream of the VMI takes
// over, and the one before gets TakeOverMessage and is closed (docs/console.md). VNC and port
// forward streams are independent of one another.
package streams

import (
	"context"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/types"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/nodeapi"
)

// Backend is what the endpoint serves: the node handler (*handler.Handler). Its errors are gRPC
// statuses whose codes become the endpoint's HTTP codes: NotFound 404, FailedPrecondition 409,
// InvalidArgument 400, Unimplemented 501, Unavailable 502, any other 500.
type Backend interface {
	// Find gives the UID of the VMI namespace/name that the handler runs.
	Find(namespace, name string) (types.UID, bool)
	// CheckStream says whether a stream (handler.StreamConsole, StreamVNC, StreamPortForward)
	// can be opened now, before the connection is upgraded.
	CheckStream(ctx context.Context, uid types.UID, kind string) error
	// Console copies in to the serial console and the console to out, until ctx is done or in
	// ends (handler.Handler.Console with in set).
	Console(ctx context.Context, uid types.UID, in io.Reader, out io.Writer) error
	// Display is one RFB session with the VM's display.
	Display(ctx context.Context, uid types.UID, in io.Reader, out io.Writer) error
	// DialGuest connects to a TCP port of the guest.
	DialGuest(ctx context.Context, uid types.UID, port int) (net.Conn, error)
	Pause(ctx context.Context, uid types.UID) error
	Unpause(ctx context.Context, uid types.UID) error
	Reset(ctx context.Context, uid types.UID) error
	SoftReboot(ctx context.Context, uid types.UID) error
	GuestOSInfo(ctx context.Context, uid types.UID) (*subv1.GuestOSInfo, error)
}

var _ Backend = (*handler.Handler)(nil)

// Config is the endpoint's configuration (the flags of kubevisor-handler serve).
type Config struct {
	// Addr is the listen address (":8186"); "" or "0" disables the endpoint.
	Addr string
	// CertDir holds tls.crt and tls.key (the serving certificate) and ca.crt (the CA bundle
	// client certificates must chain to), as in the Secret nodeapi.HandlerCertSecret. The files
	// are read again when they change (a mounted Secret is updated in place); until they exist
	// the port is not served.
	CertDir string
	// ClientName is the only client certificate common name accepted. Default:
	// nodeapi.ClientName.
	ClientName string
	// CertPoll is how often the files are looked for until they exist. Default: 5s.
	CertPoll time.Duration
	// Logger receives the endpoint's logs. Default: hclog's default logger.
	Logger hclog.Logger
}

// DefaultAddr is the listen address of the endpoint: nodeapi.Port on every address.
var DefaultAddr = net.JoinHostPort("", strconv.Itoa(nodeapi.Port))

// Enabled reports whether the configuration serves the endpoint.
func (c Config) Enabled() bool { return c.Addr != "" && c.Addr != "0" }

func (c Config) withDefaults() Config {
	if c.ClientName == "" {
		c.ClientName = nodeapi.ClientName
	}
	if c.CertPoll <= 0 {
		c.CertPoll = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = hclog.Default()
	}
	return c
}
