package cloudinit

import (
	"errors"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestAddAuthorizedKeys(t *testing.T) {
	keys := []string{"ssh-ed25519 AAAA1 a@x", "ssh-ed25519 AAAA2 b@x"}
	for _, tc := range []struct {
		name     string
		userData string
		want     []string // ssh_authorized_keys afterwards
		keep     []string // substrings the output still has
	}{
		{name: "empty", userData: "", want: keys},
		{name: "header only", userData: "#cloud-config\n", want: keys},
		{name: "no list", userData: "#cloud-config\n# users first\nusers: [root]\nruncmd:\n  - echo hi\n", want: keys,
			keep: []string{"# users first", "runcmd:", "echo hi"}},
		{name: "appended to the list", userData: "#cloud-config\nssh_authorized_keys:\n  - ssh-rsa OLD o@x\nhostname: h\n",
			want: []string{"ssh-rsa OLD o@x", keys[0], keys[1]}, keep: []string{"hostname: h"}},
		{name: "flow list, key already there", userData: "#cloud-config\nssh_authorized_keys: [\"ssh-ed25519 AAAA1 a@x\"]\n",
			want: keys},
		{name: "null list", userData: "#cloud-config\nssh_authorized_keys:\n", want: keys},
		{name: "CRLF header", userData: "#cloud-config\r\npackages: [vim]\r\n", want: keys, keep: []string{"vim"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := AddAuthorizedKeys([]byte(tc.userData), keys)
			if err != nil {
				t.Fatal(err)
			}
			s := string(out)
			if !strings.HasPrefix(s, "#cloud-config\n") {
				t.Errorf("output does not start with the header:\n%s", s)
			}
			var doc map[string]any
			if err := yaml.Unmarshal(out, &doc); err != nil {
				t.Fatalf("output is not YAML: %v\n%s", err, s)
			}
			got, _ := doc[AuthorizedKeysKey].([]any)
			if len(got) != len(tc.want) {
				t.Fatalf("%s = %v, want %v\n%s", AuthorizedKeysKey, got, tc.want, s)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("%s[%d] = %v, want %q", AuthorizedKeysKey, i, got[i], tc.want[i])
				}
			}
			// The test guest reads block list items indented under the key.
			if !strings.Contains(s, AuthorizedKeysKey+":\n  - ") {
				t.Errorf("list not written as an indented block:\n%s", s)
			}
			for _, k := range tc.keep {
				if !strings.Contains(s, k) {
					t.Errorf("output lost %q:\n%s", k, s)
				}
			}
		})
	}
}

func TestAddAuthorizedKeysRefused(t *testing.T) {
	for _, tc := range []struct {
		name, userData, want string
	}{
		{"script", "#!/bin/sh\necho hi\n", "not cloud-config"},
		{"header not first", "\n#cloud-config\nusers: []\n", "not cloud-config"},
		{"include", "#include\nhttp://x/y\n", "not cloud-config"},
		{"not a mapping", "#cloud-config\n- a\n- b\n", "not a YAML mapping"},
		{"keys not a list", "#cloud-config\nssh_authorized_keys: ssh-rsa X\n", "is not a list"},
		{"bad YAML", "#cloud-config\nusers: [\n", "not valid YAML"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := AddAuthorizedKeys([]byte(tc.userData), []string{"ssh-ed25519 K"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one with %q", err, tc.want)
			}
			if tc.want == "not cloud-config" && !errors.Is(err, ErrNotCloudConfig) {
				t.Errorf("err = %v, want ErrNotCloudConfig", err)
			}
			if CanAddKeys([]byte(tc.userData)) == nil {
				t.Error("CanAddKeys = nil")
			}
		})
	}
}

func TestKeysOf(t *testing.T) {
	got := KeysOf(map[string][]byte{
		"b":   []byte("ssh-rsa B\n\n# comment\n  ssh-ed25519 C  \n"),
		"a":   []byte("ssh-rsa A"),
		"nil": nil,
	})
	want := []string{"ssh-rsa A", "ssh-rsa B", "ssh-ed25519 C"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("KeysOf = %q, want %q", got, want)
	}
}
