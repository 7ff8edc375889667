package cluster

import (
	"encoding/json"
	"fmt"
	"os"
)

// DefaultCPUManagerStateFile is where the kubelet keeps its CPU manager's state (its root
// directory's cpu_manager_state).
const DefaultCPUManagerStateFile = "/var/lib/kubelet/cpu_manager_state"

// cpuManagerState is the part of the kubelet's CPU manager checkpoint the handler reads: the
// policy it runs ("none" or "static"). The kubelet writes the file at start and on each change of
// its assignments, and refuses to start when the file names another policy than it is
// configured with, so the file says the running kubelet's policy.
type cpuManagerState struct {
	PolicyName string `json:"policyName"`
}

// CPUManagerStatic says whether the kubelet's CPU manager state file at path names the static
// policy, the one that gives a Guaranteed pod's containers of whole CPUs exclusive CPUs. A file
// that is missing is the kubelet's none policy (false, no error); one that cannot be read or
// parsed is an error.
func CPUManagerStatic(path string) (bool, error) {
	raw, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var st cpuManagerState
	if err := json.Unmarshal(raw, &st); err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	return st.PolicyName == "static", nil
}
