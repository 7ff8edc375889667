package plugin

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadManifest(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		data    string
		want    Manifest // Dir and a relative Binary are checked against the temp dir
		wantErr []string
	}{{
		name: "json",
		file: "qmp.json",
		data: `{"name":"qmp","kind":"hypervisor","binary":"/opt/kubevisor/kubevisor-driver-qmp","sha256":"` + strings.ToUpper(digest) + `","args":["-v"],"config":{"accel":"auto"}}`,
		want: Manifest{Name: "qmp", Kind: "hypervisor", Binary: "/opt/kubevisor/kubevisor-driver-qmp", SHA256: digest, Args: []string{"-v"}, Config: json.RawMessage(`{"accel":"auto"}`)},
	}, {
		name: "yaml with a relative binary",
		file: "cni.yaml",
		data: "name: cni\nkind: network\nbinary: bin/kubevisor-driver-cni\nsha256: " + digest + "\nconfig:\n  bridge: kv0\n",
		want: Manifest{Name: "cni", Kind: "network", Binary: "bin/kubevisor-driver-cni", SHA256: digest, Config: json.RawMessage(`{"bridge":"kv0"}`)},
	}, {
		name: "yml, config null",
		file: "disk.yml",
		data: "name: disk\nkind: storage\nbinary: ./disk\nsha256: " + digest + "\nconfig: null\n",
		want: Manifest{Name: "disk", Kind: "storage", Binary: "disk", SHA256: digest},
	}, {
		name:    "bad JSON",
		file:    "bad.json",
		data:    "{\n  \"name\": \"x\",\n  \"kind\" \"hypervisor\"\n}",
		wantErr: []string{"bad.json", "invalid JSON at line 3, column 10"},
	}, {
		name:    "empty file",
		file:    "empty.json",
		wantErr: []string{"empty.json", "empty file"},
	}, {
		name:    "bad YAML",
		file:    "bad.yaml",
		data:    "name: [x\n",
		wantErr: []string{"bad.yaml", "invalid manifest"},
	}, {
		name:    "missing name",
		file:    "m.json",
		data:    `{"kind":"hypervisor","binary":"/b","sha256":"` + digest + `"}`,
		wantErr: []string{"m.json", "name: required"},
	}, {
		name:    "missing kind",
		file:    "m.json",
		data:    `{"name":"x","binary":"/b","sha256":"` + digest + `"}`,
		wantErr: []string{"m.json", "kind: required"},
	}, {
		name:    "missing binary",
		file:    "m.json",
		data:    `{"name":"x","kind":"hypervisor","sha256":"` + digest + `"}`,
		wantErr: []string{"m.json", "binary: required"},
	}, {
		name:    "missing sha256",
		file:    "m.json",
		data:    `{"name":"x","kind":"hypervisor","binary":"/b"}`,
		wantErr: []string{"m.json", "sha256: required"},
	}, {
		name:    "unknown kind",
		file:    "m.json",
		data:    `{"name":"x","kind":"gpu","binary":"/b","sha256":"` + digest + `"}`,
		wantErr: []string{"m.json", `kind: unknown driver kind "gpu"`},
	}, {
		name:    "upper-case name",
		file:    "m.json",
		data:    `{"name":"QMP","kind":"hypervisor","binary":"/b","sha256":"` + digest + `"}`,
		wantErr: []string{"m.json", `name: "QMP" is not a DNS label`},
	}, {
		name:    "name with an underscore",
		file:    "m.json",
		data:    `{"name":"my_driver","kind":"hypervisor","binary":"/b","sha256":"` + digest + `"}`,
		wantErr: []string{"m.json", `name: "my_driver" is not a DNS label`},
	}, {
		name:    "name ending in a dash",
		file:    "m.json",
		data:    `{"name":"qmp-","kind":"hypervisor","binary":"/b","sha256":"` + digest + `"}`,
		wantErr: []string{"m.json", `name: "qmp-" is not a DNS label`},
	}, {
		name:    "name too long",
		file:    "m.json",
		data:    `{"name":"` + strings.Repeat("a", 64) + `","kind":"hypervisor","binary":"/b","sha256":"` + digest + `"}`,
		wantErr: []string{"m.json", "is not a DNS label"},
	}, {
		name:    "short digest",
		file:    "m.json",
		data:    `{"name":"x","kind":"hypervisor","binary":"/b","sha256":"abc"}`,
		wantErr: []string{"m.json", `sha256: "abc" is not 64 hex digits`},
	}, {
		name:    "unknown field",
		file:    "m.json",
		data:    `{"name":"x","kind":"hypervisor","binary":"/b","sha256":"` + digest + `","sha":"x"}`,
		wantErr: []string{"m.json", `unknown field "sha"`},
	}, {
		name:    "unknown field in YAML",
		file:    "m.yaml",
		data:    "name: x\nkind: hypervisor\nbinary: /b\nsha256: " + digest + "\nargz: [a]\n",
		wantErr: []string{"m.yaml", `unknown field "argz"`},
	}, {
		name:    "field of the wrong type",
		file:    "m.json",
		data:    `{"name":"x","kind":"hypervisor","binary":"/b","sha256":"` + digest + `","args":"-v"}`,
		wantErr: []string{"m.json", "Manifest.args"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, tt.file)
			writeFile(t, path, tt.data)
			got, err := LoadManifest(path)
			if tt.wantErr != nil {
				wantErr(t, err, tt.wantErr...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := tt.want
			want.Dir = dir
			if !filepath.IsAbs(want.Binary) {
				want.Binary = filepath.Join(dir, want.Binary)
			}
			gotJSON, _ := json.Marshal(got)
			wantJSON, _ := json.Marshal(want)
			if string(gotJSON) != string(wantJSON) || got.Dir != want.Dir {
				t.Errorf("got  %s (dir %s)\nwant %s (dir %s)", gotJSON, got.Dir, wantJSON, want.Dir)
			}
		})
	}
}

