package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-plugin"
)

// record is what a host persists about a running plugin so that the next host can reattach to
// it: go-plugin's ReattachConfig, how the process was started (binary digest, args), and what
// names the process for ever (boot id, pid, start time), so a reused pid is never taken for
// the plugin.
type record struct {
	Name            string    `json:"name"`
	Binary          string    `json:"binary"`
	SHA256          string    `json:"sha256"`
	Args            []string  `json:"args,omitempty"`
	Protocol        string    `json:"protocol"`
	ProtocolVersion int       `json:"protocolVersion"`
	Network         string    `json:"network"`
	Addr            string    `json:"addr"`
	Pid             int       `json:"pid"`
	StartTime       uint64    `json:"startTime"` // field 22 of /proc/<pid>/stat
	BootID          string    `json:"bootID"`
	StartedAt       time.Time `json:"startedAt"`
}

// reattachConfig turns the record back into go-plugin's form.
func (r *record) reattachConfig() (*plugin.ReattachConfig, error) {
	var addr net.Addr
	switch r.Network {
	case "unix":
		addr = &net.UnixAddr{Net: "unix", Name: r.Addr}
	case "tcp":
		a, err := net.ResolveTCPAddr("tcp", r.Addr)
		if err != nil {
			return nil, err
		}
		addr = a
	default:
		return nil, fmt.Errorf("unknown network %q", r.Network)
	}
	return &plugin.ReattachConfig{
		Protocol:        plugin.Protocol(r.Protocol),
		ProtocolVersion: r.ProtocolVersion,
		Addr:            addr,
		Pid:             r.Pid,
	}, nil
}

func (h *Host) recordPath(name string) string {
	return filepath.Join(h.recordDir, name+".json")
}

// readRecord returns the record of a driver, or nil when there is none.
func (h *Host) readRecord(name string) (*record, error) {
	data, err := os.ReadFile(h.recordPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read reattach record: %w", err)
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("read reattach record %s: %w", h.recordPath(name), err)
	}
	if r.Name != name || r.Pid <= 0 {
		return nil, fmt.Errorf("read reattach record %s: not a record of %q", h.recordPath(name), name)
	}
	return &r, nil
}

// writeRecord replaces a driver's record atomically (0600, in the 0700 record directory).
func (h *Host) writeRecord(r *record) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("write reattach record: %w", err)
	}
	f, err := os.CreateTemp(h.recordDir, "."+r.Name+".*.tmp") // created 0600
	if err != nil {
		return fmt.Errorf("write reattach record: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(append(data, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, h.recordPath(r.Name))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write reattach record: %w", err)
	}
	return nil
}

// removeRecord deletes a driver's record and, when the record's socket is one of ours, the
// socket file a killed plugin leaves behind.
func (h *Host) removeRecord(name string, r *record) {
	if err := os.Remove(h.recordPath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		h.log.Warn("cannot remove reattach record", "driver", name, "error", err)
	}
	if r != nil {
		h.removeSocket(r.Network, r.Addr)
	}
}

// removeSocket removes a unix socket file if it lies in the host's socket directory.
func (h *Host) removeSocket(network, addr string) {
	if network != "unix" || filepath.Dir(addr) != h.socketDir {
		return
	}
	if err := os.Remove(addr); err != nil && !errors.Is(err, fs.ErrNotExist) {
		h.log.Warn("cannot remove plugin socket", "path", addr, "error", err)
	}
}

// removeStaleSockets removes socket files no record points at: those of plugins that died
// with no host to clean up after them. The host holds the state directory lock, so no plugin
// it does not know of can be starting.
func (h *Host) removeStaleSockets() {
	keep := map[string]bool{}
	if entries, err := os.ReadDir(h.recordDir); err == nil {
		for _, e := range entries {
			data, err := os.ReadFile(filepath.Join(h.recordDir, e.Name()))
			if err != nil {
				continue
			}
			var r record
			if json.Unmarshal(data, &r) == nil && r.Network == "unix" {
				keep[r.Addr] = true
			}
		}
	}
	entries, err := os.ReadDir(h.socketDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		path := filepath.Join(h.socketDir, e.Name())
		if !keep[path] {
			_ = os.Remove(path)
		}
	}
}
