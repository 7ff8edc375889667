package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Entry is one line of hack/deps/packages.txt: a Debian package in a set and the commands it
// provides.
type Entry struct {
	Set, Package string
	Commands     []string
	Line         int
}

// LoadSets reads hack/deps/packages.txt.
func LoadSets(path string) ([]Entry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var entries []Entry
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			return nil, fmt.Errorf("%s:%d: want \"set package commands...\" (\"-\" for none), got %q", path, n, line)
		}
		e := Entry{Set: f[0], Package: f[1], Line: n}
		if !(len(f) == 3 && f[2] == "-") {
			e.Commands = f[2:]
		}
		entries = append(entries, e)
	}
	return entries, sc.Err()
}

// Toolchain is what a fresh machine has beyond Debian's required packages.
var Toolchain = []string{"go", "gofmt", "gcc", "cc", "git", "make", "kubectl"}

var binDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// BaseCommands are the commands of a fresh machine: every command on the PATH that belongs to
// an installed package of Debian priority "required" (what debootstrap's minbase installs) or
// an Essential one, alternatives (awk → mawk) followed, plus the toolchain.
func BaseCommands() (map[string]bool, error) {
	out, err := exec.Command("dpkg-query", "-W", "-f=${Package}\t${Priority}\t${Essential}\t${db:Status-Status}\n").Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg-query: %w", err)
	}
	var base []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, "\t")
		if len(f) == 4 && f[3] == "installed" && (f[1] == "required" || f[2] == "yes") {
			base = append(base, f[0])
		}
	}
	files, err := packageFiles(base)
	if err != nil {
		return nil, err
	}
	cmds := commandsOf(files)
	for _, t := range Toolchain {
		cmds[t] = true
	}
	return cmds, nil
}

// packageFiles lists the files of installed packages (dpkg -L), as a set.
func packageFiles(pkgs []string) (map[string]bool, error) {
	files := map[string]bool{}
	if len(pkgs) == 0 {
		return files, nil
	}
	out, err := exec.Command("dpkg", append([]string{"-L"}, pkgs...)...).Output()
	if err != nil && len(out) == 0 {
		return nil, fmt.Errorf("dpkg -L %s: %w", strings.Join(pkgs, " "), err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "/") {
			files[l] = true
		}
	}
	return files, nil
}

// commandsOf names the PATH commands that are (or resolve to) one of files. Debian's merged
// /usr makes /bin/x and /usr/bin/x the same file, and dpkg lists either.
func commandsOf(files map[string]bool) map[string]bool {
	cmds := map[string]bool{}
	owned := func(p string) bool {
		if files[p] {
			return true
		}
		for _, alt := range []string{strings.TrimPrefix(p, "/usr"), "/usr" + p} {
			if files[alt] {
				return true
			}
		}
		return false
	}
	for _, d := range binDirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range entries {
			p := filepath.Join(d, e.Name())
			if owned(p) {
				cmds[e.Name()] = true
				continue
			}
			if real, err := filepath.EvalSymlinks(p); err == nil && owned(real) {
				cmds[e.Name()] = true
			}
		}
	}
	return cmds
}

// CheckDeclared compares the commands packages.txt declares with what the installed packages
// really provide. Packages not installed here cannot be checked; their names are returned.
func CheckDeclared(entries []Entry) (problems []string, unchecked []string, err error) {
	for _, e := range entries {
		out, _ := exec.Command("dpkg-query", "-W", "-f=${db:Status-Status}", e.Package).Output()
		if string(out) != "installed" {
			unchecked = append(unchecked, e.Package)
			continue
		}
		files, err := packageFiles([]string{e.Package})
		if err != nil {
			return nil, nil, err
		}
		have := commandsOf(files)
		for _, c := range e.Commands {
			if !have[c] {
				var list []string
				for h := range have {
					list = append(list, h)
				}
				sort.Strings(list)
				problems = append(problems, fmt.Sprintf("packages.txt:%d: package %s provides no command %q on the PATH (it has: %s)",
					e.Line, e.Package, c, strings.Join(list, " ")))
			}
		}
	}
	return problems, unchecked, nil
}
