package e2e

import (
	"strings"
	"testing"
)

func TestParsePluginKill(t *testing.T) {
	out := "before kubevisor-driver-cni 20\nbefore kubevisor-driver-libvirt 21\nbefore kubevisor-driver-qmp 22\n" +
		"parent kubevisor-handler 7\nsignalled kubevisor-driver-qmp 22 SIGKILL\nrestarted kubevisor-driver-qmp 99\n" +
		"after kubevisor-driver-cni 20\nafter kubevisor-driver-libvirt 21\nafter kubevisor-driver-qmp 99\n"
	k, err := parsePluginKill(out)
	if err != nil {
		t.Fatal(err)
	}
	if k.handlerPID != 7 || k.killed != 22 || k.restarted != 99 {
		t.Errorf("handler %d killed %d restarted %d, want 7 22 99", k.handlerPID, k.killed, k.restarted)
	}
	if k.before["kubevisor-driver-libvirt"] != 21 || k.after["kubevisor-driver-qmp"] != 99 || len(k.before) != 3 || len(k.after) != 3 {
		t.Errorf("before %v after %v", k.before, k.after)
	}
	for _, bad := range []string{
		"before kubevisor-driver-qmp 22\nparent kubevisor-handler 7\nsignalled kubevisor-driver-qmp 22 SIGKILL\n", // no restart
		"parent kubevisor-handler 7\nsignalled kubevisor-driver-qmp x SIGKILL\nrestarted kubevisor-driver-qmp 9\n",
	} {
		if _, err := parsePluginKill(bad); err == nil {
			t.Errorf("parsePluginKill(%q) = nil error", bad)
		} else if !strings.Contains(err.Error(), "e2e-signal") && !strings.Contains(err.Error(), "pid") {
			t.Errorf("parsePluginKill(%q): %v", bad, err)
		}
	}
}
