// Command testdriver is a hypervisor driver plugin for the plugin host's tests: fakehv, served
// with driver.ServeHypervisor, misbehaving as its arguments ask.
//
//	name=NAME         the name Info reports (default "testdriver")
//	exit-at-start     print a line on stderr and exit 3 before serving
//	wrong-cookie      serve with a handshake cookie the host does not know
//	version=N         serve protocol version N only
//	panic-on=OP       panic inside operation OP (Status, Configure, ...)
//	slow-start=DUR    sleep DUR before serving
//	marker=...        ignored: lets a test find its processes
package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-plugin"

	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	"github.com/kubevisor/kubevisor/core/plugin/internal/fakehv"
)

func main() {
	hv := fakehv.New("testdriver")
	var (
		exitAtStart, wrongCookie bool
		version                  int
		slow                     time.Duration
	)
	for _, arg := range os.Args[1:] {
		key, val, _ := strings.Cut(arg, "=")
		switch key {
		case "name":
			hv.Name = val
		case "exit-at-start":
			exitAtStart = true
		case "wrong-cookie":
			wrongCookie = true
		case "version":
			v, err := strconv.Atoi(val)
			if err != nil {
				fail("version: %v", err)
			}
			version = v
		case "panic-on":
			hv.PanicOn = val
		case "slow-start":
			d, err := time.ParseDuration(val)
			if err != nil {
				fail("slow-start: %v", err)
			}
			slow = d
		case "marker":
		default:
			fail("unknown argument %q", arg)
		}
	}
	log := driver.NewLogger(hv.Name)
	if exitAtStart {
		fmt.Fprintln(os.Stderr, "testdriver: exit-at-start: giving up before serving, as asked")
		os.Exit(3)
	}
	time.Sleep(slow)
	log.Info("testdriver serving", "pid", os.Getpid())
	kind := basev1.Kind_KIND_HYPERVISOR
	switch {
	case wrongCookie:
		hs := driver.Handshake
		hs.MagicCookieValue = "not-the-kubevisor-cookie"
		plugin.Serve(&plugin.ServeConfig{
			HandshakeConfig:  hs,
			VersionedPlugins: map[int]plugin.PluginSet{driver.ProtocolVersion: {driver.KindName(kind): &driver.Plugin{Kind: kind, Impl: hv}}},
			GRPCServer:       plugin.DefaultGRPCServer,
			Logger:           log,
		})
	case version != 0:
		plugin.Serve(&plugin.ServeConfig{
			HandshakeConfig:  driver.Handshake,
			VersionedPlugins: map[int]plugin.PluginSet{version: {driver.KindName(kind): &driver.Plugin{Kind: kind, Impl: hv}}},
			GRPCServer:       plugin.DefaultGRPCServer,
			Logger:           log,
		})
	default:
		driver.ServeHypervisor(hv, driver.WithLogger(log))
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "testdriver: "+format+"\n", args...)
	os.Exit(2)
}
