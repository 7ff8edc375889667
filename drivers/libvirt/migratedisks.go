package libvirt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	golibvirt "libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/kubevisor/kubevisor/core/domain"
	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
	"github.com/kubevisor/kubevisor/core/driver/launcher"
	"github.com/kubevisor/kubevisor/drivers/qmp"
)

// Block migration of writable node-local disks (driver.Migrator's "Disks"): the package doc's
// "Live migration" says how, and why not by libvirt's own storage migration.

const (
	// storageDaemonBinary is QEMU's storage daemon, beside the QEMU the probe found.
	storageDaemonBinary = "qemu-storage-daemon"
	// storageDaemonNBD and storageDaemonQMP are its sockets in the target's run dir, and
	// storageDaemonLog its output.
	storageDaemonNBD = "migration-qsd-nbd.sock"
	storageDaemonQMP = "migration-qsd-qmp.sock"
	storageDaemonLog = "migration-qsd.log"
	// storageDaemonWait bounds the storage daemon's coming up and its exit.
	storageDaemonWait = 10 * time.Second
	// diskPoll is how often the source samples its copies.
	diskPoll = 200 * time.Millisecond
	// releaseWait bounds the source's wait for the target to let go of the copied images.
	releaseWait = 30 * time.Second
)

// incomingDisks is a target's NBD service of the disks it receives: QEMU's storage daemon,
// a companion of the VM's libvirtd, exports them on a socket of its own, and the driver relays
// incoming_migration.disks_socket_path to it, counting the source's connections (one per
// disk: QEMU's NBD client of a mirror). Once every disk's connection came and all are closed
// (the source completed its mirrors), or the migration ends, it releases the images: the
// storage daemon is told to quit and the relay waits for it to exit (its image locks go with
// it) before it closes its socket. A connection that comes meanwhile is held until then and
// closed without a byte, which is how the source learns that the target's QEMU can open the
// images.
type incomingDisks struct {
	log  hclog.Logger
	want int    // connections to expect: the disks
	nbd  string // the storage daemon's NBD socket
	qmp  string // its QMP socket

	mu        sync.Mutex
	lis       net.Listener
	path      string // incoming_migration.disks_socket_path
	mon       qmp.Monitor
	sessions  int
	active    int
	conns     map[net.Conn]bool // the relayed connections (the source's side)
	releasing bool
	abandoned bool
	held      []net.Conn
	released  chan struct{}
}

// storageDaemon is the companion that serves a target's incoming_migration.disks (nil, nil
// without them): qemu-storage-daemon as the VM's user, a QMP monitor and an NBD server on
// sockets in the run dir, and one writable export per disk, named as the disk, of its image
// (the fresh image the target's storage driver made, with its backing chain).
func (d *Driver) storageDaemon(v *vm, qemu string, launched bool) (*launcher.Companion, *incomingDisks, error) {
	idxs, err := qmp.IncomingDisks(v.spec)
	if err != nil || len(idxs) == 0 {
		if err != nil {
			err = status.Error(codes.InvalidArgument, err.Error())
		}
		return nil, nil, err
	}
	in := d.newIncomingDisks(v, len(idxs))
	for _, p := range []string{in.nbd, in.qmp} {
		if len(p) > domain.MaxSocketPath {
			return nil, nil, status.Errorf(codes.InvalidArgument, "runDir: the storage daemon's socket %s is longer than a unix socket's %d bytes", p, domain.MaxSocketPath)
		}
		_ = os.Remove(p)
	}
	args := []string{
		"--chardev", "socket,id=kvqmp,server=on,wait=off,path=" + strings.ReplaceAll(in.qmp, ",", ",,"),
		"--monitor", "chardev=kvqmp",
		"--nbd-server", jsonArg(map[string]any{"addr": map[string]any{"type": "unix", "path": in.nbd}}),
	}
	for i, idx := range idxs {
		disk := v.spec.GetDisks()[idx]
		proto := "file"
		if isBlockDevice(disk.GetPath()) {
			proto = "host_device"
		}
		format := "raw"
		if disk.GetFormat() == domainv1.DiskFormat_DISK_FORMAT_QCOW2 {
			format = "qcow2"
		}
		file, node := fmt.Sprintf("kvfile%d", i), fmt.Sprintf("kvdisk%d", i)
		args = append(args,
			"--blockdev", jsonArg(map[string]any{"driver": proto, "node-name": file, "filename": disk.GetPath()}),
			"--blockdev", jsonArg(map[string]any{"driver": format, "node-name": node, "file": file}),
			"--export", jsonArg(map[string]any{"type": "nbd", "id": fmt.Sprintf("kvexport%d", i), "node-name": node, "name": disk.GetName(), "writable": true}))
	}
	return &launcher.Companion{
		Name:    storageDaemonBinary,
		Path:    d.config().Setpriv,
		Args:    v.dmn.asUser(launched, append([]string{filepath.Join(filepath.Dir(qemu), storageDaemonBinary)}, args...)...),
		LogPath: filepath.Join(v.rec.RunDir, storageDaemonLog),
	}, in, nil
}

