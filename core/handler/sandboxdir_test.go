package handler

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubevisor/kubevisor/core/api/v1alpha1"
)

// recordingDisks is a ContainerDiskResolver that puts every disk at <dir>/<volume>.img and
// records what it was asked.
type recordingDisks struct {
	dir   string
	mu    sync.Mutex
	asked []string // volume=image
}

func (r *recordingDisks) ContainerDisk(_ context.Context, _ *v1alpha1.VirtualMachineInstance, volume string, src *v1alpha1.ContainerDiskSource) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, volume+"="+src.Image)
	return filepath.Join(r.dir, volume+".img"), nil
}

// TestSandboxDirAndContainerDisks: with a sandbox directory the VMI's run and work directories
// are its run/ and volumes/ subdirectories, not under Config.RunDir and VolumeDir; Stop removes
// them and nothing else of the sandbox directory (the launcher's socket directory stays).
// Options.ContainerDisks resolves containerDisk volumes by volume; other volumes and kernels
// still go to the Resolver.
func TestSandboxDirAndContainerDisks(t *testing.T) {
	e := newEnv(t, fakeSet, fakeManifests(t))
	sdir := filepath.Join(e.dir, "vmi", "uid-sdir")
	launcherFile := filepath.Join(sdir, "launcher", "launcher.sock")
	disks := &recordingDisks{dir: filepath.Join(sdir, "containerdisks")}
	for _, d := range []string{filepath.Dir(launcherFile), disks.dir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{launcherFile, filepath.Join(disks.dir, "containerdisk.img")} {
		if err := os.WriteFile(f, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e.opts.Sandboxes = sandboxesOf(map[types.UID]*testSandbox{"uid-sdir": newTestSandbox(SandboxSpec{NetNSPath: "/run/netns/none", Dir: sdir})})
	e.opts.ContainerDisks = disks
	h := e.start()
	vmi := testVMI("sdir", "uid-sdir", "registry.example/guest:1")
	mustRun(t, h, vmi)

	if len(disks.asked) == 0 || disks.asked[0] != "containerdisk=registry.example/guest:1" {
		t.Errorf("ContainerDisks asked %v, want containerdisk=registry.example/guest:1", disks.asked)
	}
	data, err := os.ReadFile(filepath.Join(e.cfg.StateDir, "vmis", "uid-sdir.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ RunDir, WorkDir string }
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	runDir, workDir := filepath.Join(sdir, SandboxRunDir), filepath.Join(sdir, SandboxVolumesDir)
	if st.RunDir != runDir || st.WorkDir != workDir {
		t.Errorf("run directory %s, work directory %s; want %s, %s", st.RunDir, st.WorkDir, runDir, workDir)
	}
	if _, err := os.Stat(runDir); err != nil {
		t.Errorf("run directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.RunDir, "uid-sdir")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a run directory under Config.RunDir too: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.Stop(ctx, vmi, time.Second); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{runDir, workDir} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after Stop: %v", p, err)
		}
	}
	if _, err := os.Stat(launcherFile); err != nil {
		t.Errorf("the launcher's file is gone after Stop: %v", err)
	}
}
