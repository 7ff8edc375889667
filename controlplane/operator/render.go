package operator

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/featuregate"
	"github.com/kubevisor/kubevisor/core/liveconfig"
)

// The labels every object of an install carries. ManagedByLabel is how the operator finds what
// it made (to prune what a spec no longer wants, and to uninstall); PartOfLabel is the install
// manifests' own.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "kubevisor-operator"
	PartOfLabel    = "app.kubernetes.io/part-of"
	// VersionAnnotation on the pod templates of the components says which version (image tag)
	// of the install made them.
	VersionAnnotation = "kubevisor.io/version"
	// DefaultClassAnnotation marks the default HypervisorClass (as StorageClass's).
	DefaultClassAnnotation = "hypervisorclass.kubevisor.io/is-default-class"
	// Namespace is where the components run.
	Namespace = "kubevisor-system"
)

// The workloads of an install, in the order the operator rolls them out: the controller and
// the node handlers before the API (the API server keeps answering old clients until both
// run the new version).
const (
	ControllerDeployment = "kubevisor-controller"
	HandlerDaemonSet     = "kubevisor-handler"
	APIDeployment        = "kubevisor-api"
)

// images are the component images the install manifests name (kubevisor/<name>).
var images = []string{"kubevisor-controller", "kubevisor-api", "kubevisor-handler", "kubevisor-launcher"}

// The handler configuration parts the operator adds: the drivers from driver images (after the
// base's 00- and the in-tree drivers' 10- files), and the drivers' configuration, last so that
// its driverConfig entries win.
const (
	imageDriversHandlerFile = "20-kubevisor-operator-drivers.yaml"
	operatorHandlerFile     = "90-kubevisor-operator.yaml"
)

// driverKinds are the kinds of drivers, as the handler configuration names them.
var driverKinds = []string{"hypervisor", "network", "storage", "device"}

// imagePart is the handler configuration part of a driver from a driver image.
func imagePart(d v1alpha1.KubevisorDriver) driverPart {
	var p driverPart
	switch d.Kind {
	case "hypervisor":
		p.Drivers.Hypervisors = []string{d.Name}
	case "network":
		p.Drivers.Network = d.Name
	case "storage":
		p.Drivers.Storage = d.Name
	case "device":
		p.Drivers.Devices = []string{d.Name}
	}
	return p
}

// addDriverImages appends to the handler DaemonSet an init container per driver from a driver
// image, after the base's plugin-dir init container: it runs the kubevisor-plugin-install
// that plugin-dir left in the plugin-tools volume, which copies the image's /kubevisor/plugin
// (binary and manifest) into the plugin directory (docs/driver-authoring.md).
func addDriverImages(ds *unstructured.Unstructured, drivers []v1alpha1.KubevisorDriver) error {
	inits, _, err := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "initContainers")
	if err != nil {
		return err
	}
	for _, d := range drivers {
		if d.Image == "" {
			continue
		}
		inits = append(inits, map[string]any{
			"name": "driver-" + d.Name, "image": d.Image, "imagePullPolicy": "IfNotPresent",
			"command": []any{"/kubevisor/tools/kubevisor-plugin-install", "--from=/kubevisor/plugin", "--plugin-dir=/etc/kubevisor/plugins"},
			"resources": map[string]any{
				"requests": map[string]any{"cpu": "10m", "memory": "16Mi"},
				"limits":   map[string]any{"memory": "64Mi"},
			},
			"securityContext": map[string]any{"allowPrivilegeEscalation": false, "capabilities": map[string]any{"drop": []any{"ALL"}}},
			"volumeMounts": []any{
				map[string]any{"name": "plugins", "mountPath": "/etc/kubevisor/plugins"},
				map[string]any{"name": "plugin-tools", "mountPath": "/kubevisor/tools", "readOnly": true},
			},
		})
	}
	return unstructured.SetNestedSlice(ds.Object, inits, "spec", "template", "spec", "initContainers")
}

// Rendered is the install a spec wants.
type Rendered struct {
	// CRDs are applied first, and must be established before the rest.
	CRDs []*unstructured.Unstructured
	// Objects are the rest, in apply order (cluster-wide and configuration objects, then
	// the workloads, then what needs the API to answer: webhooks, APIService, classes).
	Objects []*unstructured.Unstructured
	// Version is the image tag of the components.
	Version string
	// Drivers are the driver names, sorted.
	Drivers []string
	// Classes are the HypervisorClasses of the driver set; DefaultClass is the one marked
	// default ("" when none is).
	Classes      []string
	DefaultClass string
}

