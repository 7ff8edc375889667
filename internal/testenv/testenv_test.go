package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The decisions are checked in a child test process, where a skip and a failure can be told
// apart by the exit status and output.
func TestDecisions(t *testing.T) {
	if name := os.Getenv("TESTENV_CHILD"); name != "" {
		switch name {
		case "missing":
			Missing(t, "no %s here", "frobnicator")
		case "command":
			Command(t, "kubevisor-no-such-command", "no-such-package")
		case "heavy":
			Heavy(t, "a real API server")
		}
		return
	}
	for _, tc := range []struct {
		child, ci string
		short     bool
		fail      bool
		want      string
	}{
		{child: "missing", ci: "", want: "--- SKIP"},
		{child: "missing", ci: "true", fail: true, want: "CI=true, and this test cannot run: no frobnicator here"},
		{child: "command", ci: "true", fail: true, want: "kubevisor-no-such-command not found: install Debian's no-such-package"},
		{child: "command", ci: "true", short: true, want: "-short: needs kubevisor-no-such-command"},
		{child: "heavy", ci: "true", short: true, want: "-short: needs a real API server"},
		{child: "heavy", ci: "true", want: "--- PASS"},
	} {
		args := []string{"-test.run=^TestDecisions$", "-test.v"}
		if tc.short {
			args = append(args, "-test.short")
		}
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), "TESTENV_CHILD="+tc.child, "CI="+tc.ci)
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != tc.fail || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s (CI=%q short=%v): failed=%v, want failed=%v and output with %q; output:\n%s",
				tc.child, tc.ci, tc.short, failed, tc.fail, tc.want, out)
		}
	}
}