// newIncomingDisks is the service of want disks of v's storage daemon, not serving yet.
func (d *Driver) newIncomingDisks(v *vm, want int) *incomingDisks {
	return &incomingDisks{
		log: d.log.With("id", v.id), want: want, released: make(chan struct{}), conns: map[net.Conn]bool{},
		nbd: filepath.Join(v.rec.RunDir, storageDaemonNBD), qmp: filepath.Join(v.rec.RunDir, storageDaemonQMP),
	}
}

// releaseLeftoverDisks makes the storage daemon an earlier driver process started for v quit,
// when it still serves v's incoming disks (its monitor's socket is there), and says so: the
// source's copies lost their connection with that process's relay, so the migration cannot
// complete.
func (d *Driver) releaseLeftoverDisks(ctx context.Context, v *vm) bool {
	idxs, err := qmp.IncomingDisks(v.spec)
	if err != nil || len(idxs) == 0 {
		return false
	}
	in := d.newIncomingDisks(v, len(idxs))
	if _, err := os.Stat(in.qmp); err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, storageDaemonWait)
	defer cancel()
	if mon, err := qmp.DialQMP(ctx, in.qmp); err == nil {
		in.adopt(mon)
	}
	in.release()
	return true
}

func jsonArg(v any) string {
	raw, _ := json.Marshal(v)
	return string(raw)
}

// serve waits for the storage daemon's monitor and NBD socket and listens on path
// (incoming_migration.disks_socket_path, a stale socket there removed).
func (in *incomingDisks) serve(ctx context.Context, path string) error {
	ctx, cancel := context.WithTimeout(ctx, storageDaemonWait)
	defer cancel()
	var mon qmp.Monitor
	for {
		var err error
		if mon, err = qmp.DialQMP(ctx, in.qmp); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the storage daemon (%s) did not come up: %v", storageDaemonBinary, err)
		case <-time.After(25 * time.Millisecond):
		}
	}
	in.adopt(mon)
	if _, err := os.Stat(in.nbd); err != nil {
		in.release()
		return fmt.Errorf("the storage daemon serves no NBD socket: %v", err)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		in.release()
		return fmt.Errorf("incomingMigration.disksSocketPath: %v", err)
	}
	in.mu.Lock()
	in.lis, in.path = lis, path
	in.mu.Unlock()
	go in.accept(lis)
	return nil
}

// adopt makes mon, the storage daemon's monitor, the one release quits it through; its events
// are read and dropped (QEMU's replies queue behind them).
func (in *incomingDisks) adopt(mon qmp.Monitor) {
	go func() {
		for range mon.Events() {
		}
	}()
	in.mu.Lock()
	in.mon = mon
	in.mu.Unlock()
}

