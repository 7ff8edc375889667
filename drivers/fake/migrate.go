package fake

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kubevisor/kubevisor/core/driver"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// A simulated live migration over real sockets, so that the host's side of a migration (the
// handlers, their migration proxies, the control plane) can be tested without QEMU.
//
// Target: a VM created with incoming_migration starts PAUSED (IncomingMigration) listening on
// its socket_path (and on disks_socket_path, when the source copies disks). The source's stream
// is one JSON object, streamMessage, closed by the source's half-close; the target answers
// "ok\n", then runs: RUNNING with reason Migrated, no boot of its own, its console saying
// "migrated in from <source VM's boots> boots". A stream that is not such a message fails the
// target: STOPPED with reason MigrationFailed.
//
// Source: Migrate to a target_socket_path where a socket is starts the stream in the
// background (phase ACTIVE): it writes each copied disk's name on the disks socket, then the
// message on the socket, and waits for the answer; then it stops with reason Migrated (phase
// COMPLETED). An error (no target, no answer within streamTimeout) leaves it RUNNING, phase
// FAILED; CancelMigration while it streams leaves it RUNNING, phase CANCELLED. Migrate with a
// target_uri, or a socket path where no socket is, completes at once as before (no stream).

// incomingRecord is a target's incoming migration, kept in its record.
type incomingRecord struct {
	Socket      string   `json:"socket"`
	DisksSocket string   `json:"disksSocket,omitempty"`
	Disks       []string `json:"disks,omitempty"`
}

// streamMessage is what a simulated source sends its target.
type streamMessage struct {
	ID          string `json:"id"`
	Boots       uint32 `json:"boots"`
	MemoryBytes uint64 `json:"memoryBytes"`
}

// streamTimeout bounds a simulated migration's stream.
const streamTimeout = 30 * time.Second

func isSocket(path string) bool {
	if path == "" {
		return false
	}
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&os.ModeSocket != 0
}

// listenIncomingLocked starts a target: PAUSED (IncomingMigration), listening on its sockets.
func (h *Hypervisor) listenIncomingLocked(v *vm) error {
	in := v.rec.Incoming
	var ls []net.Listener
	for _, path := range []string{in.Socket, in.DisksSocket} {
		if path == "" {
			continue
		}
		_ = os.Remove(path)
		l, err := net.Listen("unix", path)
		if err != nil {
			for _, l := range ls {
				_ = l.Close()
			}
			return precondition("incomingMigration: listen on %s: %v", path, err)
		}
		ls = append(ls, l)
	}
	v.listeners = ls
	v.gen++
	v.run = &run{stopped: make(chan struct{})}
	v.migration = &hypervisorv1.MigrationInfo{Role: hypervisorv1.MigrationRole_MIGRATION_ROLE_TARGET,
		Phase: hypervisorv1.MigrationPhase_MIGRATION_PHASE_SETUP, Mode: hypervisorv1.MigrationMode_MIGRATION_MODE_PRE_COPY, StartedAt: timestamppb.Now()}
	h.setStateLocked(v, hypervisorv1.State_STATE_PAUSED, hypervisorv1.EventType_EVENT_TYPE_MIGRATION, driver.ReasonIncomingMigration,
		"waiting for the migration stream on "+in.Socket)
	gen := v.gen
	go h.acceptStream(v, ls[0], gen)
	if len(ls) > 1 {
		go drainDisks(ls[1])
	}
	return nil
}

// drainDisks accepts the disks channel's connections, reads each to its end and answers
// "ok\n", as a disk copy completes before the memory moves.
func drainDisks(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(streamTimeout))
			if _, err := io.Copy(io.Discard, c); err == nil {
				_, _ = io.WriteString(c, "ok\n")
			}
		}()
	}
}

// acceptStream receives the source's message on a target's socket and runs the target.
func (h *Hypervisor) acceptStream(v *vm, l net.Listener, gen uint64) {
	c, err := l.Accept()
	if err != nil {
		return // stopped
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(streamTimeout))
	var msg streamMessage
	err = json.NewDecoder(io.LimitReader(c, 1<<20)).Decode(&msg)
	if err == nil && msg.ID != v.rec.ID {
		err = fmt.Errorf("the stream is of VM %q, not %q", msg.ID, v.rec.ID)
	}
	if err == nil {
		_, err = io.WriteString(c, "ok\n")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if v.gen != gen || v.state != hypervisorv1.State_STATE_PAUSED {
		return
	}
	now := timestamppb.Now()
	v.migration.EndedAt = now
	if err != nil {
		v.migration.Phase, v.migration.Message = hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, "incoming stream: "+err.Error()
		h.stopLocked(v, hypervisorv1.EventType_EVENT_TYPE_STOPPED, driver.ReasonMigrationFailed, v.migration.Message)
		return
	}
	v.closeListeners()
	v.rec.Incoming = nil
	v.migration.Phase = hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED
	v.migration.TotalBytes, v.migration.TransferredBytes = msg.MemoryBytes, msg.MemoryBytes
	v.rec.StartedAt = time.Now().UTC()
	h.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_MIGRATION)
	h.setStateLocked(v, hypervisorv1.State_STATE_RUNNING, hypervisorv1.EventType_EVENT_TYPE_STARTED, driver.ReasonMigrated, "")
	h.consoleWriteLocked(v, fmt.Appendf(nil, "migrated in from %d boots\n", msg.Boots))
}

