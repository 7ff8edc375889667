package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"mvdan.cc/sh/v3/syntax"
)

// Use is one external command that a target's recipe, one of its scripts or one of its Go
// programs calls, and where.
type Use struct {
	Command string
	Where   string // file:line, or "recipe" for the make -n output
}

// goRun is a Go program a target runs on the machine: `go test` or `go run` of some packages,
// or a binary of this repository's cmd/ that the target built and then runs.
type goRun struct {
	dir  string   // working directory (a module root)
	pkgs []string // package patterns
	tags string
	test bool // test files count too
}

// walker follows one target's recipe through the scripts it runs (and the scripts they run or
// source), collecting the commands called, the deps sets installed and the Go programs run.
//
// What it cannot see, by design: a command whose name is a variable (`"$KUBECTL" get`), a
// command inside a string run later (`sh -c "$restart"`, a heredoc that writes a script), a
// script whose path it cannot resolve from the literal part of its name.
type walker struct {
	root    string
	uses    []Use
	sets    map[string]bool
	goRuns  []goRun
	seen    map[string]bool // scripts walked
	errs    []error
	scripts []string // every repository shell script, for resolving "$X/path/to/s.sh"
}

func newWalker(root string) *walker {
	w := &walker{root: root, sets: map[string]bool{}, seen: map[string]bool{}}
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "_output" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".sh") {
			w.scripts = append(w.scripts, p)
		}
		return nil
	})
	return w
}

// scope is where a piece of shell runs: its file (for messages and relative paths), the
// functions it defines or sources, and the working directory of the statement.
type scope struct {
	file  string // repository-relative, or "recipe"
	dir   string // the file's directory (absolute), for "$(dirname "$0")/x.sh"
	cwd   string // the statement's working directory (absolute), as far as known
	funcs map[string]bool
}

// recipe walks the output of `make -n`: every line is shell run from the repository root.
func (w *walker) recipe(out []byte) {
	f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(bytes.NewReader(out), "recipe")
	if err != nil {
		w.errs = append(w.errs, fmt.Errorf("parse make -n output: %w", err))
		return
	}
	sc := &scope{file: "recipe", dir: w.root, cwd: w.root, funcs: map[string]bool{}}
	w.walkFile(f, sc)
}

// script walks a repository shell script once.
func (w *walker) script(path string) {
	if w.seen[path] {
		return
	}
	w.seen[path] = true
	f, err := parseFile(path)
	if err != nil {
		w.errs = append(w.errs, err)
		return
	}
	sc := &scope{file: w.rel(path), dir: filepath.Dir(path), cwd: w.root, funcs: map[string]bool{}}
	w.collectFuncs(f, sc, map[string]bool{path: true})
	w.walkFile(f, sc)
}

func parseFile(path string) (*syntax.File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(bytes.NewReader(data), path)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return f, nil
}

// collectFuncs records the functions a script defines and those of the files it sources, so
// that calls to them (wherever they stand in the file) are not taken for commands.
func (w *walker) collectFuncs(f *syntax.File, sc *scope, visiting map[string]bool) {
	syntax.Walk(f, func(n syntax.Node) bool {
		switch n := n.(type) {
		case *syntax.FuncDecl:
			sc.funcs[n.Name.Value] = true
		case *syntax.CallExpr:
			if len(n.Args) >= 2 {
				if name, ok := lit(n.Args[0]); ok && (name == "source" || name == ".") {
					if p := w.resolve(n.Args[1], sc); p != "" && !visiting[p] {
						visiting[p] = true
						if sf, err := parseFile(p); err == nil {
							w.collectFuncs(sf, sc, visiting)
						}
					}
				}
			}
		}
		return true
	})
}

func (w *walker) walkFile(f *syntax.File, sc *scope) {
	for _, st := range f.Stmts {
		sc.cwd = w.root // each recipe line is a shell of its own; scripts mostly cd to the root
		syntax.Walk(st, func(n syntax.Node) bool {
			if c, ok := n.(*syntax.CallExpr); ok && len(c.Args) > 0 {
				w.call(c.Args, sc, c.Pos().Line())
			}
			return true
		})
	}
}

// Bash builtins and keywords that parse as calls: never external commands.
var builtins = set("alias", "bg", "bind", "break", "builtin", "caller", "cd", "compgen", "complete",
	"compopt", "continue", "declare", "dirs", "disown", "echo", "enable", "eval", "exit", "export",
	"false", "fc", "fg", "getopts", "hash", "help", "history", "jobs", "kill", "let", "local",
	"logout", "mapfile", "popd", "printf", "pushd", "pwd", "read", "readarray", "readonly",
	"return", "set", "shift", "shopt", "suspend", "test", "times", "trap", "true", "type",
	"typeset", "ulimit", "umask", "unalias", "unset", "wait", "[", ":")

