package handler

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// TestAccessCredentialsAndHostnameInGuest boots the test guest through the qmp and local
// driver plugins (TCG) with a cloud-config that has one key of its own and two access
// credentials' Secrets with three more keys: the guest reports four authorized keys, and its
// hostname is the VMI's spec.hostname (cloud-init meta-data local-hostname), which a command run
// through the guest agent (the exec probes' way) prints too.
func TestAccessCredentialsAndHostnameInGuest(t *testing.T) {
	e, cmdline := newQMPGuestEnv(t)
	e.opts.Resolver = secretResolver{
		MapResolver: MapResolver{Images: e.cfg.Images},
		secrets: map[string]map[string][]byte{
			"alice": {"key": []byte(keyA + "\n")},
			"team":  {"b": []byte(keyB), "c": []byte("# carol\n" + keyC + "\n")},
		},
	}
	h := e.start()

	vmi := guestVMI("ssh-guest", types.UID("00000000-0000-4000-8000-0000000000a1"), cmdline)
	vmi.Spec.Hostname = "db-0"
	vmi.Spec.Volumes[0].CloudInitNoCloud.UserData = "#cloud-config\nssh_authorized_keys:\n  - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIZ own@example\n"
	vmi.Spec.AccessCredentials = []v1alpha1.AccessCredential{sshCredential("alice", false), sshCredential("team", false)}
	mustRun(t, h, vmi)
	c := attach(t, h, vmi.UID)
	eventually(t, "the guest boots", 3*time.Minute, func() error {
		if c.count(guestReady) == 0 {
			return fmt.Errorf("no %s on the console yet", guestReady)
		}
		return nil
	})
	if c.count("KUBEVISOR-SSH: 4 authorized keys") != 1 {
		c.mu.Lock()
		out := c.out.String()
		c.mu.Unlock()
		t.Fatalf("want KUBEVISOR-SSH: 4 authorized keys (one of the user data, three of the Secrets) on the console:\n%s", out)
	}
	if _, err := io.WriteString(c.in, "\necho kv-host-$(hostname)-end\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the guest answers with its hostname", time.Minute, func() error {
		if c.count("kv-host-db-0-end") == 0 {
			return fmt.Errorf("no kv-host-db-0-end on the console")
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The probes' way into the guest (exec, guestAgentPing): through the qmp plugin's guest agent,
	// the command runs in this guest.
	eventually(t, "the guest agent answers a ping", time.Minute, func() error {
		p, err := h.GuestAgentPing(ctx, vmi.UID)
		if err != nil || !p.GetConnected() {
			return fmt.Errorf("GuestAgentPing = %v, %v", p, err)
		}
		return nil
	})
	if r, err := h.GuestAgentExec(ctx, vmi.UID, []string{"hostname"}, 20*time.Second); err != nil || !r.GetExited() || r.GetExitCode() != 0 || string(r.GetStdout()) != "db-0\n" {
		t.Errorf("GuestAgentExec hostname = %v, %v; want status 0 and db-0", r, err)
	}
	if r, err := h.GuestAgentExec(ctx, vmi.UID, []string{"false"}, 20*time.Second); err != nil || !r.GetExited() || r.GetExitCode() != 1 {
		t.Errorf("GuestAgentExec false = %v, %v; want status 1", r, err)
	}
	if final, err := h.Stop(ctx, vmi, 30*time.Second); err != nil || final.Phase != v1alpha1.Succeeded {
		t.Errorf("Stop = %s, %v", final.Phase, err)
	}
	requireNothingLeft(t, h, vmi.UID)
}