// closeListeners stops a target's listening.
func (v *vm) closeListeners() {
	for _, l := range v.listeners {
		_ = l.Close()
	}
	v.listeners = nil
}

// streamOutLocked starts a source's stream in the background (phase ACTIVE).
func (h *Hypervisor) streamOutLocked(v *vm, req *hypervisorv1.MigrateRequest, disks []*hypervisorv1.MigrationDisk) {
	ctx, cancel := context.WithTimeout(context.Background(), streamTimeout)
	v.cancel = cancel
	now := timestamppb.Now()
	v.migration = &hypervisorv1.MigrationInfo{
		Role: hypervisorv1.MigrationRole_MIGRATION_ROLE_SOURCE, Phase: hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE,
		Mode: hypervisorv1.MigrationMode_MIGRATION_MODE_PRE_COPY, StartedAt: now, Target: req.GetTargetSocketPath(),
		TotalBytes: v.rec.MemoryBytes, RemainingBytes: v.rec.MemoryBytes,
		BandwidthLimitBytesPerSecond: req.GetBandwidthBytesPerSecond(),
		AutoConverge:                 req.GetAllowAutoConverge(), PostCopy: req.GetAllowPostCopy(), Disks: disks,
	}
	msg := streamMessage{ID: v.rec.ID, Boots: v.rec.Boots, MemoryBytes: v.rec.MemoryBytes}
	gen := v.gen
	go func() {
		defer cancel()
		err := stream(ctx, req, msg)
		h.mu.Lock()
		defer h.mu.Unlock()
		if v.gen != gen || v.migration.GetPhase() != hypervisorv1.MigrationPhase_MIGRATION_PHASE_ACTIVE {
			return // cancelled, or the VM stopped
		}
		v.cancel = nil
		v.migration.EndedAt = timestamppb.Now()
		if err != nil {
			v.migration.Phase, v.migration.Message = hypervisorv1.MigrationPhase_MIGRATION_PHASE_FAILED, err.Error()
			h.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_MIGRATION)
			return
		}
		v.migration.Phase = hypervisorv1.MigrationPhase_MIGRATION_PHASE_COMPLETED
		v.migration.TransferredBytes, v.migration.RemainingBytes = v.rec.MemoryBytes, 0
		h.emitLocked(v, hypervisorv1.EventType_EVENT_TYPE_MIGRATION)
		h.stopLocked(v, hypervisorv1.EventType_EVENT_TYPE_STOPPED, driver.ReasonMigrated, "migrated to "+req.GetTargetSocketPath())
	}()
}

// stream sends a source's disks and message to its target and waits for the answer.
func stream(ctx context.Context, req *hypervisorv1.MigrateRequest, msg streamMessage) error {
	var d net.Dialer
	if p := req.GetTargetDisksSocketPath(); p != "" {
		c, err := d.DialContext(ctx, "unix", p)
		if err != nil {
			return fmt.Errorf("disks: %w", err)
		}
		stop := context.AfterFunc(ctx, func() { _ = c.Close() })
		err = copyDisks(c, req.GetDisks())
		stop()
		_ = c.Close()
		if err != nil {
			return fmt.Errorf("disks: %w", err)
		}
	}
	c, err := d.DialContext(ctx, "unix", req.GetTargetSocketPath())
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	if err := json.NewEncoder(c).Encode(msg); err != nil {
		return err
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		if ctx.Err() != nil {
			return errors.New("no answer from the target within the stream's time")
		}
		return fmt.Errorf("the target did not answer: %w", err)
	}
	if line != "ok\n" {
		return fmt.Errorf("the target answered %q", line)
	}
	return nil
}

// copyDisks sends the disks' names on the disks channel and waits for the target's answer:
// the copies are done before the memory moves.
func copyDisks(c net.Conn, disks []*hypervisorv1.MigrateDisk) error {
	for _, disk := range disks {
		if _, err := fmt.Fprintln(c, disk.GetName()); err != nil {
			return err
		}
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("the target did not answer: %w", err)
	}
	if line != "ok\n" {
		return fmt.Errorf("the target answered %q", line)
	}
	return nil
}