func (w *walker) use(cmd string, sc *scope, line uint) {
	where := sc.file
	if sc.file != "recipe" {
		where = fmt.Sprintf("%s:%d", sc.file, line)
	}
	w.uses = append(w.uses, Use{Command: cmd, Where: where})
}

// call handles one simple command (its words), following wrappers to the command they run.
func (w *walker) call(args []*syntax.Word, sc *scope, line uint) {
	if len(args) == 0 {
		return
	}
	name, ok := lit(args[0])
	if !ok {
		if p := w.resolve(args[0], sc); p != "" {
			w.run(p, args[1:], sc, line)
		}
		return
	}
	rest := args[1:]
	switch {
	case name == "source" || name == ".":
		if len(rest) > 0 {
			if p := w.resolve(rest[0], sc); p != "" {
				w.script(p)
			}
		}
		return
	case name == "cd":
		if len(rest) > 0 {
			if d, ok := lit(rest[0]); ok {
				sc.cwd = abs(sc.cwd, d)
			}
		}
		return
	case name == "exec" || name == "command":
		if name == "command" && len(rest) > 0 {
			if o, _ := lit(rest[0]); o == "-v" || o == "-V" {
				rest = rest[1:] // `command -v X || die`: the script needs X
			}
		}
		w.call(rest, sc, line)
		return
	case builtins[name] || sc.funcs[name]:
		return
	}
	if strings.Contains(name, "/") {
		w.run(abs(sc.cwd, name), rest, sc, line)
		return
	}
	w.use(name, sc, line)
	switch name {
	case "env", "nohup", "setsid", "sudo", "nice", "stdbuf", "unshare", "nsenter", "xargs":
		w.call(skipOptions(name, rest), sc, line)
	case "timeout":
		if rest = skipOptions(name, rest); len(rest) > 0 {
			w.call(rest[1:], sc, line) // the duration
		}
	case "chroot":
		if rest = skipOptions(name, rest); len(rest) > 0 {
			w.call(rest[1:], sc, line) // the new root
		}
	case "ip":
		if len(rest) >= 3 && litIs(rest[0], "netns") && litIs(rest[1], "exec") {
			w.call(rest[3:], sc, line)
		}
	case "bash", "sh":
		if len(rest) >= 2 && litIs(rest[0], "-c") {
			if s, ok := lit(rest[1]); ok {
				if f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(s), sc.file); err == nil {
					w.walkFile(f, sc)
				}
			}
		} else if rest = skipOptions(name, rest); len(rest) > 0 {
			if p := w.resolve(rest[0], sc); p != "" {
				w.script(p)
			}
		}
	case "go":
		w.goCommand(rest, sc)
	}
}

// run handles a command named by its path: a repository script is walked, a binary this
// repository builds into bin/ is a Go program run, a system path is its base name.
func (w *walker) run(path string, args []*syntax.Word, sc *scope, line uint) {
	rel, inRepo := w.inRepo(path)
	switch {
	case inRepo && rel == "hack/deps/install.sh":
		for _, a := range args {
			if s, ok := lit(a); ok {
				w.sets[s] = true
			}
		}
		w.script(path)
	case inRepo && strings.HasPrefix(rel, "bin/"):
		if cmd := filepath.Join(w.root, "cmd", filepath.Base(rel)); isDir(cmd) {
			w.goRuns = append(w.goRuns, goRun{dir: w.root, pkgs: []string{"./cmd/" + filepath.Base(rel)}})
		}
	case inRepo && isShellScript(path):
		w.script(path)
	case inRepo:
		// Another file of the repository or build output (_output/...): nothing to install.
	case filepath.IsAbs(path) && strings.HasPrefix(path, "/usr/") || strings.HasPrefix(path, "/bin/") || strings.HasPrefix(path, "/sbin/"):
		w.use(filepath.Base(path), sc, line)
	}
}

// goCommand records `go run PKG` and `go test [-c] PKGS` as Go programs the target runs
// (not `go test -short`, whose tests that need a command skip).
func (w *walker) goCommand(args []*syntax.Word, sc *scope) {
	if len(args) == 0 {
		return
	}
	sub, _ := lit(args[0])
	if sub != "run" && sub != "test" {
		return
	}
	r := goRun{dir: sc.cwd, test: sub == "test"}
	withValue := set("-tags", "-o", "-run", "-bench", "-benchtime", "-timeout", "-count", "-ldflags",
		"-gcflags", "-modfile", "-mod", "-exec", "-coverprofile", "-p", "-parallel", "-cpu", "-skip")
	for i := 1; i < len(args); i++ {
		a, ok := lit(args[i])
		if !ok {
			continue
		}
		if a == "-args" || a == "--" {
			break
		}
		if strings.HasPrefix(a, "-") {
			flag, value, hasValue := strings.Cut(a, "=")
			flag = "-" + strings.TrimLeft(flag, "-")
			if !hasValue && withValue[flag] && i+1 < len(args) {
				i++
				value, _ = lit(args[i])
			}
			switch flag {
			case "-tags":
				r.tags = value
			case "-short":
				// Under go test -short every test that needs an external command skips
				// (internal/testenv), so the programs' commands do not count.
				return
			}
			continue
		}
		r.pkgs = append(r.pkgs, a)
		if sub == "run" {
			break // the rest are the program's arguments
		}
	}
	if len(r.pkgs) > 0 {
		w.goRuns = append(w.goRuns, r)
	}
}

