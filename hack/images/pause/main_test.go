package main

import (
	"testing"
	"time"
)

func TestBurnSpendsCPUTime(t *testing.T) {
	before := cpuTime()
	burn(before + 200*time.Millisecond)
	if spent := cpuTime() - before; spent < 200*time.Millisecond {
		t.Fatalf("burn returned after %s of CPU, want at least 200ms", spent)
	}
}
