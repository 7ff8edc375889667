package launcher

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The descriptor side channel (FilesSocketName, SOCK_SEQPACKET): one request and one reply per
// connection.
//
//	request: FilesRequest, with 1 to MaxFiles descriptors attached (SCM_RIGHTS)
//	reply:   "OK <token>\n" or "ERR <message>\n"
//
// The token goes into StartRequest.files_token of one Start within FilesTTL; the descriptors
// become that process's fds 3, 4, ... in the order they were sent.
const (
	FilesRequest = "FILES\n"
	// MaxFiles is the most descriptors one request may carry (SCM_MAX_FD is 253).
	MaxFiles = 128
	// FilesTTL is how long a token is good for.
	FilesTTL = time.Minute
	// FilesIOTimeout bounds one exchange on the channel.
	FilesIOTimeout = 10 * time.Second
)

// sendFiles hands files to the launcher whose files channel is at path and returns their token.
func sendFiles(ctx context.Context, path string, files []*os.File) (string, error) {
	if len(files) == 0 || len(files) > MaxFiles {
		return "", fmt.Errorf("send files: %d descriptors (want 1 to %d)", len(files), MaxFiles)
	}
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return "", fmt.Errorf("send files: %w", err)
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	deadline := time.Now().Add(FilesIOTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetDeadline(deadline)
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	_, _, err = conn.WriteMsgUnix([]byte(FilesRequest), unix.UnixRights(fds...), nil)
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
