// Package testbin builds the repository's commands for tests that run them as real processes
// (plugin binaries, the launcher), once per test binary.
package testbin

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// GoTool is the go command running the tests: the one on PATH, else the one in $GOROOT.
func GoTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(os.Getenv("GOROOT"), "bin", "go")
}

// Build builds the packages (import paths of main packages) into dir, each binary named after
// its package's last path element; race builds them with the race detector. The error carries
// the compiler's output.
func Build(dir string, race bool, pkgs ...string) error {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if race {
		args = append(args, "-race")
	}
	out, err := exec.Command(GoTool(), append(args, pkgs...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build %v: %w\n%s", pkgs, err, out)
	}
	return nil
}

// FuzzOnly reports whether this test binary runs fuzz targets alone: it is a fuzzing worker
// (-test.fuzzworker), or its -test.run pattern is one alternative starting with "^Fuzz" (go
// test -run '^FuzzX$' [-fuzz FuzzX]). A TestMain that builds binaries for its package's tests
// skips that then: fuzz targets need none, and fuzzing runs TestMain again in every worker.
// flag.Parse must have been called.
func FuzzOnly() bool {
	if f := flag.Lookup("test.fuzzworker"); f != nil && f.Value.String() == "true" {
		return true
	}
	f := flag.Lookup("test.run")
	return f != nil && strings.HasPrefix(f.Value.String(), "^Fuzz") && !strings.Contains(f.Value.String(), "|")
}
