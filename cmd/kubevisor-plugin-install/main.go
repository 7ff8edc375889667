// Command kubevisor-plugin-install installs driver plugins into the handler's plugin directory
// (package core/plugin/plugindir). The handler DaemonSet runs it twice over:
//
//	kubevisor-plugin-install --plugin-dir /etc/kubevisor/plugins --copy-self-to /kubevisor/tools
//
// from the handler image, to make the plugin directory root-only and put a copy of itself
// where the next init containers find it; then once per driver image, from that image, with
// that copy:
//
//	/kubevisor/tools/kubevisor-plugin-install --from /kubevisor/plugin --plugin-dir /etc/kubevisor/plugins
//
// to copy the image's driver binary and manifest in. It exits 1 only when it cannot write the
// plugin directory: a driver image without a usable manifest, or whose binary does not match
// its manifest's sha256, is reported and left for the handler to refuse by name, so that one
// bad driver image does not keep the handler, and its other drivers, from starting. It is a
// static binary (hack/images builds it with CGO_ENABLED=0) since driver images hold no C
// library.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kubevisor/kubevisor/core/plugin/plugindir"
)

func main() {
	pluginDir := flag.String("plugin-dir", "", "the handler's plugin `directory` (made root-only)")
	from := flag.String("from", "", "install the drivers whose manifests are in `directory` (a driver image's "+plugindir.ImageDir+")")
	copySelf := flag.String("copy-self-to", "", "copy this binary into `directory` for the driver images' init containers")
	flag.Parse()
	if *pluginDir == "" || flag.NArg() > 0 || (*from == "" && *copySelf == "") {
		fmt.Fprintln(os.Stderr, "usage: "+plugindir.Command+" --plugin-dir DIR (--copy-self-to DIR | --from DIR)")
		flag.PrintDefaults()
		os.Exit(2)
	}
	if err := plugindir.Prepare(*pluginDir); err != nil {
		fail("%v", err)
	}
	if *copySelf != "" {
		to, err := plugindir.CopySelf(*copySelf)
		if err != nil {
			fail("%v", err)
		}
		fmt.Printf("%s: plugin directory %s ready (0700); installer copied to %s\n", plugindir.Command, *pluginDir, to)
	}
	if *from == "" {
		return
	}
	installed, err := plugindir.Install(*from, *pluginDir)
	for _, in := range installed {
		m := in.Manifest
		fmt.Printf("%s: installed %s driver %q: %s (sha256 %s), manifest %s\n", plugindir.Command, m.Kind, m.Name, m.Binary, m.SHA256, in.Path)
		if in.Mismatch != "" {
			fmt.Fprintf(os.Stderr, "%s: ERROR: driver %q: binary %s has sha256 %s, its manifest says %s: the handler will refuse to run it (rebuild the driver image with the binary's digest in its manifest)\n",
				plugindir.Command, m.Name, m.Binary, in.Mismatch, m.SHA256)
		}
	}
	if err != nil {
		// Not fatal: the handler reports a configured driver it cannot find or run, and runs
		// the others.
		fmt.Fprintf(os.Stderr, "%s: ERROR: %v\n", plugindir.Command, err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, plugindir.Command+": "+format+"\n", args...)
	os.Exit(1)
}
