package cli_test

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubevisor/kubevisor/conformance/driver/cli"
	"github.com/kubevisor/kubevisor/drivers/fake"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// repoFile is a file of the repository, from this package's directory.
func repoFile(rel string) string { return filepath.Join("..", "..", "..", rel) }

// The class files the install puts on a cluster.
var (
	qmpClass     = repoFile("manifests/install/drivers/qmp/hypervisorclass.yaml")
	libvirtClass = repoFile("manifests/install/drivers/libvirt/hypervisorclass.yaml")
)

// writeClass writes a class manifest into a directory of its own and returns its path.
func writeClass(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// fakeClass is a class of the fake hypervisor driver (kubevisor-driver-fake) with what a cluster
// applies and the kit does not.
const fakeClass = `apiVersion: kubevisor.io/v1alpha1
kind: HypervisorClass
metadata:
  name: simulated
driver: fake
deviceResources:
- devices.kubevisor.io/kvm
launcherCapabilities:
- SETUID
`

// TestClassUsage: a class file that is not one HypervisorClass the API server would accept, or
// flags that disagree with it, are usage errors naming the file and what is wrong.
func TestClassUsage(t *testing.T) {
	bin := buildFake(t)
	pluginDir := filepath.Dir(bin)
	vmi := writeClass(t, "vmi.yaml", "apiVersion: kubevisor.io/v1alpha1\nkind: VirtualMachineInstance\nmetadata:\n  name: demo\n")
	otherGroup := writeClass(t, "rc.yaml", "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: x\nhandler: runc\n")
	params := writeClass(t, "params.yaml", fakeClass+"parameters:\n  accel: tcg\n")
	sysAdmin := writeClass(t, "admin.json", `{"apiVersion": "kubevisor.io/v1alpha1", "kind": "HypervisorClass", "metadata": {"name": "x"}, "driver": "fake", "launcherCapabilities": ["SYS_ADMIN"]}`)
	unknown := writeClass(t, "unknown.yaml", fakeClass+"launcherCapabilites: [SETGID]\n")
	two := writeClass(t, "two.yaml", fakeClass+"---\n"+fakeClass)
	noDriver := writeClass(t, "nodriver.yaml", "apiVersion: kubevisor.io/v1alpha1\nkind: HypervisorClass\nmetadata:\n  name: x\n")
	fakeFile := writeClass(t, "fake.yaml", fakeClass)
	emptyDir := t.TempDir()
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"WrongKind", []string{"vm", "--class", vmi}, []string{vmi, "is a VirtualMachineInstance (kubevisor.io/v1alpha1), not a HypervisorClass (kubevisor.io/v1alpha1)"}},
		{"WrongGroup", []string{"driver", "--class", otherGroup}, []string{otherGroup, "is a RuntimeClass (node.k8s.io/v1), not a HypervisorClass"}},
		{"Parameters", []string{"vm", "--class", params}, []string{params, "parameters: no hypervisor driver of this release takes class parameters: remove them"}},
		{"ParametersDriver", []string{"driver", "--class", params}, []string{params, "no hypervisor driver of this release takes class parameters"}},
		{"Capability", []string{"vm", "--class", sysAdmin}, []string{sysAdmin, `launcherCapabilities[0]: "SYS_ADMIN" is not one of [SETUID SETGID]`}},
		{"UnknownField", []string{"driver", "--class", unknown}, []string{unknown, `unknown field "launcherCapabilites"`}},
		{"TwoObjects", []string{"driver", "--class", two}, []string{two, "holds 2 objects, want one HypervisorClass"}},
		{"NoDriver", []string{"driver", "--class", noDriver}, []string{noDriver, "driver: required"}},
		{"NoFile", []string{"vm", "--class", filepath.Join(emptyDir, "none.yaml")}, []string{"--class: ", "none.yaml"}},
		{"BinaryNotInPluginDir", []string{"vm", "--class", qmpClass, "--plugin-dir", emptyDir, "--storage", bin, "--guest-dir", emptyDir},
			[]string{qmpClass, `names driver "qmp"`, filepath.Join(emptyDir, "kubevisor-driver-qmp"), "--plugin-dir"}},
		// The install's libvirt class (two launcherCapabilities) reads, and names its binary.
		{"LibvirtBinaryNotInPluginDir", []string{"driver", "--class", libvirtClass, "--plugin-dir", emptyDir},
			[]string{libvirtClass, `names driver "libvirt"`, filepath.Join(emptyDir, "kubevisor-driver-libvirt")}},
		{"BinaryNotInPluginDirDriver", []string{"driver", "--class", fakeFile, "--plugin-dir", emptyDir},
			[]string{filepath.Join(emptyDir, "kubevisor-driver-fake"), "no such file"}},
		{"NameDisagrees", []string{"driver", "--class", fakeFile, "--plugin-dir", pluginDir, "--name", "qmp"},
			[]string{`--name "qmp" disagrees with --class ` + fakeFile + `, whose driver is "fake"`}},
		{"BinaryDisagrees", []string{"vm", "--class", qmpClass, "--hypervisor", bin, "--storage", bin, "--guest-dir", emptyDir},
			[]string{"--hypervisor " + bin + ` is driver "fake" by its file name, --class ` + qmpClass + ` names driver "qmp"`}},
		{"KindNotHypervisor", []string{"driver", "--class", fakeFile, "--kind", "storage"}, []string{"--kind storage: --class names a hypervisor driver"}},
		{"PluginDirWithoutClass", []string{"driver", "--plugin", bin, "--kind", "storage", "--plugin-dir", pluginDir}, []string{"--plugin-dir is for --class"}},
		{"NoHypervisor", []string{"vm", "--storage", bin, "--guest-dir", emptyDir}, []string{"--hypervisor or --class is required"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := run(t, c.args...)
			if code != cli.ExitUsage {
				t.Errorf("exit code %d, want %d", code, cli.ExitUsage)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing: no check runs", stdout)
			}
			for _, w := range c.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
		})
	}
}

