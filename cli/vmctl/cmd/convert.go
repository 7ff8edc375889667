package cmd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/kubevisor/kubevisor/controlplane/webhook"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/kubevirtcompat"
)

// KubeVirtAPIVersion is the apiVersion convert reads.
const KubeVirtAPIVersion = "kubevirt.io/v1"

// KubeVirtMigrationsAPIVersion is the apiVersion of KubeVirt's MigrationPolicy, which convert
// reads too: Kubevisor's is in kubevisor.io/v1alpha1, as every KubeVirt group maps to kubevisor.io.
const KubeVirtMigrationsAPIVersion = "migrations.kubevirt.io/v1alpha1"

// Problem is one thing convert could not carry over or the webhook would reject.
type Problem struct {
	// Object is "Kind/name" of the document.
	Object string
	// Path is the field's path; Detail says what is wrong with it.
	Path, Detail string
	// Dropped is true when the field is left out of the output (not in the Kubevisor types);
	// false when it is kept but the admission webhook rejects it.
	Dropped bool
}

func (p Problem) String() string {
	what := "rejected by validation"
	if p.Dropped {
		what = "dropped"
	}
	return fmt.Sprintf("%s: %s: %s (%s)", p.Object, p.Path, p.Detail, what)
}

// convertDocument converts one YAML document. KubeVirt documents of a supported kind become
// Kubevisor ones (kubevirt.io/v1's, and migrations.kubevirt.io/v1alpha1's MigrationPolicy);
// documents of other API groups are copied unchanged; a KubeVirt kind without a Kubevisor
// counterpart is dropped whole.
func convertDocument(doc []byte) ([]byte, []Problem, error) {
	jsonDoc, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, nil, fmt.Errorf("parse yaml: %w", err)
	}
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(jsonDoc, &meta); err != nil {
		return nil, nil, fmt.Errorf("parse yaml: %w", err)
	}
	objName := meta.Kind + "/" + meta.Metadata.Name
	switch meta.APIVersion {
	case KubeVirtAPIVersion, KubeVirtMigrationsAPIVersion, v1alpha1.GroupVersion.String():
	default:
		return doc, nil, nil
	}
	var obj runtime.Object
	if (meta.APIVersion == KubeVirtMigrationsAPIVersion) != (meta.Kind == "MigrationPolicy") && meta.APIVersion != v1alpha1.GroupVersion.String() {
		return nil, []Problem{{Object: objName, Path: "kind", Detail: "kind " + meta.Kind + " is not supported in " + meta.APIVersion, Dropped: true}}, nil
	}
	switch meta.Kind {
	case "MigrationPolicy":
		obj = &v1alpha1.MigrationPolicy{}
	case "VirtualMachine":
		obj = &v1alpha1.VirtualMachine{}
	case "VirtualMachineInstance":
		obj = &v1alpha1.VirtualMachineInstance{}
	case "VirtualMachineInstanceReplicaSet":
		obj = &v1alpha1.VirtualMachineInstanceReplicaSet{}
	case "VirtualMachineInstanceMigration":
		obj = &v1alpha1.VirtualMachineInstanceMigration{}
	default:
		return nil, []Problem{{Object: objName, Path: "kind", Detail: "kind " + meta.Kind + " is not supported", Dropped: true}}, nil
	}
	strict, err := kjson.UnmarshalStrict(jsonDoc, obj, kjson.DisallowUnknownFields, kjson.DisallowDuplicateFields)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", objName, err)
	}
	problems, err := droppedFields(objName, meta.Kind, jsonDoc, strict)
	if err != nil {
		return nil, nil, err
	}
	for _, fe := range validate(obj) {
		problems = append(problems, Problem{Object: objName, Path: fe.Field, Detail: fe.ErrorBody()})
	}
	setAPIVersion(obj)
	out, err := yaml.Marshal(obj)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: encode: %w", objName, err)
	}
	return out, problems, nil
}

