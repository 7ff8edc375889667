// Package consolelog is the guest's serial console log of a VMI on its node: the file the node
// handler writes into the VMI directory and the launcher pod's guest-console-log container
// follows (`kubectl logs <pod> -c guest-console-log`); the file is layout.ConsoleLog. It uses
// the standard library only, so its command (kubevisor-console-log) builds small and static.
package consolelog

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"time"
)

// Follow copies path to out as it grows, as `tail -F` does, until ctx ends: it waits for
// the file to appear, starts over when the file is truncated or replaced, and polls every
// poll (the file lives on a hostPath, where inotify may not see the writer's changes).
func Follow(ctx context.Context, path string, out io.Writer, poll time.Duration) error {
	var (
		f   *os.File
		off int64
	)
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		if f == nil {
			var err error
			f, err = os.Open(path)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			off = 0
		}
		if f != nil {
			fi, ferr := f.Stat()
			cur, perr := os.Stat(path)
			switch {
			case ferr != nil:
				return ferr
			case perr == nil && !os.SameFile(fi, cur):
				// Replaced: finish the old file's tail on the next round from the new one.
				f.Close()
				f = nil
				continue
			case fi.Size() < off:
				// Truncated: the writer started over.
				off = 0
			}
			for {
				n, err := f.ReadAt(buf, off)
				if n > 0 {
					if _, werr := out.Write(buf[:n]); werr != nil {
						return werr
					}
					off += int64(n)
				}
				if err == io.EOF || n == 0 {
					break
				}
				if err != nil {
					return err
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(poll):
		}
	}
}