// TestDriverClass: `driver --class` runs the hypervisor checks against the class's driver found
// in --plugin-dir, says its launcher capabilities and cluster fields are not applied; a binary
// given with --plugin that agrees with the class is taken; YAML and JSON both read.
func TestDriverClass(t *testing.T) {
	bin := buildFake(t)
	yamlFile := writeClass(t, "fake.yaml", fakeClass)
	jsonFile := writeClass(t, "fake.json", `{"apiVersion": "kubevisor.io/v1alpha1", "kind": "HypervisorClass", "metadata": {"name": "simulated"},
		"driver": "fake", "deviceResources": ["devices.kubevisor.io/kvm"], "launcherCapabilities": ["SETUID"]}`)
	for _, c := range []struct {
		name string
		args []string
	}{
		{"PluginDir", []string{"--class", yamlFile, "--plugin-dir", filepath.Dir(bin)}},
		{"JSON", []string{"--class", jsonFile, "--plugin-dir", filepath.Dir(bin), "--kind", "hypervisor"}},
		{"AgreeingPlugin", []string{"--class", yamlFile, "--plugin", bin, "--name", "fake"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"driver", "--arg", "hypervisor", "--console-marker", fake.ConsoleMarker,
				"--state-dir", filepath.Join(t.TempDir(), "state"), "--run", "Info|Lifecycle"}, c.args...)
			code, stdout, _ := run(t, args...)
			if code != cli.ExitOK {
				t.Errorf("exit code %d, want 0", code)
			}
			for _, want := range []string{
				"=== driver fake (hypervisor): " + bin,
				"=== class simulated: " + c.args[1] + " (driver fake)",
				"=== launcher capabilities: SETUID; not applied: the driver checks start no launcher",
				"=== not applied outside a cluster: deviceResources devices.kubevisor.io/kvm\n",
				"--- PASS: hypervisor/Info/NameAndKind (",
				", 0 failed, 0 skipped",
			} {
				if !strings.Contains(stdout, want) {
					t.Errorf("stdout lacks %q", want)
				}
			}
		})
	}
}

// TestClassDriverNameMismatch: the binary in the plugin directory answers Info with another name
// than the class's driver: the run fails naming both, and the class.
func TestClassDriverNameMismatch(t *testing.T) {
	bin := buildFake(t)
	dir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(dir, "kubevisor-driver-other")); err != nil {
		t.Fatal(err)
	}
	class := writeClass(t, "other.yaml", strings.Replace(fakeClass, "driver: fake", "driver: other", 1))
	code, stdout, _ := run(t, "driver", "--class", class, "--plugin-dir", dir, "--arg", "hypervisor", "--state-dir", t.TempDir())
	if code != cli.ExitFail {
		t.Errorf("exit code %d, want %d", code, cli.ExitFail)
	}
	for _, want := range []string{"--- FAIL: hypervisor (", class, `plugin reports name "fake", manifest says "other"`, "0 passed, 1 failed, 0 skipped"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
}

