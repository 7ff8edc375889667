package conformance

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	"github.com/kubevisor/kubevisor/core/driver"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	storagev1 "github.com/kubevisor/kubevisor/core/driver/storage/v1"
)

// Channels of a migration, as a MigrationRelay carries them: the memory and device state, and
// the disks the migration copies (the target's NBD server).
const (
	ChannelMemory = "memory"
	ChannelDisks  = "disks"
)

const (
	// migrationDisksSocketName is the target's NBD socket in its run directory.
	migrationDisksSocketName = "migration-disks.sock"
	// markerSector and markerLoopSector are where the guest writes its markers on a disk
	// (512-byte sectors): one before the migration, then one per loop pass from the second.
	markerSector     = 1000
	markerLoopSector = 2000
	// markerTailSectors is how far from a top-only disk's end its marker is.
	markerTailSectors = 2048
)

// checkMigrateLocalDisks: a guest with writable node-local disks (the containerDisk's overlay,
// an emptyDisk) moves to the peer with its disks copied (Capabilities.migration_disks): the
// target gets fresh images of its own from the storage driver (prepared again for it, in a
// work directory of its own), serves them over NBD (incoming_migration.disks), and the source
// mirrors them into it, the containerDisk's top image only, the emptyDisk whole. The guest
// writes a marker on each disk before the migration and keeps writing numbered markers on the
// emptyDisk while it migrates; on the target, its page cache dropped, it reads every marker
// back from its disks. Before that, Migrate refuses a disk it cannot copy (the cloud-init
// CD-ROM), and the source reports the disks' progress.
func (s *vmSuite) checkMigrateLocalDisks(t T) {
	peer := s.requireMigration(t)
	hv, hvCaps := s.hypervisor(t)
	if !hvCaps.GetMigrationDisks() {
		t.Skipf("the hypervisor driver does not declare Capabilities.migration_disks (copying writable node-local disks in a migration)")
	}
	st, stCaps := s.storage(t)
	requireVolumeType(t, stCaps, "emptyDisk")
	vm := s.boot(t, "")
	ctx := s.ctx(t)
	m := optional[driver.Migrator](t, hv, basev1.Feature_FEATURE_HYPERVISOR_MIGRATE)

	// The target's fresh images: the same volumes prepared again in a work directory of its own.
	plan := s.plan(t, hvCaps, stCaps, "", vm.token)
	fresh := (&storageSuite{s.suite}).prepare(t, st, &request{vmiID: vm.id, workDir: t.TempDir(), volumes: plan.volumes})
	var copies []*hypervisorv1.MigrateDisk
	sizes := map[string]uint64{}
	for _, d := range fresh {
		if d.GetReadOnly() || d.GetCdrom() {
			continue
		}
		top := volumeOf(plan.volumes, d.GetVolumeName()).GetContainerDisk() != nil
		copies = append(copies, &hypervisorv1.MigrateDisk{Name: d.GetVolumeName(), TopOnly: top})
		sizes[d.GetVolumeName()] = d.GetSizeBytes()
	}
	if !slices.ContainsFunc(copies, func(c *hypervisorv1.MigrateDisk) bool { return c.GetName() == emptyDiskVolume }) {
		t.Fatalf("the emptyDisk is not among the writable disks the storage driver prepared: %v", fresh)
	}

	// The guest finds each disk by its size, and writes its markers.
	devs := map[string]string{}
	for name, size := range sizes {
		if size == 0 || size%512 != 0 {
			continue
		}
		dev, err := guestValue(ctx, vm.console, "dev"+strconv.Itoa(len(devs)),
			fmt.Sprintf("$(for b in /sys/block/*; do [ \"$(cat $b/size)\" = %d ] && echo ${b##*/}; done | head -n 1)", size/512))
		if err != nil || dev == "" {
			t.Fatalf("find the guest's disk %q of %d bytes: %v", name, size, err)
		}
		devs[name] = dev
	}
	if _, ok := devs[emptyDiskVolume]; !ok {
		t.Fatalf("the guest has no disk of the emptyDisk's size (%d bytes)", sizes[emptyDiskVolume])
	}
	for name, dev := range devs {
		if err := vm.console.typeUntil(ctx, writeMarker(dev, markerSectorOf(sizes[name], topOnly(copies, name)), vm.token+"-"+name, name), "kv-marked-"+name+"-42", commandWithin); err != nil {
			t.Fatalf("write a marker on disk %q (/dev/%s): %v", name, dev, err)
		}
	}
	empty := devs[emptyDiskVolume]
	// From here on the guest writes a numbered marker on the emptyDisk five times a second.
	loop := fmt.Sprintf("(i=0; while true; do i=$((i+1)); printf 'KVMARK-%s-%%d\\n' $i | dd of=/dev/%s bs=512 seek=$((%d+i)) conv=sync,fsync 2>/dev/null && echo $i > /tmp/kvmark-n; sleep 0.2; done) & echo $! > /tmp/kvmark-pid; echo kv-loop-$((6*7))",
		vm.token, empty, markerLoopSector)
	if err := vm.console.typeUntil(ctx, loop, "kv-loop-42", commandWithin); err != nil {
		t.Fatalf("start writing markers in a loop: %v", err)
	}
	before, err := guestCount(ctx, vm.console, "n0", "$(cat /tmp/kvmark-n 2>/dev/null || echo 0)")
	if err != nil {
		t.Fatalf("read the loop's count: %v", err)
	}

	tgt := s.prepareTargetWith(t, peer, vm, func(spec *domainv1.DomainSpec) {
		for _, d := range spec.GetDisks() {
			for _, f := range fresh {
				if f.GetVolumeName() == d.GetName() {
					d.Path, d.Format = f.GetPath(), f.GetFormat()
				}
			}
		}
		in := spec.GetIncomingMigration()
		in.DisksSocketPath = filepath.Join(spec.GetRunDir(), migrationDisksSocketName)
		for _, c := range copies {
			in.Disks = append(in.Disks, c.GetName())
		}
	})
	paths := s.migrationPaths(t, vm, tgt)

	// What Migrate refuses, the VM running on.
	expectCode(t, m.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: vm.id, TargetSocketPath: paths[ChannelMemory], TargetDisksSocketPath: paths[ChannelDisks],
		Disks: []*hypervisorv1.MigrateDisk{{Name: cloudInitVolume}}}), codes.InvalidArgument, "Migrate copying the read-only cloud-init CD-ROM")
	expectCode(t, m.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: vm.id, TargetSocketPath: paths[ChannelMemory], Disks: copies}),
		codes.InvalidArgument, "Migrate with disks and no targetDisksSocketPath")
	s.expectState(t, vm, hypervisorv1.State_STATE_RUNNING, "refused migrations")

	start := time.Now()
	if err := m.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: vm.id, TargetSocketPath: paths[ChannelMemory], TargetDisksSocketPath: paths[ChannelDisks],
		Disks: copies, CompletionTimeout: durationpb.New(s.opts.Timeout)}); err != nil {
		t.Fatalf("Migrate copying disks %v: %s", copies, describe(err))
	}
	var diskSamples int
	info := s.waitMigration(t, m, vm.id, func(info *hypervisorv1.MigrationInfo) bool {
		if info.GetDiskTotalBytes() > 0 && len(info.GetDisks()) == len(copies) {
			diskSamples++
		}
		return false
	})
	took := time.Since(start)
	if info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED {
		t.Fatalf("the migration ended %s: %q; target events: %s", info.GetPhase(), info.GetMessage(), tgt.events)
	}
	t.Logf("migrated with %d disks in %s: downtime %s, disks %d of %d bytes copied, memory %d bytes; %v",
		len(copies), took.Round(time.Millisecond), info.GetDowntime().AsDuration(), info.GetDiskTransferredBytes(), info.GetDiskTotalBytes(), info.GetTransferredBytes(), info.GetDisks())
	if diskSamples == 0 {
		t.Errorf("MigrationStatus never reported the disks' progress (disk_total_bytes, disks) while the migration ran")
	}
	if info.GetDiskTransferredBytes() == 0 || len(info.GetDisks()) != len(copies) {
		t.Errorf("the completed migration reports %d disk bytes copied over %d disks, want the copies of %d disks", info.GetDiskTransferredBytes(), len(info.GetDisks()), len(copies))
	}
	for _, d := range info.GetDisks() {
		if !d.GetReady() {
			t.Errorf("disk %q of the completed migration is not reported ready (in sync)", d.GetName())
		}
	}
	if st := s.waitState(t, vm, hypervisorv1.State_STATE_STOPPED, targetStopWithin); st.GetReason() != driver.ReasonMigrated {
		t.Errorf("after the migration the source is %s (reason %q), want STOPPED with reason %s", st.GetState(), st.GetReason(), driver.ReasonMigrated)
	}
	if tst := s.waitState(t, tgt.guestVM, hypervisorv1.State_STATE_RUNNING, targetStopWithin); tst.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Fatalf("after the migration the target is %s (reason %q, message %q); its events: %s", tst.GetState(), tst.GetReason(), tst.GetMessage(), tgt.events)
	}

	// On the target: the loop stopped, the page cache dropped, every marker read from the disks.
	c := optional[driver.Consoler](t, peer, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE)
	tgt.console = attachConsole(t, c, vm.id)
	if err := tgt.console.typeUntil(ctx, "kill $(cat /tmp/kvmark-pid); sleep 0.5; sync; echo 3 > /proc/sys/vm/drop_caches; echo kv-dropped-$((6*7))", "kv-dropped-42", commandWithin); err != nil {
		t.Fatalf("stop the loop and drop the page cache on the target: %v", err)
	}
	n, err := guestCount(ctx, tgt.console, "n1", "$(cat /tmp/kvmark-n)")
	if err != nil {
		t.Fatalf("read the loop's count on the target: %v", err)
	}
	if n <= before {
		t.Errorf("the guest wrote no marker while it migrated: %d before, %d after", before, n)
	}
	for name, dev := range devs {
		want := "KVMARK-" + vm.token + "-" + name
		got, err := guestValue(ctx, tgt.console, "m-"+name, fmt.Sprintf("$(dd if=/dev/%s bs=512 skip=%d count=1 2>/dev/null | head -n 1)", dev, markerSectorOf(sizes[name], topOnly(copies, name))))
		if err != nil || got != want {
			t.Errorf("disk %q (/dev/%s, %s) on the target: the marker written before the migration reads %q (%v), want %q",
				name, dev, map[bool]string{true: "top image copied", false: "copied whole"}[topOnly(copies, name)], got, err, want)
		}
	}
	bad, err := guestCount(ctx, tgt.console, "bad", fmt.Sprintf("$(b=0; i=1; while [ $i -le %d ]; do [ \"$(dd if=/dev/%s bs=512 skip=$((%d+i)) count=1 2>/dev/null | head -n 1)\" = \"KVMARK-%s-$i\" ] || b=$((b+1)); i=$((i+1)); done; echo $b)",
		n, empty, markerLoopSector, vm.token))
	switch {
	case err != nil:
		t.Errorf("read the loop's markers on the target: %v", err)
	case bad != 0:
		t.Errorf("%d of the %d markers the guest wrote on the emptyDisk (%d of them before the migration began) are not on the target's disk", bad, n, before)
	default:
		t.Logf("the target's guest read back all %d markers of the loop (%d written before the migration began) and the marker of each of %d disks", n, before, len(devs))
	}
}

