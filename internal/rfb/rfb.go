// Package rfb is a small RFB (VNC) 3.8 client: the handshake with security type None, a 32-bit
// true-colour pixel format, framebuffer update requests, and the Raw and CopyRect encodings,
// decoded into an image. It is what "vmctl vnc screenshot" needs, not a viewer: other encodings,
// other security types and the input messages are not implemented.
package rfb

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/color"
	"io"
)

// ProtocolVersion is the version string both sides send first.
const ProtocolVersion = "RFB 003.008\n"

// SecurityNone is the security type without authentication.
const SecurityNone = 1

// Encodings this client decodes.
const (
	EncodingRaw      int32 = 0
	EncodingCopyRect int32 = 1
)

// Client-to-server message types.
const (
	msgSetPixelFormat           = 0
	msgSetEncodings             = 2
	msgFramebufferUpdateRequest = 3
)

// Server-to-client message types.
const (
	msgFramebufferUpdate   = 0
	msgSetColourMapEntries = 1
	msgBell                = 2
	msgServerCutText       = 3
)

// maxFramebuffer bounds the framebuffer a server may announce (width × height pixels), so that a
// bad server cannot make the client allocate without limit.
const maxFramebuffer = 8192 * 8192

// PixelFormat is the RFB pixel format (RFC 6143, 7.4).
type PixelFormat struct {
	BitsPerPixel, Depth             uint8
	BigEndian, TrueColour           bool
	RedMax, GreenMax, BlueMax       uint16
	RedShift, GreenShift, BlueShift uint8
}

// TrueColour32 is the format this client asks for: 32 bits per pixel, depth 24, little endian,
// red in bits 16-23, green 8-15, blue 0-7.
var TrueColour32 = PixelFormat{
	BitsPerPixel: 32, Depth: 24, TrueColour: true,
	RedMax: 255, GreenMax: 255, BlueMax: 255,
	RedShift: 16, GreenShift: 8, BlueShift: 0,
}

// Marshal returns the format's 16 bytes on the wire.
func (f PixelFormat) Marshal() []byte {
	b := make([]byte, 16)
	b[0], b[1] = f.BitsPerPixel, f.Depth
	b[2], b[3] = boolByte(f.BigEndian), boolByte(f.TrueColour)
	binary.BigEndian.PutUint16(b[4:], f.RedMax)
	binary.BigEndian.PutUint16(b[6:], f.GreenMax)
	binary.BigEndian.PutUint16(b[8:], f.BlueMax)
	b[10], b[11], b[12] = f.RedShift, f.GreenShift, f.BlueShift
	return b
}

