package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/syncbuf"
)

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds or the test's patience ends.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConsoleCarriesBytesBothWaysUntilTheEscapeKey(t *testing.T) {
	f := newFakeServer(t)
	inR, inW := io.Pipe()
	var out, errOut syncbuf.Buffer
	done := make(chan error, 1)
	go func() { done <- f.runWith(testContext(t), inR, &out, &errOut, "console", "vm1") }()

	_, _ = inW.Write([]byte("ls\r"))
	waitFor(t, "the echo", func() bool { return strings.Contains(out.String(), "echo:ls\r") })
	// Bytes before the escape key in the same read still go out; nothing after it does.
	_, _ = inW.Write([]byte("ab\x1dcd"))
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Ctrl-] did not end the session")
	}
	if !strings.Contains(errOut.String(), "Console session of VMI vm1 ended (Ctrl-])") {
		t.Fatalf("stderr = %q", errOut.String())
	}
	if strings.Contains(out.String(), "cd") {
		t.Fatalf("bytes after the escape key were sent: %q", out.String())
	}
}

func TestConsoleFollowReconnectsWhenTheStreamDrops(t *testing.T) {
	f := newFakeServer(t)
	sessions := make(chan int, 10)
	n := 0
	f.console = func(c net.Conn) {
		n++
		sessions <- n
		_, _ = c.Write([]byte("boot " + string(rune('0'+n)) + "\n"))
		if n == 1 {
			// The first run of the VMI ends; the next dial finds it not running once.
			f.refuse("virtualmachineinstances/vm1/console", metav1.Status{Code: 409, Message: "VMI vm1 is not running"})
			go func() {
				time.Sleep(300 * time.Millisecond)
				f.refuse("virtualmachineinstances/vm1/console", metav1.Status{})
			}()
			return
		}
		echo(c)
	}
	inR, inW := io.Pipe()
	var out, errOut syncbuf.Buffer
	done := make(chan error, 1)
	go func() { done <- f.runWith(testContext(t), inR, &out, &errOut, "console", "--follow", "vm1") }()
	waitFor(t, "the second boot", func() bool { return strings.Contains(out.String(), "boot 2") })
	_, _ = inW.Write([]byte("x"))
	waitFor(t, "the echo", func() bool { return strings.Contains(out.String(), "echo:x") })
	_, _ = inW.Write([]byte{EscapeKey})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut.String(), "waiting for it to run again") || !strings.Contains(errOut.String(), "Reconnected") {
		t.Fatalf("stderr = %q", errOut.String())
	}
	if !strings.Contains(out.String(), "echo:x") {
		t.Fatalf("stdout = %q", out.String())
	}
}

func TestPortForwardCarriesATCPExchange(t *testing.T) {
	f := newFakeServer(t)
	guest, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer guest.Close()
	go func() {
		for {
			c, err := guest.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line := make([]byte, 5)
				if _, err := io.ReadFull(c, line); err == nil {
					_, _ = c.Write(bytes.ToUpper(line))
				}
			}()
		}
	}()
	remote := guest.Addr().(*net.TCPAddr).Port

	ctx, cancel := context.WithCancel(testContext(t))
	var out, errOut syncbuf.Buffer
	done := make(chan error, 1)
	go func() { done <- f.runWith(ctx, nil, &out, &errOut, "port-forward", "vm/vm1", ":"+itoa(remote)) }()
	addr := regexp.MustCompile(`Forwarding from (127\.0\.0\.1:\d+) -> `)
	waitFor(t, "the listener", func() bool { return addr.MatchString(out.String()) })
	local := addr.FindStringSubmatch(out.String())[1]
	// Two connections, each its own stream.
	for _, word := range []string{"hello", "again"} {
		c, err := net.Dial("tcp", local)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte(word))
		got := make([]byte, 5)
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		c.Close()
		if string(got) != strings.ToUpper(word) {
			t.Fatalf("guest answered %q", got)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := len(f.recorded("GET", subPrefix+"virtualmachineinstances/vm1/portforward/"+itoa(remote))); got != 2 {
		t.Fatalf("%d streams opened, want 2", got)
	}
}

