// Command runc-wrapper stands between containerd's runc shim and the real runc on the build
// machines, whose kernel refuses two things every pod sandbox asks for: writing a negative
// oom_score_adj fails with EIO, and RLIMIT_NOFILE cannot be raised above the hard limit the
// machine starts with (20000). containerd's CRI config names this program as the runc
// `BinaryName`; for `create`/`run` it rewrites the bundle's config.json, for `exec` the
// --process file, so that
//
//   - process.oomScoreAdj is dropped (the container keeps the shim's score), and
//   - every process.rlimits entry is clamped to this process's own hard limit of that resource,
//
// and then execs the real runc with the unchanged arguments. Everything else passes through.
// The real runc is RUNC (environment), else the path linked in with -X main.realRunc, else
// /usr/sbin/runc.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// realRunc is the runc this wrapper execs; hack/cluster/up.sh links in `command -v runc`.
var realRunc = "/usr/sbin/runc"

func main() {
	args := os.Args[1:]
	if err := patchFor(args, hardLimit); err != nil {
		// Pass through anyway: runc's own error then says what the kernel refused.
		fmt.Fprintf(os.Stderr, "runc-wrapper: %v\n", err)
	}
	runc := realRunc
	if r := os.Getenv("RUNC"); r != "" {
		runc = r
	}
	argv := append([]string{runc}, args...)
	if err := syscall.Exec(runc, argv, os.Environ()); err != nil {
		fmt.Fprintf(os.Stderr, "runc-wrapper: exec %s: %v\n", runc, err)
		os.Exit(127)
	}
}

// patchFor finds the OCI document a runc command line reads (create/run: <bundle>/config.json;
// exec: the --process file) and patches it in place.
func patchFor(args []string, limit func(string) (uint64, bool)) error {
	cmd, flags := subcommand(args)
	var file string
	switch cmd {
	case "create", "run":
		bundle := flagValue(flags, "bundle", "b")
		if bundle == "" {
			bundle = "."
		}
		file = filepath.Join(bundle, "config.json")
	case "exec":
		file = flagValue(flags, "process", "p")
		if file == "" {
			return nil // the process comes from the command line: nothing to patch
		}
	default:
		return nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read %s: %w", file, err)
	}
	var out []byte
	if cmd == "exec" {
		out, err = patchProcess(data, limit)
	} else {
		out, err = patchSpec(data, limit)
	}
	if err != nil || out == nil {
		if err != nil {
			err = fmt.Errorf("patch %s: %w", file, err)
		}
		return err
	}
	info, err := os.Stat(file)
	if err != nil {
		return err
	}
	return os.WriteFile(file, out, info.Mode().Perm())
}

// globalWithValue lists runc's global flags that take a separate value (runc --help).
var globalWithValue = map[string]bool{"--root": true, "--log": true, "--log-format": true, "--criu": true, "--rootless": true}

// subcommand returns runc's subcommand and the arguments after it.
func subcommand(args []string) (string, []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			if globalWithValue[a] {
				i++
			}
			continue
		}
		return a, args[i+1:]
	}
	return "", nil
}

// flagValue returns the value of --long / -short in args (forms: "--x v", "--x=v", "-x v").
func flagValue(args []string, long, short string) string {
	for i, a := range args {
		if a == "--" {
			break
		}
		for _, name := range []string{"--" + long, "-" + long, "-" + short} {
			if a == name && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
		}
	}
	return ""
}

// patchSpec patches the "process" of an OCI runtime spec; nil output means nothing changed.
func patchSpec(data []byte, limit func(string) (uint64, bool)) ([]byte, error) {
	var spec map[string]any
	if err := decode(data, &spec); err != nil {
		return nil, err
	}
	proc, ok := spec["process"].(map[string]any)
	if !ok || !patchProcessObject(proc, limit) {
		return nil, nil
	}
	return json.Marshal(spec)
}

// patchProcess patches an OCI process document (runc exec --process); nil means unchanged.
func patchProcess(data []byte, limit func(string) (uint64, bool)) ([]byte, error) {
	var proc map[string]any
	if err := decode(data, &proc); err != nil {
		return nil, err
	}
	if !patchProcessObject(proc, limit) {
		return nil, nil
	}
	return json.Marshal(proc)
}

func decode(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // keep 64-bit limits exact
	return dec.Decode(v)
}

// patchProcessObject drops oomScoreAdj and clamps rlimits; it reports whether it changed anything.
func patchProcessObject(proc map[string]any, limit func(string) (uint64, bool)) bool {
	changed := false
	if _, ok := proc["oomScoreAdj"]; ok {
		delete(proc, "oomScoreAdj")
		changed = true
	}
	rlimits, _ := proc["rlimits"].([]any)
	for _, r := range rlimits {
		rl, ok := r.(map[string]any)
		if !ok {
			continue
		}
		typ, _ := rl["type"].(string)
		max, ok := limit(typ)
		if !ok {
			continue
		}
		for _, k := range []string{"hard", "soft"} {
			n, ok := rl[k].(json.Number)
			if !ok {
				continue
			}
			v, err := parseUint(n)
			if err == nil && v > max {
				rl[k] = json.Number(fmt.Sprint(max))
				changed = true
			}
		}
	}
	return changed
}

func parseUint(n json.Number) (uint64, error) {
	var v uint64
	_, err := fmt.Sscan(n.String(), &v)
	return v, err
}

// rlimitNumbers maps the OCI rlimit names to Linux resource numbers (asm-generic/resource.h).
var rlimitNumbers = map[string]int{
	"RLIMIT_CPU": 0, "RLIMIT_FSIZE": 1, "RLIMIT_DATA": 2, "RLIMIT_STACK": 3, "RLIMIT_CORE": 4,
	"RLIMIT_RSS": 5, "RLIMIT_NPROC": 6, "RLIMIT_NOFILE": 7, "RLIMIT_MEMLOCK": 8, "RLIMIT_AS": 9,
	"RLIMIT_LOCKS": 10, "RLIMIT_SIGPENDING": 11, "RLIMIT_MSGQUEUE": 12, "RLIMIT_NICE": 13,
	"RLIMIT_RTPRIO": 14, "RLIMIT_RTTIME": 15,
}

// hardLimit is this process's hard limit of the named resource: the most runc can set.
func hardLimit(name string) (uint64, bool) {
	res, ok := rlimitNumbers[name]
	if !ok {
		return 0, false
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(res, &rl); err != nil {
		return 0, false
	}
	return rl.Max, true
}