// droppedFields lists the fields of the document jsonDoc, of kind, that the Kubevisor types do not
// have (strict, the errors of strict decoding). Those of the VirtualMachineInstanceSpec get the
// words the admission webhook answers them with (kubevirtcompat.CheckObject): the reason Kubevisor
// does not support a KubeVirt field and its alternative, or "unknown field"; others (such as a
// VM's dataVolumeTemplates) are "not supported".
func droppedFields(objName, kind string, jsonDoc []byte, strict []error) ([]Problem, error) {
	specErrs, err := kubevirtcompat.CheckObject(kind, jsonDoc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", objName, err)
	}
	specPrefix := ""
	if fields, ok := kubevirtcompat.SpecPaths[kind]; ok {
		specPrefix = strings.Join(fields, ".") + "."
	}
	var problems []Problem
	for _, e := range strict {
		p := Problem{Object: objName, Detail: "not supported", Dropped: true}
		var fe kjson.FieldError
		if errors.As(e, &fe) {
			p.Path = fe.FieldPath()
		} else {
			p.Path, p.Detail = "?", e.Error()
		}
		if specPrefix != "" && strings.HasPrefix(p.Path, specPrefix) {
			continue // in specErrs, with its reason
		}
		problems = append(problems, p)
	}
	for _, e := range specErrs {
		problems = append(problems, Problem{Object: objName, Path: e.Field, Detail: e.Detail, Dropped: true})
	}
	return problems, nil
}

func setAPIVersion(obj runtime.Object) {
	gvk := obj.GetObjectKind().GroupVersionKind()
	obj.GetObjectKind().SetGroupVersionKind(v1alpha1.GroupVersion.WithKind(gvk.Kind))
}

// validate runs the admission webhook's defaulting and validation on a copy of obj.
func validate(obj runtime.Object) field.ErrorList {
	spec := field.NewPath("spec")
	switch o := obj.DeepCopyObject().(type) {
	case *v1alpha1.VirtualMachine:
		if o.Spec.Template != nil {
			webhook.Default(&o.Spec.Template.Spec, webhook.DefaultOptions{})
		}
		return webhook.ValidateVirtualMachineSpec(&o.Spec, spec)
	case *v1alpha1.VirtualMachineInstance:
		webhook.Default(&o.Spec, webhook.DefaultOptions{})
		return webhook.Validate(&o.Spec, spec)
	case *v1alpha1.VirtualMachineInstanceReplicaSet:
		if o.Spec.Template != nil {
			webhook.Default(&o.Spec.Template.Spec, webhook.DefaultOptions{})
		}
		return webhook.ValidateReplicaSetSpec(&o.Spec, spec)
	case *v1alpha1.VirtualMachineInstanceMigration:
		return webhook.ValidateMigrationSpec(&o.Spec, spec)
	}
	return nil
}

// convert converts every document of in to out and returns the problems found.
func convert(in io.Reader, out io.Writer) ([]Problem, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(in))
	var all []Problem
	first := true
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return all, nil
		}
		if err != nil {
			return all, fmt.Errorf("read yaml: %w", err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		conv, problems, err := convertDocument(doc)
		if err != nil {
			return all, err
		}
		all = append(all, problems...)
		if conv == nil {
			continue
		}
		if !first {
			fmt.Fprintln(out, "---")
		}
		first = false
		if _, err := out.Write(conv); err != nil {
			return all, err
		}
	}
}

// stripComments drops comment lines, so that a document of comments only counts as empty.
func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			b.Write(line)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

func newConvertCommand(o *options) *cobra.Command {
	var (
		file       string
		allowDrops bool
	)
	cmd := &cobra.Command{
		Use:   "convert -f FILE",
		Short: "Convert KubeVirt manifests (kubevirt.io/v1) to Kubevisor (kubevisor.io/v1alpha1)",
		Long: "Convert KubeVirt VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceReplicaSet,\n" +
			"VirtualMachineInstanceMigration and MigrationPolicy (migrations.kubevirt.io/v1alpha1) manifests\n" +
			"(multi-document YAML) to Kubevisor's API on stdout.\n" +
			"Every field Kubevisor does not support is listed with its path on stderr and left out; the\n" +
			"command then fails unless --allow-drops. Fields the admission webhook would reject are listed\n" +
			"too, and always fail the command. Documents of other API groups are copied as they are.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var in io.Reader
			switch file {
			case "":
				return fmt.Errorf("-f FILE is required (- for stdin)")
			case "-":
				in = o.streams.In
			default:
				f, err := os.Open(file)
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			problems, err := convert(in, o.streams.Out)
			if err != nil {
				return err
			}
			dropped, rejected := 0, 0
			for _, p := range problems {
				fmt.Fprintln(o.streams.ErrOut, p)
				if p.Dropped {
					dropped++
				} else {
					rejected++
				}
			}
			switch {
			case rejected > 0:
				return fmt.Errorf("%d field(s) would be rejected by validation, %d dropped", rejected, dropped)
			case dropped > 0 && !allowDrops:
				return fmt.Errorf("%d field(s) dropped: not supported by Kubevisor (--allow-drops accepts that)", dropped)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "", "Manifest file (- for stdin)")
	cmd.Flags().BoolVar(&allowDrops, "allow-drops", false, "Succeed even when unsupported fields were dropped")
	return cmd
}