func TestPortForwardStdio(t *testing.T) {
	f := newFakeServer(t)
	guest, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer guest.Close()
	go func() {
		c, err := guest.Accept()
		if err == nil {
			_, _ = io.Copy(c, c)
			c.Close()
		}
	}()
	inR, inW := io.Pipe()
	var out, errOut syncbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- f.runWith(testContext(t), inR, &out, &errOut, "port-forward", "--stdio", "vmi/vm1", itoa(guest.Addr().(*net.TCPAddr).Port))
	}()
	_, _ = inW.Write([]byte("SSH-2.0-test\r\n"))
	waitFor(t, "the echo", func() bool { return out.String() == "SSH-2.0-test\r\n" })
	inW.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestVNCScreenshotWritesAPNGOfTheFramebuffer(t *testing.T) {
	f := newFakeServer(t)
	fb := image.NewRGBA(image.Rect(0, 0, 64, 48))
	for y := 0; y < 48; y++ {
		for x := 0; x < 64; x++ {
			fb.SetRGBA(x, y, color.RGBA{R: uint8(4 * x), G: uint8(5 * y), B: 200, A: 255})
		}
	}
	f.framebuffer = fb
	file := filepath.Join(t.TempDir(), "shot.png")
	_, stderr, err := f.run(testContext(t), nil, "vnc", "screenshot", "vm1", "-o", file)
	if err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	img, err := png.Decode(r)
	if err != nil {
		t.Fatal(err)
	}
	if img.Bounds() != fb.Bounds() {
		t.Fatalf("bounds %v, want %v", img.Bounds(), fb.Bounds())
	}
	for _, p := range []image.Point{{0, 0}, {63, 47}, {10, 20}} {
		if got := color.RGBAModel.Convert(img.At(p.X, p.Y)); got != fb.At(p.X, p.Y) {
			t.Fatalf("pixel %v = %v, want %v", p, got, fb.At(p.X, p.Y))
		}
	}
	if !strings.Contains(stderr, "64x48") {
		t.Fatalf("stderr = %q", stderr)
	}
}