// Renderer renders installs from the install manifests (manifests.FS: crd/, rbac/, webhook/,
// install/) with kustomize, as `kubectl kustomize` renders the base with the chosen driver
// components, then applies the spec's configuration to the result.
type Renderer struct {
	// Manifests is the tree of install manifests.
	Manifests fs.FS
	// DefaultVersion is the image tag of a spec that names none: the operator's own.
	DefaultVersion string
}

// Drivers lists the in-tree drivers of the manifests (install/drivers/<name>), sorted.
func (r Renderer) Drivers() ([]string, error) {
	entries, err := fs.ReadDir(r.Manifests, "install/drivers")
	if err != nil {
		return nil, fmt.Errorf("install manifests: %w", err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			if _, err := fs.Stat(r.Manifests, path.Join("install/drivers", e.Name(), "kustomization.yaml")); err == nil {
				names = append(names, e.Name())
			}
		}
	}
	return names, nil
}

// driverPart is what a driver component's handler configuration part says.
type driverPart struct {
	Drivers struct {
		Hypervisor  string   `json:"hypervisor"`
		Hypervisors []string `json:"hypervisors"`
		Network     string   `json:"network"`
		Storage     string   `json:"storage"`
		Device      string   `json:"device"`
		Devices     []string `json:"devices"`
	} `json:"drivers"`
	DriverConfig map[string]json.RawMessage `json:"driverConfig"`
}

func (r Renderer) driverPart(name string) (driverPart, error) {
	var p driverPart
	data, err := fs.ReadFile(r.Manifests, path.Join("install/drivers", name, "handler.yaml"))
	if err != nil {
		return p, fmt.Errorf("install manifests of driver %q: %w", name, err)
	}
	if err := yaml.Unmarshal(data, &p); err != nil {
		return p, fmt.Errorf("install manifests of driver %q: handler.yaml: %w", name, err)
	}
	return p, nil
}

