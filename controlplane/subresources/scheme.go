package subresources

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// Kinds of the parent resources in this group. The generic installer needs a parent storage,
// with a registered kind, for each subresource; the objects themselves are kubevisor.io's, so
// the kubevisor.io types are registered here under these names and never served.
var (
	vmiKind = subv1.GroupVersion.WithKind("VirtualMachineInstance")
	vmKind  = subv1.GroupVersion.WithKind("VirtualMachine")
)

// subpathKey is the connect option that carries a subresource's path tail (portforward/{port}[/{protocol}]).
const subpathKey = "path"

// newScheme holds the group's types, the parents' kinds, the meta types the generic server
// answers with, and the conversion of a portforward's path and query into PortForwardOptions.
func newScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := subv1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	s.AddKnownTypeWithName(vmiKind, &v1alpha1.VirtualMachineInstance{})
	s.AddKnownTypeWithName(vmKind, &v1alpha1.VirtualMachine{})
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	err := s.AddConversionFunc((*url.Values)(nil), (*subv1.PortForwardOptions)(nil), func(a, b any, _ conversion.Scope) error {
		opts, err := portForwardOptions(*a.(*url.Values))
		if err != nil {
			return err
		}
		*b.(*subv1.PortForwardOptions) = *opts
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	return s, nil
}

func serializerFor(s *runtime.Scheme) serializer.CodecFactory { return serializer.NewCodecFactory(s) }

func metaTypeOf(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: subv1.GroupVersion.String(), Kind: kind}
}

// portForwardOptions reads the port and protocol of a portforward from its path tail
// ("/80" or "/80/tcp"), else from the port and protocol query parameters. The port is 1 to
// 65535; the protocol, tcp when empty, must be tcp.
func portForwardOptions(q url.Values) (*subv1.PortForwardOptions, error) {
	port, proto := q.Get("port"), q.Get("protocol")
	if tail := strings.Trim(q.Get(subpathKey), "/"); tail != "" {
		parts := strings.Split(tail, "/")
		if len(parts) > 2 {
			return nil, fmt.Errorf("portforward path %q: want portforward/{port}[/{protocol}]", tail)
		}
		port, proto = parts[0], ""
		if len(parts) == 2 {
			proto = parts[1]
		}
	}
	if port == "" {
		return nil, fmt.Errorf("portforward needs a port: portforward/{port}[/{protocol}]")
	}
	n, err := strconv.ParseInt(port, 10, 32)
	if err != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("portforward port %q: want 1 to 65535", port)
	}
	if proto == "" {
		proto = "tcp"
	}
	if proto != "tcp" {
		return nil, fmt.Errorf("portforward protocol %q is not supported: only tcp", proto)
	}
	return &subv1.PortForwardOptions{TypeMeta: metaTypeOf("PortForwardOptions"), Port: int32(n), Protocol: proto}, nil
}