func TestVNCProxyOpensAStreamPerClient(t *testing.T) {
	f := newFakeServer(t)
	f.framebuffer = image.NewRGBA(image.Rect(0, 0, 4, 4))
	ctx, cancel := context.WithCancel(testContext(t))
	var out, errOut syncbuf.Buffer
	done := make(chan error, 1)
	go func() { done <- f.runWith(ctx, nil, &out, &errOut, "vnc", "vm1", "--port", "0") }()
	addr := regexp.MustCompile(`VNC of VMI vm1 on (127\.0\.0\.1:\d+)`)
	waitFor(t, "the listener", func() bool { return addr.MatchString(out.String()) })
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", addr.FindStringSubmatch(out.String())[1])
		if err != nil {
			t.Fatal(err)
		}
		version := make([]byte, 12)
		if _, err := io.ReadFull(c, version); err != nil || string(version) != "RFB 003.008\n" {
			t.Fatalf("client %d read %q, %v", i, version, err)
		}
		c.Close()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestStopSendsTheGracePeriod(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want subv1.StopOptions
	}{
		{"grace period", []string{"stop", "vm1", "--grace-period", "7"}, subv1.StopOptions{GracePeriodSeconds: ptr(int64(7))}},
		{"zero grace period", []string{"stop", "vm1", "--grace-period=0"}, subv1.StopOptions{GracePeriodSeconds: ptr(int64(0))}},
		{"force", []string{"stop", "vm1", "--force"}, subv1.StopOptions{Force: true}},
		{"defaults", []string{"stop", "vm1"}, subv1.StopOptions{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeServer(t)
			out, _, err := f.run(testContext(t), nil, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			reqs := f.recorded("PUT", subPrefix+"virtualmachines/vm1/stop")
			if len(reqs) != 1 {
				t.Fatalf("%d stop requests", len(reqs))
			}
			var got subv1.StopOptions
			if err := json.Unmarshal(reqs[0].Body, &got); err != nil {
				t.Fatal(err)
			}
			if got.Kind != "StopOptions" || got.APIVersion != subv1.GroupVersion.String() {
				t.Fatalf("body type %+v", got.TypeMeta)
			}
			got.TypeMeta = metav1.TypeMeta{}
			if (got.GracePeriodSeconds == nil) != (tt.want.GracePeriodSeconds == nil) ||
				(got.GracePeriodSeconds != nil && *got.GracePeriodSeconds != *tt.want.GracePeriodSeconds) || got.Force != tt.want.Force {
				t.Fatalf("body = %s", reqs[0].Body)
			}
			if !strings.Contains(out, "VM vm1 was scheduled to stop") {
				t.Fatalf("stdout = %q", out)
			}
		})
	}
	f := newFakeServer(t)
	if _, _, err := f.run(testContext(t), nil, "stop", "vm1", "--force", "--grace-period", "5"); err == nil {
		t.Fatal("--force with a grace period was accepted")
	}
}

func ptr[T any](v T) *T { return &v }

func itoa(i int) string { return strconv.Itoa(i) }

func TestRefusalsSayWhatToDo(t *testing.T) {
	tests := []struct {
		name, key string
		st        metav1.Status
		args      []string
		want      string
	}{
		{"403 on an action", "virtualmachineinstances/vm1/pause", metav1.Status{Code: 403, Reason: metav1.StatusReasonForbidden, Message: "forbidden"},
			[]string{"pause", "vmi", "vm1"}, "you (alice) may not pause virtualmachineinstances in namespace ns1: ask for the kubevisor.io:edit role"},
		{"409 on a stream", "virtualmachineinstances/vm1/console", metav1.Status{Code: 409, Reason: metav1.StatusReasonConflict, Message: "VMI vm1 is not running"},
			[]string{"console", "vm1"}, "VMI vm1 is not running: start it with vmctl start vm1"},
		{"501 on an action", "virtualmachineinstances/vm1/softreboot", metav1.Status{Code: 501, Message: "the hypervisor driver fake does not offer soft reboot"},
			[]string{"soft-reboot", "vm1"}, "the hypervisor driver fake does not offer soft reboot"},
		{"403 on a stream names the user of the message", "virtualmachineinstances/vm1/vnc",
			metav1.Status{Code: 403, Message: `User "bob" cannot get resource "virtualmachineinstances/vnc"`},
			[]string{"vnc", "screenshot", "vm1", "-o", "-"}, "you (bob) may not open the VNC display of virtualmachineinstances in namespace ns1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeServer(t)
			f.refuse(tt.key, tt.st)
			_, _, err := f.run(testContext(t), nil, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestActionsReachTheirSubresource(t *testing.T) {
	tests := []struct {
		args []string
		path string
	}{
		{[]string{"start", "vm1"}, "virtualmachines/vm1/start"},
		{[]string{"restart", "vm1"}, "virtualmachines/vm1/restart"},
		{[]string{"pause", "vm", "vm1"}, "virtualmachineinstances/vm1/pause"},
		{[]string{"unpause", "vmi/vm1"}, "virtualmachineinstances/vm1/unpause"},
		{[]string{"soft-reboot", "vm1"}, "virtualmachineinstances/vm1/softreboot"},
		{[]string{"reset", "vm1"}, "virtualmachineinstances/vm1/reset"},
	}
	f := newFakeServer(t)
	for _, tt := range tests {
		if _, _, err := f.run(testContext(t), nil, tt.args...); err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if len(f.recorded("PUT", subPrefix+tt.path)) != 1 {
			t.Fatalf("%v did not PUT %s", tt.args, tt.path)
		}
	}
	out, _, err := f.run(testContext(t), nil, "guestosinfo", "vm1")
	if err != nil || !strings.Contains(out, `"name": "debian"`) {
		t.Fatalf("guestosinfo: %q, %v", out, err)
	}
}

func TestVersion(t *testing.T) {
	f := newFakeServer(t)
	out, _, err := f.run(testContext(t), nil, "version")
	if err != nil || !strings.Contains(out, "client: ") || !strings.Contains(out, "server: v9.9.9 go1.26 linux/amd64") {
		t.Fatalf("version: %q, %v", out, err)
	}
	var stdout syncbuf.Buffer
	err = Execute(testContext(t), "vmctl", []string{"--kubeconfig", f.kubeconfig(), "--token", "wrong", "version"},
		IOStreams{In: bytes.NewReader(nil), Out: &stdout, ErrOut: io.Discard})
	if err != nil || !strings.Contains(stdout.String(), "server: unavailable (") {
		t.Fatalf("version with bad credentials: %q, %v", stdout.String(), err)
	}
}

func TestExposeCreatesAServiceSelectingTheLauncherPod(t *testing.T) {
	f := newFakeServer(t)
	out, _, err := f.run(testContext(t), nil, "expose", "vm", "vm1", "--port", "80", "--target-port", "8080", "--type", "NodePort", "--name", "web")
	if err != nil {
		t.Fatal(err)
	}
	reqs := f.recorded("POST", "/api/v1/namespaces/"+testNS+"/services")
	if len(reqs) != 1 || !strings.Contains(out, "service/web created") {
		t.Fatalf("%d service creates, stdout %q", len(reqs), out)
	}
	var svc corev1.Service
	if err := json.Unmarshal(reqs[0].Body, &svc); err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Selector[v1alpha1.VirtualMachineInstanceNameLabel] != "vm1" || svc.Spec.Type != corev1.ServiceTypeNodePort ||
		svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[0].TargetPort.IntValue() != 8080 || svc.Name != "web" {
		t.Fatalf("service = %+v", svc.Spec)
	}
}

func TestDisplayName(t *testing.T) {
	for arg0, want := range map[string]string{"/usr/local/bin/kubectl-vm": "kubectl vm", "vmctl": "vmctl", "./bin/vmctl": "vmctl"} {
		if got := DisplayName(arg0); got != want {
			t.Errorf("DisplayName(%q) = %q, want %q", arg0, got, want)
		}
	}
	var out bytes.Buffer
	root := NewRootCommand("kubectl-vm", IOStreams{In: bytes.NewReader(nil), Out: &out, ErrOut: &out})
	root.SetArgs([]string{"--help"})
	if err := root.Execute(); err != nil || !strings.Contains(out.String(), "kubectl vm [command]") {
		t.Fatalf("help: %v\n%s", err, out.String())
	}
}