// UnmarshalPixelFormat reads a format from its 16 bytes.
func UnmarshalPixelFormat(b []byte) PixelFormat {
	return PixelFormat{
		BitsPerPixel: b[0], Depth: b[1], BigEndian: b[2] != 0, TrueColour: b[3] != 0,
		RedMax: binary.BigEndian.Uint16(b[4:]), GreenMax: binary.BigEndian.Uint16(b[6:]),
		BlueMax:  binary.BigEndian.Uint16(b[8:]),
		RedShift: b[10], GreenShift: b[11], BlueShift: b[12],
	}
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// Client is one RFB session after the handshake. It is not safe for concurrent use.
type Client struct {
	r *bufio.Reader
	w io.Writer
	// Name is the desktop name the server announced.
	Name string
	// ServerFormat is the pixel format the server announced before SetPixelFormat.
	ServerFormat PixelFormat
	fb           *image.RGBA
	formatSet    bool
}

// Handshake runs the RFB 3.8 handshake on rw: version, security type None, a shared ClientInit,
// and the ServerInit that gives the framebuffer's size. It fails when the server speaks an older
// version or does not offer None.
func Handshake(rw io.ReadWriter) (*Client, error) {
	c := &Client{r: bufio.NewReaderSize(rw, 64<<10), w: rw}
	version := make([]byte, len(ProtocolVersion))
	if _, err := io.ReadFull(c.r, version); err != nil {
		return nil, fmt.Errorf("read protocol version: %w", err)
	}
	if string(version) != ProtocolVersion {
		return nil, fmt.Errorf("server speaks %q, only %q is supported", trimNL(version), trimNL([]byte(ProtocolVersion)))
	}
	if _, err := io.WriteString(c.w, ProtocolVersion); err != nil {
		return nil, fmt.Errorf("write protocol version: %w", err)
	}
	n, err := c.r.ReadByte()
	if err != nil {
		return nil, fmt.Errorf("read security types: %w", err)
	}
	if n == 0 {
		reason, err := c.readString()
		if err != nil {
			return nil, fmt.Errorf("read refusal: %w", err)
		}
		return nil, fmt.Errorf("server refused the connection: %s", reason)
	}
	types := make([]byte, n)
	if _, err := io.ReadFull(c.r, types); err != nil {
		return nil, fmt.Errorf("read security types: %w", err)
	}
	if !containsByte(types, SecurityNone) {
		return nil, fmt.Errorf("server offers security types %v, and only None (%d) is supported", types, SecurityNone)
	}
	if _, err := c.w.Write([]byte{SecurityNone}); err != nil {
		return nil, fmt.Errorf("write security type: %w", err)
	}
	var result uint32
	if err := binary.Read(c.r, binary.BigEndian, &result); err != nil {
		return nil, fmt.Errorf("read security result: %w", err)
	}
	if result != 0 {
		reason, err := c.readString()
		if err != nil {
			return nil, fmt.Errorf("security handshake failed (%d)", result)
		}
		return nil, fmt.Errorf("security handshake failed: %s", reason)
	}
	// ClientInit: share the desktop with other clients.
	if _, err := c.w.Write([]byte{1}); err != nil {
		return nil, fmt.Errorf("write client init: %w", err)
	}
	init := make([]byte, 20)
	if _, err := io.ReadFull(c.r, init); err != nil {
		return nil, fmt.Errorf("read server init: %w", err)
	}
	w, h := int(binary.BigEndian.Uint16(init[0:])), int(binary.BigEndian.Uint16(init[2:]))
	if w*h > maxFramebuffer {
		return nil, fmt.Errorf("framebuffer %dx%d is too large", w, h)
	}
	c.ServerFormat = UnmarshalPixelFormat(init[4:20])
	if c.Name, err = c.readString(); err != nil {
		return nil, fmt.Errorf("read desktop name: %w", err)
	}
	c.fb = image.NewRGBA(image.Rect(0, 0, w, h))
	return c, nil
}

// Size is the framebuffer's size.
func (c *Client) Size() image.Point { return c.fb.Bounds().Size() }

// Image is the framebuffer as decoded so far; it is updated in place by ReadUpdate.
func (c *Client) Image() *image.RGBA { return c.fb }

// SetPixelFormat asks for TrueColour32 and announces the encodings this client decodes (Raw and
// CopyRect). It must come before the first update request.
func (c *Client) SetPixelFormat() error {
	msg := append([]byte{msgSetPixelFormat, 0, 0, 0}, TrueColour32.Marshal()...)
	msg = append(msg, msgSetEncodings, 0, 0, 2)
	msg = binary.BigEndian.AppendUint32(msg, uint32(EncodingCopyRect))
	msg = binary.BigEndian.AppendUint32(msg, uint32(EncodingRaw))
	if _, err := c.w.Write(msg); err != nil {
		return fmt.Errorf("write pixel format: %w", err)
	}
	c.formatSet = true
	return nil
}

// RequestUpdate sends a FramebufferUpdateRequest for r (the whole framebuffer when r is empty).
func (c *Client) RequestUpdate(incremental bool, r image.Rectangle) error {
	if r.Empty() {
		r = c.fb.Bounds()
	}
	msg := []byte{msgFramebufferUpdateRequest, boolByte(incremental)}
	for _, v := range []int{r.Min.X, r.Min.Y, r.Dx(), r.Dy()} {
		msg = binary.BigEndian.AppendUint16(msg, uint16(v))
	}
	if _, err := c.w.Write(msg); err != nil {
		return fmt.Errorf("write update request: %w", err)
	}
	return nil
}

// ReadUpdate reads server messages until one FramebufferUpdate has been applied to the image, and
// returns the union of the rectangles it changed. Bell and cut-text messages are skipped.
func (c *Client) ReadUpdate() (image.Rectangle, error) {
	if !c.formatSet {
		return image.Rectangle{}, errors.New("SetPixelFormat must come before the first update")
	}
	for {
		typ, err := c.r.ReadByte()
		if err != nil {
			return image.Rectangle{}, fmt.Errorf("read message type: %w", err)
		}
		switch typ {
		case msgFramebufferUpdate:
			return c.readFramebufferUpdate()
		case msgSetColourMapEntries:
			hdr := make([]byte, 5)
			if _, err := io.ReadFull(c.r, hdr); err != nil {
				return image.Rectangle{}, fmt.Errorf("read colour map: %w", err)
			}
			if _, err := c.r.Discard(6 * int(binary.BigEndian.Uint16(hdr[3:]))); err != nil {
				return image.Rectangle{}, fmt.Errorf("read colour map: %w", err)
			}
		case msgBell:
		case msgServerCutText:
			hdr := make([]byte, 7)
			if _, err := io.ReadFull(c.r, hdr); err != nil {
				return image.Rectangle{}, fmt.Errorf("read cut text: %w", err)
			}
			if _, err := c.r.Discard(int(binary.BigEndian.Uint32(hdr[3:]))); err != nil {
				return image.Rectangle{}, fmt.Errorf("read cut text: %w", err)
			}
		default:
			return image.Rectangle{}, fmt.Errorf("unknown server message type %d", typ)
		}
	}
}

func (c *Client) readFramebufferUpdate() (image.Rectangle, error) {
	hdr := make([]byte, 3)
	if _, err := io.ReadFull(c.r, hdr); err != nil {
		return image.Rectangle{}, fmt.Errorf("read update: %w", err)
	}
	n := int(binary.BigEndian.Uint16(hdr[1:]))
	var changed image.Rectangle
	rect := make([]byte, 12)
	for i := 0; i < n; i++ {
		if _, err := io.ReadFull(c.r, rect); err != nil {
			return changed, fmt.Errorf("read rectangle %d: %w", i, err)
		}
		x, y := int(binary.BigEndian.Uint16(rect[0:])), int(binary.BigEndian.Uint16(rect[2:]))
		w, h := int(binary.BigEndian.Uint16(rect[4:])), int(binary.BigEndian.Uint16(rect[6:]))
		r := image.Rect(x, y, x+w, y+h)
		if !r.In(c.fb.Bounds()) {
			return changed, fmt.Errorf("rectangle %v lies outside the framebuffer %v", r, c.fb.Bounds())
		}
		switch enc := int32(binary.BigEndian.Uint32(rect[8:])); enc {
		case EncodingRaw:
			if err := c.readRaw(r); err != nil {
				return changed, fmt.Errorf("raw rectangle %v: %w", r, err)
			}
		case EncodingCopyRect:
			if err := c.readCopyRect(r); err != nil {
				return changed, fmt.Errorf("copyrect rectangle %v: %w", r, err)
			}
		default:
			return changed, fmt.Errorf("rectangle %v has encoding %d, which was not asked for", r, enc)
		}
		changed = changed.Union(r)
	}
	return changed, nil
}

func (c *Client) readRaw(r image.Rectangle) error {
	row := make([]byte, 4*r.Dx())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		if _, err := io.ReadFull(c.r, row); err != nil {
			return err
		}
		for x := 0; x < r.Dx(); x++ {
			c.fb.SetRGBA(r.Min.X+x, y, decodePixel(row[4*x:4*x+4]))
		}
	}
	return nil
}

