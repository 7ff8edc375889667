package e2e

import (
	"bytes"
	"context"
	"image"
	"image/color"
	"image/png"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

func pngOf(t *testing.T, w, h int, paint func(img *image.RGBA)) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	paint(img)
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestScreenshot: a PNG decodes and is measured; a blank screen, a tiny image and bytes that
// are no PNG are told apart from a display with text on it.
func TestScreenshot(t *testing.T) {
	black := func(img *image.RGBA) {}
	text := func(img *image.RGBA) {
		for x := 10; x < 20; x++ {
			img.Set(x, 5, color.RGBA{0xaa, 0xaa, 0xaa, 0xff})
		}
	}
	for _, tc := range []struct {
		name    string
		data    []byte
		colours int
		bad     string // what Plausible's error says; "" for none
		decode  bool
	}{
		{"text on a VGA screen", pngOf(t, 720, 400, text), 2, "", true},
		{"blank", pngOf(t, 640, 480, black), 1, "blank", true},
		{"tiny", pngOf(t, 16, 16, text), 2, "not a display", true},
		{"not a PNG", []byte("RFB 003.008\n"), 0, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ReadScreenshot(tc.data)
			if !tc.decode {
				if err == nil {
					t.Fatalf("ReadScreenshot of %q: no error", tc.data)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Colours != tc.colours {
				t.Errorf("colours %d, want %d", s.Colours, tc.colours)
			}
			err = s.Plausible()
			switch {
			case tc.bad == "" && err != nil:
				t.Errorf("Plausible: %v", err)
			case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
				t.Errorf("Plausible: %v, want an error saying %q", err, tc.bad)
			}
		})
	}
}

// TestHeartbeats: the loop's lines count, wherever the prompt puts them; the echo of the
// command that starts the loop does not.
func TestHeartbeats(t *testing.T) {
	out := "kubevisor-guest:~# " + strings.TrimSuffix(heartbeatCommand, "\r") + "\r\n" +
		"kubevisor-guest:~# HB-12.50\r\nHB-13.51\r\n\r\nkubevisor-guest:~# HB-14.52\r\nHB-x\r\n"
	if got, want := Heartbeats(out), []float64{12.50, 13.51, 14.52}; !slices.Equal(got, want) {
		t.Errorf("Heartbeats = %v, want %v", got, want)
	}
	if got := Heartbeats(answerCommand); len(got) != 0 {
		t.Errorf("Heartbeats of another command = %v", got)
	}
}

// TestAnswerCommand: the command's echo does not hold the answer, only its output does.
func TestAnswerCommand(t *testing.T) {
	if strings.Contains(answerCommand, answerText) {
		t.Errorf("%q holds %q: its echo would pass for the answer", answerCommand, answerText)
	}
}

func TestVmctlArgs(t *testing.T) {
	got := vmctlArgs("/k", "ns-1", "console", "vm")
	want := []string{"--kubeconfig=/k", "--namespace=ns-1", "console", "vm"}
	if !slices.Equal(got, want) {
		t.Errorf("vmctlArgs = %q, want %q", got, want)
	}
	if got := vmctlArgs("", "", "version"); !slices.Equal(got, []string{"version"}) {
		t.Errorf("vmctlArgs without kubeconfig and namespace = %q", got)
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"vmctl":               "vmctl",
		"--kubeconfig=/a/b":   "--kubeconfig=/a/b",
		"":                    "''",
		"a b":                 "'a b'",
		"it's":                `'it'\''s'`,
		"$((6*7))":            "'$((6*7))'",
		"/tmp/x y/kubeconfig": "'/tmp/x y/kubeconfig'",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
		if out, err := exec.Command("sh", "-c", "printf %s "+shellQuote(in)).Output(); err != nil || string(out) != in {
			t.Errorf("sh read %s as %q (%v), want %q", shellQuote(in), out, err, in)
		}
	}
}

// TestTokenKubeconfig: the kubeconfig written for a ServiceAccount reaches the same server,
// trusts it the same way, and carries the token alone.
func TestTokenKubeconfig(t *testing.T) {
	rc := &rest.Config{Host: "https://10.0.0.1:6443", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("CA"), ServerName: "kubernetes"}}
	data, err := clientcmd.Write(tokenKubeconfig(rc, "e2e-user", "TOKEN", "ns-1"))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := clientcmd.NewClientConfigFromBytes(data)
	if err != nil {
		t.Fatal(err)
	}
	got, err := cc.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		t.Fatal(err)
	}
	if got.Host != rc.Host || string(got.CAData) != "CA" || got.ServerName != "kubernetes" || got.BearerToken != "TOKEN" ||
		got.CertData != nil || got.KeyData != nil || ns != "ns-1" {
		t.Errorf("kubeconfig gives %+v in namespace %q", got, ns)
	}
}