func TestDiscover(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "b-qmp.json"), `{"name":"qmp","kind":"hypervisor","binary":"qmp","sha256":"`+digest+`"}`)
	writeFile(t, filepath.Join(dir, "a-cni.yaml"), "name: cni\nkind: network\nbinary: /usr/lib/kubevisor/cni\nsha256: "+digest+"\n")
	writeFile(t, filepath.Join(dir, "c-broken.json"), `{"name":"broken","kind":"hypervisor","binary":"x"}`)
	writeFile(t, filepath.Join(dir, "d-again.yml"), "name: qmp\nkind: hypervisor\nbinary: other\nsha256: "+digest+"\n")
	writeFile(t, filepath.Join(dir, "README.md"), "not a manifest")
	writeFile(t, filepath.Join(dir, ".hidden.json"), "{")
	if err := os.Mkdir(filepath.Join(dir, "sub.json"), 0o755); err != nil {
		t.Fatal(err)
	}

	got, err := Discover(dir)
	var names []string
	for _, m := range got {
		names = append(names, m.Name)
	}
	if strings.Join(names, ",") != "cni,qmp" {
		t.Errorf("names = %v, want cni,qmp", names)
	}
	if len(got) == 2 && got[1].Binary != filepath.Join(dir, "qmp") {
		t.Errorf("qmp binary = %s", got[1].Binary)
	}
	wantErr(t, err,
		filepath.Join(dir, "c-broken.json")+": sha256: required",
		filepath.Join(dir, "d-again.yml")+`: name: "qmp" is already used by `+filepath.Join(dir, "b-qmp.json"))
	if strings.Contains(err.Error(), "README") || strings.Contains(err.Error(), "hidden") || strings.Contains(err.Error(), "sub.json") {
		t.Errorf("error mentions a file that is not a manifest: %v", err)
	}

	if got, err := Discover(t.TempDir()); err != nil || len(got) != 0 {
		t.Errorf("empty dir: %v, %v", got, err)
	}
	if _, err := Discover(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing dir: no error")
	}
}

func TestManifestFor(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kubevisor-driver-test")
	writeFile(t, bin, "test")
	m, err := ManifestFor(bin, "device", "")
	if err != nil {
		t.Fatal(err)
	}
	if m.Name != "test" || m.Kind != "device" || m.Binary != bin || m.SHA256 != digest || m.Dir != filepath.Dir(bin) {
		t.Errorf("manifest = %+v", m)
	}
	_, err = ManifestFor("/nonexistent/bin", "device", "x")
	wantErr(t, err, `driver "x": binary /nonexistent/bin: no such file`)
	_, err = ManifestFor(bin, "gpu", "x")
	wantErr(t, err, `kind: unknown driver kind "gpu"`)
}