func (in *incomingDisks) accept(lis net.Listener) {
	for {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		in.mu.Lock()
		if in.releasing {
			in.held = append(in.held, c)
			in.mu.Unlock()
			continue
		}
		in.sessions++
		in.active++
		in.conns[c] = true
		in.mu.Unlock()
		go in.relay(c)
	}
}

// relay carries one NBD connection to the storage daemon; the last one to end, once every
// disk's came, releases the images.
func (in *incomingDisks) relay(c net.Conn) {
	defer func() {
		_ = c.Close()
		in.mu.Lock()
		in.active--
		delete(in.conns, c)
		done := in.active == 0 && in.sessions >= in.want && !in.abandoned
		in.mu.Unlock()
		if done {
			in.log.Info("the source closed its disk copies: releasing the images")
			in.release()
		}
	}()
	up, err := net.Dial("unix", in.nbd)
	if err != nil {
		in.log.Warn("reach the storage daemon", "error", err)
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	<-done
}

// release makes the storage daemon quit and waits for its exit (at most storageDaemonWait),
// then closes the relay: its socket removed, the connections held meanwhile closed. Idempotent;
// a second caller waits for the first.
func (in *incomingDisks) release() {
	in.mu.Lock()
	if in.releasing {
		in.mu.Unlock()
		<-in.released
		return
	}
	in.releasing = true
	mon := in.mon
	in.mu.Unlock()
	if mon != nil {
		ctx, cancel := context.WithTimeout(context.Background(), storageDaemonWait)
		_, err := mon.Run(ctx, "quit", nil)
		if err == nil {
			// Its monitor closes once it has closed its images and exits.
			for _, ok := <-mon.Events(); ok; _, ok = <-mon.Events() {
				if ctx.Err() != nil {
					break
				}
			}
		}
		cancel()
		_ = mon.Close()
	}
	in.mu.Lock()
	lis, held, path := in.lis, in.held, in.path
	in.held = nil
	in.mu.Unlock()
	if lis != nil {
		_ = lis.Close()
		_ = os.Remove(path)
	}
	for _, c := range held {
		_ = c.Close()
	}
	_ = os.Remove(in.nbd)
	_ = os.Remove(in.qmp)
	close(in.released)
}

// abandon stops the relay as the driver process's end would (Close): its socket and the
// connections it carries close, the storage daemon runs on with the images, for a later
// driver's Recover to serve again.
func (in *incomingDisks) abandon() {
	in.mu.Lock()
	in.abandoned = true
	lis := in.lis
	var conns []net.Conn
	for c := range in.conns {
		conns = append(conns, c)
	}
	mon := in.mon
	in.mu.Unlock()
	if lis != nil {
		_ = lis.Close()
	}
	for _, c := range conns {
		_ = c.Close()
	}
	if mon != nil {
		_ = mon.Close()
	}
}

// releaseIncomingDisks releases v's incoming disks, if it serves any (not under v.mu: it waits
// for the storage daemon).
func (v *vm) releaseIncomingDisks() {
	v.mu.Lock()
	in := v.in
	v.mu.Unlock()
	if in != nil {
		in.release()
	}
}

// diskJob is a disk the source copies and its target in the VM's domain (libvirt's name).
type diskJob struct {
	qmp.DiskCopy
	Dev string `json:"dev"`
}

// diskDevs maps the VM's disks (by the name in its spec) to their targets in the running
// domain (the disks carry the user alias ua-disk-<name>).
func diskDevs(dom *golibvirt.Domain) (map[string]string, error) {
	disks, err := domainDisks(dom)
	if err != nil {
		return nil, err
	}
	devs := map[string]string{}
	for _, disk := range disks {
		if disk.Alias != nil && disk.Target != nil {
			devs[disk.Alias.Name] = disk.Target.Dev
		}
	}
	return devs, nil
}

// domainDisks are the disks of the running domain's XML (with their mirrors while a block copy
// runs).
func domainDisks(dom *golibvirt.Domain) ([]libvirtxml.DomainDisk, error) {
	raw, err := dom.GetXMLDesc(0)
	if err != nil {
		return nil, err
	}
	var x libvirtxml.Domain
	if err := x.Unmarshal(raw); err != nil {
		return nil, err
	}
	if x.Devices == nil {
		return nil, nil
	}
	return x.Devices.Disks, nil
}

// startDiskCopies starts libvirt's block copy of each disk into the target's NBD export of the
// same name through socket (the destination exists: REUSE_EXT; SHALLOW for a top_only disk:
// only its top image, the target's has the same backing), each limited to bandwidth bytes/s
// (0: none). On an error it cancels those it started.
func startDiskCopies(dom *golibvirt.Domain, copies []qmp.DiskCopy, socket string, bandwidth uint64) ([]diskJob, error) {
	devs, err := diskDevs(dom)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "the VM's domain: %s", libvirtMessage(err))
	}
	var jobs []diskJob
	for i, c := range copies {
		dev := devs["ua-disk-"+alias(c.Name)]
		if dev == "" {
			abortDiskCopies(dom, jobs)
			return nil, status.Errorf(codes.InvalidArgument, "disks[%d]: the VM's domain has no disk %q", i, c.Name)
		}
		dest := libvirtxml.DomainDisk{
			Device: "disk",
			Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"},
			Source: &libvirtxml.DomainDiskSource{Network: &libvirtxml.DomainDiskSourceNetwork{
				Protocol: "nbd", Name: c.Name, Hosts: []libvirtxml.DomainDiskSourceHost{{Transport: "unix", Socket: socket}},
			}},
		}
		xml, err := dest.Marshal()
		if err != nil {
			abortDiskCopies(dom, jobs)
			return nil, status.Errorf(codes.Internal, "disks[%d]: destination xml: %v", i, err)
		}
		flags := golibvirt.DOMAIN_BLOCK_COPY_REUSE_EXT
		if c.TopOnly {
			flags |= golibvirt.DOMAIN_BLOCK_COPY_SHALLOW
		}
		params := &golibvirt.DomainBlockCopyParameters{}
		if bandwidth > 0 {
			params.Bandwidth, params.BandwidthSet = bandwidth, true
		}
		if err := dom.BlockCopy(dev, xml, params, flags); err != nil {
			abortDiskCopies(dom, jobs)
			return nil, status.Errorf(codes.FailedPrecondition, "disks[%d]: copy disk %q to the target: %s", i, c.Name, libvirtMessage(err))
		}
		jobs = append(jobs, diskJob{DiskCopy: c, Dev: dev})
	}
	return jobs, nil
}

