package network

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/containernetworking/cni/libcni"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	networkv1 "github.com/kubevisor/kubevisor/core/driver/network/v1"
)

// Teardown implements driver.Network. It works from the VMI's state, not from the request:
// it succeeds for a VMI never set up (or already torn down), with the namespace gone (then
// it stops the DHCP servers and runs CNI DEL without a namespace, which releases the IPAM
// allocations), and after a half-made Setup (the state is written before Setup changes
// anything). It fails only when something it should remove stays, and then keeps the state
// so that a later Teardown tries again.
func (d *Driver) Teardown(ctx context.Context, req *networkv1.TeardownRequest) error {
	_, stateDir, cni := d.config()
	vmiID := req.GetVmiId()
	if vmiID == "" {
		return invalid("vmi_id is required")
	}
	defer d.locks.Lock(vmiID)()
	store := stateStore{stateDir}
	st, err := store.load(vmiID)
	if err != nil {
		return status.Errorf(codes.Internal, "VMI %s: %v", vmiID, err)
	}
	if st == nil {
		// Nothing recorded. What could still be there (a DHCP server, a link carrying the
		// VMI's alias) goes all the same.
		d.dhcp.stopVMI(vmiID)
		if req.GetNetnsPath() != "" {
			if err := inNS(req.GetNetnsPath(), func() error { return sweepLinks(owner(vmiID)) }); err != nil && !errors.Is(err, errNSGone) {
				return status.Errorf(codes.Internal, "VMI %s: %v", vmiID, err)
			}
		}
		return nil
	}
	if err := d.teardownState(ctx, cni, store, st); err != nil {
		return status.Errorf(codes.Internal, "VMI %s: teardown: %v", vmiID, err)
	}
	return nil
}

// teardownState removes everything st records, the last interface first, then the state.
func (d *Driver) teardownState(ctx context.Context, cni libcni.CNI, store stateStore, st *vmiState) error {
	var errs []error
	id, err := statNS(st.NetNS)
	alive := err == nil && id == st.NSID
	alias := owner(st.VMIID)
	for _, is := range st.Interfaces {
		d.dhcp.stop(st.VMIID + "/" + is.Name)
	}
	if alive {
		// The kernel takes tens of milliseconds to delete a link (RCU grace periods), and
		// those waits overlap when links go in parallel.
		var names []string
		for _, is := range st.Interfaces {
			names = append(names, is.Tap, is.Bridge)
		}
		if err := deleteLinks(st.NetNS, names, alias); err != nil && !errors.Is(err, errNSGone) {
			errs = append(errs, err)
		}
	}
	for i := len(st.Interfaces) - 1; i >= 0; i-- {
		is := st.Interfaces[i]
		if alive {
			err := inNS(st.NetNS, func() error { return undoInterface(is, alias) })
			if err != nil && !errors.Is(err, errNSGone) {
				errs = append(errs, fmt.Errorf("interface %q: %w", is.Name, err))
			}
		}
		if is.CNI != nil {
			netnsPath := ""
			if alive {
				netnsPath = st.NetNS
			}
			if err := d.cniDel(ctx, cni, st.VMIID, netnsPath, is); err != nil {
				errs = append(errs, fmt.Errorf("interface %q: %w", is.Name, err))
			}
		}
	}
	if alive {
		if err := inNS(st.NetNS, func() error { return sweepLinks(alias) }); err != nil && !errors.Is(err, errNSGone) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := store.remove(st.VMIID); err != nil {
		return err
	}
	d.log.Info("torn down", "vmi", st.VMIID, "netns", st.NetNS, "namespaceGone", !alive)
	return nil
}

// undoInterface removes, in the calling thread's namespace, what Setup made for one
// interface and gives the pod interface back what it took.
func undoInterface(is *ifaceState, alias string) error {
	var errs []error
	errs = append(errs, deleteOwned(is.Tap, alias), deleteOwned(is.Bridge, alias))
	switch is.Binding {
	case BindingBridge:
		if is.Pod != nil {
			errs = append(errs, restorePod(is.PodIface, is.Pod))
		}
	case BindingMasquerade:
		errs = append(errs, deleteNAT(nftables.TableFamilyIPv4, is.PodIface), deleteNAT(nftables.TableFamilyIPv6, is.PodIface))
		// The reverse of the order Setup set them in: forwarding off before accept_ra.
		for _, k := range []string{sysctlForward6, sysctlAcceptRA(is.PodIface), sysctlForward4} {
			if v, ok := is.Sysctls[k]; ok {
				if _, err := writeSysctl(k, v); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// deleteLinks deletes the links names of the namespace that carry alias, in parallel.
func deleteLinks(ns string, names []string, alias string) error {
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = inNS(ns, func() error { return deleteOwned(name, alias) })
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// sweepLinks deletes every link of the calling thread's namespace that carries alias.
func sweepLinks(alias string) error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	var errs []error
	for _, l := range links {
		if l.Attrs().Alias == alias {
			if err := netlink.LinkDel(l); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("delete %s: %w", l.Attrs().Name, err))
			}
		}
	}
	return errors.Join(errs...)
}
