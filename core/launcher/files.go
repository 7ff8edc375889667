package launcher

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	lclient "github.com/kubevisor/kubevisor/core/driver/launcher"
)

// The files channel is the SDK's (core/driver/launcher: FilesRequest, MaxFiles, FilesTTL,
// FilesIOTimeout); this is the launcher's end of it.

// fileDrop holds descriptors handed over on the files channel until a Start takes them.
type fileDrop struct {
	lis *net.UnixListener
	log *slog.Logger

	mu      sync.Mutex
	pending map[string]*heldFiles
	closed  bool
}

type heldFiles struct {
	files []*os.File
	timer *time.Timer
}

func listenFiles(path string, log *slog.Logger) (*fileDrop, error) {
	lis, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = lis.Close()
		return nil, err
	}
	return &fileDrop{lis: lis, log: log, pending: map[string]*heldFiles{}}, nil
}

func (d *fileDrop) serve() {
	for {
		conn, err := d.lis.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				d.log.Error("files channel", "error", err)
			}
			return
		}
		go d.handle(conn)
	}
}

func (d *fileDrop) handle(conn *net.UnixConn) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(lclient.FilesIOTimeout))
	reply := func(s string) { _, _ = conn.Write([]byte(s + "\n")) }
	files, err := recvFiles(conn)
	if err != nil {
		reply("ERR " + err.Error())
		return
	}
	token, err := d.hold(files)
	if err != nil {
		closeAll(files)
		reply("ERR " + err.Error())
		return
	}
	d.log.Debug("holding files", "count", len(files))
	reply("OK " + token)
}

// recvFiles reads one request and returns its descriptors (close-on-exec, as Go's net package
// receives them).
func recvFiles(conn *net.UnixConn) ([]*os.File, error) {
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(lclient.MaxFiles*4))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("read request: %w", err)
	}
	var fds []int
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err == nil {
		for _, m := range msgs {
			got, perr := unix.ParseUnixRights(&m)
			if perr != nil {
				continue
			}
			fds = append(fds, got...)
		}
	}
	files := make([]*os.File, 0, len(fds))
	for i, fd := range fds {
		files = append(files, os.NewFile(uintptr(fd), fmt.Sprintf("passed-fd-%d", 3+i)))
	}
	switch {
	case err != nil:
		err = fmt.Errorf("read descriptors: %w", err)
	case flags&unix.MSG_CTRUNC != 0:
		err = fmt.Errorf("more than %d descriptors", lclient.MaxFiles)
	case string(buf[:n]) != lclient.FilesRequest:
		err = errors.New("malformed request")
	case len(files) == 0:
		err = errors.New("no descriptors")
	}
	if err != nil {
		closeAll(files)
		return nil, err
	}
	return files, nil
}

func (d *fileDrop) hold(files []*os.File) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b[:])
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return "", errors.New("launcher is exiting")
	}
	h := &heldFiles{files: files}
	h.timer = time.AfterFunc(lclient.FilesTTL, func() {
		if fs := d.take(token); fs != nil {
			d.log.Warn("descriptors not taken by a start in time, closing them", "count", len(fs))
			closeAll(fs)
		}
	})
	d.pending[token] = h
	return token, nil
}

// take returns the descriptors of token and forgets them; nil for an unknown token.
func (d *fileDrop) take(token string) []*os.File {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.pending[token]
	if !ok {
		return nil
	}
	delete(d.pending, token)
	h.timer.Stop()
	return h.files
}

func (d *fileDrop) close() {
	_ = d.lis.Close()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for token, h := range d.pending {
		h.timer.Stop()
		closeAll(h.files)
		delete(d.pending, token)
	}
}

func closeAll(files []*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}
