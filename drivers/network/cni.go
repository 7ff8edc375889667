package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// cniConfExtensions are the files of the configuration directory that are read: network
// lists. (libcni deprecates single network configurations, .conf.)
var cniConfExtensions = []string{".conflist"}

// findNetworkList returns the network list of the configuration directory named network:
// a list whose name is network ("ns/net-a") or, as multus does for a networkName with a
// namespace, the part after the slash ("net-a"); the first in file name order. A missing
// list, or one that is there but does not parse, is FailedPrecondition.
func findNetworkList(dir, network string) (*libcni.NetworkConfigList, string, error) {
	want := []string{network}
	if _, name, ok := strings.Cut(network, "/"); ok {
		want = append(want, name)
	}
	files, err := libcni.ConfFiles(dir, cniConfExtensions)
	if err != nil {
		return nil, "", status.Errorf(codes.FailedPrecondition, "read CNI configuration directory %s: %v", dir, err)
	}
	sort.Strings(files)
	var unparsable []string
	type found struct {
		list *libcni.NetworkConfigList
		file string
	}
	matches := map[string]found{}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			unparsable = append(unparsable, fmt.Sprintf("%s: %v", filepath.Base(file), err))
			continue
		}
		list, err := libcni.NetworkConfFromBytes(b)
		if err != nil {
			var head struct {
				Name string `json:"name"`
			}
			if json.Unmarshal(b, &head) == nil && slices.Contains(want, head.Name) {
				return nil, "", status.Errorf(codes.FailedPrecondition, "CNI network list %q (%s) does not parse: %v", head.Name, file, err)
			}
			unparsable = append(unparsable, fmt.Sprintf("%s: %v", filepath.Base(file), err))
			continue
		}
		if _, dup := matches[list.Name]; !dup && slices.Contains(want, list.Name) {
			matches[list.Name] = found{list, file}
		}
	}
	for _, name := range want {
		if m, ok := matches[name]; ok {
			return m.list, m.file, nil
		}
	}
	msg := fmt.Sprintf("no CNI network list named %q", network)
	if len(want) > 1 {
		msg += fmt.Sprintf(" or %q", want[1])
	}
	msg += " in " + dir
	if len(unparsable) > 0 {
		msg += " (files that do not parse: " + strings.Join(unparsable, "; ") + ")"
	}
	return nil, "", status.Error(codes.FailedPrecondition, msg)
}

// runtimeConf is the CNI runtime configuration of a VMI's secondary interface.
func runtimeConf(vmiID, netnsPath, ifName string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: vmiID, NetNS: netnsPath, IfName: ifName}
}

// cniAdd runs ADD of the interface's network list, unless an earlier Setup did. It records
// the list in the state before ADD runs, so that Teardown runs DEL whatever happens next.
func (s *session) cniAdd(p *ifacePlan, is *ifaceState) error {
	if is.CNI != nil && is.CNI.Added {
		return nil
	}
	list, file, err := findNetworkList(s.cfg.CNIConfDir, p.network)
	if err != nil {
		return err
	}
	is.CNI = &cniState{List: list.Name, File: file, Config: list.Bytes, IfName: p.podIface}
	if err := s.save(); err != nil {
		return err
	}
	rt := runtimeConf(s.st.VMIID, s.st.NetNS, p.podIface)
	if cached, err := s.cni.GetNetworkListCachedResult(list, rt); err == nil && cached != nil {
		// An ADD whose success was not recorded: undo it first, or ADD fails on the
		// interface it made.
		_ = s.cni.DelNetworkList(s.ctx, list, rt)
	}
	res, err := s.cni.AddNetworkList(s.ctx, list, rt)
	if err != nil {
		return cniError(s.ctx, "ADD", list.Name, err)
	}
	// CHECK now, while the interface is as the plugins made it: once the binding has moved
	// its address and MAC to the guest, the plugins' CHECK fails by design (see cniCheck).
	if err := s.cni.CheckNetworkList(s.ctx, list, rt); err != nil && !errors.Is(err, libcni.ErrorCheckNotSupp) {
		return cniError(s.ctx, "CHECK", list.Name, err)
	}
	if r, err := types100.NewResultFromResult(res); err == nil {
		is.CNI.DNS = r.DNS.Nameservers
		is.CNI.Search = r.DNS.Search
	}
	is.CNI.Added = true
	return s.save()
}