// abortDiskCopies cancels the copies (the source's disks were never switched: it runs on
// them).
func abortDiskCopies(dom *golibvirt.Domain, jobs []diskJob) {
	for _, j := range jobs {
		_ = dom.BlockJobAbort(j.Dev, 0)
	}
}

// mirroredDisks are the domain's disks (their targets) that a block copy mirrors.
func mirroredDisks(dom *golibvirt.Domain) []string {
	disks, _ := domainDisks(dom)
	var devs []string
	for _, disk := range disks {
		if disk.Mirror != nil && disk.Target != nil {
			devs = append(devs, disk.Target.Dev)
		}
	}
	return devs
}

// diskCopiesIn is how many block copies run in the domain.
func diskCopiesIn(dom *golibvirt.Domain) int { return len(mirroredDisks(dom)) }

// abortLeftoverCopies aborts every block copy in the domain (a recovered source's, of a disk
// phase it does not go on with) and says how many there were.
func abortLeftoverCopies(dom *golibvirt.Domain) int {
	devs := mirroredDisks(dom)
	for _, dev := range devs {
		_ = dom.BlockJobAbort(dev, 0)
	}
	return len(devs)
}

// readoptDiskPhase goes on with a recovered source's disk phase (the copies ran on in QEMU
// while no driver did), then moves the memory, as Migrate's goroutine would have.
func (d *Driver) readoptDiskPhase(v *vm, m *migration) {
	mconn, err := golibvirt.NewConnect(v.dmn.uri())
	var dom *golibvirt.Domain
	if err == nil {
		if dom, err = mconn.LookupDomainByName(DomainName); err != nil {
			_, _ = mconn.Close()
		}
	}
	if err != nil {
		d.finishRecoveredSource(v, m, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, "recover the disk copies: "+libvirtMessage(err))
		close(m.done)
		return
	}
	release := func() {
		_ = dom.Free()
		_, _ = mconn.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), targetConnectWait)
	plan, err := d.planMemory(ctx, v, m.info.GetTarget(), m.info.GetBandwidthLimitBytesPerSecond(), m.info.GetAutoConverge(), true)
	cancel()
	if err != nil {
		abortDiskCopies(dom, m.jobs)
		release()
		d.finishRecoveredSource(v, m, hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, "recover the disk copies: "+err.Error())
		close(m.done)
		return
	}
	d.runDiskPhase(v, dom, release, m, m.jobs, m.disksSocket, func() {
		d.runMigration(v, dom, release, socketURI(m.info.GetTarget()), plan.params, plan.flags, m)
	})
}

