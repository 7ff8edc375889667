package guestprobe

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestListenAsk: a request reaches the probe function with its timeout as ctx's deadline, the
// answer comes back; the directory is 0700, made anew over a symbolic link (which is not
// followed) and over a stale socket; Close removes the socket.
func TestListenAsk(t *testing.T) {
	vmiDir := t.TempDir()
	elsewhere := t.TempDir()
	dir := filepath.Join(vmiDir, "guest-probe")
	if err := os.Symlink(elsewhere, dir); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "probe.sock")
	var got Request
	var left time.Duration
	probe := func(ctx context.Context, req Request) Result {
		got = req
		dl, _ := ctx.Deadline()
		left = time.Until(dl)
		if req.Ping {
			return Result{Success: true}
		}
		if req.Command[0] == "sleep" {
			<-ctx.Done()
			return Result{Reason: "still running"}
		}
		return Result{Reason: "exit 3", Stdout: []byte("out\n")}
	}
	s, err := Listen(path, os.Getuid(), os.Getgid(), probe)
	if err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Errorf("Listen wrote into the symbolic link's target: %v", entries)
	}
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("directory %v (%v), want a 0700 directory", fi.Mode(), err)
	}
	ctx := context.Background()
	if res, err := Ask(ctx, path, Request{Ping: true, TimeoutMillis: 2000}); err != nil || !res.Success {
		t.Errorf("ping = %+v, %v", res, err)
	}
	if !got.Ping || left <= time.Second || left > 2*time.Second {
		t.Errorf("probe got %+v with %s left, want the ping with at most 2s", got, left)
	}
	res, err := Ask(ctx, path, Request{Command: []string{"sh", "-c", "exit 3"}})
	if err != nil || res.Success || res.Reason != "exit 3" || string(res.Stdout) != "out\n" {
		t.Errorf("exec = %+v, %v", res, err)
	}
	if strings.Join(got.Command, " ") != "sh -c exit 3" || left > DefaultTimeout {
		t.Errorf("probe got %+v with %s left, want the command with the default timeout", got, left)
	}
	begin := time.Now()
	if res, err := Ask(ctx, path, Request{Command: []string{"sleep"}, TimeoutMillis: 200}); err != nil || res.Reason != "still running" || time.Since(begin) > time.Second {
		t.Errorf("a command past its timeout = %+v, %v after %s", res, err, time.Since(begin))
	}
	// A second server over the first one's socket (a new handler process).
	if err := s.l.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Listen(path, -1, -1, probe)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	if res, err := Ask(ctx, path, Request{Ping: true}); err != nil || !res.Success {
		t.Errorf("ping of the second server = %+v, %v", res, err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("socket after Close: %v", err)
	}
	if _, err := Ask(ctx, path, Request{Ping: true}); err == nil || !strings.Contains(err.Error(), "cannot reach the node handler") {
		t.Errorf("Ask with no server = %v", err)
	}
}