// cniCheck checks the interface's attachment: libcni must still have the result of its
// ADD. CNI CHECK itself (which Setup runs right after ADD) cannot be run once the binding
// gave the interface's address and MAC to the guest: the plugins' CHECK compares the
// interface with the ADD result ("Interface net1 Mac ... doesn't match container Mac").
func (s *session) cniCheck(is *ifaceState) error {
	list, err := libcni.NetworkConfFromBytes(is.CNI.Config)
	if err != nil {
		return fmt.Errorf("parse the network list it was set up with: %w", err)
	}
	res, err := s.cni.GetNetworkListCachedResult(list, runtimeConf(s.st.VMIID, s.st.NetNS, is.CNI.IfName))
	if err != nil || res == nil {
		return status.Errorf(codes.FailedPrecondition, "CNI network %q: no cached ADD result in the cache directory (%v)", list.Name, err)
	}
	return nil
}

// cniDel runs DEL of the interface's network list, with the namespace when it is still there.
func (d *Driver) cniDel(ctx context.Context, cni libcni.CNI, vmiID, netnsPath string, is *ifaceState) error {
	list, err := libcni.NetworkConfFromBytes(is.CNI.Config)
	if err != nil {
		return fmt.Errorf("parse the network list it was set up with: %w", err)
	}
	rt := runtimeConf(vmiID, netnsPath, is.CNI.IfName)
	err = cni.DelNetworkList(ctx, list, rt)
	if err != nil && isPluginMissing(err) {
		// libcni stops at the first plugin it cannot find, and the plugins before it in the
		// list (after it, for DEL) would keep what they allocated. A plugin that is not there
		// cannot undo anything: run DEL of the others.
		binDirs := d.binDirs()
		reduced := *list
		reduced.Plugins = nil
		var missing []string
		for _, p := range list.Plugins {
			if _, ferr := invoke.FindInPath(p.Network.Type, binDirs); ferr != nil {
				missing = append(missing, p.Network.Type)
				continue
			}
			reduced.Plugins = append(reduced.Plugins, p)
		}
		d.log.Warn("CNI DEL without the plugins that are missing", "network", list.Name, "missing", missing, "vmi", vmiID)
		err = cni.DelNetworkList(ctx, &reduced, rt)
	}
	if err != nil {
		return cniError(ctx, "DEL", list.Name, err)
	}
	return nil
}

// binDirs are the CNI plugin directories as last configured.
func (d *Driver) binDirs() []string {
	cfg, _, _ := d.config()
	return cfg.CNIBinDir
}

// isPluginMissing reports whether err is libcni's "failed to find plugin".
func isPluginMissing(err error) bool {
	return strings.Contains(err.Error(), "failed to find plugin")
}

// cniError is the status error of a failed CNI operation: FailedPrecondition when a plugin
// is missing, DeadlineExceeded or Canceled with the context, Internal with the plugin's own
// message otherwise.
func cniError(ctx context.Context, op, network string, err error) error {
	var te *types.Error
	switch {
	case ctx.Err() != nil:
		return status.FromContextError(fmt.Errorf("CNI %s of network %q: %w", op, network, err)).Err()
	case errors.As(err, &te) && te.Code == types.ErrIncompatibleCNIVersion:
		return status.Errorf(codes.FailedPrecondition, "CNI %s of network %q: %v", op, network, err)
	case errors.As(err, &te):
		return status.Errorf(codes.Internal, "CNI %s of network %q: plugin failed: %v", op, network, err)
	case isPluginMissing(err):
		return status.Errorf(codes.FailedPrecondition, "CNI %s of network %q: %v", op, network, err)
	}
	return status.Errorf(codes.Internal, "CNI %s of network %q: %v", op, network, err)
}
