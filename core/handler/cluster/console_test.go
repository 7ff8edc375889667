package cluster

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/launcher/consolelog"
	"github.com/kubevisor/kubevisor/core/layout"
	"github.com/kubevisor/kubevisor/internal/syncbuf"
)

// scriptedConsole writes one boot's output per attach, then ends (the guest rebooted).
type scriptedConsole struct{ attaches chan int }

func (s *scriptedConsole) Console(ctx context.Context, _ types.UID, _ io.Reader, out io.Writer) error {
	n := <-s.attaches
	_, _ = io.WriteString(out, strings.Repeat("x", 10)+"\n")
	_, _ = io.WriteString(out, "boot "+string(rune('0'+n))+"\n")
	if n == 2 {
		<-ctx.Done() // the last boot runs until stopped
	}
	return nil
}

func TestConsoleLogs(t *testing.T) {
	root := t.TempDir()
	uid := types.UID("u1")
	if err := os.MkdirAll(layout.VMIDir(root, uid), 0o755); err != nil {
		t.Fatal(err)
	}
	src := &scriptedConsole{attaches: make(chan int, 3)}
	c := newConsoleLogs(src, root, testr.New(t))
	c.max, c.retry = 16, 200*time.Millisecond
	// Every new file is labelled (with the VMI's SELinux level) before it takes the log's name.
	var labelled syncbuf.Buffer
	c.label = func(u types.UID, p string, recurse bool) error {
		if _, err := os.Stat(p); err != nil || u != uid || recurse {
			t.Errorf("labelled %s of %s (recurse %v): %v", p, u, recurse, err)
		}
		_, _ = labelled.Write([]byte(p + "\n"))
		return nil
	}
	path := layout.ConsoleLog(root, uid)

	// Follow the file as the guest-console-log container would.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got syncbuf.Buffer
	go func() { _ = consolelog.Follow(ctx, path, &got, 5*time.Millisecond) }()

	src.attaches <- 1
	c.ensure(context.Background(), uid)
	c.ensure(context.Background(), uid) // already writing: no second writer
	src.attaches <- 2
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && !strings.Contains(got.String(), "boot 2") {
		time.Sleep(10 * time.Millisecond)
	}
	out := got.String()
	if !strings.Contains(out, "boot 1") || !strings.Contains(out, "boot 2") {
		t.Fatalf("followed console %q, want both boots", out)
	}
	// Each boot's 11+7 bytes pass the 16-byte cap: the file was rotated, never grown past it.
	if fi, err := os.Stat(path); err != nil || fi.Size() > 16 {
		t.Errorf("console log %v, %v: want at most 16 bytes", fi, err)
	}
	if files := strings.Fields(labelled.String()); len(files) < 2 || files[0] != path+".new" {
		t.Errorf("labelled %v, want every rotation's %s.new", files, path)
	}
	c.stop(uid)
	c.close()
	if len(c.running) != 0 {
		t.Errorf("writers left: %v", c.running)
	}
}