// Render renders the install spec wants, or returns what is wrong with the spec, each error
// with its field path.
func (r Renderer) Render(spec *v1alpha1.KubevisorSpec) (*Rendered, field.ErrorList) {
	var errs field.ErrorList
	known, err := r.Drivers()
	if err != nil {
		return nil, field.ErrorList{field.InternalError(field.NewPath("spec", "drivers"), err)}
	}
	driversPath := field.NewPath("spec", "drivers")
	var (
		names                       []string
		hypervisors, network, store []string
		driverConfig                = map[string]json.RawMessage{}
	)
	var imageDrivers []v1alpha1.KubevisorDriver
	// permitted are hostdev's permitted host devices, which go live rather than into the
	// handler configuration (liveConfigMap).
	var permitted *v1alpha1.PermittedHostDevices
	for i, d := range spec.Drivers {
		p := driversPath.Index(i)
		if slices.Contains(names, d.Name) {
			errs = append(errs, field.Duplicate(p.Child("name"), d.Name))
			continue
		}
		var part driverPart
		switch {
		case d.Kind != "" || (d.Image != "" && !slices.Contains(known, d.Name)):
			if slices.Contains(known, d.Name) {
				errs = append(errs, field.Invalid(p.Child("kind"), d.Kind, "an in-tree driver's kind is the release's: give only image to replace its binary"))
				continue
			}
			if d.Image == "" || !slices.Contains(driverKinds, d.Kind) {
				errs = append(errs, field.Invalid(p, d.Image+" "+d.Kind, "a driver from a driver image names its image and its kind ("+strings.Join(driverKinds, ", ")+")"))
				continue
			}
			part = imagePart(d)
			imageDrivers = append(imageDrivers, d)
		case !slices.Contains(known, d.Name):
			errs = append(errs, field.NotSupported(p.Child("name"), d.Name, known))
			continue
		default:
			var err error
			if part, err = r.driverPart(d.Name); err != nil {
				errs = append(errs, field.InternalError(p, err))
				continue
			}
		}
		names = append(names, d.Name)
		hypervisors = append(hypervisors, part.Drivers.Hypervisor)
		hypervisors = append(hypervisors, part.Drivers.Hypervisors...)
		network = append(network, part.Drivers.Network)
		store = append(store, part.Drivers.Storage)
		if d.Config == nil {
			continue
		}
		patch := json.RawMessage(d.Config.Raw)
		if d.Name == liveconfig.HostDevicesDriver {
			var ferrs field.ErrorList
			patch, permitted, ferrs = splitHostDevices(patch, p.Child("config"))
			errs = append(errs, ferrs...)
			if patch == nil {
				continue // no other field: the handler configuration stays the install's
			}
		}
		merged, err := mergeConfig(part.DriverConfig[d.Name], patch)
		if err != nil {
			errs = append(errs, field.Invalid(p.Child("config"), string(d.Config.Raw), err.Error()))
			continue
		}
		driverConfig[d.Name] = merged
	}
	hypervisors, network, store = nonEmpty(hypervisors), nonEmpty(network), nonEmpty(store)
	if len(errs) == 0 {
		if len(hypervisors) == 0 {
			errs = append(errs, field.Required(driversPath, "no hypervisor driver: name one (qmp, libvirt) to run VMs"))
		}
		if len(network) != 1 {
			errs = append(errs, field.Invalid(driversPath, network, "a node runs exactly one network driver (cni)"))
		}
		if len(store) != 1 {
			errs = append(errs, field.Invalid(driversPath, store, "a node runs exactly one storage driver (local)"))
		}
	}
	errs = append(errs, validateCerts(spec.CertificateRotateStrategy)...)
	errs = append(errs, liveconfig.ValidateMigrations(spec.Configuration.Migrations, field.NewPath("spec", "configuration", "migrations"))...)
	errs = append(errs, featuregate.Validate(spec.Configuration.FeatureGates, field.NewPath("spec", "configuration", "featureGates"))...)
	errs = append(errs, validateWorkloadUpdate(spec.WorkloadUpdateStrategy)...)
	if len(errs) > 0 {
		return nil, errs
	}

	version := spec.ImageTag
	if version == "" {
		version = r.DefaultVersion
	}
	var inTree []string
	for _, n := range names {
		if slices.Contains(known, n) {
			inTree = append(inTree, n)
		}
	}
	objs, err := r.kustomize(inTree, imageDrivers, spec.ImageRegistry, version, driverConfig)
	if err != nil {
		return nil, field.ErrorList{field.InternalError(driversPath, err)}
	}
	out := &Rendered{Version: version, Drivers: slices.Sorted(slices.Values(names))}
	for _, o := range objs {
		if o.GetKind() == "HypervisorClass" {
			out.Classes = append(out.Classes, o.GetName())
		}
	}
	sort.Strings(out.Classes)
	def, ferr := defaultClass(objs, out.Classes, spec.Configuration.DefaultHypervisorClass)
	if ferr != nil {
		return nil, field.ErrorList{ferr}
	}
	out.DefaultClass = def
	for _, o := range objs {
		if err := configure(o, spec, version, def); err != nil {
			return nil, field.ErrorList{field.InternalError(field.NewPath("spec"), err)}
		}
		if o.GetKind() == "CustomResourceDefinition" {
			out.CRDs = append(out.CRDs, o)
		} else {
			out.Objects = append(out.Objects, o)
		}
	}
	live, err := liveConfigMap(spec, permitted)
	if err != nil {
		return nil, field.ErrorList{field.InternalError(field.NewPath("spec", "configuration"), err)}
	}
	out.Objects = append(out.Objects, live)
	sort.SliceStable(out.Objects, func(i, j int) bool { return applyRank(out.Objects[i]) < applyRank(out.Objects[j]) })
	return out, nil
}

func nonEmpty(s []string) []string {
	return slices.DeleteFunc(s, func(v string) bool { return v == "" })
}