// sampleDiskCopies reads each copy's progress into info and says whether all are ready (in
// sync), or which one ended (failed: libvirt removes a block job that ended on an error).
func sampleDiskCopies(dom *golibvirt.Domain, jobs []diskJob, info *hypervisorv1.MigrationInfo) (allReady bool, ended string, err error) {
	disks, err := domainDisks(dom)
	if err != nil {
		return false, "", err
	}
	ready := map[string]bool{}
	mirrored := map[string]bool{}
	for _, disk := range disks {
		if disk.Target != nil && disk.Mirror != nil {
			mirrored[disk.Target.Dev] = true
			ready[disk.Target.Dev] = disk.Mirror.Ready == "yes"
		}
	}
	allReady = true
	info.Disks = make([]*hypervisorv1.MigrationDisk, len(jobs))
	info.DiskTotalBytes, info.DiskTransferredBytes = 0, 0
	for i, j := range jobs {
		md := &hypervisorv1.MigrationDisk{Name: j.Name, TopOnly: j.TopOnly, Ready: ready[j.Dev]}
		if bi, err := dom.GetBlockJobInfo(j.Dev, 0); err == nil && bi.Type == golibvirt.DOMAIN_BLOCK_JOB_TYPE_COPY {
			md.TotalBytes, md.TransferredBytes = bi.End, bi.Cur
		} else if !mirrored[j.Dev] {
			return false, j.Name, nil
		}
		info.Disks[i] = md
		info.DiskTotalBytes += md.TotalBytes
		info.DiskTransferredBytes += md.TransferredBytes
		allReady = allReady && md.Ready
	}
	return allReady, "", nil
}

