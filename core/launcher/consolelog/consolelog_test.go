package consolelog

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubevisor/kubevisor/internal/syncbuf"
)

func TestFollow(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "console.log")
	ctx, cancel := context.WithCancel(context.Background())
	var out syncbuf.Buffer
	done := make(chan error, 1)
	go func() { done <- Follow(ctx, path, &out, 10*time.Millisecond) }()

	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if out.String() == want {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("followed %q, want %q", out.String(), want)
	}
	appendTo := func(s string) {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}

	// The file does not exist yet: the follower waits for it.
	time.Sleep(30 * time.Millisecond)
	appendTo("boot\n")
	waitFor("boot\n")
	appendTo("KUBEVISOR-GUEST-READY\n")
	waitFor("boot\nKUBEVISOR-GUEST-READY\n")
	// Truncated (a new boot's log): followed from its start.
	if err := os.WriteFile(path, []byte("r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor("boot\nKUBEVISOR-GUEST-READY\nr\n")
	// Replaced by another file: followed from the new file's start.
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte("second file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitFor("boot\nKUBEVISOR-GUEST-READY\nr\nsecond file\n")
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Follow did not return when its context ended")
	}
	if strings.Count(out.String(), "boot") != 1 {
		t.Errorf("output repeated: %q", out.String())
	}
}
