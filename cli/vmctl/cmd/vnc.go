package cmd

import (
	"context"
	"fmt"
	"image/png"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/rfb"
)

func newVNCCommand(o *options) *cobra.Command {
	var port int
	cmd := &cobra.Command{
		Use:   "vnc NAME",
		Short: "Serve a VMI's VNC display on a local port",
		Long: "Serve a VMI's VNC display on 127.0.0.1: the address is printed, and every VNC client that\n" +
			"connects there gets its own stream to the VMI's display, until Ctrl-C.",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: o.completeNames(subv1.VirtualMachineInstances),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, name, err := parseTarget(args[0])
			if err != nil {
				return err
			}
			dial, err := o.vncDialer(name)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			fmt.Fprintf(o.streams.Out, "VNC of VMI %s on %s\n", name, ln.Addr())
			return serveListener(cmdContext(cmd), ln, dial, func(err error) { fmt.Fprintln(o.streams.ErrOut, "error:", err) })
		},
	}
	cmd.Flags().IntVar(&port, "port", 0, "Local port to listen on (0: any free port)")
	cmd.AddCommand(newScreenshotCommand(o))
	return cmd
}

// vncDialer opens VNC streams of the named VMI, with refusals explained.
func (o *options) vncDialer(name string) (func(context.Context) (net.Conn, error), error) {
	c, err := o.Client()
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (net.Conn, error) {
		conn, err := c.Dial(ctx, name, subv1.SubresourceVNC)
		if err != nil {
			return nil, c.Explain(ctx, err, o.action(c, "open the VNC display of", subv1.VirtualMachineInstances, name))
		}
		return conn, nil
	}, nil
}

func newScreenshotCommand(o *options) *cobra.Command {
	var (
		file    string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:               "screenshot NAME -o FILE.png",
		Short:             "Write a PNG of a VMI's VNC display",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: o.completeNames(subv1.VirtualMachineInstances),
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" {
				return fmt.Errorf("-o FILE.png is required (- for stdout)")
			}
			_, name, err := parseTarget(args[0])
			if err != nil {
				return err
			}
			dial, err := o.vncDialer(name)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmdContext(cmd), timeout)
			defer cancel()
			conn, err := dial(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			if d, ok := ctx.Deadline(); ok {
				_ = conn.SetDeadline(d)
			}
			img, err := rfb.Screenshot(conn)
			if err != nil {
				return fmt.Errorf("screenshot of VMI %s: %w", name, err)
			}
			var w io.Writer = o.streams.Out
			if file != "-" {
				f, err := os.Create(file)
				if err != nil {
					return fmt.Errorf("create %s: %w", file, err)
				}
				defer f.Close()
				w = f
			}
			if err := png.Encode(w, img); err != nil {
				return fmt.Errorf("write png: %w", err)
			}
			if f, ok := w.(*os.File); ok && file != "-" {
				if err := f.Close(); err != nil {
					return fmt.Errorf("write %s: %w", file, err)
				}
				fmt.Fprintf(o.streams.ErrOut, "Wrote %dx%d screenshot of VMI %s to %s\n", img.Bounds().Dx(), img.Bounds().Dy(), name, file)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "output", "o", "", "PNG file to write (- for stdout)")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "Give up after this long")
	return cmd
}