// topOnly says whether copies copy disk name's top image only.
func topOnly(copies []*hypervisorv1.MigrateDisk, name string) bool {
	i := slices.IndexFunc(copies, func(c *hypervisorv1.MigrateDisk) bool { return c.GetName() == name })
	return i >= 0 && copies[i].GetTopOnly()
}

// markerSectorOf is where a disk's single marker goes: near the end of a top-only disk (past
// what its base image holds at its start: the guest's boot files), else at markerSector.
func markerSectorOf(size uint64, top bool) uint64 {
	if top && size/512 > 2*markerTailSectors {
		return size/512 - markerTailSectors
	}
	return markerSector
}

// writeMarker is a shell line writing "KVMARK-<text>" at sector of /dev/dev, flushed, then
// printing kv-marked-<name>-42.
func writeMarker(dev string, sector uint64, text, name string) string {
	return fmt.Sprintf("printf 'KVMARK-%s\\n' | dd of=/dev/%s bs=512 seek=%d conv=sync,fsync 2>/dev/null && echo kv-marked-%s-$((6*7))", text, dev, sector, name)
}

// volumeOf is the volume named name of vols, or nil.
func volumeOf(vols []*storagev1.Volume, name string) *storagev1.Volume {
	for _, v := range vols {
		if v.GetName() == name {
			return v
		}
	}
	return nil
}