// runDiskPhase copies the disks, then moves the memory (runMigration): it samples the copies
// until every one is ready; then it pauses the guest, completes every copy (libvirt's abort of
// a ready copy without pivot waits for the target to be in sync with the paused guest, and
// leaves the source on its own images), waits for the target to release the images, and
// starts the memory migration of the paused domain, which libvirt resumes at the target (or
// this driver here, when it fails). A cancel, the completion timeout or a copy that fails
// before that cancels the copies; the guest runs on here.
func (d *Driver) runDiskPhase(v *vm, dom *golibvirt.Domain, release func(), mig *migration, jobs []diskJob, socket string, memory func()) {
	fail := func(phase hypervisorv1.MigrationPhase, msg string, paused bool) {
		abortDiskCopies(dom, jobs)
		v.mu.Lock()
		if v.mig == mig && !mig.ended() {
			if mig.cancelReason != "" {
				phase, msg = hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED, mig.cancelReason
			}
			d.endMigrationLocked(v, phase, msg)
		}
		close(mig.done)
		v.mu.Unlock()
		release()
		if paused {
			d.afterFailedOut(v)
		}
	}
	tick := time.NewTicker(diskPoll)
	defer tick.Stop()
	for {
		v.mu.Lock()
		// Let go of (Close: a later driver's Recover goes on with the copies), or the
		// daemon went away with them.
		detached := v.mig != mig || v.conn == nil
		over := mig.ended() || mig.cancelReason != ""
		v.mu.Unlock()
		switch {
		case detached:
			close(mig.done)
			release()
			return
		case over:
			fail(hypervisorv1.MigrationPhase_MIGRATION_PHASE_CANCELLED, "cancelled", false)
			return
		}
		info := &hypervisorv1.MigrationInfo{}
		allReady, ended, err := sampleDiskCopies(dom, jobs, info)
		if err == nil {
			v.mu.Lock()
			if v.mig == mig {
				mig.info.Disks, mig.info.DiskTotalBytes, mig.info.DiskTransferredBytes = info.Disks, info.DiskTotalBytes, info.DiskTransferredBytes
			}
			v.mu.Unlock()
		}
		switch {
		case err != nil:
			fail(hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, "the VM's domain: "+libvirtMessage(err), false)
			return
		case ended != "":
			fail(hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, fmt.Sprintf("the copy of disk %q to the target failed (its block job ended)", ended), false)
			return
		case allReady:
			if err := d.switchDisksOver(v, dom, mig, jobs, socket); err != nil {
				fail(hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, err.Error(), true)
				return
			}
			memory()
			return
		}
		<-tick.C
	}
}

// switchDisksOver pauses the guest, completes every copy and waits for the target to release
// the images.
func (d *Driver) switchDisksOver(v *vm, dom *golibvirt.Domain, mig *migration, jobs []diskJob, socket string) error {
	if err := dom.Suspend(); err != nil {
		return fmt.Errorf("pause the guest for the switch-over: %s", libvirtMessage(err))
	}
	v.mu.Lock()
	for _, md := range mig.info.GetDisks() {
		md.Ready = true
	}
	v.mu.Unlock()
	for _, j := range jobs {
		// Synchronous: it returns once the job ended, every write of the paused guest in the
		// target's image.
		if err := dom.BlockJobAbort(j.Dev, 0); err != nil {
			return fmt.Errorf("complete the copy of disk %q: %s", j.Name, libvirtMessage(err))
		}
	}
	d.log.Info("disks copied: waiting for the target to release them", "id", v.id, "disks", len(jobs))
	ctx, cancel := context.WithTimeout(context.Background(), releaseWait)
	defer cancel()
	if err := targetReleased(ctx, socket); err != nil {
		return fmt.Errorf("the target did not release the copied disks within %s: %v", releaseWait, err)
	}
	return nil
}

// targetReleased waits until the target's disk service at path has released the images: a
// connection to it is refused, or ends without a byte (the NBD server's greeting would be the
// first).
func targetReleased(ctx context.Context, path string) error {
	for {
		var dialer net.Dialer
		c, err := dialer.DialContext(ctx, "unix", path)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return nil
		}
		dl, _ := ctx.Deadline()
		_ = c.SetReadDeadline(dl)
		n, err := c.Read(make([]byte, 1))
		_ = c.Close()
		switch {
		case n == 0 && errors.Is(err, io.EOF):
			return nil
		case ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded):
			return errors.New("its NBD server still serves")
		}
		select {
		case <-ctx.Done():
			return errors.New("its NBD server still serves")
		case <-time.After(100 * time.Millisecond):
		}
	}
}
