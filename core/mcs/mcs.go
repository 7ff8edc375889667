// Package mcs gives each VirtualMachineInstance an SELinux MCS level of its own ("s0:cX,cY") and
// labels the files a node makes for the VMI with it, so that where SELinux is enabled one VM's
// process cannot open another VM's disks, sockets or cloud-init media.
//
// # Who does what
//
// kubevisor-controller allocates a VMI's level (Allocator) when it builds the VMI's launcher pod
// and sets it as the pod's securityContext.seLinuxOptions.level, which the pod's containers
// (and so the VM process) run at; a pod's security context cannot change, so the level is
// chosen before the pod exists, before the scheduler picks a node. It records the level in the
// VMI's status.selinuxLevel. The allocator keeps nothing of its own: the launcher pods are the
// record, and a controller that starts (or becomes the leader) rebuilds it from the levels on
// the launcher pods that exist. A migration's target pod is a copy of the source's and keeps the
// level; the level is released once the VMI's last launcher pod is gone.
//
// The node handler labels the files it and its drivers make for the VMI outside the pod
// (overlays, emptyDisk images and cloud-init media in the storage driver's work directory, the
// VM's run directory) with the container file type of the node's policy at the pod's level
// (Labeler), where SELinux is enabled; where it is disabled it labels nothing and says so in
// the node label kubevisor.io/selinux (NodeMode).
//
// # Why not the library's allocator
//
// github.com/opencontainers/selinux has an MCS allocator (ContainerLabels, KVMContainerLabel),
// but it cannot serve here: it allocates only where SELinux is enabled on the machine that
// asks, and the controller's machine says nothing about the nodes the VMs run on (it may run
// on a node without SELinux, or off the cluster); it keeps its reservations in one list per
// process, which cannot be rebuilt per owner from the launcher pods; and it draws again for
// ever once every level is taken. Allocator is built on the same scheme (two distinct
// categories of the library's 1024, drawn at random) with levels held per VMI and an error when
// none is left. The library labels the files (label.InitLabels for the node's container file
// label, selinux.Chcon), and parses and writes contexts (selinux.NewContext, Context.Get).
package mcs

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"

	"github.com/opencontainers/selinux/go-selinux"
	corev1 "k8s.io/api/core/v1"
)

// Categories is how many MCS categories levels are made of (c0 to c1023), the library's and
// the container runtimes' range.
const Categories = int(selinux.DefaultCategoryRange)

// Sensitivity is the sensitivity of every level: MCS policies have only s0.
const Sensitivity = "s0"

// Level is an MCS level of two distinct categories, "s0:cLow,cHigh" with Low < High.
type Level struct {
	low, high uint16
}

// NewLevel is the level of categories a and b, in either order; an error when they are equal
// or one is not below Categories.
func NewLevel(a, b int) (Level, error) {
	if a > b {
		a, b = b, a
	}
	switch {
	case a < 0 || b >= Categories:
		return Level{}, fmt.Errorf("categories c%d and c%d: each must be within c0 to c%d", a, b, Categories-1)
	case a == b:
		return Level{}, fmt.Errorf("categories c%d and c%d: a level needs two distinct categories", a, b)
	}
	return Level{low: uint16(a), high: uint16(b)}, nil
}

// ParseLevel reads a level as String writes it, "s0:cX,cY" with X < Y < Categories: the only
// form Allocator gives, so that one level has one spelling.
func ParseLevel(s string) (Level, error) {
	bad := func(why string) (Level, error) {
		return Level{}, fmt.Errorf("SELinux level %q: %s (want %s:cX,cY with X < Y < %d)", s, why, Sensitivity, Categories)
	}
	cats, ok := strings.CutPrefix(s, Sensitivity+":")
	if !ok {
		return bad("no " + Sensitivity + " sensitivity")
	}
	first, second, ok := strings.Cut(cats, ",")
	if !ok {
		return bad("not two categories")
	}
	var c [2]int
	for i, part := range []string{first, second} {
		digits, ok := strings.CutPrefix(part, "c")
		// No sign, no leading zero: one spelling per category.
		if !ok || digits == "" || digits[0] == '+' || digits[0] == '-' || (len(digits) > 1 && digits[0] == '0') {
			return bad(fmt.Sprintf("category %q is not c<number>", part))
		}
		n, err := strconv.Atoi(digits)
		if err != nil {
			return bad(fmt.Sprintf("category %q is not c<number>", part))
		}
		c[i] = n
	}
	if c[0] >= c[1] {
		return bad("the categories are not in increasing order")
	}
	l, err := NewLevel(c[0], c[1])
	if err != nil {
		return bad(err.Error())
	}
	return l, nil
}

// String is the level as SELinux writes it, "s0:cLow,cHigh"; "" for the zero Level.
func (l Level) String() string {
	if l.IsZero() {
		return ""
	}
	return fmt.Sprintf("%s:c%d,c%d", Sensitivity, l.low, l.high)
}

// IsZero says l is no level.
func (l Level) IsZero() bool { return l == Level{} }

// Categories are the level's two categories, the lower first.
func (l Level) Categories() (low, high int) { return int(l.low), int(l.high) }

// levels is how many levels there are of n categories: the pairs of distinct ones.
func levels(n int) int { return n * (n - 1) / 2 }

