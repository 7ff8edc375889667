package qmp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/internal/testenv"
)

// hugepages2M is the host's pool of 2 MiB huge pages.
const hugepages2M = "/sys/kernel/mm/hugepages/hugepages-2048kB"

func readCount(t *testing.T, name string) int {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(hugepages2M, name))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}

// reserveHugepages adds n pages to the host's pool of 2 MiB huge pages until the test ends,
// when the pool is set back to what it was (the kernel frees pages still in use as they are
// released).
func reserveHugepages(t *testing.T, n int) {
	t.Helper()
	testenv.Root(t, "reserve huge pages and mount a hugetlbfs")
	nr := filepath.Join(hugepages2M, "nr_hugepages")
	if _, err := os.Stat(nr); err != nil {
		testenv.Missing(t, "the kernel has no 2 MiB huge pages: %v", err)
	}
	old := readCount(t, "nr_hugepages")
	write := func(v int) error { return os.WriteFile(nr, []byte(strconv.Itoa(v)), 0o644) }
	t.Cleanup(func() {
		if err := write(old); err != nil {
			t.Errorf("restore %s to %d: %v", nr, old, err)
		}
	})
	if err := write(old + n); err != nil {
		testenv.Missing(t, "cannot reserve %d huge pages of 2 MiB: %v", n, err)
	}
	if got := readCount(t, "nr_hugepages"); got < old+n {
		// The kernel found too few free contiguous 2 MiB blocks.
		testenv.Missing(t, "asked the kernel for %d huge pages of 2 MiB, it has %d", old+n, got)
	}
}

// mountHugetlbfs mounts a hugetlbfs of 2 MiB pages holding at most size bytes in a temporary
// directory, unmounted when the test ends.
func mountHugetlbfs(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("hugetlbfs", dir, "hugetlbfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("pagesize=2M,size=%d", size)); err != nil {
		testenv.Missing(t, "mount a hugetlbfs at %s: %v", dir, err)
	}
	t.Cleanup(func() {
		// Lazily: a QEMU being killed may still hold its file.
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// hugeMapping is the size and page size, in kB, of the mapping of pid's whose file is under
// dir, from /proc/PID/smaps.
func hugeMapping(pid int, dir string) (sizeKB, pageKB int, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if !strings.HasSuffix(fields[0], ":") {
			// A mapping's header: address perms offset dev inode [path].
			if in {
				break
			}
			in = len(fields) >= 6 && strings.HasPrefix(fields[5], dir+"/")
			continue
		}
		if !in || len(fields) < 2 {
			continue
		}
		v, _ := strconv.Atoi(fields[1])
		switch fields[0] {
		case "Size:":
			sizeKB = v
		case "KernelPageSize:":
			pageKB = v
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if sizeKB == 0 {
		return 0, 0, errors.New("no mapping of a file in " + dir)
	}
	return sizeKB, pageKB, nil
}

// TestHugepages boots the test guest with its 128 MiB on 2 MiB huge pages of a hugetlbfs that
// the test mounts on pages it reserves on the host: QEMU takes all 64 pages at start
// (prealloc), maps its guest memory from the hugetlbfs with 2 MiB pages, and the guest comes up.
func TestHugepages(t *testing.T) {
	const guest, page = 128 << 20, 2 << 20
	requireQEMU(t)
	testenv.File(t, filepath.Join(guestDir(), "vmlinuz"), "guest")
	reserveHugepages(t, guest/page)
	dir := mountHugetlbfs(t, guest)
	d := newTestDriver(t, t.TempDir())
	h := inProcess(t, d)
	ctx := context.Background()
	spec := realGuestSpec(t, "hugepages")
	spec.Memory = &domainv1.Memory{GuestBytes: guest, Hugepages: &domainv1.Hugepages{PageSizeBytes: page, Path: dir}}

	freeBefore := readCount(t, "free_hugepages")
	if _, err := h.Create(ctx, spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := h.Start(ctx, spec.GetId()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	out, _, _ := attachConsole(t, h, spec.GetId())
	out.waitCount(t, GuestReadyMarker, 1, 120*time.Second)

	freeAfter := readCount(t, "free_hugepages")
	t.Logf("the host's free 2 MiB huge pages: %d before, %d with the guest up", freeBefore, freeAfter)
	if used := freeBefore - freeAfter; used < guest/page {
		t.Errorf("the host's free 2 MiB huge pages dropped by %d, want %d (all the guest memory)", used, guest/page)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks - st.Bfree; used != guest/page {
		t.Errorf("the hugetlbfs has %d pages in use, want %d", used, guest/page)
	}
	pid := readPIDFile(filepath.Join(spec.GetRunDir(), "qemu.pid"))
	sizeKB, pageKB, err := hugeMapping(pid, dir)
	if err != nil {
		t.Fatalf("QEMU's mapping of its guest memory: %v", err)
	}
	t.Logf("QEMU maps %d kB of the hugetlbfs in %d kB pages", sizeKB, pageKB)
	if sizeKB != guest>>10 || pageKB != page>>10 {
		t.Errorf("QEMU maps %d kB of the hugetlbfs in %d kB pages, want %d kB in %d kB pages", sizeKB, pageKB, guest>>10, page>>10)
	}
	if err := h.Kill(ctx, spec.GetId()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
}