// decodePixel decodes one TrueColour32 pixel (little endian: blue, green, red, unused).
func decodePixel(p []byte) color.RGBA {
	v := binary.LittleEndian.Uint32(p)
	return color.RGBA{
		R: uint8(v >> TrueColour32.RedShift), G: uint8(v >> TrueColour32.GreenShift),
		B: uint8(v >> TrueColour32.BlueShift), A: 0xff,
	}
}

// EncodePixel is the inverse of the client's decoding: the four bytes of c in TrueColour32.
// Test servers use it.
func EncodePixel(c color.RGBA) []byte {
	v := uint32(c.R)<<TrueColour32.RedShift | uint32(c.G)<<TrueColour32.GreenShift | uint32(c.B)<<TrueColour32.BlueShift
	return binary.LittleEndian.AppendUint32(nil, v)
}

func (c *Client) readCopyRect(r image.Rectangle) error {
	src := make([]byte, 4)
	if _, err := io.ReadFull(c.r, src); err != nil {
		return err
	}
	sx, sy := int(binary.BigEndian.Uint16(src[0:])), int(binary.BigEndian.Uint16(src[2:]))
	from := image.Rect(sx, sy, sx+r.Dx(), sy+r.Dy())
	if !from.In(c.fb.Bounds()) {
		return fmt.Errorf("source %v lies outside the framebuffer", from)
	}
	// Copy through a buffer: source and destination may overlap.
	buf := image.NewRGBA(from)
	for y := from.Min.Y; y < from.Max.Y; y++ {
		copy(buf.Pix[buf.PixOffset(from.Min.X, y):], c.fb.Pix[c.fb.PixOffset(from.Min.X, y):c.fb.PixOffset(from.Max.X, y)])
	}
	for y := 0; y < r.Dy(); y++ {
		copy(c.fb.Pix[c.fb.PixOffset(r.Min.X, r.Min.Y+y):],
			buf.Pix[buf.PixOffset(from.Min.X, from.Min.Y+y):buf.PixOffset(from.Max.X, from.Min.Y+y)])
	}
	return nil
}

// Screenshot runs a whole session on rw: handshake, pixel format, one non-incremental update
// request for the whole framebuffer, and the first update that answers it.
func Screenshot(rw io.ReadWriter) (*image.RGBA, error) {
	c, err := Handshake(rw)
	if err != nil {
		return nil, err
	}
	if err := c.SetPixelFormat(); err != nil {
		return nil, err
	}
	if err := c.RequestUpdate(false, image.Rectangle{}); err != nil {
		return nil, err
	}
	if _, err := c.ReadUpdate(); err != nil {
		return nil, err
	}
	return c.Image(), nil
}

func (c *Client) readString() (string, error) {
	var n uint32
	if err := binary.Read(c.r, binary.BigEndian, &n); err != nil {
		return "", err
	}
	if n > 1<<20 {
		return "", fmt.Errorf("string of %d bytes is too long", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(c.r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

func containsByte(b []byte, v byte) bool {
	for _, x := range b {
		if x == v {
			return true
		}
	}
	return false
}

func trimNL(b []byte) string {
	if len(b) > 0 && b[len(b)-1] == '\n' {
		b = b[:len(b)-1]
	}
	return string(b)
}
