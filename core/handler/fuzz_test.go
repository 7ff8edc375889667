package handler

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// configRefusal starts every line of withDefaults' refusal: the field at fault.
var configRefusal = regexp.MustCompile(`^(stateDir|runDir|volumeDir|drivers|acceleration|diskBus|cdromBus|driverConfig\.[^:]*): `)

// checkConfig parses data as a configuration file in /etc/kubevisor/handler.d and checks it as
// the handler does (withDefaults): every refusal names its field; an accepted configuration has
// absolute directories and positive periods, takes its defaults again unchanged, and written as
// JSON and parsed again (from another directory: every path is absolute now) gives the same
// configuration.
func checkConfig(t *testing.T, data []byte) {
	c, err := parseConfig(data, "/etc/kubevisor/handler.d")
	if err != nil {
		return // a decoding error: YAML's or JSON's own message, or an unknown field
	}
	d, err := c.withDefaults()
	if err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			if !configRefusal.MatchString(line) {
				t.Fatalf("%q: refusal %q names no field", data, line)
			}
		}
		return
	}
	for _, p := range []string{d.StateDir, d.RunDir, d.VolumeDir} {
		if !filepath.IsAbs(p) {
			t.Fatalf("%q: accepted with the relative directory %q", data, p)
		}
	}
	if d.ResyncPeriod.Duration <= 0 || d.GuestAgentPollInterval.Duration <= 0 {
		t.Fatalf("%q: accepted with periods %v and %v", data, d.ResyncPeriod, d.GuestAgentPollInterval)
	}
	if again, err := d.withDefaults(); err != nil || !reflect.DeepEqual(again, d) {
		t.Fatalf("%q: defaults taken again: %+v, %v; first %+v", data, again, err, d)
	}
	written, err := json.Marshal(c)
	if err != nil {
		t.Fatalf("%q: marshal %+v: %v", data, c, err)
	}
	back, err := parseConfig(written, "/elsewhere")
	if err != nil {
		t.Fatalf("%q: written as %s, parsed again: %v", data, written, err)
	}
	if rewritten, _ := json.Marshal(back); string(rewritten) != string(written) {
		t.Fatalf("%q: written as %s, parsed and written again %s", data, written, rewritten)
	}
	if _, err := back.withDefaults(); err != nil {
		t.Fatalf("%q: written as %s, refused: %v", data, written, err)
	}
}

// FuzzConfig feeds the handler's configuration parsing (LoadConfig without the file) and checks
// (withDefaults); the seeds are the install manifests' configuration parts, this package's
// tests' and some malformed ones.
func FuzzConfig(f *testing.F) {
	files, err := filepath.Glob("../../manifests/install/handler.d/*.yaml")
	parts, err2 := filepath.Glob("../../manifests/install/drivers/*/handler.yaml")
	if err != nil || err2 != nil || len(files) == 0 || len(parts) == 0 {
		f.Fatalf("no configuration parts in manifests/install: %v %v", err, err2)
	}
	for _, file := range append(files, parts...) {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, seed := range []string{
		`
pluginDir: plugins
stateDir: /var/lib/kv
runDir: run
nodeName: node-1
drivers: {hypervisor: qmp, network: cni, storage: local}
driverConfig:
  qmp: {disableKVM: true}
acceleration: emulated
cdromBus: scsi
images:
  kubevisor/test-guest:latest: guest/disk.qcow2
claims: {default/data: /dev/vdb}
resyncPeriod: 10s
guestAgentPollInterval: 1m30s
standalone:
  cniBinDir: [cni/bin]
  subnet: 10.244.254.0/24
  launcher: bin/kubevisor-launcher
  cpus: [2, 3]
  bypassLauncher: true
`,
		`{"drivers": {"network": "cni"}, "driverConfig": {"cni": {"cniBinDir": ["/opt/cni/bin"]}}}`,
		"drivers: {hypervisors: [qmp, libvirt], network: cni, devices: [hostdev, sim], device: hostdev}\n",
		"drivers: {hypervisor: x, storage: x}\n",
		"drivers: {hypervisor: qmp}\nstatedir: /x\n",
		"acceleration: fast\ndiskBus: ide\nstateDir: relative\nresyncPeriod: -5s\n",
		"driverConfig: {qmp: \"<&>\", n: 12345678901234567890}\nimages: {}\n",
		"resyncPeriod: 10\n",
		"drivers: [qmp]\n",
		"a: &a [*a, *a]\n",
		"{",
		"",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(checkConfig)
}
