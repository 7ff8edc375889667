package network

import (
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
)

// fingerprint is HEALTHY when probeKernel succeeds, with the CNI plugins found as the
// attribute cni-plugins ("bridge.host-local.loopback.ptp"); UNHEALTHY saying why otherwise.
func fingerprint(cfg Config) *basev1.FingerprintResponse {
	if err := probeKernel(); err != nil {
		return &basev1.FingerprintResponse{
			Health:            basev1.Health_HEALTH_UNHEALTHY,
			HealthDescription: fmt.Sprintf("cannot make the sandbox objects of the bindings (run as root, with CAP_NET_ADMIN and CAP_SYS_ADMIN): %v", err),
		}
	}
	plugins := findPlugins(cfg.CNIBinDir)
	desc := fmt.Sprintf("bridge and masquerade bindings; CNI plugins in %s: %s", strings.Join(cfg.CNIBinDir, ":"), strings.Join(plugins, " "))
	if len(plugins) == 0 {
		desc = fmt.Sprintf("bridge and masquerade bindings; no CNI plugin in %s: secondary networks will fail", strings.Join(cfg.CNIBinDir, ":"))
	}
	return &basev1.FingerprintResponse{
		Health:            basev1.Health_HEALTH_HEALTHY,
		HealthDescription: desc,
		Attributes: map[string]string{
			"cni-plugins": labelList(plugins),
			"bindings":    labelList(Bindings),
		},
	}
}

// probeKernel makes, in a new network namespace that goes away afterwards, what Setup makes
// in a sandbox: a bridge, a tap in it, an nftables NAT table.
func probeKernel() error {
	return inNewNS(func() error {
		br, err := ensureBridge("kvprobe-br", "kubevisor:probe", 1500, nil)
		if err != nil {
			return err
		}
		if _, err := ensureTap("kvprobe-tap", "kubevisor:probe", br, 1500, 0, 0, false); err != nil {
			return err
		}
		if _, err := netlink.LinkByName("kvprobe-tap"); err != nil {
			return err
		}
		return applyNAT(masqNAT{family: nftables.TableFamilyIPv4, podIface: "kvprobe-br", guest: netip.MustParseAddr("10.0.2.2")})
	})
}

// findPlugins lists the executable files of the CNI plugin directories, sorted, once each.
func findPlugins(dirs []string) []string {
	var names []string
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			info, err := e.Info()
			if err != nil || !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
				continue
			}
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// labelUnsafe are the characters a label value cannot hold.
var labelUnsafe = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// labelList joins names with dots into a valid label value: at most 63 characters (whole
// names only), alphanumeric at both ends.
func labelList(names []string) string {
	out := ""
	for _, n := range names {
		n = strings.Trim(labelUnsafe.ReplaceAllString(n, "-"), "._-")
		if n == "" {
			continue
		}
		next := n
		if out != "" {
			next = out + "." + n
		}
		if len(next) > 63 {
			break
		}
		out = next
	}
	return out
}
