package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// goScanner finds the commands Go programs start by a literal name: exec.Command("ip", ...),
// exec.CommandContext(ctx, "qemu-img", ...), exec.LookPath("xorriso"). It lists the packages a
// run builds (go list -deps, with -test for go test) and reads those of the run's own module;
// test files count for the packages under test. A name held in a variable is not seen: code
// that looks commands up by other means names them in a directive comment,
//
//	//deps:commands qemu-system-x86_64 qemu-img
type goScanner struct {
	root  string
	files map[string][]Use // parsed file → its uses
	runs  map[string][]Use // goRun key → uses
}

func newGoScanner(root string) *goScanner {
	return &goScanner{root: root, files: map[string][]Use{}, runs: map[string][]Use{}}
}

type listedPackage struct {
	ImportPath   string
	Dir          string
	GoFiles      []string
	TestGoFiles  []string
	XTestGoFiles []string
	DepOnly      bool
	ForTest      string
	Module       *struct{ Main bool }
}

func (g *goScanner) uses(r goRun) ([]Use, error) {
	key := fmt.Sprintf("%s|%s|%v|%s", r.dir, r.tags, r.test, strings.Join(r.pkgs, " "))
	if u, ok := g.runs[key]; ok {
		return u, nil
	}
	args := []string{"list", "-e", "-deps", "-json=ImportPath,Dir,GoFiles,TestGoFiles,XTestGoFiles,DepOnly,ForTest,Module"}
	if r.test {
		args = append(args, "-test")
	}
	if r.tags != "" {
		args = append(args, "-tags", r.tags)
	}
	args = append(args, r.pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = r.dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s (in %s): %w: %s", strings.Join(args, " "), r.dir, err, stderr.String())
	}
	var uses []Use
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p listedPackage
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("go list output: %w", err)
		}
		if p.Module == nil || !p.Module.Main {
			continue // the standard library and other modules start nothing of ours to install
		}
		files := p.GoFiles
		if r.test && !p.DepOnly {
			files = append(append(append([]string{}, files...), p.TestGoFiles...), p.XTestGoFiles...)
		}
		for _, f := range files {
			if filepath.IsAbs(f) {
				continue // generated into the build cache (cgo), not source
			}
			u, err := g.file(filepath.Join(p.Dir, f))
			if err != nil {
				return nil, err
			}
			uses = append(uses, u...)
		}
	}
	g.runs[key] = uses
	return uses, nil
}

func (g *goScanner) file(path string) ([]Use, error) {
	if u, ok := g.files[path]; ok {
		return u, nil
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution|parser.ParseComments)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	execName := ""
	for _, imp := range f.Imports {
		if imp.Path.Value == `"os/exec"` {
			execName = "exec"
			if imp.Name != nil {
				execName = imp.Name.Name
			}
		}
	}
	var uses []Use
	rel, _ := filepath.Rel(g.root, path)
	for _, cg := range f.Comments {
		for _, c := range cg.List {
			if names, ok := strings.CutPrefix(c.Text, "//deps:commands "); ok {
				for _, name := range strings.Fields(names) {
					uses = append(uses, Use{Command: name, Where: fmt.Sprintf("%s:%d", rel, fset.Position(c.Pos()).Line)})
				}
			}
		}
	}
	if execName != "" {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != execName {
				return true
			}
			arg := -1
			switch sel.Sel.Name {
			case "Command", "LookPath":
				arg = 0
			case "CommandContext":
				arg = 1
			}
			if arg < 0 || len(call.Args) <= arg {
				return true
			}
			bl, ok := call.Args[arg].(*ast.BasicLit)
			if !ok || bl.Kind != token.STRING {
				return true
			}
			name, err := strconv.Unquote(bl.Value)
			if err != nil || name == "" {
				return true
			}
			if strings.Contains(name, "/") {
				if !strings.HasPrefix(name, "/usr/") && !strings.HasPrefix(name, "/bin/") && !strings.HasPrefix(name, "/sbin/") {
					return true // a path of the program's own (a sandbox, an image)
				}
				name = filepath.Base(name)
			}
			uses = append(uses, Use{Command: name, Where: fmt.Sprintf("%s:%d", rel, fset.Position(bl.Pos()).Line)})
			return true
		})
	}
	g.files[path] = uses
	return uses, nil
}
