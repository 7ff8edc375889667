package subresources

import (
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"

	"k8s.io/apimachinery/pkg/runtime"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/util"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// openAPIV3Config is the OpenAPI the generic server needs to install a group (it builds the
// type converter of server-side apply from it): every type of the scheme is an object that
// keeps unknown fields. Nothing here is stored or applied, so no finer schema is needed; the
// aggregator publishes these as the group's OpenAPI v3, and there is no v2 document.
func openAPIV3Config(s *runtime.Scheme) *common.OpenAPIV3Config {
	defs := func(common.ReferenceCallback) map[string]common.OpenAPIDefinition {
		m := map[string]common.OpenAPIDefinition{}
		types := []reflect.Type{reflect.TypeFor[version.Info](), reflect.TypeFor[metav1.APIGroupList](), reflect.TypeFor[metav1.APIGroup](),
			reflect.TypeFor[metav1.APIResourceList](), reflect.TypeFor[metav1.APIVersions](), reflect.TypeFor[metav1.Status](),
			reflect.TypeFor[metav1.TypeMeta](), reflect.TypeFor[metav1.ObjectMeta](), reflect.TypeFor[metav1.ListMeta]()}
		for _, t := range s.AllKnownTypes() {
			types = append(types, t)
		}
		object := common.OpenAPIDefinition{Schema: spec.Schema{
			SchemaProps:      spec.SchemaProps{Type: []string{"object"}},
			VendorExtensible: spec.VendorExtensible{Extensions: spec.Extensions{"x-kubernetes-preserve-unknown-fields": true}},
		}}
		for _, t := range types {
			// Under the Go name and, for the routes' references, the REST-friendly one.
			name := t.PkgPath() + "." + t.Name()
			m[name], m[util.ToRESTFriendlyName(name)] = object, object
		}
		return m
	}
	c := genericapiserver.DefaultOpenAPIV3Config(defs, openapinamer.NewDefinitionNamer(s))
	c.Info.Title = "kubevisor-api"
	return c
}