// resolve finds the repository script a word names: a literal path, or the literal tail of a
// word like "${HERE}/lib.sh" or "$ROOT/deviceplugins/testdata/s.sh", looked up next to the
// current file, then from the repository root, then as a unique suffix of a repository script.
func (w *walker) resolve(word *syntax.Word, sc *scope) string {
	if s, ok := lit(word); ok {
		for _, p := range []string{abs(sc.cwd, s), abs(sc.dir, s)} {
			if isFile(p) {
				return p
			}
		}
		return ""
	}
	tail := literalTail(word)
	if !strings.HasPrefix(tail, "/") || !strings.HasSuffix(tail, ".sh") {
		return ""
	}
	for _, p := range []string{filepath.Join(sc.dir, tail), filepath.Join(w.root, tail)} {
		if isFile(p) {
			return p
		}
	}
	var match string
	for _, p := range w.scripts {
		if strings.HasSuffix(p, tail) {
			if match != "" {
				return "" // ambiguous
			}
			match = p
		}
	}
	return match
}

func (w *walker) inRepo(path string) (string, bool) {
	rel, err := filepath.Rel(w.root, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return rel, true
}

func (w *walker) rel(path string) string {
	if rel, ok := w.inRepo(path); ok {
		return rel
	}
	return path
}

// lit is the word's value when it is fully literal (quotes allowed, no expansions).
func lit(word *syntax.Word) (string, bool) {
	var b strings.Builder
	var add func(parts []syntax.WordPart) bool
	add = func(parts []syntax.WordPart) bool {
		for _, p := range parts {
			switch p := p.(type) {
			case *syntax.Lit:
				b.WriteString(p.Value)
			case *syntax.SglQuoted:
				b.WriteString(p.Value)
			case *syntax.DblQuoted:
				if !add(p.Parts) {
					return false
				}
			default:
				return false
			}
		}
		return true
	}
	if !add(word.Parts) {
		return "", false
	}
	return b.String(), true
}

func litIs(word *syntax.Word, s string) bool {
	v, ok := lit(word)
	return ok && v == s
}

// literalTail is the literal text after the word's last expansion.
func literalTail(word *syntax.Word) string {
	var b strings.Builder
	var add func(parts []syntax.WordPart)
	add = func(parts []syntax.WordPart) {
		for _, p := range parts {
			switch p := p.(type) {
			case *syntax.Lit:
				b.WriteString(p.Value)
			case *syntax.SglQuoted:
				b.WriteString(p.Value)
			case *syntax.DblQuoted:
				add(p.Parts)
			default:
				b.Reset()
			}
		}
	}
	add(word.Parts)
	return b.String()
}

// skipOptions drops a wrapper's leading options (and "--"), leaving the command it runs.
func skipOptions(wrapper string, args []*syntax.Word) []*syntax.Word {
	withValue := map[string]map[string]bool{
		"xargs":   set("-I", "-n", "-P", "-d", "-a", "-E", "-L", "-s"),
		"timeout": set("-s", "-k", "--signal", "--kill-after"),
		"nsenter": set("-t", "--target"),
		"unshare": set("--propagation", "--setgroups", "--map-user", "--map-group", "-S", "-G", "-R", "-w", "--root", "--wd"),
		"env":     set("-u", "-C", "--unset", "--chdir"),
		"sudo":    set("-u", "-g"),
		"nice":    set("-n"),
	}[wrapper]
	for len(args) > 0 {
		a, ok := lit(args[0])
		if !ok {
			return args
		}
		switch {
		case a == "--":
			return args[1:]
		case wrapper == "env" && strings.Contains(a, "=") && !strings.HasPrefix(a, "-"):
			args = args[1:]
		case strings.HasPrefix(a, "-"):
			args = args[1:]
			if withValue[a] && len(args) > 0 {
				args = args[1:]
			}
		default:
			return args
		}
	}
	return args
}

func isShellScript(path string) bool {
	if strings.HasSuffix(path, ".sh") {
		return true
	}
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, 64)
	n, _ := f.Read(head)
	first, _, _ := strings.Cut(string(head[:n]), "\n")
	return strings.HasPrefix(first, "#!") && (strings.HasSuffix(first, "sh") || strings.HasSuffix(first, "bash"))
}

func abs(dir, p string) string {
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(dir, p)
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

func set(xs ...string) map[string]bool {
	m := make(map[string]bool, len(xs))
	for _, x := range xs {
		m[x] = true
	}
	return m
}
