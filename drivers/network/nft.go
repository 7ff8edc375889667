package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The functions of this file work on the network namespace of the calling thread: they run
// inside inNS. They speak nftables' netlink protocol (github.com/google/nftables); no nft
// binary is needed.

// nftTable is the name of the masquerade binding's table (in the ip and ip6 families) for
// the pod interface podIface.
func nftTable(podIface string) string { return "kubevisor_" + podIface }

// masqNAT is the NAT of one family of the masquerade binding.
type masqNAT struct {
	family   nftables.TableFamily
	podIface string
	// podAddrs are the pod interface's addresses of the family: traffic to them is the
	// guest's.
	podAddrs []netip.Addr
	guest    netip.Addr
	// ports are forwarded to the guest; none means every port (and every protocol).
	ports []portState
}

// Chains of a masquerade table.
const (
	chainPrerouting  = "prerouting"
	chainOutput      = "output"
	chainPostrouting = "postrouting"
)

// rules returns the rules of each chain of the table, as KubeVirt's masquerade has them:
//
//	prerouting   iifname P ip daddr <pod address> [tcp|udp dport N] counter dnat to <guest>
//	output       ip daddr <pod address> [tcp|udp dport N] counter dnat to <guest>
//	postrouting  oifname P ip saddr <guest> counter masquerade
//
// prerouting brings the guest what reaches the pod from the network; output what processes
// of the pod itself send to the pod address; postrouting hides the guest behind the pod
// address on the way out.
func (m masqNAT) rules() map[string][][]expr.Any {
	daddrOff, saddrOff, alen := uint32(16), uint32(12), uint32(4)
	natFamily := uint32(unix.NFPROTO_IPV4)
	if m.family == nftables.TableFamilyIPv6 {
		daddrOff, saddrOff, alen = 24, 8, 16
		natFamily = unix.NFPROTO_IPV6
	}
	dnat := []expr.Any{
		&expr.Counter{},
		&expr.Immediate{Register: 1, Data: m.guest.AsSlice()},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: natFamily, RegAddrMin: 1},
	}
	var pre, out [][]expr.Any
	for _, a := range m.podAddrs {
		match := []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: daddrOff, Len: alen},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()},
		}
		var portMatches [][]expr.Any
		for _, p := range m.ports {
			proto := byte(unix.IPPROTO_TCP)
			if p.Protocol == "UDP" {
				proto = unix.IPPROTO_UDP
			}
			portMatches = append(portMatches, []expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, uint16(p.Port))},
			})
		}
		if len(portMatches) == 0 {
			portMatches = [][]expr.Any{nil}
		}
		for _, pm := range portMatches {
			pre = append(pre, concat(ifaceMatch(expr.MetaKeyIIFNAME, m.podIface), match, pm, dnat))
			out = append(out, concat(match, pm, dnat))
		}
	}
	post := [][]expr.Any{concat(
		ifaceMatch(expr.MetaKeyOIFNAME, m.podIface),
		[]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: saddrOff, Len: alen},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: m.guest.AsSlice()},
			&expr.Counter{},
			&expr.Masq{},
		},
	)}
	return map[string][][]expr.Any{chainPrerouting: pre, chainOutput: out, chainPostrouting: post}
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// ifaceMatch matches the input or output interface's name.
func ifaceMatch(key expr.MetaKey, name string) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

// chainHooks are the hook and priority of each chain.
var chainHooks = map[string]struct {
	hook *nftables.ChainHook
	prio *nftables.ChainPriority
}{
	chainPrerouting:  {nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest},
	chainOutput:      {nftables.ChainHookOutput, nftables.ChainPriorityNATDest},
	chainPostrouting: {nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource},
}

// applyNAT replaces the family's masquerade table with one holding m's rules, in one
// transaction: the table never is half there.
func applyNAT(m masqNAT) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	name := nftTable(m.podIface)
	t := &nftables.Table{Family: m.family, Name: name}
	exists, err := tableExists(c, name, m.family)
	if err != nil {
		return err
	}
	if exists {
		c.DelTable(t)
	}
	c.AddTable(t)
	for chainName, rules := range m.rules() {
		h := chainHooks[chainName]
		ch := c.AddChain(&nftables.Chain{Name: chainName, Table: t, Type: nftables.ChainTypeNAT, Hooknum: h.hook, Priority: h.prio})
		for _, r := range rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: add table %s %s: %w", familyName(m.family), name, err)
	}
	return nil
}

// checkNAT reports an error unless the family's masquerade table holds m's chains with
// as many rules as m has.
func checkNAT(m masqNAT) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	name := nftTable(m.podIface)
	exists, err := tableExists(c, name, m.family)
	if err != nil {
		return err
	}
	if !exists {
		return fmt.Errorf("nftables table %s %s is missing", familyName(m.family), name)
	}
	t := &nftables.Table{Family: m.family, Name: name}
	for chainName, want := range m.rules() {
		ch, err := c.ListChain(t, chainName)
		if err != nil {
			return fmt.Errorf("nftables chain %s of table %s %s is missing", chainName, familyName(m.family), name)
		}
		got, err := c.GetRules(t, ch)
		if err != nil {
			return fmt.Errorf("nftables: list rules of %s: %w", chainName, err)
		}
		if len(got) != len(want) {
			return fmt.Errorf("nftables chain %s of table %s %s has %d rules, want %d", chainName, familyName(m.family), name, len(got), len(want))
		}
	}
	return nil
}

// deleteNAT deletes the family's masquerade table of podIface, if there is one.
func deleteNAT(family nftables.TableFamily, podIface string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	name := nftTable(podIface)
	if exists, err := tableExists(c, name, family); err != nil || !exists {
		return err
	}
	c.DelTable(&nftables.Table{Family: family, Name: name})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: delete table %s %s: %w", familyName(family), name, err)
	}
	return nil
}

// tableExists reports whether the table is there.
func tableExists(c *nftables.Conn, name string, family nftables.TableFamily) (bool, error) {
	_, err := c.ListTableOfFamily(name, family)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT):
		return false, nil
	}
	return false, fmt.Errorf("nftables: find table %s %s: %w", familyName(family), name, err)
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	}
	return fmt.Sprint(f)
}