// splitHostDevices takes permittedHostDevices out of the hostdev driver's configuration in the
// spec (raw, at p): they are live (the live configuration's), not a part of the handler
// configuration, so that changing them rolls no handler. It returns the rest of the
// configuration (nil when nothing is left) and the permitted host devices (nil when the spec
// has none, or null: the install's), checked strictly, each error under
// p.permittedHostDevices. A configuration that is not a JSON object is returned as it is, for
// mergeConfig to refuse.
func splitHostDevices(raw json.RawMessage, p *field.Path) (json.RawMessage, *v1alpha1.PermittedHostDevices, field.ErrorList) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return raw, nil, nil
	}
	doc, ok := obj["permittedHostDevices"]
	if !ok {
		return raw, nil, nil
	}
	delete(obj, "permittedHostDevices")
	rest, err := json.Marshal(obj)
	if err != nil {
		return raw, nil, field.ErrorList{field.InternalError(p, err)}
	}
	if len(obj) == 0 {
		rest = nil
	}
	pp := p.Child("permittedHostDevices")
	if string(doc) == "null" {
		return rest, nil, nil
	}
	var permitted v1alpha1.PermittedHostDevices
	strict, err := kjson.UnmarshalStrict(doc, &permitted)
	if err != nil {
		return rest, nil, field.ErrorList{field.Invalid(pp, string(doc), err.Error())}
	}
	var errs field.ErrorList
	for _, e := range strict {
		errs = append(errs, field.Invalid(pp, string(doc), e.Error()))
	}
	errs = append(errs, permitted.Validate(pp)...)
	return rest, &permitted, errs
}

// mergeConfig applies the spec's configuration of a driver (a JSON merge patch) over the
// install's.
func mergeConfig(base, patch json.RawMessage) (json.RawMessage, error) {
	var obj map[string]any
	if err := json.Unmarshal(patch, &obj); err != nil || obj == nil {
		return nil, fmt.Errorf("not a JSON object")
	}
	if len(base) == 0 {
		base = json.RawMessage("{}")
	}
	merged, err := jsonpatch.MergePatch(base, patch)
	if err != nil {
		return nil, err
	}
	return merged, nil
}

// kustomize renders the base with the drivers' components, the images at registry and tag,
// and the drivers' configuration as one more part of the handler configuration.
func (r Renderer) kustomize(drivers []string, imageDrivers []v1alpha1.KubevisorDriver, registry, tag string, driverConfig map[string]json.RawMessage) ([]*unstructured.Unstructured, error) {
	mem := filesys.MakeFsInMemory()
	err := fs.WalkDir(r.Manifests, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(r.Manifests, p)
		if err != nil {
			return err
		}
		return mem.WriteFile(path.Join("/manifests", p), data)
	})
	if err != nil {
		return nil, fmt.Errorf("install manifests: %w", err)
	}
	k := map[string]any{
		"apiVersion": "kustomize.config.k8s.io/v1beta1",
		"kind":       "Kustomization",
		"resources":  []string{"../manifests/install"},
		"labels": []map[string]any{{
			"pairs":            map[string]string{PartOfLabel: "kubevisor", ManagedByLabel: ManagedByValue},
			"includeSelectors": false,
		}},
	}
	var components []string
	for _, d := range drivers {
		components = append(components, "../manifests/install/drivers/"+d)
	}
	if len(components) > 0 {
		k["components"] = components
	}
	var imgs []map[string]string
	for _, i := range images {
		img := map[string]string{"name": "kubevisor/" + i, "newTag": tag}
		if registry != "" {
			img["newName"] = registry + "/" + i
		}
		imgs = append(imgs, img)
	}
	k["images"] = imgs
	var parts []string
	if len(imageDrivers) > 0 {
		var set driverPart
		for _, d := range imageDrivers {
			p := imagePart(d)
			set.Drivers.Hypervisors = append(set.Drivers.Hypervisors, p.Drivers.Hypervisors...)
			set.Drivers.Devices = append(set.Drivers.Devices, p.Drivers.Devices...)
			set.Drivers.Network += p.Drivers.Network
			set.Drivers.Storage += p.Drivers.Storage
		}
		drivers := map[string]any{}
		if len(set.Drivers.Hypervisors) > 0 {
			drivers["hypervisors"] = set.Drivers.Hypervisors
		}
		if len(set.Drivers.Devices) > 0 {
			drivers["devices"] = set.Drivers.Devices
		}
		if set.Drivers.Network != "" {
			drivers["network"] = set.Drivers.Network
		}
		if set.Drivers.Storage != "" {
			drivers["storage"] = set.Drivers.Storage
		}
		data, err := yaml.Marshal(map[string]any{"drivers": drivers})
		if err != nil {
			return nil, err
		}
		if err := mem.WriteFile("/work/"+imageDriversHandlerFile, append([]byte("# Made by kubevisor-operator: the drivers of spec.drivers[] from driver images.\n"), data...)); err != nil {
			return nil, err
		}
		parts = append(parts, imageDriversHandlerFile)
	}
	if len(driverConfig) > 0 {
		part, err := yaml.Marshal(map[string]any{"driverConfig": driverConfig})
		if err != nil {
			return nil, err
		}
		if err := mem.WriteFile("/work/"+operatorHandlerFile, append([]byte("# Made by kubevisor-operator: spec.drivers[].config merged over the drivers' own.\n"), part...)); err != nil {
			return nil, err
		}
		parts = append(parts, operatorHandlerFile)
	}
	if len(parts) > 0 {
		k["configMapGenerator"] = []map[string]any{{
			"name": "kubevisor-handler", "namespace": Namespace, "behavior": "merge", "files": parts,
		}}
	}
	data, err := yaml.Marshal(k)
	if err != nil {
		return nil, err
	}
	if err := mem.WriteFile("/work/kustomization.yaml", data); err != nil {
		return nil, err
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, "/work")
	if err != nil {
		return nil, fmt.Errorf("kustomize: %w", err)
	}
	var objs []*unstructured.Unstructured
	for _, d := range imageDrivers {
		if d.Kind == "hypervisor" {
			objs = append(objs, &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": v1alpha1.GroupVersion.String(), "kind": "HypervisorClass",
				"metadata": map[string]any{"name": d.Name, "labels": map[string]any{PartOfLabel: "kubevisor", ManagedByLabel: ManagedByValue}},
				"driver":   d.Name,
			}})
		}
	}
	for _, r := range res.Resources() {
		// Through JSON: kustomize's maps hold ints, unstructured's hold int64s.
		data, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("kustomize: %s: %w", r.CurId(), err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(data); err != nil {
			return nil, fmt.Errorf("kustomize: %s: %w", r.CurId(), err)
		}
		objs = append(objs, u)
	}
	return objs, nil
}