// guestValue prints expr (shell) in the guest as one word and returns it.
func guestValue(ctx context.Context, cs *consoleSession, key, expr string) (string, error) {
	line := fmt.Sprintf("echo kvv-%s-$((6*7))=%s=kve", key, expr)
	re := regexp.MustCompile(`kvv-` + regexp.QuoteMeta(key) + `-42=([^=\s]*)=kve`)
	before := len(re.FindAllString(cs.out.String(), -1))
	if err := cs.send(line + "\n"); err != nil {
		return "", err
	}
	err := cs.out.waitUntil(ctx, commandWithin, "the value of "+key, func(out string) bool {
		return len(re.FindAllString(out, -1)) > before
	})
	if err != nil {
		return "", err
	}
	all := re.FindAllStringSubmatch(cs.out.String(), -1)
	return all[len(all)-1][1], nil
}

// guestCount is guestValue as a number.
func guestCount(ctx context.Context, cs *consoleSession, key, expr string) (int, error) {
	v, err := guestValue(ctx, cs, key, expr)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a number", key, v)
	}
	return n, nil
}

const (
	// cancelDiskBandwidth keeps the copy of the data the cancel check writes going for seconds.
	cancelDiskBandwidth = 1 << 20
	// afterMarkerSector is where the cancel check writes after the cancelled migration: past
	// the 8 MiB of random data it checksums.
	afterMarkerSector = 20000
)

