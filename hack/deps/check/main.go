// Command check verifies that every make target installs what it uses, so that any target
// works first on a fresh machine (Debian's required packages, Go, gcc, git, make, kubectl), in
// any order.
//
// For each target of the Makefile's help list it takes what `make -n` prints (the target's
// recipe and its prerequisites', sub-makes included), follows it into the repository scripts
// it runs or sources, and into the Go programs it runs (go test, go run, the binaries of cmd/),
// collecting every external command called. A command must be on a fresh machine or be
// provided by a package of a set (hack/deps/packages.txt) that the target installs through a
// `deps-<set>` prerequisite. It also checks the sets' command lists against dpkg for the
// packages installed here. `make verify` runs it; see hack/deps/packages.txt.
//
//	go run ./hack/deps/check [-root DIR] [-v] [TARGET...]
//	go run ./hack/deps/check -print-base
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

func main() {
	root := flag.String("root", ".", "repository root (Makefile, hack/deps/packages.txt)")
	verbose := flag.Bool("v", false, "print the commands and sets of every target")
	printBase := flag.Bool("print-base", false, "print the paths of a fresh machine's commands (for a PATH that has nothing else) and exit")
	flag.Parse()
	if *printBase {
		os.Exit(printBaseCommands())
	}
	os.Exit(run(*root, flag.Args(), *verbose))
}

func run(root string, targets []string, verbose bool) int {
	root, err := filepath.Abs(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "deps check:", err)
		return 2
	}
	r, err := Check(root, targets)
	if err != nil {
		fmt.Fprintln(os.Stderr, "deps check:", err)
		return 2
	}
	for _, t := range r.Targets {
		if verbose || len(t.Missing) > 0 {
			fmt.Printf("%-28s sets [%s]; %d commands: %s\n", t.Name, strings.Join(t.Sets, " "), len(t.Commands), strings.Join(t.Commands, " "))
		}
		for _, m := range t.Missing {
			fmt.Printf("  MISSING %s\n", m)
		}
	}
	for _, p := range r.Declared {
		fmt.Println("  WRONG", p)
	}
	if len(r.Unchecked) > 0 && verbose {
		fmt.Printf("not installed here, so their command lists are unchecked: %s\n", strings.Join(r.Unchecked, " "))
	}
	if r.Failed() {
		fmt.Println("deps check: FAILED: a target calls a command that a fresh machine lacks and no deps set of the target installs (hack/deps/packages.txt)")
		return 1
	}
	fmt.Printf("deps check: %d targets install what they use (hack/deps/packages.txt)\n", len(r.Targets))
	return 0
}

// printBaseCommands prints the path of every command of a fresh machine found on the PATH, one
// a line, so that a PATH of links to them alone stands in for a fresh machine.
func printBaseCommands() int {
	base, err := BaseCommands()
	if err != nil {
		fmt.Fprintln(os.Stderr, "deps check:", err)
		return 2
	}
	var names []string
	for c := range base {
		names = append(names, c)
	}
	sort.Strings(names)
	for _, c := range names {
		if p, err := exec.LookPath(c); err == nil {
			fmt.Println(p)
		}
	}
	return 0
}

// Report is the result of Check.
type Report struct {
	Targets   []TargetReport
	Declared  []string // packages.txt lines that dpkg contradicts
	Unchecked []string // packages not installed here
}

// Failed says whether any target misses a command or a declaration is wrong.
func (r *Report) Failed() bool {
	for _, t := range r.Targets {
		if len(t.Missing) > 0 {
			return true
		}
	}
	return len(r.Declared) > 0
}

// TargetReport is what one target uses and lacks.
type TargetReport struct {
	Name     string
	Sets     []string
	Commands []string // external commands that are not on a fresh machine, sorted
	Missing  []string // "cmd (where): hint"
}

