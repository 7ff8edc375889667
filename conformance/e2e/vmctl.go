package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevisor/kubevisor/internal/syncbuf"
)

// vmctlArgs puts the cluster and namespace flags before args, in their --flag=value form so
// that no parser can take a value for a subcommand.
func vmctlArgs(kubeconfig, namespace string, args ...string) []string {
	var full []string
	if kubeconfig != "" {
		full = append(full, "--kubeconfig="+kubeconfig)
	}
	if namespace != "" {
		full = append(full, "--namespace="+namespace)
	}
	return append(full, args...)
}

// Vmctl runs vmctl in the spec's namespace with the suite's kubeconfig and returns its
// standard output; a failure carries its standard error.
func (f *Framework) Vmctl(ctx context.Context, args ...string) (string, error) {
	return f.VmctlAs(ctx, Cfg.Kubeconfig, args...)
}

// VmctlAs is Vmctl with another kubeconfig (another user). stdin is empty.
func (f *Framework) VmctlAs(ctx context.Context, kubeconfig string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, Cfg.Vmctl, vmctlArgs(kubeconfig, f.Namespace, args...)...)
	cmd.Stdin = strings.NewReader("")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("vmctl %s: %w: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

// VmctlOK is Vmctl that fails the spec when vmctl fails.
func (f *Framework) VmctlOK(ctx context.Context, args ...string) string {
	GinkgoHelper()
	out, err := f.Vmctl(ctx, args...)
	Expect(err).NotTo(HaveOccurred(), out)
	return out
}

// Console is a running `vmctl console NAME` whose standard input is a pipe: what the spec
// writes goes to the guest's serial port, what the guest prints collects in Output.
type Console struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *syncbuf.Buffer
	errb   *syncbuf.Buffer
	exited chan struct{}
	err    error // once exited is closed
}

// OpenConsole starts `vmctl console [FLAGS] NAME` in the spec's namespace; it is stopped after
// the spec.
func (f *Framework) OpenConsole(ctx context.Context, name string, flags ...string) *Console {
	GinkgoHelper()
	return f.OpenConsoleAs(ctx, Cfg.Kubeconfig, name, flags...)
}

// OpenConsoleAs is OpenConsole with another kubeconfig (KubeconfigFor).
func (f *Framework) OpenConsoleAs(ctx context.Context, kubeconfig, name string, flags ...string) *Console {
	GinkgoHelper()
	args := append(append([]string{"console"}, flags...), name)
	// Not the spec's context: the process is ended by Close, after the spec's last step.
	cmd := exec.Command(Cfg.Vmctl, vmctlArgs(kubeconfig, f.Namespace, args...)...)
	c := &Console{cmd: cmd, out: &syncbuf.Buffer{}, errb: &syncbuf.Buffer{}, exited: make(chan struct{})}
	stdin, err := cmd.StdinPipe()
	Expect(err).NotTo(HaveOccurred())
	c.stdin = stdin
	cmd.Stdout, cmd.Stderr = c.out, c.errb
	Expect(cmd.Start()).To(Succeed())
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	DeferCleanup(c.Close)
	return c
}

// Send writes s to the console (a line wants "\r", as a terminal's Enter sends).
func (c *Console) Send(s string) {
	GinkgoHelper()
	_, err := io.WriteString(c.stdin, s)
	Expect(err).NotTo(HaveOccurred(), "write to vmctl console: stderr %q", c.errb.String())
}

// Output is what vmctl printed so far.
func (c *Console) Output() string { return c.out.String() }

// Stderr is what vmctl printed on its standard error so far.
func (c *Console) Stderr() string { return c.errb.String() }

// Exited reports whether vmctl has exited.
func (c *Console) Exited() bool {
	select {
	case <-c.exited:
		return true
	default:
		return false
	}
}

// WaitFor waits until the output holds want and returns the output; a vmctl that exits on
// the way fails the spec with its standard error.
func (c *Console) WaitFor(ctx context.Context, want string, timeout time.Duration) string {
	GinkgoHelper()
	var out string
	Eventually(func(g Gomega) {
		out = c.Output()
		if strings.Contains(out, want) {
			return
		}
		g.Expect(c.Exited()).To(BeFalse(), "vmctl console exited (%v): stderr %q", c.err, c.Stderr())
		g.Expect(out).To(ContainSubstring(want))
	}).WithContext(ctx).WithTimeout(timeout).WithPolling(200*time.Millisecond).Should(Succeed(),
		"vmctl console: stderr %s", c.errb)
	return out
}

// Close ends vmctl: its standard input closes, then it is killed if it is still there after
// a few seconds.
func (c *Console) Close() {
	_ = c.stdin.Close()
	select {
	case <-c.exited:
		return
	case <-time.After(5 * time.Second):
	}
	_ = c.cmd.Process.Kill()
	<-c.exited
}