// defaultClass picks the default HypervisorClass: the spec's, else the one the driver
// components mark, else the only one.
func defaultClass(objs []*unstructured.Unstructured, classes []string, want string) (string, *field.Error) {
	if want != "" {
		if !slices.Contains(classes, want) {
			return "", field.NotSupported(field.NewPath("spec", "configuration", "defaultHypervisorClass"), want, classes)
		}
		return want, nil
	}
	var marked []string
	for _, o := range objs {
		if o.GetKind() == "HypervisorClass" && o.GetAnnotations()[DefaultClassAnnotation] == "true" {
			marked = append(marked, o.GetName())
		}
	}
	switch {
	case len(marked) == 1:
		return marked[0], nil
	case len(marked) == 0 && len(classes) == 1:
		return classes[0], nil
	}
	return "", nil
}

// configure applies the spec to one rendered object: the default class's annotation, the
// components' flags, their placement, and the version on the pod templates.
func configure(o *unstructured.Unstructured, spec *v1alpha1.KubevisorSpec, version, defClass string) error {
	switch o.GetKind() {
	case "HypervisorClass":
		ann := o.GetAnnotations()
		if o.GetName() == defClass {
			if ann == nil {
				ann = map[string]string{}
			}
			ann[DefaultClassAnnotation] = "true"
		} else {
			delete(ann, DefaultClassAnnotation)
		}
		o.SetAnnotations(ann)
		return nil
	case "Deployment", "DaemonSet":
	default:
		return nil
	}
	var (
		container string
		flags     map[string]string
		place     *v1alpha1.ComponentPlacement
	)
	cfg := spec.Configuration
	switch o.GetName() {
	case ControllerDeployment:
		container, flags, place = "controller", controllerFlags(cfg), spec.Infra
		maps.Copy(flags, workloadUpdateFlags(spec.WorkloadUpdateStrategy))
	case APIDeployment:
		container, flags, place = "api", apiFlags(cfg), spec.Infra
		maps.Copy(flags, certFlags(spec.CertificateRotateStrategy))
		// The operator owns the CA (ca.go).
		flags["manage-ca"] = "false"
	case HandlerDaemonSet:
		container, flags, place = "handler", handlerFlags(cfg), spec.Workloads
		if err := addDriverImages(o, spec.Drivers); err != nil {
			return err
		}
	default:
		return nil
	}
	if err := unstructured.SetNestedField(o.Object, version, "spec", "template", "metadata", "annotations", VersionAnnotation); err != nil {
		return err
	}
	containers, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if err != nil {
		return err
	}
	for i, c := range containers {
		cm, _ := c.(map[string]any)
		if cm == nil || cm["name"] != container {
			continue
		}
		args, _, _ := unstructured.NestedStringSlice(cm, "args")
		cm["args"] = toAny(setFlags(args, flags))
		containers[i] = cm
	}
	if err := unstructured.SetNestedSlice(o.Object, containers, "spec", "template", "spec", "containers"); err != nil {
		return err
	}
	return applyPlacement(o, place)
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// setFlags sets each --name=value of flags in args, replacing the flag where args has it.
func setFlags(args []string, flags map[string]string) []string {
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range flags {
			if !yield(n) {
				return
			}
		}
	})
	for _, n := range names {
		arg := "--" + n + "=" + flags[n]
		i := slices.IndexFunc(args, func(a string) bool { return a == "--"+n || strings.HasPrefix(a, "--"+n+"=") })
		if i >= 0 {
			args[i] = arg
		} else {
			args = append(args, arg)
		}
	}
	return args
}

