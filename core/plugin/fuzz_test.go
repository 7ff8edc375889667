package plugin

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kubevisor/kubevisor/core/driver"
)

// manifestRefusal is how every refusal of a manifest starts: the field, or what did not decode.
var manifestRefusal = regexp.MustCompile(`^(name|kind|binary|sha256|config): |^invalid (JSON|manifest)\b`)

// fuzzDir is the plugin directory the fuzzed manifests are read from.
const fuzzDir = "/etc/kubevisor/plugins"

// checkManifest parses data as the manifest file m.json (or m.yaml) of fuzzDir and checks what
// LoadManifest promises: a refusal names the field or says the file did not decode; an accepted
// manifest has every required field in its form (a DNS label, a known kind, an absolute clean
// binary, 64 lowercase hex digits, config absent or JSON), checks again unchanged, and written as
// JSON reads back the same.
func checkManifest(t *testing.T, data []byte, asYAML bool) {
	file := "m.json"
	if asYAML {
		file = "m.yaml"
	}
	m, err := parseManifest(filepath.Join(fuzzDir, file), data)
	if err != nil {
		if !manifestRefusal.MatchString(err.Error()) {
			t.Fatalf("%s %q: refusal %q names no field", file, data, err)
		}
		return
	}
	_, kindErr := driver.ParseKind(m.Kind)
	switch {
	case !nameRE.MatchString(m.Name), kindErr != nil, !sha256RE.MatchString(m.SHA256),
		!filepath.IsAbs(m.Binary), filepath.Clean(m.Binary) != m.Binary, m.Dir != fuzzDir,
		m.Config != nil && (!json.Valid(m.Config) || strings.TrimSpace(string(m.Config)) == "null"):
		t.Fatalf("%s %q: accepted %+v", file, data, m)
	}
	again := m
	again.Args = slices.Clone(m.Args) // an empty list stays empty, not nil
	if err := again.normalize(); err != nil || !reflect.DeepEqual(again, m) {
		t.Fatalf("%s %q: %+v checked again: %+v, %v", file, data, m, again, err)
	}
	written, err := json.Marshal(m)
	if err != nil {
		t.Fatalf("%s %q: marshal %+v: %v", file, data, m, err)
	}
	back, err := parseManifest(filepath.Join(fuzzDir, "back.json"), written)
	if err != nil {
		t.Fatalf("%s %q: %s written back: %v", file, data, written, err)
	}
	if rewritten, _ := json.Marshal(back); string(rewritten) != string(written) || back.Dir != m.Dir {
		t.Fatalf("%s %q: written %s, read back and written again %s", file, data, written, rewritten)
	}
}

// FuzzManifest feeds parseManifest (LoadManifest without the file) JSON and YAML manifests; the
// seeds are the manifests of this package's tests, as plugindir writes them, and malformed ones.
func FuzzManifest(f *testing.F) {
	for _, seed := range []struct {
		yaml bool
		data string
	}{
		{false, `{"name":"qmp","kind":"hypervisor","binary":"/opt/kubevisor/kubevisor-driver-qmp","sha256":"` + strings.ToUpper(digest) + `","args":["-v"],"config":{"accel":"auto"}}`},
		{true, "name: cni\nkind: network\nbinary: bin/kubevisor-driver-cni\nsha256: " + digest + "\nconfig:\n  bridge: kv0\n"},
		{true, "name: disk\nkind: storage\nbinary: ./disk\nsha256: " + digest + "\nconfig: null\n"},
		{false, "{\n  \"name\": \"hostdev\",\n  \"kind\": \"device\",\n  \"binary\": \"hostdev/kubevisor-driver-hostdev\",\n  \"sha256\": \"" + digest + "\",\n  \"args\": [\n    \"--x\"\n  ],\n  \"config\": {\n    \"a\": [1, 2.5, \"<&>\"]\n  }\n}\n"},
		{false, `{"name":"qmp","kind":"hypervisor","binary":"../x/./y//z","sha256":"` + digest + `","config":  null }`},
		{false, "{\n  \"name\": \"x\",\n  \"kind\" \"hypervisor\"\n}"},
		{false, ""},
		{true, "name: [x\n"},
		{false, `{"kind":"hypervisor","binary":"/b","sha256":"` + digest + `"}`},
		{false, `{"name":"x","kind":"gpu","binary":"/b","sha256":"` + digest + `"}`},
		{false, `{"name":"qmp-","kind":"hypervisor","binary":"/b","sha256":"` + digest + `"}`},
		{false, `{"name":"x","kind":"hypervisor","binary":"/b","sha256":"abc"}`},
		{false, `{"name":"x","kind":"hypervisor","binary":"/b","sha256":"` + digest + `","sha":"x"}`},
		{true, "name: x\nkind: hypervisor\nbinary: /b\nsha256: " + digest + "\nargz: [a]\n"},
		{false, `{"name":"x","kind":"hypervisor","binary":"/b","sha256":"` + digest + `","args":"-v"}`},
		{false, `{"name":"x","kind":"hypervisor","binary":"/b","sha256":"` + digest + `"} {}`},
		{true, "name: x\nname: y\nkind: hypervisor\nbinary: /b\nsha256: " + digest + "\n"},
	} {
		f.Add([]byte(seed.data), seed.yaml)
	}
	f.Fuzz(checkManifest)
}
