package cmd

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/envtest"
	"github.com/kubevisor/kubevisor/internal/syncbuf"
)

// writeKubeconfig writes a kubeconfig of cfg (its impersonation included) for namespace ns.
func writeKubeconfig(t *testing.T, cfg *rest.Config, ns string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData,
		Token: cfg.BearerToken, Impersonate: cfg.Impersonate.UserName}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "user", Namespace: ns}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestMigrateCommands runs vmctl migrate and migrate-cancel against a real API server, as a
// user with the kubevisor.io:migrate role's rights only; the test plays the migration
// controller by writing the migrations' status.
func TestMigrateCommands(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	user := env.ImpersonateWithMarkers(t, "migrator", filepath.Join(envtest.RepoRoot(), "controlplane", "rbac", "migrate", "migrate.go"))
	kubeconfig := writeKubeconfig(t, user, "default")
	c := env.Client
	defer func(d time.Duration) { migrationPoll = d }(migrationPoll)
	migrationPoll = 50 * time.Millisecond

	run := func(ctx context.Context, args ...string) (string, error) {
		var out syncbuf.Buffer
		err := Execute(ctx, "vmctl", append([]string{"--kubeconfig", kubeconfig}, args...),
			IOStreams{In: bytes.NewReader(nil), Out: &out, ErrOut: io.Discard})
		return out.String(), err
	}
	migrationsOf := func(vmi string) []v1alpha1.VirtualMachineInstanceMigration {
		var list v1alpha1.VirtualMachineInstanceMigrationList
		if err := c.List(context.Background(), &list, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		var out []v1alpha1.VirtualMachineInstanceMigration
		for _, m := range list.Items {
			if m.Spec.VMIName == vmi {
				out = append(out, m)
			}
		}
		return out
	}
	setStatus := func(m *v1alpha1.VirtualMachineInstanceMigration, st v1alpha1.VirtualMachineInstanceMigrationStatus) {
		t.Helper()
		cur := &v1alpha1.VirtualMachineInstanceMigration{}
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(m), cur); err != nil {
			t.Fatal(err)
		}
		cur.Status = st
		if err := c.Status().Update(context.Background(), cur); err != nil {
			t.Fatal(err)
		}
	}
	// waitCreated waits for the one migration of vmi that --wait follows.
	waitCreated := func(vmi string) *v1alpha1.VirtualMachineInstanceMigration {
		t.Helper()
		waitFor(t, "the migration of "+vmi, func() bool { return len(migrationsOf(vmi)) == 1 })
		return &migrationsOf(vmi)[0]
	}
	type result struct {
		out string
		err error
	}
	background := func(args ...string) chan result {
		done := make(chan result, 1)
		go func() {
			out, err := run(testContext(t), args...)
			done <- result{out, err}
		}()
		return done
	}

	t.Run("migrate creates a migration and prints its name", func(t *testing.T) {
		out, err := run(testContext(t), "migrate", "vm/web")
		if err != nil {
			t.Fatal(err)
		}
		got := migrationsOf("web")
		if len(got) != 1 || !strings.HasPrefix(got[0].Name, "web-migration-") {
			t.Fatalf("migrations of web: %+v", got)
		}
		if want := "migration " + got[0].Name + " of VMI web created\n"; out != want {
			t.Errorf("output %q, want %q", out, want)
		}
		if out, err := run(testContext(t), "migrate", "web", "--dry-run"); err != nil || !strings.Contains(out, "dry run") || len(migrationsOf("web")) != 1 {
			t.Errorf("--dry-run: %q, %v, %d migrations", out, err, len(migrationsOf("web")))
		}
	})

	t.Run("migrate --wait follows the phases to Succeeded", func(t *testing.T) {
		done := background("migrate", "ok", "--wait")
		m := waitCreated("ok")
		time.Sleep(200 * time.Millisecond)
		setStatus(m, v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: v1alpha1.MigrationScheduling})
		time.Sleep(200 * time.Millisecond)
		state := &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: "node-1", TargetNode: "node-2", Mode: v1alpha1.MigrationPreCopy}
		setStatus(m, v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: v1alpha1.MigrationRunning, MigrationState: state})
		time.Sleep(200 * time.Millisecond)
		state.Completed = true
		setStatus(m, v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: v1alpha1.MigrationSucceeded, MigrationState: state})
		r := <-done
		if r.err != nil {
			t.Fatalf("migrate --wait: %v (output %q)", r.err, r.out)
		}
		for _, want := range []string{
			"migration " + m.Name + " of VMI ok created",
			"migration " + m.Name + ": Scheduling\n",
			"migration " + m.Name + ": Running, node-1 -> node-2, mode PreCopy\n",
			"migration " + m.Name + " succeeded: VMI ok runs on node node-2\n",
		} {
			if !strings.Contains(r.out, want) {
				t.Errorf("output lacks %q:\n%s", want, r.out)
			}
		}
	})

	t.Run("migrate --wait exits with the failure's reason", func(t *testing.T) {
		done := background("migrate", "bad", "--wait")
		m := waitCreated("bad")
		setStatus(m, v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: v1alpha1.MigrationFailed,
			MigrationState: &v1alpha1.VirtualMachineInstanceMigrationState{Failed: true, FailureReason: "NotLiveMigratable: VMI is not LiveMigratable (DisksNotLiveMigratable: ...)"}})
		r := <-done
		if r.err == nil || !strings.Contains(r.err.Error(), "migration "+m.Name+" of VMI bad failed: NotLiveMigratable") {
			t.Fatalf("migrate --wait of a failing migration: %v", r.err)
		}
	})

	t.Run("migrate-cancel deletes the unfinished migration; --wait says so", func(t *testing.T) {
		done := background("migrate", "gone", "--wait")
		m := waitCreated("gone")
		setStatus(m, v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: v1alpha1.MigrationRunning})
		// A finished migration of the same VMI is left alone.
		old := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "gone-old", Namespace: "default"},
			Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "gone"}}
		if err := c.Create(context.Background(), old); err != nil {
			t.Fatal(err)
		}
		setStatus(old, v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: v1alpha1.MigrationSucceeded})
		out, err := run(testContext(t), "migrate-cancel", "gone")
		if err != nil || out != "migration "+m.Name+" of VMI gone cancelled\n" {
			t.Fatalf("migrate-cancel: %q, %v", out, err)
		}
		if got := migrationsOf("gone"); len(got) != 1 || got[0].Name != "gone-old" {
			t.Errorf("migrations after cancel: %d", len(got))
		}
		r := <-done
		if r.err == nil || !strings.Contains(r.err.Error(), "deleted (cancelled)") {
			t.Errorf("migrate --wait of a cancelled migration: %v", r.err)
		}
		_, err = run(testContext(t), "migrate-cancel", "gone")
		if err == nil || !strings.Contains(err.Error(), "VMI gone in namespace default has no unfinished migration to cancel") {
			t.Errorf("migrate-cancel with none: %v", err)
		}
	})
}