// controllerFlags are kubevisor-controller's flags of the configuration that it cannot take
// live. Its migration defaults and limits and its verbosity are live (liveConfigMap): they are
// not flags here, so that changing them leaves the pod template, and the pods, as they are.
func controllerFlags(c v1alpha1.KubevisorConfiguration) map[string]string {
	f := map[string]string{}
	if c.DefaultEvictionStrategy != "" {
		f["default-eviction-strategy"] = c.DefaultEvictionStrategy
	}
	return f
}

// apiFlags are kubevisor-api's flags of the configuration; its verbosity is live.
func apiFlags(c v1alpha1.KubevisorConfiguration) map[string]string {
	f := map[string]string{}
	if c.DefaultEvictionStrategy != "" {
		f["default-eviction-strategy"] = c.DefaultEvictionStrategy
	}
	return f
}

// liveConfigMap is the live configuration (core/liveconfig) of spec: the ConfigMap the
// components watch, holding configuration.migrations, logVerbosity and featureGates, and the
// hostdev driver's permittedHostDevices (permitted, from spec.drivers[hostdev].config). It is
// rendered for every spec, empty fields and all, so that a field removed from the spec returns
// the components to their flags (the nodes to their driverConfig.hostdev). featureGates is
// always written, [] when the spec lists none: the Kubevisor is the truth of the gates, not
// kubevisor-api's --feature-gates.
func liveConfigMap(spec *v1alpha1.KubevisorSpec, permitted *v1alpha1.PermittedHostDevices) (*unstructured.Unstructured, error) {
	c := liveconfig.New()
	c.PermittedHostDevices = permitted
	c.FeatureGates = append([]string{}, spec.Configuration.FeatureGates...)
	if m := spec.Configuration.Migrations; m != nil {
		c.Migrations = m.DeepCopy()
	}
	if v := spec.Configuration.LogVerbosity; v != nil && (v.Controller != nil || v.API != nil || v.Handler != "") {
		c.LogVerbosity = &liveconfig.LogVerbosity{Controller: v.Controller, API: v.API, Handler: v.Handler}
	}
	if errs := c.Validate(field.NewPath("spec", "configuration")); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	data, err := c.Marshal()
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": liveconfig.Name, "namespace": liveconfig.Namespace,
			"labels": map[string]any{PartOfLabel: "kubevisor", ManagedByLabel: ManagedByValue}},
		"data": toAnyMap(data),
	}}, nil
}

func toAnyMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// minCertDuration is the shortest certificate lifetime the operator accepts: rotation runs
// on a timer, and a lifetime of seconds would have the components renewing all the time.
const minCertDuration = 10 * time.Minute

