// Command images builds Kubevisor's container images as `docker save` tarballs, with no
// registry or Docker daemon (hack/images/imagebuild), for `ctr -n k8s.io images import` on the
// local cluster (hack/cluster/load-images.sh):
//
//	go run ./hack/images [flags] all|pause|components|<image name>...
//	go run ./hack/images -name NAME -bins bin/a,bin/b [-qemu] [-host-bins qemu-img] custom
//	go run ./hack/images -name NAME -driver-bin BIN -driver-kind KIND [-driver-name N] [-repo R] driver
//
// driver is a driver image, the way a third-party driver reaches a cluster without a handler
// image of its own (docs/driver-authoring.md): its static binary and a manifest naming it with
// the binary's sha256 (computed here; -driver-sha256 writes another, for tests of the handler's
// refusal) in /kubevisor/plugin, nothing else. A driver component's init container copies them
// into the handler's plugin directory (manifests/install/drivers, kubevisor-plugin-install).
//
// pause is the cluster's sandbox image (hack/images/pause, built static). Component images
// take the binaries from --bin-dir (make build); an image whose main binary is not built yet is
// skipped with a note. The launcher image also carries the host's QEMU with its libraries,
// firmware and TCG module, and kubevisor-console-log (its guest-console-log container) and
// kubevisor-probe (the compute container's exec probe for a VMI's exec or guestAgentPing probe)
// and kubevisor-containerdisk (which its init container copies for the containerDisk
// containers, whose images hold only the disk) built static. The
// test guest's containerDisk is built by hack/guest (make guest) and imported as it is. Each image goes to <out>/<name>.tar, tagged <repo>/<name>:<tag>.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kubevisor/kubevisor/core/plugin"
	"github.com/kubevisor/kubevisor/core/plugin/plugindir"
	"github.com/kubevisor/kubevisor/hack/images/imagebuild"
)

// component is one image made of Kubevisor binaries.
type component struct {
	name string
	// bins are globs in --bin-dir, copied to /usr/local/bin; the first must match.
	bins []string
	// cni copies the CNI plugins (--cni-dir) to /opt/cni/bin, for the network driver.
	cni bool
	// qemu adds the host's QEMU (imagebuild.DefaultQEMUOptions).
	qemu bool
	// libvirt adds the host's libvirt daemon (imagebuild.DefaultLibvirtOptions).
	libvirt bool
	// hostBins are host executables (with their libraries) at their host paths.
	hostBins []string
	// static are commands (./cmd/<name>) built static (CGO_ENABLED=0) into /usr/local/bin:
	// binaries that other images run (kubevisor-containerdisk runs in containerDisk images,
	// which hold nothing but /disk/), built here rather than taken from --bin-dir.
	static []string
}

// components lists the images of the install manifests; the handler DaemonSet runs the
// driver plugins and the device plugins beside the handler, so they share its image.
var components = []component{
	{name: "kubevisor-controller", bins: []string{"kubevisor-controller"}},
	{name: "kubevisor-api", bins: []string{"kubevisor-api"}},
	{name: "kubevisor-operator", bins: []string{"kubevisor-operator"}},
	// The handler image carries QEMU too: the qmp driver probes it (version, machines,
	// accelerators) for its fingerprint, though VMs run in the launcher pods; and swtpm's tools,
	// which the libvirt driver looks for to say its nodes' VMs can have a TPM.
	// kubevisor-plugin-install: its init container prepares the plugin directory and hands itself to the driver images' init
	// containers (manifests/install/drivers), which run it from a shared volume.
	{name: "kubevisor-handler", bins: []string{"kubevisor-handler", "kubevisor-driver-*", "kubevisor-deviceplugins"},
		cni: true, qemu: true, hostBins: []string{"qemu-img", "swtpm_setup", "swtpm_ioctl"}, static: []string{"kubevisor-plugin-install"}},
	// The launcher image carries libvirtd too: the libvirt driver runs a daemon per VMI in the
	// launcher pod, which forks QEMU there. Its init container install-containerdisk copies
	// kubevisor-containerdisk into an emptyDir for the pod's containerDisk containers.
	{name: "kubevisor-launcher", bins: []string{"kubevisor-launcher"}, qemu: true, libvirt: true, static: []string{"kubevisor-console-log", "kubevisor-probe", "kubevisor-containerdisk"}},
}

type options struct {
	binDir, cniDir, out, repo, tag string
	created                        time.Time
	custom                         component // the "custom" image: -name, -bins, -qemu, -host-bins
	driver                         driverImage
}

