package launcher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The files channel (FilesSocketName, SOCK_SEQPACKET): one request, one reply per connection.
//
//	request: "FILES\n", with the descriptors attached (SCM_RIGHTS)
//	reply:   "OK <token>\n" or "ERR <message>\n"
const (
	filesRequest = "FILES\n"
	// maxFiles is the most descriptors one request may carry (SCM_MAX_FD is 253).
	maxFiles = 128
	// filesTTL is how long a token is good for.
	filesTTL = time.Minute
	// filesIOTimeout bounds one exchange on the channel.
	filesIOTimeout = 10 * time.Second
)

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
	_ = conn.SetDeadline(time.Now().Add(filesIOTimeout))
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
	oob := make([]byte, unix.CmsgSpace(maxFiles*4))
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
		err = fmt.Errorf("more than %d descriptors", maxFiles)
	case string(buf[:n]) != filesRequest:
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
	h.timer = time.AfterFunc(filesTTL, func() {
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

// sendFiles hands files to the launcher whose files channel is at path and returns their token.
func sendFiles(ctx context.Context, path string, files []*os.File) (string, error) {
	if len(files) == 0 || len(files) > maxFiles {
		return "", fmt.Errorf("send files: %d descriptors (want 1 to %d)", len(files), maxFiles)
	}
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return "", fmt.Errorf("send files: %w", err)
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	deadline := time.Now().Add(filesIOTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetDeadline(deadline)
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	_, _, err = conn.WriteMsgUnix([]byte(filesRequest), unix.UnixRights(fds...), nil)
	runtime.KeepAlive(files)
	if err != nil {
		return "", fmt.Errorf("send files: %w", err)
	}
	buf := make([]byte, 512)
	n, err := conn.Read(buf)
	if err != nil {
		return "", fmt.Errorf("send files: read reply: %w", err)
	}
	reply := strings.TrimSuffix(string(buf[:n]), "\n")
	if token, ok := strings.CutPrefix(reply, "OK "); ok {
		return token, nil
	}
	return "", fmt.Errorf("send files: launcher: %s", strings.TrimPrefix(reply, "ERR "))
}
