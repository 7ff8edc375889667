package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	conformance "github.com/kubevisor/kubevisor/conformance/driver"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
)

// DriverBinaryPrefix starts the file name of a driver plugin binary: --class looks for
// kubevisor-driver-<driver> in the plugin directory.
const DriverBinaryPrefix = "kubevisor-driver-"

// What the HypervisorClass CRD refuses (core/api/v1alpha1, hypervisorclass_types.go), refused
// the same way in a class file.
var (
	// parametersRefused is the CRD's reason for refusing a class with parameters.
	parametersRefused = "no hypervisor driver of this release takes class parameters: remove them (the driver's settings are its handler configuration)"
	// launcherCapabilitiesAllowed are the capabilities the CRD accepts in launcherCapabilities.
	launcherCapabilitiesAllowed = []corev1.Capability{"SETUID", "SETGID"}
)

// loadClass reads the HypervisorClass manifest file (YAML or JSON, one object), decoded strictly
// with the API's types, and refuses what the API server would refuse of it. Errors name the file.
func loadClass(file string) (*v1alpha1.HypervisorClass, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--class: %w", err)
	}
	c, err := decodeClass(data)
	if err != nil {
		return nil, fmt.Errorf("--class %s: %w", file, err)
	}
	return c, nil
}

func decodeClass(data []byte) (*v1alpha1.HypervisorClass, error) {
	docs, err := documents(data)
	if err != nil {
		return nil, err
	}
	if len(docs) != 1 {
		return nil, fmt.Errorf("holds %d objects, want one HypervisorClass", len(docs))
	}
	// The kind first: decoding another kind strictly as a class would only list its fields.
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(docs[0], &tm); err != nil {
		return nil, err
	}
	want := v1alpha1.HypervisorClassGroupVersionKind
	if tm.Kind != want.Kind || tm.APIVersion != want.GroupVersion().String() {
		found := "an object with no kind"
		if tm.Kind != "" {
			found = "a " + tm.Kind
		}
		if tm.APIVersion != "" {
			found += " (" + tm.APIVersion + ")"
		}
		return nil, fmt.Errorf("is %s, not a %s (%s)", found, want.Kind, want.GroupVersion())
	}
	c := &v1alpha1.HypervisorClass{}
	if err := handler.DecodeStrict(docs[0], c); err != nil {
		return nil, err
	}
	if c.Name == "" {
		return nil, errors.New("metadata.name: required")
	}
	if c.Driver == "" {
		return nil, errors.New("driver: required (the name of the hypervisor driver plugin)")
	}
	if msgs := validation.IsDNS1123Label(c.Driver); len(msgs) > 0 {
		return nil, fmt.Errorf("driver %q: %s", c.Driver, strings.Join(msgs, "; "))
	}
	if len(c.Parameters) > 0 {
		return nil, fmt.Errorf("parameters: %s", parametersRefused)
	}
	for i, name := range c.LauncherCapabilities {
		if !slices.Contains(launcherCapabilitiesAllowed, name) {
			return nil, fmt.Errorf("launcherCapabilities[%d]: %q is not one of %v (a launcher pod stays unprivileged)", i, name, launcherCapabilitiesAllowed)
		}
		if slices.Contains(c.LauncherCapabilities[:i], name) {
			return nil, fmt.Errorf("launcherCapabilities[%d]: %q twice", i, name)
		}
	}
	return c, nil
}

// documents splits YAML (or JSON) into its objects as JSON, leaving out empty documents.
func documents(data []byte) ([][]byte, error) {
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, err
		}
		if t := bytes.TrimSpace(j); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
			docs = append(docs, j)
		}
	}
}

// defaultPluginDir is where --class finds driver binaries without --plugin-dir: the directory of
// this executable, as the launcher is found (conformance.FindLauncher).
func defaultPluginDir() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return filepath.Dir(exe)
}

