package conformance

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// capabilityNumbers are the Linux capabilities by the name a pod's securityContext gives them
// (CAP_ without its prefix).
var capabilityNumbers = map[string]int{
	"CHOWN": unix.CAP_CHOWN, "DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE, "DAC_READ_SEARCH": unix.CAP_DAC_READ_SEARCH,
	"FOWNER": unix.CAP_FOWNER, "FSETID": unix.CAP_FSETID, "KILL": unix.CAP_KILL, "SETGID": unix.CAP_SETGID,
	"SETUID": unix.CAP_SETUID, "SETPCAP": unix.CAP_SETPCAP, "LINUX_IMMUTABLE": unix.CAP_LINUX_IMMUTABLE,
	"NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE, "NET_BROADCAST": unix.CAP_NET_BROADCAST,
	"NET_ADMIN": unix.CAP_NET_ADMIN, "NET_RAW": unix.CAP_NET_RAW, "IPC_LOCK": unix.CAP_IPC_LOCK,
	"IPC_OWNER": unix.CAP_IPC_OWNER, "SYS_MODULE": unix.CAP_SYS_MODULE, "SYS_RAWIO": unix.CAP_SYS_RAWIO,
	"SYS_CHROOT": unix.CAP_SYS_CHROOT, "SYS_PTRACE": unix.CAP_SYS_PTRACE, "SYS_PACCT": unix.CAP_SYS_PACCT,
	"SYS_ADMIN": unix.CAP_SYS_ADMIN, "SYS_BOOT": unix.CAP_SYS_BOOT, "SYS_NICE": unix.CAP_SYS_NICE,
	"SYS_RESOURCE": unix.CAP_SYS_RESOURCE, "SYS_TIME": unix.CAP_SYS_TIME, "SYS_TTY_CONFIG": unix.CAP_SYS_TTY_CONFIG,
	"MKNOD": unix.CAP_MKNOD, "LEASE": unix.CAP_LEASE, "AUDIT_WRITE": unix.CAP_AUDIT_WRITE,
	"AUDIT_CONTROL": unix.CAP_AUDIT_CONTROL, "SETFCAP": unix.CAP_SETFCAP, "MAC_OVERRIDE": unix.CAP_MAC_OVERRIDE,
	"MAC_ADMIN": unix.CAP_MAC_ADMIN, "SYSLOG": unix.CAP_SYSLOG, "WAKE_ALARM": unix.CAP_WAKE_ALARM,
	"BLOCK_SUSPEND": unix.CAP_BLOCK_SUSPEND, "AUDIT_READ": unix.CAP_AUDIT_READ, "PERFMON": unix.CAP_PERFMON,
	"BPF": unix.CAP_BPF, "CHECKPOINT_RESTORE": unix.CAP_CHECKPOINT_RESTORE,
}

// newConfinement checks the capability names of WithLauncherCapabilities and finds setpriv.
// Confining needs root: a kit that is not root returns a confinement that applies nothing (its
// launchers run as its own user, which has no capability root's launcher pod would keep).
func newConfinement(caps []string) (*confinement, error) {
	c := &confinement{}
	for _, name := range caps {
		n, ok := capabilityNumbers[canonicalCapability(name)]
		if !ok {
			return nil, fmt.Errorf("launcher capability %q: not a Linux capability", name)
		}
		c.mask |= 1 << n
	}
	for name, n := range capabilityNumbers {
		if c.mask&(1<<n) != 0 {
			c.caps = append(c.caps, name)
		}
	}
	slices.Sort(c.caps)
	if os.Geteuid() != 0 {
		c.notRoot = true
		return c, nil
	}
	var err error
	if c.setpriv, err = exec.LookPath("setpriv"); err != nil {
		return nil, fmt.Errorf("confining the launcher to its class's capabilities needs util-linux's setpriv: %w", err)
	}
	return c, nil
}

// canonicalCapability is the name of a capability as a pod's securityContext and
// LauncherCapabilities give it: upper case, without CAP_ ("setuid", "CAP_SETUID": "SETUID").
func canonicalCapability(name string) string {
	return strings.TrimPrefix(strings.ToUpper(name), "CAP_")
}

// command is the launcher's command line, args its arguments: setpriv drops every capability
// but the class's from the bounding set and clears the inheritable set (hence the ambient one),
// sets no-new-privs, and execs the launcher, which as root then has the bounding set as its
// permitted and effective sets, as the compute container of a launcher pod has.
func (c *confinement) command(launcher string, args []string) (string, []string) {
	if c == nil || c.notRoot {
		return launcher, args
	}
	bounding := "-all"
	for _, name := range c.caps {
		bounding += ",+" + strings.ToLower(name)
	}
	return c.setpriv, append([]string{"--bounding-set=" + bounding, "--inh-caps=-all", "--no-new-privs", "--", launcher}, args...)
}

// verify checks what the launcher process pid holds: the class's capabilities exactly in its
// bounding, permitted and effective sets, none inheritable or ambient, no new privileges.
func (c *confinement) verify(pid int) error {
	if c == nil || c.notRoot {
		return nil
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return err
	}
	defer f.Close()
	status := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if key, value, ok := strings.Cut(sc.Text(), ":"); ok {
			status[key] = strings.TrimSpace(value)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	var wrong []string
	for _, w := range []struct {
		key  string
		want uint64
	}{{"CapBnd", c.mask}, {"CapPrm", c.mask}, {"CapEff", c.mask}, {"CapInh", 0}, {"CapAmb", 0}, {"NoNewPrivs", 1}} {
		base, format := 16, "%016x"
		if w.key == "NoNewPrivs" {
			base, format = 10, "%d"
		}
		got, err := strconv.ParseUint(status[w.key], base, 64)
		if err != nil {
			return fmt.Errorf("/proc/%d/status: %s %q: %w", pid, w.key, status[w.key], err)
		}
		if got != w.want {
			wrong = append(wrong, fmt.Sprintf("%s %s, want "+format, w.key, status[w.key], w.want))
		}
	}
	if len(wrong) > 0 {
		return fmt.Errorf("the launcher (pid %d) has %s (%s)", pid, strings.Join(wrong, "; "), c.describe())
	}
	return nil
}