// TestTmux drives a real tmux the way the terminal spec does, with cat in vmctl's place: keys
// typed arrive, Ctrl-D ends the command, and the pane then shows its exit status.
func TestTmux(t *testing.T) {
	testenv.Command(t, "tmux", "tmux")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tm, err := NewTmux(ctx, "kv-e2e-test-"+strings.ReplaceAll(t.Name(), "/", "-"), 80, 24, "sh", "-c", "cat; exit 3")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tm.Kill(context.Background()) }()
	if err := tm.SendText(ctx, "hello $((6*7))"); err != nil {
		t.Fatal(err)
	}
	if err := tm.SendKeys(ctx, "Enter"); err != nil {
		t.Fatal(err)
	}
	waitPane(t, ctx, tm, func(p string) bool { return strings.Count(p, "hello $((6*7))") == 2 }) // the tty's echo and cat's copy
	if _, exited := Exited(capture(t, ctx, tm)); exited {
		t.Fatal("exited before Ctrl-D")
	}
	if err := tm.SendKeys(ctx, "C-d"); err != nil {
		t.Fatal(err)
	}
	waitPane(t, ctx, tm, func(p string) bool { _, ok := Exited(p); return ok })
	if status, _ := Exited(capture(t, ctx, tm)); status != "3" {
		t.Errorf("exit status %q, want 3", status)
	}
}

func capture(t *testing.T, ctx context.Context, tm *Tmux) string {
	t.Helper()
	p, err := tm.Capture(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func waitPane(t *testing.T, ctx context.Context, tm *Tmux, ok func(string) bool) {
	t.Helper()
	for {
		p := capture(t, ctx, tm)
		if ok(p) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pane never showed what was expected:\n%s", p)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func TestPickTwoClasses(t *testing.T) {
	class := func(name, driver string) v1alpha1.HypervisorClass {
		return v1alpha1.HypervisorClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Driver: driver}
	}
	qmp, qmp2, virt := class("qmp", "qmp"), class("a-qmp", "qmp"), class("libvirt", "libvirt")
	for _, tt := range []struct {
		name       string
		classes    []v1alpha1.HypervisorClass
		told       string
		a, b, skip string // skip: a substring; "" for none
		err        string
	}{
		{name: "none", skip: "fewer than two HypervisorClasses exist ([])"},
		{name: "one", classes: []v1alpha1.HypervisorClass{qmp}, skip: "fewer than two HypervisorClasses exist ([qmp])"},
		{name: "two drivers", classes: []v1alpha1.HypervisorClass{qmp, virt}, a: "libvirt", b: "qmp"},
		{name: "different drivers first", classes: []v1alpha1.HypervisorClass{qmp, qmp2, virt}, a: "a-qmp", b: "libvirt"},
		{name: "one driver", classes: []v1alpha1.HypervisorClass{qmp, qmp2}, a: "a-qmp", b: "qmp"},
		{name: "told", classes: []v1alpha1.HypervisorClass{qmp, qmp2, virt}, told: "qmp,libvirt", a: "qmp", b: "libvirt"},
		{name: "told, one missing", classes: []v1alpha1.HypervisorClass{qmp}, told: "qmp,libvirt", err: "libvirt does not exist"},
		{name: "told, none", told: "qmp,libvirt", err: "qmp and libvirt do not exist"},
		{name: "told badly", classes: []v1alpha1.HypervisorClass{qmp, virt}, told: "qmp", err: "want two different names"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, b, skip, err := pickTwoClasses(tt.classes, tt.told)
			switch {
			case tt.err != "":
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
			case err != nil:
				t.Fatal(err)
			case tt.skip != "":
				if !strings.Contains(skip, tt.skip) || a != nil || b != nil {
					t.Fatalf("skip %q (%v, %v), want %q", skip, a, b, tt.skip)
				}
			default:
				if skip != "" || a == nil || b == nil || a.Name != tt.a || b.Name != tt.b {
					t.Fatalf("got %v, %v, skip %q; want %s, %s", a, b, skip, tt.a, tt.b)
				}
			}
		})
	}
}

func TestTableColumns(t *testing.T) {
	// As kubectl get vmi -o wide printed it on the local cluster: PAUSED empty.
	header := "NAME     AGE     PHASE        IP            NODENAME   READY   PAUSED   CLASS     DRIVER"
	for _, tt := range []struct{ row, class, driver, phase string }{
		{"first    4s      Running      10.247.0.10   vm         True             qmp       qmp", "qmp", "qmp", "Running"},
		{"second   1s      Scheduling                            False            libvirt   libvirt", "libvirt", "libvirt", "Scheduling"},
		{"third    1s      Pending", "", "", "Pending"},
	} {
		got, err := tableColumns(header, tt.row, "CLASS", "DRIVER", "PHASE")
		if err != nil || !slices.Equal(got, []string{tt.class, tt.driver, tt.phase}) {
			t.Errorf("row %q: %q, %v", tt.row, got, err)
		}
	}
	if _, err := tableColumns(header, "x", "NOPE"); err == nil {
		t.Error("no error for a missing column")
	}
}
