// Package testenv decides what a test does when the machine lacks what it needs. Under
// `go test -short` (make unit) a test that needs root, QEMU, a network namespace, a built test
// guest or a real API server is skipped. Otherwise a missing need skips the test on a
// developer's machine and fails it under CI=true, so that a green CI means those tests ran.
// The one documented exception is KVM, which CI machines have but cannot use: tests that need a
// working KVM skip everywhere.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// CI reports whether the tests run under CI (CI=true), where a missing need is a failure.
func CI() bool { return os.Getenv("CI") == "true" }

// Heavy marks a test that needs more than the Go toolchain (root, QEMU, a network namespace, a
// built guest, a real API server): `go test -short` skips it, naming what it needs.
func Heavy(t testing.TB, needs string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: needs %s", needs)
	}
}

// Missing reports that the machine lacks what the test needs: under CI=true the test fails,
// elsewhere it is skipped. The message says what is missing and how to get it.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if CI() {
		t.Fatalf("CI=true, and this test cannot run: "+format, args...)
	}
	t.Skipf(format, args...)
}

// Root requires root (why says what for). It is Heavy.
func Root(t testing.TB, why string) {
	t.Helper()
	Heavy(t, "root ("+why+")")
	if os.Geteuid() != 0 {
		Missing(t, "needs root: %s", why)
	}
}

// Command requires an external command and returns its path; pkg is the Debian package that
// has it (the Makefile's deps sets install it). It is Heavy.
func Command(t testing.TB, name, pkg string) string {
	t.Helper()
	Heavy(t, name)
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "%s not found: install Debian's %s (make deps): %v", name, pkg, err)
	}
	return p
}

// File requires a file that a make target builds (the test guest, the CNI plugins), named by
// target for the message. It is Heavy.
func File(t testing.TB, path, target string) {
	t.Helper()
	Heavy(t, path)
	if _, err := os.Stat(path); err != nil {
		Missing(t, "%s is missing: run make %s (%v)", path, target, err)
	}
}