// levelAt is the i-th level of the pairs of categories, ordered by the higher category then the
// lower: (c0,c1), (c0,c2), (c1,c2), (c0,c3), ...
func levelAt(i int) Level {
	// levels(high) <= i < levels(high+1): high is about (1 + sqrt(1 + 8i)) / 2.
	high := int((1 + math.Sqrt(float64(1+8*i))) / 2)
	for levels(high) > i {
		high--
	}
	for levels(high+1) <= i {
		high++
	}
	return Level{low: uint16(i - levels(high)), high: uint16(high)}
}

// ErrExhausted is returned by Allocate when every level is held.
var ErrExhausted = errors.New("every SELinux MCS level is in use")

// Allocator hands out levels, one per owner (a VMI's UID), each to one owner at a time. It is
// safe for concurrent use. It holds only what it is told (Reserve) and what it gave
// (Allocate), until Release: the caller rebuilds it from its record after a restart.
type Allocator struct {
	categories int
	mu         sync.Mutex
	byOwner    map[string]Level
	// holders are the owners of each held level: one, unless Reserve was told of a level that
	// two owners have (pods made before, or by hand), which is then held until both release it.
	holders map[Level][]string
	rand    *rand.Rand
}

// NewAllocator returns an empty Allocator of levels of the categories c0 to c<categories-1>;
// 0 means Categories (the full range). Fewer leave more categories to the levels a container
// runtime draws for pods that set none, and make exhaustion testable.
func NewAllocator(categories int) (*Allocator, error) {
	if categories == 0 {
		categories = Categories
	}
	if categories < 2 || categories > Categories {
		return nil, fmt.Errorf("%d categories: levels need 2 to %d", categories, Categories)
	}
	return &Allocator{
		categories: categories,
		byOwner:    map[string]Level{},
		holders:    map[Level][]string{},
		rand:       rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}, nil
}

// Size is how many levels the allocator has to give.
func (a *Allocator) Size() int { return levels(a.categories) }

// Len is how many levels are held.
func (a *Allocator) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.holders)
}

// Level is the level owner holds, if any.
func (a *Allocator) Level(owner string) (Level, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.byOwner[owner]
	return l, ok
}

// ErrShared is wrapped by Reserve's error when the level is held by another owner too.
var ErrShared = errors.New("the level is held by another owner")

// Reserve records that owner holds l (a level found on its launcher pod). Reserving the level
// an owner holds again does nothing. It is an error when owner holds another level (it keeps
// that one), when l is outside the allocator's categories, or (ErrShared) when another owner
// holds l too: l is then held by both, and given to nobody else until both released it.
func (a *Allocator) Reserve(owner string, l Level) error {
	if l.IsZero() || int(l.high) >= a.categories {
		return fmt.Errorf("reserve %q for %s: not a level of categories c0 to c%d", l, owner, a.categories-1)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if have, ok := a.byOwner[owner]; ok {
		if have == l {
			return nil
		}
		return fmt.Errorf("reserve %s for %s: it holds %s", l, owner, have)
	}
	others := a.holders[l]
	a.byOwner[owner] = l
	a.holders[l] = append(others, owner)
	if len(others) > 0 {
		return fmt.Errorf("reserve %s for %s: %w (%s)", l, owner, ErrShared, strings.Join(others, ", "))
	}
	return nil
}

// randomTries is how many levels Allocate draws before it looks through them in order: with
// fewer than a quarter of them held, 8 draws find a free one but once in 65536.
const randomTries = 8

// Allocate returns the level owner holds, or gives it a free one, drawn at random; ErrExhausted
// when none is free.
func (a *Allocator) Allocate(owner string) (Level, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l, ok := a.byOwner[owner]; ok {
		return l, nil
	}
	n := levels(a.categories)
	if len(a.holders) >= n {
		return Level{}, fmt.Errorf("allocate a level for %s: %w (%d levels of %d categories)", owner, ErrExhausted, n, a.categories)
	}
	l, found := Level{}, false
	for range randomTries {
		if l = levelAt(a.rand.IntN(n)); len(a.holders[l]) == 0 {
			found = true
			break
		}
	}
	if !found {
		// Most are held: the first free one from a random start, so that there is one.
		start := a.rand.IntN(n)
		for i := range n {
			if l = levelAt((start + i) % n); len(a.holders[l]) == 0 {
				found = true
				break
			}
		}
	}
	if !found {
		return Level{}, fmt.Errorf("allocate a level for %s: %w", owner, ErrExhausted) // unreachable: fewer are held than there are
	}
	a.byOwner[owner] = l
	a.holders[l] = []string{owner}
	return l, nil
}

// Release gives up the level owner holds, if any: once no owner holds it, Allocate may give it
// again.
func (a *Allocator) Release(owner string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.byOwner[owner]
	if !ok {
		return
	}
	delete(a.byOwner, owner)
	rest := a.holders[l][:0:0]
	for _, o := range a.holders[l] {
		if o != owner {
			rest = append(rest, o)
		}
	}
	if len(rest) == 0 {
		delete(a.holders, l)
	} else {
		a.holders[l] = rest
	}
}

// PodLevel is the level pod's containers run at: its securityContext.seLinuxOptions.level (the
// launcher pods' only SELinux option), with ok false when it sets none, and an error when it is
// not a level as String writes it.
func PodLevel(pod *corev1.Pod) (l Level, ok bool, err error) {
	sc := pod.Spec.SecurityContext
	if sc == nil || sc.SELinuxOptions == nil || sc.SELinuxOptions.Level == "" {
		return Level{}, false, nil
	}
	l, err = ParseLevel(sc.SELinuxOptions.Level)
	if err != nil {
		return Level{}, false, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return l, true, nil
}
