package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fixture writes a small repository: a Makefile with deps-<set> targets as the real one has,
// hack/deps/install.sh (never run: make -n only prints it) and packages.txt, plus files.
func fixture(t *testing.T, makefileTargets string, files map[string]string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is part of a fresh machine and must be here:", err)
	}
	root := t.TempDir()
	all := map[string]string{
		"hack/deps/packages.txt": "# set package commands\nruntime containerd containerd ctr\nruntime runc runc\nqemu qemu-utils qemu-img\n",
		"hack/deps/install.sh":   "#!/usr/bin/env bash\necho never run by the check\n",
		"Makefile": "DEPS_SETS := runtime qemu\n" +
			".PHONY: $(addprefix deps-,$(DEPS_SETS))\n" +
			"$(addprefix deps-,$(DEPS_SETS)): deps-%:\n\t@hack/deps/install.sh $*\n\n" + makefileTargets,
	}
	for k, v := range files {
		all[k] = v
	}
	for name, data := range all {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func checkOne(t *testing.T, root, target string) TargetReport {
	t.Helper()
	r, err := Check(root, []string{target})
	if err != nil {
		t.Fatal(err)
	}
	return r.Targets[0]
}

func missing(tr TargetReport) string { return strings.Join(tr.Missing, "\n") }

// The case of the bug: a target runs a script that calls ctr, and nothing installs it.
func TestScriptCommandWithoutDeps(t *testing.T) {
	root := fixture(t, "sandbox: ## test\n\ttestdata/sandbox.sh\n", map[string]string{
		"testdata/sandbox.sh": "#!/usr/bin/env bash\nset -e\nmkdir -p /tmp/x\nctr -n k8s.io images import x.tar\n",
	})
	tr := checkOne(t, root, "sandbox")
	if len(tr.Missing) != 1 || !strings.Contains(tr.Missing[0], "ctr (called at testdata/sandbox.sh:4)") ||
		!strings.Contains(tr.Missing[0], "deps-runtime (containerd)") {
		t.Fatalf("want ctr missing at testdata/sandbox.sh:4 with the deps-runtime hint, got:\n%s", missing(tr))
	}
}

func TestDepsPrerequisiteProvides(t *testing.T) {
	root := fixture(t, "sandbox: deps-runtime ## test\n\ttestdata/sandbox.sh\n", map[string]string{
		"testdata/sandbox.sh": "#!/usr/bin/env bash\nctr images ls\nrunc --version\n",
	})
	tr := checkOne(t, root, "sandbox")
	if len(tr.Missing) != 0 || strings.Join(tr.Sets, ",") != "runtime" {
		t.Fatalf("want no missing command and sets [runtime], got sets %v:\n%s", tr.Sets, missing(tr))
	}
}

// Functions (also from a sourced library), builtins, base commands and wrappers.
func TestScriptScopes(t *testing.T) {
	root := fixture(t, "x: ## test\n\tbash hack/x.sh\n", map[string]string{
		"hack/lib.sh": "log() { echo \"$*\"; }\nqemu() { echo not the real one; }\n",
		"hack/x.sh": `#!/usr/bin/env bash
HERE="$(dirname "${BASH_SOURCE[0]}")"
source "${HERE}/lib.sh"
log start
qemu
local_fn() { :; }
local_fn
cat /etc/hostname | grep -q . && sed -n 1p /etc/hostname
unshare --mount --propagation private -- qemu-img info disk
timeout 5 env A=1 nosuchtool-a
v=$(nosuchtool-b --version)
ip netns exec ns1 nosuchtool-c
"$HERE/nested.sh" arg
`,
		"hack/nested.sh": "#!/bin/sh\nnosuchtool-d\n",
	})
	tr := checkOne(t, root, "x")
	got := strings.Join(tr.Commands, " ")
	for _, want := range []string{"qemu-img", "nosuchtool-a", "nosuchtool-b", "nosuchtool-c", "nosuchtool-d"} {
		if !strings.Contains(got, want) {
			t.Errorf("commands %q lack %s", got, want)
		}
	}
	for _, not := range []string{"log", "local_fn", "cat", "grep", "sed", "unshare", "timeout", "env", "qemu "} {
		if strings.Contains(got+" ", not+" ") {
			t.Errorf("commands %q hold %s (a function, builtin or base command)", got, not)
		}
	}
	if !strings.Contains(missing(tr), "qemu-img (called at hack/x.sh:9): make the target depend on deps-qemu") {
		t.Errorf("want qemu-img missing at hack/x.sh:9, got:\n%s", missing(tr))
	}
	if !strings.Contains(missing(tr), "nosuchtool-d (called at hack/nested.sh:2): no set provides it") {
		t.Errorf("want nosuchtool-d found in the nested script, got:\n%s", missing(tr))
	}
}

// A sub-make's recipe counts for the target that runs it, and so do its deps sets.
func TestSubMake(t *testing.T) {
	root := fixture(t, "inner: deps-qemu ## i\n\tqemu-img --version\nouter: ## o\n\t$(MAKE) --no-print-directory inner\n\tctr version\n", nil)
	tr := checkOne(t, root, "outer")
	if strings.Join(tr.Sets, ",") != "qemu" || !strings.Contains(missing(tr), "ctr (called at recipe)") || strings.Contains(missing(tr), "qemu-img") {
		t.Fatalf("want sets [qemu], ctr missing and qemu-img provided, got sets %v:\n%s", tr.Sets, missing(tr))
	}
}

// Go programs a target runs: exec calls with a literal name and the deps:commands directive,
// for go test (test files too) and go run.
func TestGoPrograms(t *testing.T) {
	root := fixture(t, "test: ## t\n\tgo test ./pkg/...\nrun: deps-qemu ## r\n\tgo run ./tool --flag\nunit: ## u\n\tgo test -short ./...\n", map[string]string{
		"go.mod":          "module example.com/fx\n\ngo 1.22\n",
		"pkg/a.go":        "package pkg\n\nimport \"os/exec\"\n\nfunc A() error { return exec.Command(\"qemu-img\", \"info\").Run() }\n",
		"pkg/a_test.go":   "package pkg\n\nimport (\n\t\"os/exec\"\n\t\"testing\"\n)\n\nfunc TestA(t *testing.T) { _, _ = exec.LookPath(\"ctr\") }\n",
		"tool/main.go":    "package main\n\nimport \"example.com/fx/dep\"\n\nfunc main() { dep.D() }\n",
		"dep/dep.go":      "package dep\n\n//deps:commands qemu-img\nfunc D() {}\n",
		"dep/dep_test.go": "package dep\n\nimport (\n\t\"os/exec\"\n\t\"testing\"\n)\n\n// Not run by go run ./tool: does not count there.\nfunc TestD(t *testing.T) { _ = exec.Command(\"nosuchtool\") }\n",
	})
	test := checkOne(t, root, "test")
	if !strings.Contains(missing(test), "ctr (called at pkg/a_test.go:8)") || !strings.Contains(missing(test), "qemu-img (called at pkg/a.go:5)") {
		t.Errorf("go test: want ctr and qemu-img missing, got:\n%s", missing(test))
	}
	if unit := checkOne(t, root, "unit"); len(unit.Commands) != 0 {
		t.Errorf("go test -short: want no commands counted (its tests that need one skip), got %v", unit.Commands)
	}
	run := checkOne(t, root, "run")
	if len(run.Missing) != 0 || strings.Join(run.Commands, " ") != "qemu-img" {
		t.Errorf("go run: want qemu-img only, provided by deps-qemu; got %v:\n%s", run.Commands, missing(run))
	}
}

// The real Makefile passes: every target installs what it uses. This is what make verify runs.
func TestRepositoryMakefile(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Check(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Targets) < 10 {
		t.Fatalf("only %d targets found in the Makefile's help list", len(r.Targets))
	}
	for _, tr := range r.Targets {
		for _, m := range tr.Missing {
			t.Errorf("make %s: %s", tr.Name, m)
		}
	}
	for _, p := range r.Declared {
		t.Error(p)
	}
}

func TestLoadSetsRejectsShortLines(t *testing.T) {
	p := filepath.Join(t.TempDir(), "packages.txt")
	if err := os.WriteFile(p, []byte("runtime containerd\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSets(p); err == nil || !strings.Contains(err.Error(), ":1: want") {
		t.Fatalf("want a line-numbered error, got %v", err)
	}
}