// checkMigrateLocalDisksCancel: a migration cancelled while it copies the disks (8 MiB of random
// data the guest wrote on its emptyDisk, copied at 1 MiB/s) ends CANCELLED with the VM RUNNING
// on its own disks: the guest writes and reads a marker there, its page cache dropped. The host
// then kills and deletes the target that never ran, and a second migration to a new target,
// copying the same disks, completes (nothing of the first copy is left in the way) with the
// data and the marker on the target's disk.
func (s *vmSuite) checkMigrateLocalDisksCancel(t T) {
	peer := s.requireMigration(t)
	hv, hvCaps := s.hypervisor(t)
	if !hvCaps.GetMigrationDisks() {
		t.Skipf("the hypervisor driver does not declare Capabilities.migration_disks (copying writable node-local disks in a migration)")
	}
	st, stCaps := s.storage(t)
	requireVolumeType(t, stCaps, "emptyDisk")
	vm := s.boot(t, "")
	ctx := s.ctx(t)
	m := optional[driver.Migrator](t, hv, basev1.Feature_FEATURE_HYPERVISOR_MIGRATE)
	plan := s.plan(t, hvCaps, stCaps, "", vm.token)
	size := uint64(emptyDiskSize)
	dev, err := guestValue(ctx, vm.console, "dev", fmt.Sprintf("$(for b in /sys/block/*; do [ \"$(cat $b/size)\" = %d ] && echo ${b##*/}; done | head -n 1)", size/512))
	if err != nil || dev == "" {
		t.Fatalf("find the guest's emptyDisk of %d bytes: %v", size, err)
	}
	sum := func(cs *consoleSession, key string) string {
		t.Helper()
		v, err := guestValue(ctx, cs, key, fmt.Sprintf("$(dd if=/dev/%s bs=1M count=8 2>/dev/null | md5sum | cut -c1-32)", dev))
		if err != nil || len(v) != 32 {
			t.Fatalf("checksum the first 8 MiB of the emptyDisk: %q, %v", v, err)
		}
		return v
	}
	if err := vm.console.typeUntil(ctx, fmt.Sprintf("dd if=/dev/urandom of=/dev/%s bs=1M count=8 conv=fsync 2>/dev/null && echo kv-filled-$((6*7))", dev), "kv-filled-42", commandWithin); err != nil {
		t.Fatalf("fill the emptyDisk with 8 MiB of random data: %v", err)
	}
	want := sum(vm.console, "sum0")

	migrate := func(bandwidth uint64) *migrationTarget {
		t.Helper()
		fresh := (&storageSuite{s.suite}).prepare(t, st, &request{vmiID: vm.id, workDir: t.TempDir(), volumes: plan.volumes})
		tgt := s.prepareTargetWith(t, peer, vm, func(spec *domainv1.DomainSpec) {
			for _, d := range spec.GetDisks() {
				for _, f := range fresh {
					if f.GetVolumeName() == d.GetName() {
						d.Path, d.Format = f.GetPath(), f.GetFormat()
					}
				}
			}
			spec.IncomingMigration.DisksSocketPath = filepath.Join(spec.GetRunDir(), migrationDisksSocketName)
			spec.IncomingMigration.Disks = []string{emptyDiskVolume}
		})
		paths := s.migrationPaths(t, vm, tgt)
		if err := m.Migrate(ctx, &hypervisorv1.MigrateRequest{Id: vm.id, TargetSocketPath: paths[ChannelMemory], TargetDisksSocketPath: paths[ChannelDisks],
			Disks: []*hypervisorv1.MigrateDisk{{Name: emptyDiskVolume}}, BandwidthBytesPerSecond: bandwidth}); err != nil {
			t.Fatalf("Migrate copying the emptyDisk: %s", describe(err))
		}
		return tgt
	}
	first := migrate(cancelDiskBandwidth)
	info := s.waitMigration(t, m, vm.id, func(info *hypervisorv1.MigrationInfo) bool { return info.GetDiskTransferredBytes() > 0 })
	if migrationEnded(info) || len(info.GetDisks()) != 1 || info.GetDisks()[0].GetReady() {
		t.Fatalf("a copy of 8 MiB at %s is not in progress to be cancelled: %v", fmtRate(cancelDiskBandwidth), info)
	}
	if err := m.CancelMigration(ctx, vm.id); err != nil {
		t.Fatalf("CancelMigration while the disks are copied: %s", describe(err))
	}
	if info, err := m.MigrationStatus(ctx, vm.id); err != nil || info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED {
		t.Errorf("MigrationStatus after CancelMigration in the disk phase = %v, %s; want CANCELLED", info, describe(err))
	}
	s.expectState(t, vm, hypervisorv1.State_STATE_RUNNING, "CancelMigration in the disk phase")
	if st := s.status(t, first.guestVM); st.GetState() == hypervisorv1.State_STATE_RUNNING {
		t.Errorf("the target of the migration cancelled in its disk phase runs the VM (reason %q): it never got the memory", st.GetReason())
	}
	line := writeMarker(dev, afterMarkerSector, vm.token+"-after", "after")
	if err := vm.console.typeUntil(ctx, line, "kv-marked-after-42", commandWithin); err != nil {
		t.Fatalf("write on the emptyDisk after the cancelled migration: %v", err)
	}
	if err := vm.console.typeUntil(ctx, "echo 3 > /proc/sys/vm/drop_caches; echo kv-dropped-$((6*7))", "kv-dropped-42", commandWithin); err != nil {
		t.Fatalf("drop the page cache: %v", err)
	}
	if got, err := guestValue(ctx, vm.console, "after", fmt.Sprintf("$(dd if=/dev/%s bs=512 skip=%d count=1 2>/dev/null | head -n 1)", dev, afterMarkerSector)); err != nil || got != "KVMARK-"+vm.token+"-after" {
		t.Errorf("the source's guest reads back %q (%v) of what it wrote after the cancelled migration", got, err)
	}
	if got := sum(vm.console, "sum1"); got != want {
		t.Errorf("the source's emptyDisk changed under the cancelled copy: md5 %s, was %s", got, want)
	}
	// The host kills and deletes the target that never ran.
	if err := peer.Kill(ctx, vm.id); err != nil {
		t.Fatalf("Kill of the target of the cancelled migration: %s", describe(err))
	}
	if err := peer.Delete(ctx, vm.id); err != nil {
		t.Fatalf("Delete of the target of the cancelled migration: %s", describe(err))
	}

	tgt := migrate(0)
	info = s.waitMigration(t, m, vm.id, nil)
	if info.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED {
		t.Fatalf("the migration after the cancelled one ended %s: %q", info.GetPhase(), info.GetMessage())
	}
	if tst := s.waitState(t, tgt.guestVM, hypervisorv1.State_STATE_RUNNING, targetStopWithin); tst.GetState() != hypervisorv1.State_STATE_RUNNING {
		t.Fatalf("after the second migration the target is %s (reason %q)", tst.GetState(), tst.GetReason())
	}
	c := optional[driver.Consoler](t, peer, basev1.Feature_FEATURE_HYPERVISOR_CONSOLE)
	tgt.console = attachConsole(t, c, vm.id)
	if err := tgt.console.typeUntil(ctx, "echo 3 > /proc/sys/vm/drop_caches; echo kv-dropped-$((6*7))", "kv-dropped-42", commandWithin); err != nil {
		t.Fatalf("drop the page cache: %v", err)
	}
	if got := sum(tgt.console, "sum2"); got != want {
		t.Errorf("the target's emptyDisk after the second migration: md5 %s, want the source's %s", got, want)
	}
	if got, err := guestValue(ctx, tgt.console, "after2", fmt.Sprintf("$(dd if=/dev/%s bs=512 skip=%d count=1 2>/dev/null | head -n 1)", dev, afterMarkerSector)); err != nil || got != "KVMARK-"+vm.token+"-after" {
		t.Errorf("the target's guest reads %q (%v) of the marker written between the two migrations", got, err)
	}
}
