// Package rfbtest is a fake RFB 3.8 server for tests: security None, and framebuffer updates
// sent as Raw rectangles in the 32-bit true-colour format of package rfb.
package rfbtest

import (
	"encoding/binary"
	"fmt"
	"image"
	"image/color"
	"io"

	"github.com/kubevisor/kubevisor/internal/rfb"
)

// Serve runs one session on rw showing img: the handshake, then for every update request a
// FramebufferUpdate with the requested area as one Raw rectangle. It requires the client to set
// rfb.TrueColour32 before its first request, and returns when the client goes away (nil) or
// breaks the protocol.
func Serve(rw io.ReadWriter, img image.Image) error {
	if _, err := io.WriteString(rw, rfb.ProtocolVersion); err != nil {
		return err
	}
	version := make([]byte, len(rfb.ProtocolVersion))
	if _, err := io.ReadFull(rw, version); err != nil {
		return fmt.Errorf("read version: %w", err)
	}
	if _, err := rw.Write([]byte{1, rfb.SecurityNone}); err != nil {
		return err
	}
	choice := make([]byte, 1)
	if _, err := io.ReadFull(rw, choice); err != nil || choice[0] != rfb.SecurityNone {
		return fmt.Errorf("security choice %v: %v", choice, err)
	}
	if _, err := rw.Write([]byte{0, 0, 0, 0}); err != nil {
		return err
	}
	if _, err := io.ReadFull(rw, choice); err != nil {
		return fmt.Errorf("read client init: %w", err)
	}
	b := img.Bounds()
	name := "fake"
	init := binary.BigEndian.AppendUint16(nil, uint16(b.Dx()))
	init = binary.BigEndian.AppendUint16(init, uint16(b.Dy()))
	// The server's own format differs from the one the client must ask for.
	init = append(init, rfb.PixelFormat{BitsPerPixel: 16, Depth: 16, TrueColour: true,
		RedMax: 31, GreenMax: 63, BlueMax: 31, RedShift: 11, GreenShift: 5}.Marshal()...)
	init = binary.BigEndian.AppendUint32(init, uint32(len(name)))
	init = append(init, name...)
	if _, err := rw.Write(init); err != nil {
		return err
	}
	formatOK := false
	for {
		typ := make([]byte, 1)
		if _, err := io.ReadFull(rw, typ); err != nil {
			return nil
		}
		switch typ[0] {
		case 0: // SetPixelFormat
			msg := make([]byte, 19)
			if _, err := io.ReadFull(rw, msg); err != nil {
				return err
			}
			if f := rfb.UnmarshalPixelFormat(msg[3:]); f != rfb.TrueColour32 {
				return fmt.Errorf("client asked for pixel format %+v", f)
			}
			formatOK = true
		case 2: // SetEncodings
			hdr := make([]byte, 3)
			if _, err := io.ReadFull(rw, hdr); err != nil {
				return err
			}
			if _, err := io.ReadFull(rw, make([]byte, 4*int(binary.BigEndian.Uint16(hdr[1:])))); err != nil {
				return err
			}
		case 3: // FramebufferUpdateRequest
			req := make([]byte, 9)
			if _, err := io.ReadFull(rw, req); err != nil {
				return err
			}
			if !formatOK {
				return fmt.Errorf("update requested before SetPixelFormat")
			}
			x, y := int(binary.BigEndian.Uint16(req[1:])), int(binary.BigEndian.Uint16(req[3:]))
			r := image.Rect(x, y, x+int(binary.BigEndian.Uint16(req[5:])), y+int(binary.BigEndian.Uint16(req[7:])))
			if _, err := rw.Write(RawUpdate(img, r.Add(b.Min))); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unexpected client message %d", typ[0])
		}
	}
}

// RawUpdate is a FramebufferUpdate message carrying r of img as one Raw rectangle, in
// coordinates relative to img's origin.
func RawUpdate(img image.Image, r image.Rectangle) []byte {
	b := img.Bounds()
	msg := []byte{0, 0, 0, 1}
	for _, v := range []int{r.Min.X - b.Min.X, r.Min.Y - b.Min.Y, r.Dx(), r.Dy()} {
		msg = binary.BigEndian.AppendUint16(msg, uint16(v))
	}
	msg = binary.BigEndian.AppendUint32(msg, uint32(rfb.EncodingRaw))
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			msg = append(msg, rfb.EncodePixel(color.RGBAModel.Convert(img.At(x, y)).(color.RGBA))...)
		}
	}
	return msg
}
