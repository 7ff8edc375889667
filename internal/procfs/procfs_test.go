package procfs

import (
	"os"
	"slices"
	"testing"
)

func TestStatFields(t *testing.T) {
	// A command name with spaces and parentheses.
	raw := []byte("42 (q (e) mu) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 987654 1000 10")
	f, err := StatFields(raw)
	if err != nil {
		t.Fatal(err)
	}
	if f[0] != "S" || f[4-3] != "1" || f[22-3] != "987654" {
		t.Errorf("fields = %q", f)
	}
	if _, err := StatFields([]byte("42 (x) S 1")); err == nil {
		t.Error("short stat: no error")
	}
}

func TestSelf(t *testing.T) {
	pp, err := ParentPid(os.Getpid())
	if err != nil || pp != os.Getppid() {
		t.Errorf("ParentPid = %d, %v; want %d", pp, err, os.Getppid())
	}
	if !slices.Contains(Children(os.Getppid()), os.Getpid()) {
		t.Errorf("Children of the parent do not list this process")
	}
	st, err := StartTime(os.Getpid())
	if err != nil || st == 0 {
		t.Fatalf("StartTime = %d, %v", st, err)
	}
	in, err := InnermostPid(os.Getpid())
	if err != nil || in <= 0 {
		t.Fatalf("InnermostPid = %d, %v", in, err)
	}
	if got := ChildByInnerPid(os.Getppid(), int64(in), st); got != os.Getpid() {
		t.Errorf("ChildByInnerPid of this process = %d, want %d", got, os.Getpid())
	}
	if got := ChildByInnerPid(os.Getppid(), int64(in), st+1); got != 0 {
		t.Errorf("ChildByInnerPid with another start time = %d, want 0", got)
	}
	if _, err := NSInode("/proc/self/ns/net"); err != nil {
		t.Error(err)
	}
}
