package mcs

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/opencontainers/selinux/go-selinux"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseLevel(t *testing.T) {
	for _, s := range []string{"s0:c0,c1", "s0:c3,c7", "s0:c1022,c1023", "s0:c10,c512"} {
		l, err := ParseLevel(s)
		if err != nil {
			t.Errorf("ParseLevel(%q): %v", s, err)
			continue
		}
		if l.String() != s {
			t.Errorf("ParseLevel(%q).String() = %q", s, l.String())
		}
	}
	for _, s := range []string{
		"", "s0", "s0:", "s1:c1,c2", "s0:c1", "s0:c2,c1", "s0:c1,c1", "s0:c1,c1024", "s0:c-1,c2",
		"s0:c01,c2", "s0:c1,c2,c3", "s0:c0.c1023", "s0-s0:c1,c2", "s0:1,2", "s0:c+1,c2", "s0:c1, c2",
		"system_u:object_r:container_file_t:s0:c1,c2",
	} {
		if l, err := ParseLevel(s); err == nil {
			t.Errorf("ParseLevel(%q) = %q, want an error", s, l)
		} else if !strings.Contains(err.Error(), fmt.Sprintf("%q", s)) {
			t.Errorf("ParseLevel(%q): error %q does not name the level", s, err)
		}
	}
}

// TestLevelAt checks the order of the levels Allocate draws from: every pair of distinct
// categories once, the lower first.
func TestLevelAt(t *testing.T) {
	seen := map[Level]bool{}
	n := levels(Categories)
	if n != 523776 {
		t.Fatalf("levels(%d) = %d, want 1024*1023/2", Categories, n)
	}
	for i := range n {
		l := levelAt(i)
		lo, hi := l.Categories()
		if lo >= hi || hi >= Categories {
			t.Fatalf("levelAt(%d) = %v: not two increasing categories below %d", i, l, Categories)
		}
		if seen[l] {
			t.Fatalf("levelAt(%d) = %v twice", i, l)
		}
		seen[l] = true
	}
	if got := levelAt(0).String(); got != "s0:c0,c1" {
		t.Errorf("levelAt(0) = %s", got)
	}
	if got := levelAt(n - 1).String(); got != "s0:c1022,c1023" {
		t.Errorf("levelAt(last) = %s", got)
	}
}

