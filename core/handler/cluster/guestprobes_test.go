package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler/cluster/guestprobe"
	"github.com/kubevisor/kubevisor/core/layout"
)

// TestProbeChecksAllowOnlyTheVMIsProbes: the guest probe socket answers a ping only for a VMI
// with a guestAgentPing probe and runs only the exact commands of its exec probes.
func TestProbeChecksAllowOnlyTheVMIsProbes(t *testing.T) {
	exec := func(cmd ...string) *v1alpha1.Probe {
		return &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{Exec: &corev1.ExecAction{Command: cmd}}}
	}
	ping := &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{GuestAgentPing: &v1alpha1.GuestAgentPing{}}}
	tcp := &v1alpha1.Probe{ProbeHandler: v1alpha1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{}}}
	for _, tc := range []struct {
		name      string
		liveness  *v1alpha1.Probe
		readiness *v1alpha1.Probe
		req       guestprobe.Request
		refused   string // "" allowed, else part of the reason
	}{
		{"ping with a ping probe", nil, ping, guestprobe.Request{Ping: true}, ""},
		{"ping with exec probes only", exec("true"), tcp, guestprobe.Request{Ping: true}, "no guestAgentPing probe"},
		{"the liveness command", exec("cat", "/proc/uptime"), ping, guestprobe.Request{Command: []string{"cat", "/proc/uptime"}}, ""},
		{"the readiness command", exec("true"), exec("test", "-f", "/ready"), guestprobe.Request{Command: []string{"test", "-f", "/ready"}}, ""},
		{"another argument", exec("cat", "/proc/uptime"), nil, guestprobe.Request{Command: []string{"cat", "/etc/shadow"}}, "is not the exec command"},
		{"a prefix of the command", exec("cat", "/proc/uptime"), nil, guestprobe.Request{Command: []string{"cat"}}, "is not the exec command"},
		{"no probes", nil, nil, guestprobe.Request{Command: []string{"true"}}, "is not the exec command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why := checksOf(tc.liveness, tc.readiness).allows(tc.req)
			switch {
			case tc.refused == "" && why != "":
				t.Errorf("refused: %s", why)
			case tc.refused != "" && !strings.Contains(why, tc.refused):
				t.Errorf("reason %q, want one with %q", why, tc.refused)
			}
		})
	}
}

// TestGuestProbeSocketLabelled: the socket's directory, with the socket, is labelled with the
// VMI's SELinux level once it serves; a label that cannot be set serves nothing.
func TestGuestProbeSocketLabelled(t *testing.T) {
	root, err := os.MkdirTemp("/tmp", "kvgp-") // short: a unix socket's path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	uid := types.UID("u1")
	if err := os.MkdirAll(layout.LauncherDir(root, uid), 0o700); err != nil {
		t.Fatal(err)
	}
	g := newGuestProbes(nil, root, testr.New(t))
	var got []string
	g.label = func(u types.UID, p string, recurse bool) error {
		if _, err := os.Stat(filepath.Join(p, layout.GuestProbeSocketName)); err != nil {
			t.Errorf("labelled before the socket was made: %v", err)
		}
		got = append(got, fmt.Sprintf("%s %s %v", u, p, recurse))
		return nil
	}
	if err := g.ensure(uid, probeChecks{ping: true}); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%s %s true", uid, layout.GuestProbeDir(root, uid)); len(got) != 1 || got[0] != want {
		t.Errorf("labelled %v, want [%s]", got, want)
	}
	g.stop(uid)

	g.label = func(types.UID, string, bool) error { return errors.New("lsetxattr: operation not supported") }
	if err := g.ensure(uid, probeChecks{ping: true}); err == nil || !strings.Contains(err.Error(), "operation not supported") {
		t.Errorf("ensure with a failing label: %v", err)
	}
	if len(g.servers) != 0 {
		t.Error("a socket is served whose label failed")
	}
	g.close()
}