// Check checks targets (all of the Makefile's help targets when empty).
func Check(root string, targets []string) (*Report, error) {
	entries, err := LoadSets(filepath.Join(root, "hack/deps/packages.txt"))
	if err != nil {
		return nil, err
	}
	base, err := BaseCommands()
	if err != nil {
		return nil, err
	}
	provides := map[string][]Entry{} // command → entries that provide it
	for _, e := range entries {
		for _, c := range e.Commands {
			provides[c] = append(provides[c], e)
		}
	}
	if len(targets) == 0 {
		if targets, err = helpTargets(filepath.Join(root, "Makefile")); err != nil {
			return nil, err
		}
	}
	r := &Report{}
	if r.Declared, r.Unchecked, err = CheckDeclared(entries); err != nil {
		return nil, err
	}
	g := newGoScanner(root)
	for _, t := range targets {
		tr, err := checkTarget(root, t, base, provides, entries, g)
		if err != nil {
			return nil, fmt.Errorf("target %s: %w", t, err)
		}
		r.Targets = append(r.Targets, *tr)
	}
	return r, nil
}

func checkTarget(root, target string, base map[string]bool, provides map[string][]Entry, entries []Entry, g *goScanner) (*TargetReport, error) {
	out, err := makeDryRun(root, target)
	if err != nil {
		return nil, err
	}
	w := newWalker(root)
	w.recipe(out)
	if len(w.errs) > 0 {
		return nil, w.errs[0]
	}
	uses := w.uses
	for _, run := range w.goRuns {
		u, err := g.uses(run)
		if err != nil {
			return nil, err
		}
		uses = append(uses, u...)
	}
	tr := &TargetReport{Name: target}
	for s := range w.sets {
		tr.Sets = append(tr.Sets, s)
	}
	sort.Strings(tr.Sets)
	installed := map[string]bool{}
	for _, e := range entries {
		if w.sets[e.Set] {
			for _, c := range e.Commands {
				installed[c] = true
			}
		}
	}
	first := map[string]Use{}
	for _, u := range uses {
		if base[u.Command] || isDir(filepath.Join(root, "cmd", u.Command)) {
			continue // on a fresh machine, or a binary of this repository (cmd/<name>)
		}
		if _, ok := first[u.Command]; !ok {
			first[u.Command] = u
			tr.Commands = append(tr.Commands, u.Command)
		}
	}
	sort.Strings(tr.Commands)
	for _, c := range tr.Commands {
		if installed[c] {
			continue
		}
		hint := "no set provides it: add its Debian package to hack/deps/packages.txt"
		if es := provides[c]; len(es) > 0 {
			var alts []string
			for _, e := range es {
				alts = append(alts, fmt.Sprintf("deps-%s (%s)", e.Set, e.Package))
			}
			hint = "make the target depend on " + strings.Join(alts, " or ")
		}
		tr.Missing = append(tr.Missing, fmt.Sprintf("%s (called at %s): %s", c, first[c].Where, hint))
	}
	return tr, nil
}

// makeDryRun is what `make -n` prints for a target: the commands of its recipe and of its
// prerequisites', as make would run them on this tree (-B: as if nothing were built yet).
func makeDryRun(root, target string) ([]byte, error) {
	cmd := exec.Command("make", "-n", "-B", "--no-print-directory", "-C", root, target)
	cmd.Env = cleanEnv()
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		return nil, fmt.Errorf("make -n %s: %w: %s", target, err, msg)
	}
	return out, nil
}

// cleanEnv is the environment without what a calling make or the user's cluster would add.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "KUBECONFIG":
			continue
		}
		env = append(env, kv)
	}
	return env
}

var helpLine = regexp.MustCompile(`^([a-z0-9-]+):.*## `)

// helpTargets are the Makefile's documented targets (those `make help` lists).
func helpTargets(makefile string) ([]string, error) {
	f, err := os.Open(makefile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var targets []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := helpLine.FindStringSubmatch(sc.Text()); m != nil {
			targets = append(targets, m[1])
		}
	}
	return targets, sc.Err()
}