// classDriver returns the plugin binary and the name of the class's driver. binary and name are
// what the flags binaryFlag and nameFlag gave: with the class they must agree, the driver's name
// (name, else binary's file name without DriverBinaryPrefix) being the class's driver. Without
// binary, it is DriverBinaryPrefix+driver in pluginDir (default: defaultPluginDir).
func classDriver(c *v1alpha1.HypervisorClass, file, binary, name, pluginDir, binaryFlag, nameFlag string) (string, string, error) {
	switch {
	case name != "" && name != c.Driver:
		return "", "", fmt.Errorf("%s %q disagrees with --class %s, whose driver is %q", nameFlag, name, file, c.Driver)
	case binary != "" && name == "" && strings.TrimPrefix(filepath.Base(binary), DriverBinaryPrefix) != c.Driver:
		return "", "", fmt.Errorf("%s %s is driver %q by its file name, --class %s names driver %q (give %s %s if the binary is that driver)",
			binaryFlag, binary, strings.TrimPrefix(filepath.Base(binary), DriverBinaryPrefix), file, c.Driver, nameFlag, c.Driver)
	case binary != "":
		return binary, c.Driver, nil
	}
	if pluginDir == "" {
		pluginDir = defaultPluginDir()
	}
	p := filepath.Join(pluginDir, DriverBinaryPrefix+c.Driver)
	fi, err := os.Stat(p)
	if err == nil && (!fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0) {
		err = errors.New("not an executable file")
	}
	if err != nil {
		return "", "", fmt.Errorf("--class %s names driver %q, whose plugin binary is not in the plugin directory: %v (build it, give the directory with --plugin-dir or the binary with %s)", file, c.Driver, err, binaryFlag)
	}
	return p, c.Driver, nil
}

// printClass prints what the run takes from the class and what it does not apply outside a
// cluster. launchers says whether the run starts launchers (vm) or not (driver).
func printClass(w io.Writer, file string, c *v1alpha1.HypervisorClass, launchers bool) {
	fmt.Fprintf(w, "=== class %s: %s (driver %s)\n", c.Name, file, c.Driver)
	keeps := "none"
	if len(c.LauncherCapabilities) > 0 {
		names := make([]string, len(c.LauncherCapabilities))
		for i, cp := range c.LauncherCapabilities {
			names[i] = string(cp)
		}
		keeps = strings.Join(names, ", ")
	}
	sets := "every capability dropped"
	if len(c.LauncherCapabilities) > 0 {
		sets = "these alone in its bounding, permitted and effective sets, none inheritable"
	}
	switch {
	case !launchers:
		fmt.Fprintf(w, "=== launcher capabilities: %s; not applied: the driver checks start no launcher (kubevisor-conformance vm does)\n", keeps)
	case os.Geteuid() != 0:
		fmt.Fprintf(w, "=== launcher capabilities: not confined to %s: the kit runs as uid %d, not root, and so do its launchers (a launcher pod's runs as root)\n", keeps, os.Geteuid())
	default:
		fmt.Fprintf(w, "=== launcher capabilities: %s (as in a launcher pod of class %s: root, %s, no new privileges)\n", keeps, c.Name, sets)
	}
	var cluster []string
	if len(c.DeviceResources) > 0 {
		names := make([]string, len(c.DeviceResources))
		for i, r := range c.DeviceResources {
			names[i] = string(r)
		}
		cluster = append(cluster, "deviceResources "+strings.Join(names, ", "))
	}
	if c.Overhead != nil {
		cluster = append(cluster, "overhead")
	}
	if c.Scheduling != nil {
		cluster = append(cluster, "scheduling")
	}
	if len(cluster) > 0 {
		fmt.Fprintf(w, "=== not applied outside a cluster: %s\n", strings.Join(cluster, "; "))
	}
}

// launcherCapabilities is the option confining the launchers of the VM checks to the class's.
func launcherCapabilities(c *v1alpha1.HypervisorClass) conformance.Option {
	caps := make([]string, len(c.LauncherCapabilities))
	for i, cp := range c.LauncherCapabilities {
		caps[i] = string(cp)
	}
	return conformance.WithLauncherCapabilities(caps...)
}
