package kubevirtcompat

import (
	"encoding/json"
	"reflect"
	"sort"
	"strings"
)

// Node is one field of an API type as its JSON encoding sees it. An opaque node is a value whose
// inside is not looked at (a scalar, a map, a type with its own JSON encoding, a type the tree
// was told to stop at); an object node has the JSON fields of a struct as Children (none for an
// empty struct such as `slirp: {}`).
type Node struct {
	// Children are the object's fields by JSON name; nil for an opaque node.
	Children map[string]*Node
	// List says the field is a JSON array whose elements are this node (a Go slice or array of
	// objects); its path then ends in "[]".
	List bool
}

// Opaque says n's inside is not looked at.
func (n *Node) Opaque() bool { return n.Children == nil }

// Child returns the field name of the object n, or nil.
func (n *Node) Child(name string) *Node {
	if n == nil {
		return nil
	}
	return n.Children[name]
}

var jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()

// TreeOf returns the field tree of the struct type t. A struct type for which stop returns true
// is opaque, as are maps and a struct met again inside itself (a recursive type). A nil stop is
// OwnJSON.
func TreeOf(t reflect.Type, stop func(reflect.Type) bool) *Node {
	if stop == nil {
		stop = OwnJSON
	}
	return treeOf(t, stop, map[reflect.Type]bool{})
}

// OwnJSON says whether t has its own JSON decoding (resource.Quantity, metav1.Time,
// intstr.IntOrString), whose fields are then not JSON fields.
func OwnJSON(t reflect.Type) bool { return reflect.PointerTo(t).Implements(jsonUnmarshaler) }

func treeOf(t reflect.Type, stop func(reflect.Type) bool, onPath map[reflect.Type]bool) *Node {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && t.Elem().Kind() != reflect.Uint8 {
		elem := treeOf(t.Elem(), stop, onPath)
		if elem.Opaque() {
			return &Node{}
		}
		elem.List = true
		return elem
	}
	if t.Kind() != reflect.Struct || stop(t) || onPath[t] {
		return &Node{}
	}
	onPath[t] = true
	defer delete(onPath, t)
	n := &Node{Children: map[string]*Node{}}
	addFields(n, t, stop, onPath)
	return n
}

// addFields adds the JSON fields of struct t to n, those of inlined and embedded structs too.
func addFields(n *Node, t reflect.Type, stop func(reflect.Type) bool, onPath map[reflect.Type]bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		inline := name == "" && (f.Anonymous || strings.Contains(opts, "inline"))
		if inline {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				addFields(n, ft, stop, onPath)
				continue
			}
		}
		if name == "" {
			name = f.Name
		}
		n.Children[name] = treeOf(f.Type, stop, onPath)
	}
}

// childPath is the path of field name under parent ("" is the root).
func childPath(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// elemPath is the path of a list field's elements.
func elemPath(path string) string { return path + "[]" }

// Leaves returns the paths of n's leaf fields, sorted: opaque fields and objects without
// fields, written with JSON names, dots between them and "[]" after a list of objects
// ("domain.devices.interfaces[].slirp").
func (n *Node) Leaves() []string {
	var out []string
	n.leaves("", &out)
	sort.Strings(out)
	return out
}

func (n *Node) leaves(path string, out *[]string) {
	if len(n.Children) == 0 {
		if n.List {
			path = elemPath(path)
		}
		*out = append(*out, path)
		return
	}
	if n.List {
		path = elemPath(path)
	}
	for name, c := range n.Children {
		c.leaves(childPath(path, name), out)
	}
}

// Has says whether path names a field of the tree rooted at n (a leaf or an inner field).
func (n *Node) Has(path string) bool { return n.Lookup(path) != nil }

// Lookup returns the field at path in the tree rooted at n, or nil. A list's elements are
// "name[]"; the last part of path may name a list without "[]" (the list field itself).
func (n *Node) Lookup(path string) *Node {
	cur := n
	parts := strings.Split(path, ".")
	for i, part := range parts {
		name, list := strings.CutSuffix(part, "[]")
		cur = cur.Child(name)
		if cur == nil || (cur.List != list && (list || i < len(parts)-1)) {
			return nil
		}
	}
	return cur
}

// TreeFromLeaves builds the tree whose Leaves are paths (as Leaves writes them), with every leaf
// opaque: what a list of leaf paths knows of a type.
func TreeFromLeaves(paths []string) *Node {
	root := &Node{Children: map[string]*Node{}}
	for _, p := range paths {
		cur := root
		for part := range strings.SplitSeq(p, ".") {
			name, list := strings.CutSuffix(part, "[]")
			if cur.Children == nil {
				cur.Children = map[string]*Node{}
			}
			c := cur.Children[name]
			if c == nil {
				c = &Node{}
				cur.Children[name] = c
			}
			c.List = c.List || list
			cur = c
		}
	}
	return root
}
