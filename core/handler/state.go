package handler

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"

	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// Names of the sync's steps (syncSteps). A step with an undo is recorded in vmiState.Steps
// before its driver call, so that an interrupted sync is undone completely: every undo is safe
// for a step that did nothing (Release of what was never prepared, Teardown after a half Setup,
// Delete of an unknown VM). States on disk name them: never rename one. (An earlier handler
// recorded "devices" too; its undo is nothing.)
const (
	stepStorage    = "storage"
	stepNetwork    = "network"
	stepDevices    = "devices"
	stepDomain     = "domain"
	stepHypervisor = "hypervisor"
	stepStart      = "start"
	// stepSELinux labels files and has no undo, so it is never recorded.
	stepSELinux = "selinux"
	// stepOwner gives files to the sandbox's user and has no undo, so it is never recorded.
	stepOwner = "owner"
)

const stateVersion = 1

// vmiState is what the handler keeps of one VMI on disk (<StateDir>/vmis/<uid>.json, 0600), so
// that a new handler process finds, adopts and can tear down what an earlier one made.
type vmiState struct {
	Version   int       `json:"version"`
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace,omitempty"`
	Name      string    `json:"name"`
	// Drivers are the drivers the VMI was set up with: they tear it down, whatever the
	// configuration says by then.
	Drivers DriverSet   `json:"drivers"`
	WorkDir string      `json:"workDir"`
	RunDir  string      `json:"runDir"`
	Sandbox SandboxSpec `json:"sandbox"`
	// Steps are the sync steps begun that have an undo, in order.
	Steps []string `json:"steps,omitempty"`
	// Network is the network driver's SetupRequest (protojson), for Teardown.
	Network json.RawMessage `json:"network,omitempty"`
	// NetworkResult is its SetupResponse (protojson), for the VMI's interfaces.
	NetworkResult json.RawMessage `json:"networkResult,omitempty"`
	// Handle is the hypervisor driver's handle of the VM (protojson), for Recover.
	Handle json.RawMessage `json:"handle,omitempty"`
	// Started is set once Start succeeded: from then on the handler never starts the VM again.
	Started bool `json:"started,omitempty"`
	// Incoming is the migration whose target the VM is, from its creation until it runs here
	// (SyncIncoming).
	Incoming types.UID `json:"incoming,omitempty"`
}

func (s *vmiState) began(step string) bool { return slices.Contains(s.Steps, step) }

func (s *vmiState) begin(step string) {
	if !s.began(step) {
		s.Steps = append(s.Steps, step)
	}
}

func (s *vmiState) handle() *hypervisorv1.Handle {
	if len(s.Handle) == 0 {
		return nil
	}
	h := &hypervisorv1.Handle{}
	if err := protojson.Unmarshal(s.Handle, h); err != nil {
		return nil
	}
	return h
}

func (s *vmiState) setupRequest() *networkv1.SetupRequest {
	r := &networkv1.SetupRequest{}
	if len(s.Network) > 0 {
		_ = protojson.Unmarshal(s.Network, r)
	}
	return r
}

func (s *vmiState) setupResponse() *networkv1.SetupResponse {
	r := &networkv1.SetupResponse{}
	if len(s.NetworkResult) > 0 {
		_ = protojson.Unmarshal(s.NetworkResult, r)
	}
	return r
}

func marshalProto(m proto.Message) json.RawMessage {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil
	}
	return b
}

// stateStore keeps vmiStates in a root-only directory.
type stateStore struct{ dir string }

func (s stateStore) path(uid types.UID) string { return filepath.Join(s.dir, string(uid)+".json") }

// save writes st atomically.
func (s stateStore) save(st *vmiState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("save state of VMI %s: %w", st.UID, err)
	}
	f, err := os.CreateTemp(s.dir, ".tmp-"+string(st.UID)+"-*")
	if err != nil {
		return fmt.Errorf("save state of VMI %s: %w", st.UID, err)
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), s.path(st.UID))
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("save state of VMI %s: %w", st.UID, err)
	}
	return nil
}

func (s stateStore) remove(uid types.UID) error {
	if err := os.Remove(s.path(uid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove state of VMI %s: %w", uid, err)
	}
	return nil
}

// loadAll reads every state in the directory. A file that cannot be read is reported in the
// error and left in place.
func (s stateStore) loadAll() ([]*vmiState, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("read VMI states: %w", err)
	}
	var out []*vmiState
	var errs []error
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var st vmiState
		if err := json.Unmarshal(b, &st); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.Name(), err))
			continue
		}
		if st.Version != stateVersion || string(st.UID)+".json" != e.Name() {
			errs = append(errs, fmt.Errorf("%s: not a version %d state of that VMI", e.Name(), stateVersion))
			continue
		}
		out = append(out, &st)
	}
	return out, errors.Join(errs...)
}
