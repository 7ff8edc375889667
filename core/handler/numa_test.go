package handler

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestHostNUMANodes(t *testing.T) {
	root := t.TempDir()
	for node, list := range map[string]string{"node0": "0-1,4", "node1": "2-3,5\n", "node2": ""} {
		dir := filepath.Join(root, "devices", "system", "node", node)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cpulist"), []byte(list), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Not a node: the kernel has files such as has_cpu and possible there.
	if err := os.WriteFile(filepath.Join(root, "devices", "system", "node", "possible"), []byte("0-2"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := hostNUMANodes(root)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32]uint32{0: 0, 1: 0, 4: 0, 2: 1, 3: 1, 5: 1}
	if !maps.Equal(got, want) {
		t.Errorf("hostNUMANodes = %v, want %v", got, want)
	}
	if _, err := hostNUMANodes(t.TempDir()); err == nil {
		t.Error("no node directories: want an error")
	}
	// This machine's.
	if here, err := hostNUMANodes("/sys"); err != nil || len(here) == 0 {
		t.Errorf("hostNUMANodes(/sys) = %v, %v", here, err)
	}
	for _, bad := range []string{"a", "3-1", "1-", "1,,2"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q): want an error", bad)
		}
	}
	if got, _ := parseCPUList("7,2-3"); !slices.Equal(got, []uint32{7, 2, 3}) {
		t.Errorf("parseCPUList(7,2-3) = %v", got)
	}
}