// TestVMClass boots the test guest with `vm --class`: the qmp class the install uses, whose
// launchers keep no capability, and a class of the qmp driver that keeps SETGID. Beside the
// kit's own check of each launcher, the test reads the capability sets of every launcher the
// run starts while its VM runs (/proc/<pid>/status): exactly the class's, as in its pods.
func TestVMClass(t *testing.T) {
	dir := guestDir(t)
	testenv.Root(t, "the launchers run as root with the class's capabilities only, as in a launcher pod")
	testenv.Command(t, "setpriv", "util-linux")
	st := build(t, "kubevisor-driver-local")
	hv := build(t, "kubevisor-driver-qmp")
	launcher := build(t, "kubevisor-launcher")
	setgid := writeClass(t, "qmp-setgid.yaml", `apiVersion: kubevisor.io/v1alpha1
kind: HypervisorClass
metadata:
  name: qmp-setgid
driver: qmp
launcherCapabilities: [SETGID]
`)
	for _, c := range []struct {
		name, class, run string
		checks           int
		keeps            string
		mask             string // CapBnd, CapPrm and CapEff of every launcher
	}{
		{"InstallClass", qmpClass, "Boot|Kill", 2, "=== launcher capabilities: none (as in a launcher pod of class qmp: root, every capability dropped, no new privileges)", "0000000000000000"},
		{"SETGID", setgid, "Boot", 1, "=== launcher capabilities: SETGID (as in a launcher pod of class qmp-setgid: root, these alone in its bounding, permitted and effective sets, none inheritable, no new privileges)", "0000000000000040"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := watchLaunchers(filepath.Base(launcher))
			code, stdout, _ := run(t, "vm", "--class", c.class, "--plugin-dir", filepath.Dir(hv), "--storage", st, "--guest-dir", dir,
				"--launcher", launcher, "--state-dir", filepath.Join(t.TempDir(), "state"), "--run", c.run)
			seen := w.stop()
			if code != cli.ExitOK {
				t.Errorf("exit code %d, want 0", code)
			}
			for _, want := range []string{"=== hypervisor qmp: " + hv, c.keeps, strconv.Itoa(c.checks) + " passed, 0 failed, 0 skipped"} {
				if !strings.Contains(stdout, want) {
					t.Errorf("stdout lacks %q", want)
				}
			}
			if c.class == qmpClass && !strings.Contains(stdout, "=== not applied outside a cluster: deviceResources devices.kubevisor.io/kvm, devices.kubevisor.io/tun; overhead\n") {
				t.Errorf("stdout does not say the class's deviceResources and overhead are not applied")
			}
			// One launcher per VM: the checks boot one VM each.
			if len(seen) < c.checks {
				t.Fatalf("saw %d launchers running, want at least %d", len(seen), c.checks)
			}
			want := map[string]string{"CapBnd": c.mask, "CapPrm": c.mask, "CapEff": c.mask, "CapInh": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1"}
			for pid, status := range seen {
				for k, v := range want {
					if status[k] != v {
						t.Errorf("launcher pid %d: %s %q, want %q (status %v)", pid, k, status[k], v, status)
					}
				}
			}
		})
	}
}

// launcherWatch records the status of the launchers this process starts while they run.
type launcherWatch struct {
	done chan struct{}
	wg   sync.WaitGroup
	seen map[int]map[string]string
}

// watchLaunchers polls /proc for children of this process running comm (as /proc/<pid>/comm
// shows it: the first 15 bytes of its name) and records the capability lines of their status.
func watchLaunchers(name string) *launcherWatch {
	comm := name
	if len(comm) > 15 {
		comm = comm[:15]
	}
	w := &launcherWatch{done: make(chan struct{}), seen: map[int]map[string]string{}}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		self := strconv.Itoa(os.Getpid())
		for {
			entries, _ := os.ReadDir("/proc")
			for _, e := range entries {
				pid, err := strconv.Atoi(e.Name())
				if err != nil || w.seen[pid] != nil {
					continue
				}
				if status := readStatus(pid); status["PPid"] == self && status["Name"] == comm {
					w.seen[pid] = status
				}
			}
			select {
			case <-w.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return w
}

// stop ends the watch and returns the status of each launcher seen, by pid.
func (w *launcherWatch) stop() map[int]map[string]string {
	close(w.done)
	w.wg.Wait()
	return w.seen
}

// readStatus reads /proc/<pid>/status into its fields (nil when the process is gone).
func readStatus(pid int) map[string]string {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil
	}
	defer f.Close()
	status := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			status[k] = strings.TrimSpace(v)
		}
	}
	return status
}
