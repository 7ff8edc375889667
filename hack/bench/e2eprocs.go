package bench

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// nodeProc is a process of the node as the e2e bench sees it: its parent, command name and
// cgroup (the unified hierarchy's path, else the memory controller's).
type nodeProc struct {
	pid, ppid int
	comm      string
	cgroup    string
}

// readProcTree reads every process's stat and cgroup under root (/proc, or a fake tree in
// tests). Processes that vanish while it reads, and kernel threads, are left out.
func readProcTree(root string) ([]nodeProc, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []nodeProc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !e.IsDir() {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(root, e.Name(), "stat"))
		if err != nil {
			continue
		}
		comm, ppid, err := ParseProcStat(stat)
		if err != nil || ppid == 2 || pid == 2 { // kthreadd and its kernel threads
			continue
		}
		cg, err := os.ReadFile(filepath.Join(root, e.Name(), "cgroup"))
		if err != nil {
			continue
		}
		out = append(out, nodeProc{pid: pid, ppid: ppid, comm: comm, cgroup: cgroupPath(string(cg))})
	}
	return out, nil
}

// cgroupPath picks the process's cgroup path from the text of /proc/PID/cgroup: the unified
// hierarchy's ("0::/..."), else the memory controller's.
func cgroupPath(text string) string {
	var memory string
	for line := range strings.SplitSeq(text, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			if parts[2] != "/" {
				return parts[2]
			}
		case strings.Contains(","+parts[1]+",", ",memory,"):
			memory = parts[2]
		}
	}
	return memory
}

// inPod tells whether a cgroup path belongs to the pod with the given UID: the kubelet names
// the pod's cgroup pod<UID> (cgroupfs driver) or pod<UID with _ for ->.slice (systemd driver).
func inPod(cgroup, podUID string) bool {
	if podUID == "" {
		return false
	}
	return strings.Contains(cgroup, "/pod"+podUID+"/") || strings.HasSuffix(cgroup, "/pod"+podUID) ||
		strings.Contains(cgroup, "pod"+strings.ReplaceAll(podUID, "-", "_")+".slice")
}

// podProcs returns the processes of a pod (every container's and the sandbox's pause), found
// by their cgroup, in the order of procs.
func podProcs(procs []nodeProc, podUID string) []nodeProc {
	var out []nodeProc
	for _, p := range procs {
		if inPod(p.cgroup, podUID) {
			out = append(out, p)
		}
	}
	return out
}

// podShims returns the parents of a pod's processes that are not in the pod themselves: the
// containerd-shim that runs its containers (one per pod with containerd's runc v2 shim).
func podShims(procs []nodeProc, pod []nodeProc) []nodeProc {
	in := map[int]bool{}
	for _, p := range pod {
		in[p.pid] = true
	}
	byPid := map[int]nodeProc{}
	for _, p := range procs {
		byPid[p.pid] = p
	}
	seen := map[int]bool{}
	var out []nodeProc
	for _, p := range pod {
		parent, ok := byPid[p.ppid]
		if !ok || in[parent.pid] || seen[parent.pid] || parent.pid == 1 {
			continue
		}
		seen[parent.pid] = true
		out = append(out, parent)
	}
	return out
}
