package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// ImageTool makes and inspects disk image files. QemuImg runs qemu-img; tests of the logic
// above it use a fake.
//
// | method  | an implementation MUST                                                           |
// |---------|----------------------------------------------------------------------------------|
// | Version | return the tool's version ("7.2.22"), or an error saying why it cannot run       |
// | Create  | make a new image at path, replacing nothing else; leave no file when it fails    |
// | Info    | open the image as format without writing it, also while a VM has it open         |
type ImageTool interface {
	Version(ctx context.Context) (string, error)
	Create(ctx context.Context, path string, opts CreateOptions) error
	Info(ctx context.Context, path string, format Format) (*ImageInfo, error)
}

// CreateOptions describe an image to make.
type CreateOptions struct {
	Format Format
	// Size is the virtual size in bytes. With a backing file, 0 means the backing file's size.
	Size int64
	// BackingFile, when set, makes a copy-on-write overlay over it; it must be absolute.
	// BackingFormat is its format, which must be given: a probed backing format is a hole.
	BackingFile   string
	BackingFormat Format
}

// ImageInfo is what Info learns of an image.
type ImageInfo struct {
	Format      Format
	VirtualSize int64
	// BackingFile is the backing file the image names, as written in it; empty for none.
	BackingFile string
}

// ErrToolUnavailable is wrapped by an ImageTool's errors when the tool cannot run at all (it is
// not installed, not executable), as opposed to failing on the image it was given.
var ErrToolUnavailable = errors.New("image tool unavailable")

// QemuImg is the ImageTool that runs qemu-img (Debian package qemu-utils).
type QemuImg struct {
	// Path is the qemu-img binary: an absolute path, or a name looked up in PATH.
	Path string
}

var _ ImageTool = (*QemuImg)(nil)

// DefaultQemuImg is the qemu-img the driver runs unless configured otherwise.
const DefaultQemuImg = "qemu-img"

// NewQemuImg returns the ImageTool running the qemu-img at path ("" for DefaultQemuImg).
func NewQemuImg(path string) ImageTool {
	if path == "" {
		path = DefaultQemuImg
	}
	return &QemuImg{Path: path}
}

var qemuImgVersion = regexp.MustCompile(`qemu-img version (\d+\.\d+(?:\.\d+)?)`)

// Version implements ImageTool.
func (q *QemuImg) Version(ctx context.Context) (string, error) {
	out, err := q.run(ctx, "--version")
	if err != nil {
		return "", err
	}
	m := qemuImgVersion.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s --version: unexpected output %q", q.Path, firstLine(out))
	}
	return string(m[1]), nil
}

// Create implements ImageTool.
func (q *QemuImg) Create(ctx context.Context, path string, opts CreateOptions) error {
	args := []string{"create", "-q", "-f", string(opts.Format)}
	if opts.BackingFile != "" {
		if opts.BackingFormat == "" {
			return errors.New("qemu-img create: backing format required")
		}
		args = append(args, "-b", opts.BackingFile, "-F", string(opts.BackingFormat))
	}
	args = append(args, path)
	if opts.Size > 0 {
		args = append(args, strconv.FormatInt(opts.Size, 10))
	}
	if _, err := q.run(ctx, args...); err != nil {
		// qemu-img may have made the file before it failed.
		_ = os.Remove(path)
		return err
	}
	return nil
}

// Info implements ImageTool. -U (force share) lets it read an image a running VM holds.
func (q *QemuImg) Info(ctx context.Context, path string, format Format) (*ImageInfo, error) {
	out, err := q.run(ctx, "info", "-U", "--output=json", "-f", string(format), path)
	if err != nil {
		return nil, err
	}
	var info struct {
		Format          string `json:"format"`
		VirtualSize     int64  `json:"virtual-size"`
		BackingFilename string `json:"backing-filename"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return nil, fmt.Errorf("qemu-img info %s: decode output: %w", path, err)
	}
	return &ImageInfo{Format: Format(info.Format), VirtualSize: info.VirtualSize, BackingFile: info.BackingFilename}, nil
}

// run runs qemu-img and returns its standard output. Its error carries qemu-img's own message.
func (q *QemuImg) run(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, q.Path, args...)
	// Messages in English, whatever the node's locale.
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("qemu-img %s: %w", args[0], ctxErr)
		}
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) {
			// It did not start: not found, not executable.
			return nil, fmt.Errorf("%w: %v", ErrToolUnavailable, err)
		}
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			// "qemu-img: x.qcow2: Could not open ...": already names the tool.
			msg = strings.ReplaceAll(msg, "\n", "; ")
			if !strings.HasPrefix(msg, "qemu-img") {
				msg = "qemu-img " + args[0] + ": " + msg
			}
			return nil, fmt.Errorf("%s (%w)", msg, err)
		}
		return nil, fmt.Errorf("qemu-img %s: %w", args[0], err)
	}
	return stdout.Bytes(), nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}

// labelVersion shortens a version to what a node label shows: "7.2.22" → "7.2".
func labelVersion(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) >= 2 {
		return parts[0] + "." + parts[1]
	}
	return v
}