func newAllocator(t *testing.T, categories int) *Allocator {
	t.Helper()
	a, err := NewAllocator(categories)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestAllocateDistinct allocates for 1,000 VMIs: each gets a valid level that is no other's,
// which the library reads as a context's level and reserves once (ReserveLabelV2 refuses a
// level twice).
func TestAllocateDistinct(t *testing.T) {
	selinux.ClearLabels()
	t.Cleanup(selinux.ClearLabels)
	a := newAllocator(t, 0)
	owners := map[Level]string{}
	for i := range 1000 {
		owner := fmt.Sprintf("vmi-%d", i)
		l, err := a.Allocate(owner)
		if err != nil {
			t.Fatalf("Allocate(%s): %v", owner, err)
		}
		if other, ok := owners[l]; ok {
			t.Fatalf("%s and %s both got %s", other, owner, l)
		}
		owners[l] = owner
		back, err := ParseLevel(l.String())
		if err != nil || back != l {
			t.Fatalf("level %s does not read back: %v, %v", l, back, err)
		}
		c, err := selinux.NewContext("system_u:system_r:container_t:" + l.String())
		if err != nil || c["level"] != l.String() {
			t.Fatalf("the library reads %s as level %q (%v)", l, c["level"], err)
		}
		// The library's own list (which works with SELinux disabled) refuses a level twice.
		if err := selinux.ReserveLabelV2(c.Get()); err != nil {
			t.Fatalf("the library's ReserveLabelV2(%s): %v", c.Get(), err)
		}
		if again, err := a.Allocate(owner); err != nil || again != l {
			t.Fatalf("Allocate(%s) again = %s, %v; want %s", owner, again, err, l)
		}
	}
	if a.Len() != 1000 {
		t.Errorf("Len = %d, want 1000", a.Len())
	}
}

// TestAllocateConcurrent: levels given to concurrent callers are distinct too (run with -race).
func TestAllocateConcurrent(t *testing.T) {
	a := newAllocator(t, 0)
	const workers, each = 8, 125
	got := make(chan Level, workers*each)
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range each {
				l, err := a.Allocate(fmt.Sprintf("vmi-%d-%d", w, i))
				if err != nil {
					errs <- err
					return
				}
				got <- l
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	close(got)
	seen := map[Level]bool{}
	for l := range got {
		if seen[l] {
			t.Fatalf("%s given twice", l)
		}
		seen[l] = true
	}
	if len(seen) != workers*each {
		t.Fatalf("%d levels, want %d", len(seen), workers*each)
	}
}

// TestRebuild is a controller restart: a new allocator told of the levels the first one gave
// (as found on the launcher pods) keeps them for their owners and gives new owners none of them.
func TestRebuild(t *testing.T) {
	first := newAllocator(t, 0)
	had := map[string]Level{}
	for i := range 1000 {
		owner := fmt.Sprintf("vmi-%d", i)
		l, err := first.Allocate(owner)
		if err != nil {
			t.Fatal(err)
		}
		had[owner] = l
	}
	second := newAllocator(t, 0)
	for owner, l := range had {
		if err := second.Reserve(owner, l); err != nil {
			t.Fatalf("Reserve(%s, %s): %v", owner, l, err)
		}
	}
	taken := map[Level]bool{}
	for owner, l := range had {
		if got, err := second.Allocate(owner); err != nil || got != l {
			t.Fatalf("after the restart %s has %s (%v), want %s", owner, got, err, l)
		}
		taken[l] = true
	}
	for i := range 1000 {
		owner := fmt.Sprintf("new-%d", i)
		l, err := second.Allocate(owner)
		if err != nil {
			t.Fatal(err)
		}
		if taken[l] {
			t.Fatalf("%s got %s, which is held", owner, l)
		}
		taken[l] = true
	}
}

func TestReserve(t *testing.T) {
	a := newAllocator(t, 0)
	l1, _ := NewLevel(1, 2)
	l2, _ := NewLevel(3, 4)
	if err := a.Reserve("a", l1); err != nil {
		t.Fatal(err)
	}
	if err := a.Reserve("a", l1); err != nil {
		t.Errorf("reserving the same level again: %v", err)
	}
	if err := a.Reserve("a", l2); err == nil {
		t.Error("an owner reserved a second level")
	}
	if l, _ := a.Level("a"); l != l1 {
		t.Errorf("a holds %s after a refused Reserve, want %s", l, l1)
	}
	// A level on two VMIs' pods (made by hand): both hold it until both let it go.
	if err := a.Reserve("b", l1); !errors.Is(err, ErrShared) {
		t.Errorf("Reserve of a held level: %v, want ErrShared", err)
	}
	a.Release("a")
	if l, _ := a.Level("b"); l != l1 {
		t.Errorf("b lost its level when a released it")
	}
	small := newAllocator(t, 3) // (c0,c1) (c0,c2) (c1,c2)
	big, _ := NewLevel(0, 3)
	if err := small.Reserve("x", big); err == nil {
		t.Error("reserved a level outside the categories")
	}
	if err := small.Reserve("x", Level{}); err == nil {
		t.Error("reserved the zero level")
	}
}

// TestReleaseReuses: a released level is given again, and a level of a released owner that
// another owner still holds is not.
func TestReleaseReuses(t *testing.T) {
	a := newAllocator(t, 2) // one level: s0:c0,c1
	l, err := a.Allocate("a")
	if err != nil || l.String() != "s0:c0,c1" {
		t.Fatalf("Allocate = %s, %v", l, err)
	}
	if _, err := a.Allocate("b"); !errors.Is(err, ErrExhausted) {
		t.Fatalf("a second owner of one level: %v, want ErrExhausted", err)
	}
	a.Release("a")
	a.Release("a") // twice is nothing
	if got, err := a.Allocate("b"); err != nil || got != l {
		t.Fatalf("after the release b got %s, %v; want %s", got, err, l)
	}
	if _, ok := a.Level("a"); ok {
		t.Error("a still holds a level")
	}
}

// TestExhaustion fills a small range: every level once, then a clear error, and one more after a
// release.
func TestExhaustion(t *testing.T) {
	a := newAllocator(t, 8) // 28 levels
	if a.Size() != 28 {
		t.Fatalf("Size = %d, want 28", a.Size())
	}
	seen := map[Level]bool{}
	for i := range 28 {
		l, err := a.Allocate(fmt.Sprint(i))
		if err != nil {
			t.Fatalf("Allocate %d of 28: %v", i, err)
		}
		if seen[l] {
			t.Fatalf("%s twice", l)
		}
		seen[l] = true
	}
	_, err := a.Allocate("one-too-many")
	if !errors.Is(err, ErrExhausted) {
		t.Fatalf("Allocate past the end: %v, want ErrExhausted", err)
	}
	for _, want := range []string{"one-too-many", "in use", "28 levels", "8 categories"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	a.Release("17")
	if _, err := a.Allocate("one-too-many"); err != nil {
		t.Fatalf("after a release: %v", err)
	}
}

func TestNewAllocatorRange(t *testing.T) {
	for _, n := range []int{-1, 1, Categories + 1} {
		if _, err := NewAllocator(n); err == nil {
			t.Errorf("NewAllocator(%d) made an allocator", n)
		}
	}
	if a := newAllocator(t, 0); a.Size() != 523776 {
		t.Errorf("the full range has %d levels", a.Size())
	}
}

// BenchmarkAllocateFull measures Allocate once all but a few of the full range's levels are held
// (the ordered search after the random draws).
func BenchmarkAllocateFull(b *testing.B) {
	a, _ := NewAllocator(0)
	for i := range a.Size() - 1 {
		if err := a.Reserve(fmt.Sprint(i), levelAt(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := a.Allocate("last"); err != nil {
			b.Fatal(err)
		}
		a.Release("last")
	}
}

func TestPodLevel(t *testing.T) {
	pod := func(sc *corev1.PodSecurityContext) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: corev1.PodSpec{SecurityContext: sc}}
	}
	for _, p := range []*corev1.Pod{pod(nil), pod(&corev1.PodSecurityContext{}), pod(&corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Type: "container_t"}})} {
		if l, ok, err := PodLevel(p); ok || err != nil {
			t.Errorf("PodLevel(%+v) = %s, %v, %v; want none", p.Spec.SecurityContext, l, ok, err)
		}
	}
	l, ok, err := PodLevel(pod(&corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Level: "s0:c5,c6"}}))
	if !ok || err != nil || l.String() != "s0:c5,c6" {
		t.Errorf("PodLevel = %s, %v, %v; want s0:c5,c6", l, ok, err)
	}
	_, _, err = PodLevel(pod(&corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Level: "s0:c6,c5"}}))
	if err == nil || !strings.Contains(err.Error(), "ns/p") {
		t.Errorf("PodLevel of a pod with level s0:c6,c5: %v, want an error naming the pod", err)
	}
}
