package network

import (
	"bufio"
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// procNSPath matches a process's namespace path, /proc/<pid>/ns/net.
var procNSPath = regexp.MustCompile(`^/proc/([0-9]+)/ns/net$`)

// resolvConfPath is where the sandbox's resolv.conf is when the driver can know it: the
// file system root of the process whose namespace it is (/proc/<pid>/root/etc/resolv.conf),
// or, for a namespace named by `ip netns` (/run/netns/NAME), /etc/netns/NAME/resolv.conf,
// which `ip netns exec` shows processes as /etc/resolv.conf. "" otherwise.
func resolvConfPath(netnsPath string) string {
	if m := procNSPath.FindStringSubmatch(filepath.Clean(netnsPath)); m != nil {
		return "/proc/" + m[1] + "/root/etc/resolv.conf"
	}
	dir, name := filepath.Split(filepath.Clean(netnsPath))
	if dir == "/run/netns/" || dir == "/var/run/netns/" {
		return filepath.Join(etcNetNS, name, "resolv.conf")
	}
	return ""
}

// etcNetNS is the directory of `ip netns`' per-namespace configuration files.
var etcNetNS = "/etc/netns"

// readResolvConf returns the IPv4 and IPv6 name servers and the search domains of the
// sandbox's resolv.conf; none when it cannot be read.
func readResolvConf(netnsPath string) (dns, dns6, search []string) {
	path := resolvConfPath(netnsPath)
	if path == "" {
		return nil, nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, nil
	}
	dns, search = parseResolvConf(b)
	return dns, parseResolvConf6(b), search
}

// parseResolvConf6 returns the IPv6 name servers of a resolv.conf, without zone (a
// link-local name server of the pod is no use to the guest).
func parseResolvConf6(b []byte) (dns6 []string) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		if a, err := netip.ParseAddr(f[1]); err == nil && a.Is6() && !a.Is4In6() && a.Zone() == "" && !a.IsLinkLocalUnicast() {
			dns6 = append(dns6, a.String())
		}
	}
	return dns6
}

// parseResolvConf returns the IPv4 name servers and search domains of a resolv.conf.
func parseResolvConf(b []byte) (dns, search []string) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if a, err := netip.ParseAddr(f[1]); err == nil && a.Is4() {
				dns = append(dns, a.String())
			}
		case "search":
			search = append([]string(nil), f[1:]...)
		case "domain":
			if search == nil {
				search = []string{f[1]}
			}
		}
	}
	return dns, search
}
