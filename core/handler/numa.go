package handler

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// hostNUMANodes maps each CPU of the node to its NUMA node, from the cpulist of each
// sysRoot/devices/system/node/nodeN (sysRoot is /sys). No such directory is an error.
func hostNUMANodes(sysRoot string) (map[uint32]uint32, error) {
	dirs, err := filepath.Glob(filepath.Join(sysRoot, "devices", "system", "node", "node[0-9]*"))
	if err != nil {
		return nil, err
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("no NUMA nodes in %s", filepath.Join(sysRoot, "devices", "system", "node"))
	}
	out := map[uint32]uint32{}
	for _, d := range dirs {
		node, err := strconv.ParseUint(strings.TrimPrefix(filepath.Base(d), "node"), 10, 32)
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(d, "cpulist"))
		if err != nil {
			return nil, err
		}
		cpus, err := parseCPUList(strings.TrimSpace(string(raw)))
		if err != nil {
			return nil, fmt.Errorf("%s/cpulist: %w", d, err)
		}
		for _, c := range cpus {
			out[c] = uint32(node)
		}
	}
	return out, nil
}

// parseCPUList reads the kernel's CPU list format ("0-3,8,10-11"; empty for none).
func parseCPUList(s string) ([]uint32, error) {
	var out []uint32
	if s == "" {
		return nil, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CPU list", s)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 32); err != nil || b < a {
				return nil, fmt.Errorf("%q is not a CPU list", s)
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, uint32(c))
		}
	}
	return out, nil
}