// driverImage is the "driver" image: -name, -driver-*.
type driverImage struct {
	bin, kind, name, sha256, config string
}

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", "bin", "`directory` with the Kubevisor binaries (make build)")
	flag.StringVar(&o.cniDir, "cni-dir", "_output/cni/bin", "`directory` with the CNI plugins (make cni-plugins)")
	flag.StringVar(&o.out, "out", "_output/images", "`directory` the image tarballs are written to")
	flag.StringVar(&o.repo, "repo", "kubevisor", "image repository prefix")
	flag.StringVar(&o.tag, "tag", "dev", "image tag (not latest, so pods default to imagePullPolicy IfNotPresent)")
	var bins, hostBins string
	flag.StringVar(&o.custom.name, "name", "", "custom: image `name`")
	flag.StringVar(&bins, "bins", "", "custom: comma-separated binaries (paths or globs; the first is the entrypoint)")
	flag.BoolVar(&o.custom.qemu, "qemu", false, "custom: add the host's QEMU, firmware and TCG module")
	flag.BoolVar(&o.custom.cni, "cni", false, "custom: add the CNI plugins of -cni-dir in /opt/cni/bin")
	flag.StringVar(&hostBins, "host-bins", "", "custom: comma-separated host executables to add with their libraries")
	flag.StringVar(&o.driver.bin, "driver-bin", "", "driver: the driver's static `binary`")
	flag.StringVar(&o.driver.kind, "driver-kind", "", "driver: hypervisor, network, storage or device")
	flag.StringVar(&o.driver.name, "driver-name", "", "driver: the driver's name (default: -name)")
	flag.StringVar(&o.driver.sha256, "driver-sha256", "", "driver: the manifest's sha256 (default: the binary's; another value makes an image the handler refuses)")
	flag.StringVar(&o.driver.config, "driver-config", "", "driver: JSON `file` of the driver's configuration, put in its manifest")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: go run ./hack/images [flags] all|pause|components|custom|driver|<image>...\nimages: pause")
		for _, c := range components {
			fmt.Fprintf(os.Stderr, " %s", c.name)
		}
		fmt.Fprintln(os.Stderr)
		flag.PrintDefaults()
	}
	flag.Parse()
	o.custom.bins = splitList(bins)
	o.custom.hostBins = splitList(hostBins)
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	o.created = time.Unix(0, 0)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fatalf("SOURCE_DATE_EPOCH=%q is not a number of seconds", s)
		}
		o.created = time.Unix(sec, 0)
	}
	var want []string
	for _, a := range flag.Args() {
		switch a {
		case "all":
			want = append(want, "pause", "components")
		default:
			want = append(want, a)
		}
	}
	for _, w := range want {
		var err error
		switch w {
		case "pause":
			err = buildPause(o)
		case "custom":
			if o.custom.name == "" || len(o.custom.bins) == 0 {
				fatalf("custom needs -name and -bins")
			}
			// Paths as given, not below -bin-dir.
			c := o.custom
			c.bins = nil
			oo := o
			oo.binDir = "/"
			for _, b := range o.custom.bins {
				abs, err := filepath.Abs(b)
				if err != nil {
					fatalf("%v", err)
				}
				c.bins = append(c.bins, abs)
			}
			err = buildComponent(oo, c, true)
		case "driver":
			if o.custom.name == "" || o.driver.bin == "" || o.driver.kind == "" {
				fatalf("driver needs -name, -driver-bin and -driver-kind")
			}
			err = buildDriver(o)
		case "components":
			for _, c := range components {
				if err = buildComponent(o, c, false); err != nil {
					break
				}
			}
		default:
			c, ok := find(w)
			if !ok {
				fatalf("unknown image %q (see -h)", w)
			}
			err = buildComponent(o, c, true)
		}
		if err != nil {
			fatalf("%v", err)
		}
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func find(name string) (component, bool) {
	for _, c := range components {
		if c.name == name || strings.TrimPrefix(c.name, "kubevisor-") == name {
			return c, true
		}
	}
	return component{}, false
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "images: "+format+"\n", args...)
	os.Exit(1)
}

func (o options) write(name string, cfg imagebuild.Config, trees ...*imagebuild.Tree) error {
	start := time.Now()
	cfg.Created = o.created
	img, err := imagebuild.Image(cfg, trees...)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	ref := fmt.Sprintf("%s/%s:%s", o.repo, name, o.tag)
	file := filepath.Join(o.out, name+".tar")
	digest, err := imagebuild.WriteTarball(img, ref, file)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	size := int64(0)
	if fi, err := os.Stat(file); err == nil {
		size = fi.Size()
	}
	fmt.Printf("==> images: %s@%s -> %s (%.1f MiB, %.1fs)\n", ref, digest, file, float64(size)/(1<<20), time.Since(start).Seconds())
	return nil
}

