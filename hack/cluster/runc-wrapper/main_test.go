package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func fakeLimit(name string) (uint64, bool) {
	if name == "RLIMIT_NOFILE" {
		return 20000, true
	}
	return 0, false
}

func TestSubcommandAndFlags(t *testing.T) {
	for _, tc := range []struct {
		args            []string
		cmd, bundle, pf string
	}{
		{[]string{"--root", "/run/r", "--log", "/l.json", "--log-format", "json", "create", "--bundle", "/b", "id"}, "create", "/b", ""},
		{[]string{"--systemd-cgroup", "create", "--bundle=/b2", "--pid-file", "p", "id"}, "create", "/b2", ""},
		{[]string{"run", "-b", "/b3", "id"}, "run", "/b3", ""},
		{[]string{"--root", "/r", "exec", "--process", "/tmp/p.json", "--detach", "id"}, "exec", "", "/tmp/p.json"},
		{[]string{"--root", "/r", "state", "id"}, "state", "", ""},
	} {
		cmd, rest := subcommand(tc.args)
		if cmd != tc.cmd {
			t.Errorf("%q: subcommand %q, want %q", tc.args, cmd, tc.cmd)
		}
		if got := flagValue(rest, "bundle", "b"); got != tc.bundle {
			t.Errorf("%q: bundle %q, want %q", tc.args, got, tc.bundle)
		}
		if got := flagValue(rest, "process", "p"); got != tc.pf {
			t.Errorf("%q: process %q, want %q", tc.args, got, tc.pf)
		}
	}
}

func TestPatchSpec(t *testing.T) {
	in := `{"ociVersion":"1.0.2","process":{"args":["/pause"],"oomScoreAdj":-998,
	  "rlimits":[{"type":"RLIMIT_NOFILE","hard":1048576,"soft":1048576},{"type":"RLIMIT_NPROC","hard":18446744073709551615,"soft":5}]},
	  "linux":{"resources":{"memory":{"limit":9223372036854771712}}}}`
	out, err := patchSpec([]byte(in), fakeLimit)
	if err != nil || out == nil {
		t.Fatalf("patchSpec: %s, %v", out, err)
	}
	var got, want any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	wantJSON := `{"ociVersion":"1.0.2","process":{"args":["/pause"],
	  "rlimits":[{"type":"RLIMIT_NOFILE","hard":20000,"soft":20000},{"type":"RLIMIT_NPROC","hard":18446744073709551615,"soft":5}]},
	  "linux":{"resources":{"memory":{"limit":9223372036854771712}}}}`
	if err := json.Unmarshal([]byte(wantJSON), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %s\nwant %s", out, wantJSON)
	}
	// Large numbers survive exactly (no float64 round trip).
	if !json.Valid(out) || !strings.Contains(string(out), "18446744073709551615") || !strings.Contains(string(out), "9223372036854771712") {
		t.Errorf("64-bit numbers changed: %s", out)
	}
}

func TestPatchSpecUnchanged(t *testing.T) {
	in := `{"process":{"args":["/pause"],"rlimits":[{"type":"RLIMIT_NOFILE","hard":1024,"soft":1024}]}}`
	out, err := patchSpec([]byte(in), fakeLimit)
	if err != nil || out != nil {
		t.Fatalf("want no change, got %s, %v", out, err)
	}
}

func TestPatchForFiles(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfg, []byte(`{"process":{"oomScoreAdj":-999}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := patchFor([]string{"--root", "/r", "create", "--bundle", dir, "id"}, fakeLimit); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(cfg); string(b) != `{"process":{}}` {
		t.Errorf("config.json = %s", b)
	}
	pf := filepath.Join(dir, "process.json")
	if err := os.WriteFile(pf, []byte(`{"args":["sh"],"oomScoreAdj":-1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := patchFor([]string{"exec", "--process", pf, "id"}, fakeLimit); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(pf); string(b) != `{"args":["sh"]}` {
		t.Errorf("process.json = %s", b)
	}
	// Other commands touch nothing, even with a bundle flag.
	if err := patchFor([]string{"delete", "--force", "id"}, fakeLimit); err != nil {
		t.Fatal(err)
	}
}
