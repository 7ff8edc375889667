package cmd

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
)

// portMapping is one LOCAL:REMOTE of port-forward; Local 0 picks any free port.
type portMapping struct{ Local, Remote int }

// parsePortMapping reads "PORT", "LOCAL:REMOTE" or ":REMOTE" (any local port).
func parsePortMapping(s string) (portMapping, error) {
	local, remote, found := strings.Cut(s, ":")
	if !found {
		remote = local
	}
	port := func(s string, zeroOK bool) (int, error) {
		if s == "" && zeroOK {
			return 0, nil
		}
		p, err := strconv.Atoi(s)
		if err != nil || p < 0 || p > 65535 || (p == 0 && !zeroOK) {
			return 0, fmt.Errorf("port mapping %q: %q is not a port", s, s)
		}
		return p, nil
	}
	var m portMapping
	var err error
	if m.Local, err = port(local, true); err != nil {
		return m, err
	}
	if m.Remote, err = port(remote, false); err != nil {
		return m, err
	}
	return m, nil
}

func newPortForwardCommand(o *options) *cobra.Command {
	var (
		address string
		stdio   bool
	)
	cmd := &cobra.Command{
		Use:   "port-forward vm/NAME|vmi/NAME|NAME [LOCAL:]REMOTE [...]",
		Short: "Forward local TCP ports to a VMI's guest",
		Long: "Forward local TCP ports to a VMI's guest: each connection to LOCAL becomes one stream to the\n" +
			"guest's REMOTE port. With --stdio, stdin and stdout are the one connection (ssh's ProxyCommand).",
		Example: "  vmctl port-forward vm/vm1 8080:80\n  vmctl port-forward --stdio vmi/vm1 22",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, name, err := parseTarget(args[0])
			if err != nil {
				return err
			}
			var maps []portMapping
			for _, a := range args[1:] {
				m, err := parsePortMapping(a)
				if err != nil {
					return err
				}
				maps = append(maps, m)
			}
			c, err := o.Client()
			if err != nil {
				return err
			}
			ctx := cmdContext(cmd)
			dialer := func(remote int) func(context.Context) (net.Conn, error) {
				return func(ctx context.Context) (net.Conn, error) {
					conn, err := c.Dial(ctx, name, subv1.SubresourcePortForward, strconv.Itoa(remote))
					if err != nil {
						return nil, c.Explain(ctx, err, o.action(c, "forward ports of", subv1.VirtualMachineInstances, name))
					}
					return conn, nil
				}
			}
			if stdio {
				if len(maps) != 1 {
					return fmt.Errorf("--stdio forwards exactly one port, not %d", len(maps))
				}
				conn, err := dialer(maps[0].Remote)(ctx)
				if err != nil {
					return err
				}
				splice(ctx, stdioConn{in: o.streams.In, out: o.streams.Out}, conn)
				return nil
			}
			g, ctx := errgroup.WithContext(ctx)
			for _, m := range maps {
				ln, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(m.Local)))
				if err != nil {
					return fmt.Errorf("listen: %w", err)
				}
				fmt.Fprintf(o.streams.Out, "Forwarding from %s -> %d\n", ln.Addr(), m.Remote)
				dial := dialer(m.Remote)
				g.Go(func() error {
					return serveListener(ctx, ln, dial, func(err error) { fmt.Fprintln(o.streams.ErrOut, "error:", err) })
				})
			}
			return g.Wait()
		},
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "Local address to listen on")
	cmd.Flags().BoolVar(&stdio, "stdio", false, "Connect stdin and stdout to the one forwarded port instead of listening")
	return cmd
}

// stdioConn is stdin and stdout as one io.ReadWriteCloser.
type stdioConn struct {
	in  interface{ Read([]byte) (int, error) }
	out interface{ Write([]byte) (int, error) }
}

func (s stdioConn) Read(p []byte) (int, error)  { return s.in.Read(p) }
func (s stdioConn) Write(p []byte) (int, error) { return s.out.Write(p) }
func (s stdioConn) Close() error                { return nil }