// buildStatic compiles a main package (run from the repository root) static into dir/name.
func buildStatic(dir, name, pkg string) (string, error) {
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build %s static (run from the repository root): %w", pkg, err)
	}
	return bin, nil
}

// buildDriver writes a driver image: the binary and its manifest in plugindir.ImageDir, on the
// base tree (a driver image runs nothing of its own: its init container runs the handler
// image's kubevisor-plugin-install from a shared volume).
func buildDriver(o options) error {
	d := o.driver
	name := d.name
	if name == "" {
		name = o.custom.name
	}
	m, err := plugin.ManifestFor(d.bin, d.kind, name)
	if err != nil {
		return err
	}
	if d.sha256 != "" {
		m.SHA256 = d.sha256
	}
	if d.config != "" {
		if m.Config, err = os.ReadFile(d.config); err != nil {
			return fmt.Errorf("driver config: %w", err)
		}
		if !json.Valid(m.Config) {
			return fmt.Errorf("driver config %s: not valid JSON", d.config)
		}
	}
	file := filepath.Base(m.Binary)
	m.Binary = file
	manifest, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	t := imagebuild.BaseTree()
	if err := t.AddFileAs(path.Join(plugindir.ImageDir, file), d.bin); err != nil {
		return err
	}
	if err := t.AddBytes(path.Join(plugindir.ImageDir, m.Name+".json"), append(manifest, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("==> images: driver %q (%s): %s, sha256 %s\n", m.Name, m.Kind, file, m.SHA256)
	return o.write(o.custom.name, imagebuild.Config{
		Entrypoint: []string{path.Join(plugindir.ToolsDir, plugindir.Command)},
		Cmd:        []string{"--from=" + plugindir.ImageDir, "--plugin-dir=/etc/kubevisor/plugins"},
		Labels:     map[string]string{"io.kubevisor.driver.name": m.Name, "io.kubevisor.driver.kind": m.Kind},
	}, t)
}

// buildPause compiles hack/images/pause static and puts it alone on the base tree.
func buildPause(o options) error {
	tmp, err := os.MkdirTemp("", "kubevisor-pause-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin, err := buildStatic(tmp, "pause", "./hack/images/pause")
	if err != nil {
		return err
	}
	t := imagebuild.BaseTree()
	if err := t.AddFileAs("/pause", bin); err != nil {
		return err
	}
	return o.write("pause", imagebuild.Config{Entrypoint: []string{"/pause"}}, t)
}

// buildComponent writes one component image: a base layer, a layer of host software (QEMU,
// qemu-img: changes rarely, so it sits below) and a layer of our binaries with their libraries.
// A component whose main binary is missing is an error when asked for by name, else skipped.
func buildComponent(o options, c component, named bool) error {
	main := filepath.Join(o.binDir, c.bins[0])
	if _, err := os.Stat(main); err != nil {
		if named {
			return fmt.Errorf("%s: %s not built (make build)", c.name, main)
		}
		fmt.Printf("==> images: %s: skipped, %s not built\n", c.name, main)
		return nil
	}
	trees := []*imagebuild.Tree{imagebuild.BaseTree()}
	if c.qemu || c.libvirt || len(c.hostBins) > 0 {
		host := imagebuild.NewTree()
		if c.qemu {
			if err := imagebuild.AddQEMU(host, imagebuild.DefaultQEMUOptions()); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
		if c.libvirt {
			if err := imagebuild.AddLibvirt(host, imagebuild.DefaultLibvirtOptions()); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
		for _, b := range c.hostBins {
			if err := host.AddExecutable("", b); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
		trees = append(trees, host)
	}
	own := imagebuild.NewTree()
	for _, pat := range c.bins {
		matches, err := filepath.Glob(filepath.Join(o.binDir, pat))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if err := own.AddExecutable(filepath.Join("/usr/local/bin", filepath.Base(m)), m); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
	}
	if len(c.static) > 0 {
		tmp, err := os.MkdirTemp("", "kubevisor-static-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		for _, name := range c.static {
			bin, err := buildStatic(tmp, name, "./cmd/"+name)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			if err := own.AddFileAs(filepath.Join("/usr/local/bin", name), bin); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
	}
	if c.cni {
		plugins, err := filepath.Glob(filepath.Join(o.cniDir, "*"))
		if err != nil {
			return err
		}
		if len(plugins) == 0 {
			return fmt.Errorf("%s: no CNI plugins in %s (make cni-plugins)", c.name, o.cniDir)
		}
		for _, p := range plugins {
			if err := own.AddExecutable(filepath.Join("/opt/cni/bin", filepath.Base(p)), p); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
	}
	trees = append(trees, own)
	entry := "/usr/local/bin/" + filepath.Base(c.bins[0])
	return o.write(c.name, imagebuild.Config{Entrypoint: []string{entry}}, trees...)
}