// validateCerts checks the certificate lifetimes against each other.
func validateCerts(c *v1alpha1.CertificateRotateStrategy) field.ErrorList {
	if c == nil || c.SelfSigned == nil {
		return nil
	}
	p := field.NewPath("spec", "certificateRotateStrategy", "selfSigned")
	ss := c.SelfSigned
	var errs field.ErrorList
	cert := 90 * 24 * time.Hour // kubevisor-api's default
	if ss.CertDuration != nil {
		cert = ss.CertDuration.Duration
		if cert < minCertDuration {
			errs = append(errs, field.Invalid(p.Child("certDuration"), ss.CertDuration.Duration.String(), "at least "+minCertDuration.String()))
		}
	}
	if ss.RenewBefore != nil && (ss.RenewBefore.Duration <= 0 || ss.RenewBefore.Duration > cert/2) {
		errs = append(errs, field.Invalid(p.Child("renewBefore"), ss.RenewBefore.Duration.String(), "more than 0 and at most half of certDuration ("+(cert/2).String()+")"))
	}
	if ss.CADuration != nil && ss.CADuration.Duration < 2*cert {
		errs = append(errs, field.Invalid(p.Child("caDuration"), ss.CADuration.Duration.String(), "at least twice certDuration ("+(2*cert).String()+")"))
	}
	if ss.NodeCertMaxDuration != nil && ss.NodeCertMaxDuration.Duration < minCertDuration {
		errs = append(errs, field.Invalid(p.Child("nodeCertMaxDuration"), ss.NodeCertMaxDuration.Duration.String(), "at least "+minCertDuration.String()))
	}
	return errs
}

// certFlags are kubevisor-api's flags of the certificate lifetimes (the CA's is the operator's:
// caOptions).
func certFlags(c *v1alpha1.CertificateRotateStrategy) map[string]string {
	f := map[string]string{}
	if c == nil || c.SelfSigned == nil {
		return f
	}
	ss := c.SelfSigned
	for flag, d := range map[string]*metav1.Duration{
		"cert-lifetime": ss.CertDuration, "cert-renew-before": ss.RenewBefore,
		"node-cert-max-lifetime": ss.NodeCertMaxDuration,
	} {
		if d != nil {
			f[flag] = d.Duration.String()
		}
	}
	return f
}

// handlerFlags are the handler's flags of the configuration: none (its log level is live).
func handlerFlags(v1alpha1.KubevisorConfiguration) map[string]string {
	return map[string]string{}
}

// applyPlacement adds p to a workload's pod template: its node selector and tolerations added
// to the template's, its affinity replacing the template's; and its replicas to a Deployment.
func applyPlacement(o *unstructured.Unstructured, p *v1alpha1.ComponentPlacement) error {
	if p == nil {
		return nil
	}
	if p.Replicas != nil && o.GetKind() == "Deployment" {
		if err := unstructured.SetNestedField(o.Object, int64(*p.Replicas), "spec", "replicas"); err != nil {
			return err
		}
	}
	pod := []string{"spec", "template", "spec"}
	if len(p.NodeSelector) > 0 {
		sel, _, err := unstructured.NestedStringMap(o.Object, append(pod, "nodeSelector")...)
		if err != nil {
			return err
		}
		if sel == nil {
			sel = map[string]string{}
		}
		maps.Copy(sel, p.NodeSelector)
		if err := unstructured.SetNestedStringMap(o.Object, sel, append(pod, "nodeSelector")...); err != nil {
			return err
		}
	}
	if len(p.Tolerations) > 0 {
		tols, _, err := unstructured.NestedSlice(o.Object, append(pod, "tolerations")...)
		if err != nil {
			return err
		}
		for i := range p.Tolerations {
			t, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&p.Tolerations[i])
			if err != nil {
				return err
			}
			tols = append(tols, t)
		}
		if err := unstructured.SetNestedSlice(o.Object, tols, append(pod, "tolerations")...); err != nil {
			return err
		}
	}
	if p.Affinity != nil {
		a, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p.Affinity)
		if err != nil {
			return err
		}
		if err := unstructured.SetNestedMap(o.Object, a, append(pod, "affinity")...); err != nil {
			return err
		}
	}
	return nil
}

// applyRank orders the objects for apply: namespaces, then identities and roles,
// configuration, services, workloads, and last what calls the components (webhook
// configurations, the APIService) or needs the webhooks (HypervisorClasses).
func applyRank(o *unstructured.Unstructured) int {
	switch o.GetKind() {
	case "Namespace":
		return 0
	case "ServiceAccount", "ClusterRole", "Role":
		return 1
	case "ClusterRoleBinding", "RoleBinding":
		return 2
	case "ConfigMap", "Secret":
		return 3
	case "Service":
		return 4
	case "Deployment", "DaemonSet":
		return 5
	case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "APIService":
		return 6
	}
	return 7
}
