package bench

import (
	"testing"
	"time"
)

func TestParseProcCPU(t *testing.T) {
	// utime 250 and stime 50 ticks: 3 s. The name holds spaces and a parenthesis.
	stat := []byte("4242 (qemu-system-x86 (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 5 0 1000 0 0")
	got, err := ParseProcCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if got != 3*time.Second {
		t.Fatalf("ParseProcCPU = %s, want 3s", got)
	}
	for _, bad := range []string{"4242 qemu S 1", "4242 (qemu) S 1 2 3", "4242 (qemu) S 1 4242 4242 0 -1 4194560 100 0 0 0 x 50"} {
		if _, err := ParseProcCPU([]byte(bad)); err == nil {
			t.Errorf("ParseProcCPU(%q): no error", bad)
		}
	}
}

func TestBootCPU(t *testing.T) {
	marker := time.Unix(1000, 0)
	t1, t2 := marker.Add(10*time.Second), marker.Add(13*time.Second)
	// 6 s of CPU at t1, idle at 10% (0.3 s over 3 s): 1 s of it since the marker.
	if got := BootCPU(marker, t1, t2, 6*time.Second, 6300*time.Millisecond); got != 5*time.Second {
		t.Errorf("BootCPU = %s, want 5s", got)
	}
	// No idle CPU: all of it was the boot's.
	if got := BootCPU(marker, t1, t2, 6*time.Second, 6*time.Second); got != 6*time.Second {
		t.Errorf("BootCPU without idle use = %s, want 6s", got)
	}
	// An idle rate that would take off more than there is gives 0, not less.
	if got := BootCPU(marker, t1, t2, time.Second, 4*time.Second); got != 0 {
		t.Errorf("BootCPU = %s, want 0", got)
	}
}

func TestBaselinePodBurn(t *testing.T) {
	idle := baselinePod("ns", "img", 3, 3, 0)
	for _, c := range idle.Spec.Containers {
		if len(c.Args) != 0 {
			t.Errorf("idle baseline container %s has args %q", c.Name, c.Args)
		}
	}
	busy := baselinePod("ns", "img", 3, 3, 4500*time.Millisecond)
	if got := busy.Spec.Containers[0].Args; len(got) != 2 || got[0] != "-burn" || got[1] != "4.5s" {
		t.Errorf("busy baseline first container args %q, want [-burn 4.5s]", got)
	}
	for _, c := range busy.Spec.Containers[1:] {
		if len(c.Args) != 0 {
			t.Errorf("busy baseline container %s has args %q, want none", c.Name, c.Args)
		}
	}
}
