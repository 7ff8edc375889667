package cmd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubevisor/kubevisor/cli/vmctl/client"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// migrationPoll is how often migrate --wait reads the migration.
var migrationPoll = time.Second

// newMigrateCommand is vmctl migrate: it creates a VirtualMachineInstanceMigration of the VMI
// and, with --wait, follows it to its end.
func newMigrateCommand(o *options) *cobra.Command {
	var (
		wait    bool
		dryRun  bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "migrate NAME",
		Short: "Live-migrate a VMI (a VM's, of the same name) to another node",
		Long: "Create a VirtualMachineInstanceMigration of the VMI NAME (vm/NAME and vmi/NAME name the same VMI)\n" +
			"and print its name. With --wait, print a line at each change of its phase until it succeeds or\n" +
			"fails; a failed migration exits non-zero with its reason.",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: o.completeNames("virtualmachineinstances"),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, name, err := parseTarget(args[0])
			if err != nil {
				return err
			}
			c, err := o.Client()
			if err != nil {
				return err
			}
			ctx := cmdContext(cmd)
			m := &v1alpha1.VirtualMachineInstanceMigration{
				ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-migration-", Namespace: c.Namespace},
				Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: name},
			}
			created, err := c.CreateMigration(ctx, m, dryRun)
			if err != nil {
				return c.Explain(ctx, err, client.Action{Command: o.command, Verb: "create a migration of", Resource: "virtualmachineinstances", Name: name, Namespace: c.Namespace})
			}
			if dryRun {
				fmt.Fprintf(o.streams.Out, "migration of VMI %s validated (dry run)\n", name)
				return nil
			}
			fmt.Fprintf(o.streams.Out, "migration %s of VMI %s created\n", created.Name, name)
			if !wait {
				return nil
			}
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			return o.followMigration(ctx, c, created)
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "Follow the migration until it succeeds or fails")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "With --wait, give up waiting after this long (0: no limit); the migration goes on")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "Validate the migration without creating it")
	return cmd
}

// followMigration prints a progress line at each change of m's phase until it ends; it returns
// an error saying why when m failed, was deleted, or ctx ended first.
func (o *options) followMigration(ctx context.Context, c *client.Client, m *v1alpha1.VirtualMachineInstanceMigration) error {
	start := time.Now()
	last := ""
	for {
		cur, err := c.Migration(ctx, m.Name)
		switch {
		case apierrors.IsNotFound(err):
			return fmt.Errorf("migration %s was deleted (cancelled) before it finished", m.Name)
		case err != nil && ctx.Err() != nil:
			return fmt.Errorf("stopped waiting for migration %s (%s): %w; it goes on", m.Name, last, ctx.Err())
		case err != nil:
			return fmt.Errorf("read migration %s: %w", m.Name, err)
		case cur.UID != m.UID:
			return fmt.Errorf("migration %s was replaced by another of the same name", m.Name)
		}
		if line := progressLine(cur, time.Since(start)); line != last {
			fmt.Fprintf(o.streams.Out, "migration %s: %s\n", m.Name, line)
			last = line
		}
		switch cur.Status.Phase {
		case v1alpha1.MigrationSucceeded:
			where := ""
			if s := cur.Status.MigrationState; s != nil && s.TargetNode != "" {
				where = " on node " + s.TargetNode
			}
			fmt.Fprintf(o.streams.Out, "migration %s succeeded: VMI %s runs%s\n", m.Name, m.Spec.VMIName, where)
			return nil
		case v1alpha1.MigrationFailed:
			return fmt.Errorf("migration %s of VMI %s failed: %s", m.Name, m.Spec.VMIName, failureReason(cur))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped waiting for migration %s (%s): %w; it goes on", m.Name, last, ctx.Err())
		case <-time.After(migrationPoll):
		}
	}
}

// progressLine is the phase of m and what its state says of the move.
func progressLine(m *v1alpha1.VirtualMachineInstanceMigration, _ time.Duration) string {
	phase := string(m.Status.Phase)
	if phase == "" {
		phase = "waiting for the controller"
	}
	parts := []string{phase}
	if s := m.Status.MigrationState; s != nil {
		switch {
		case s.SourceNode != "" && s.TargetNode != "":
			parts = append(parts, fmt.Sprintf("%s -> %s", s.SourceNode, s.TargetNode))
		case s.SourceNode != "":
			parts = append(parts, "from "+s.SourceNode)
		}
		if s.Mode != "" {
			parts = append(parts, "mode "+string(s.Mode))
		}
	}
	for _, c := range m.Status.Conditions {
		if c.Type == v1alpha1.VirtualMachineInstanceMigrationAbortRequested && c.Status == "True" {
			parts = append(parts, "abort requested")
		}
	}
	return strings.Join(parts, ", ")
}

// failureReason is why m failed, as its state says.
func failureReason(m *v1alpha1.VirtualMachineInstanceMigration) string {
	if s := m.Status.MigrationState; s != nil && s.FailureReason != "" {
		return s.FailureReason
	}
	return "no reason recorded (kubectl describe vmim " + m.Name + ")"
}

// newMigrateCancelCommand is vmctl migrate-cancel: it deletes the VMI's unfinished migrations,
// which cancels them.
func newMigrateCancelCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:               "migrate-cancel NAME",
		Short:             "Cancel a VMI's unfinished live migration (delete it)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: o.completeNames("virtualmachineinstances"),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, name, err := parseTarget(args[0])
			if err != nil {
				return err
			}
			c, err := o.Client()
			if err != nil {
				return err
			}
			ctx := cmdContext(cmd)
			action := client.Action{Command: o.command, Verb: "cancel the migration of", Resource: "virtualmachineinstances", Name: name, Namespace: c.Namespace}
			list, err := c.Migrations(ctx)
			if err != nil {
				return c.Explain(ctx, err, action)
			}
			var cancelled []string
			var errs []error
			for _, m := range list {
				if m.Spec.VMIName != name || m.DeletionTimestamp != nil ||
					m.Status.Phase == v1alpha1.MigrationSucceeded || m.Status.Phase == v1alpha1.MigrationFailed {
					continue
				}
				if err := c.DeleteMigration(ctx, m.Name, string(m.UID)); err != nil && !apierrors.IsNotFound(err) {
					errs = append(errs, c.Explain(ctx, err, action))
					continue
				}
				cancelled = append(cancelled, m.Name)
				fmt.Fprintf(o.streams.Out, "migration %s of VMI %s cancelled\n", m.Name, name)
			}
			if err := errors.Join(errs...); err != nil {
				return err
			}
			if len(cancelled) == 0 {
				return fmt.Errorf("VMI %s in namespace %s has no unfinished migration to cancel", name, c.Namespace)
			}
			return nil
		},
	}
}
