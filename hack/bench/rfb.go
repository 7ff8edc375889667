package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// rfbTimes are the moments of one RFB session's start, from the client's side.
type rfbTimes struct {
	// ServerInit is when the server's ServerInit (the framebuffer's size) had arrived.
	ServerInit time.Time
	// FirstUpdate is when the first byte of the server's first FramebufferUpdate arrived.
	FirstUpdate time.Time
	// Width and Height are the framebuffer's, from ServerInit.
	Width, Height uint16
}

// RFB message types (RFC 6143).
const (
	rfbSecurityNone          = 1
	rfbSetEncodings          = 2
	rfbFramebufferUpdateReq  = 3
	rfbFramebufferUpdate     = 0
	rfbSetColourMapEntries   = 1
	rfbBell                  = 2
	rfbServerCutText         = 3
	rfbEncodingRaw           = 0
	rfbMaxReason             = 1 << 16
	rfbMaxCutText            = 1 << 20
	rfbVersion38             = "RFB 003.008\n"
	rfbVersionLen            = 12
	rfbServerInitFixedLength = 24 // width, height, pixel format (16), name length
)

// rfbFirstUpdate runs the client's side of an RFB 3.8 handshake with no authentication on
// conn, asks for the whole framebuffer in raw encoding, and returns when the first
// FramebufferUpdate starts to arrive. Messages the server may send before it (bell, colour
// map, cut text) are skipped.
func rfbFirstUpdate(conn io.ReadWriter) (rfbTimes, error) {
	var t rfbTimes
	version := make([]byte, rfbVersionLen)
	if _, err := io.ReadFull(conn, version); err != nil {
		return t, fmt.Errorf("read protocol version: %w", err)
	}
	if string(version[:4]) != "RFB " {
		return t, fmt.Errorf("not RFB: %q", version)
	}
	if string(version) < rfbVersion38 {
		return t, fmt.Errorf("server speaks %q, the bench only RFB 3.8", version)
	}
	if _, err := io.WriteString(conn, rfbVersion38); err != nil {
		return t, fmt.Errorf("write protocol version: %w", err)
	}
	var n [1]byte
	if _, err := io.ReadFull(conn, n[:]); err != nil {
		return t, fmt.Errorf("read security types: %w", err)
	}
	if n[0] == 0 {
		return t, fmt.Errorf("server refused the connection: %s", rfbReason(conn))
	}
	types := make([]byte, n[0])
	if _, err := io.ReadFull(conn, types); err != nil {
		return t, fmt.Errorf("read security types: %w", err)
	}
	if !containsByte(types, rfbSecurityNone) {
		return t, fmt.Errorf("server offers security types %v, not None (1)", types)
	}
	if _, err := conn.Write([]byte{rfbSecurityNone}); err != nil {
		return t, fmt.Errorf("choose security None: %w", err)
	}
	var result uint32
	if err := binary.Read(conn, binary.BigEndian, &result); err != nil {
		return t, fmt.Errorf("read security result: %w", err)
	}
	if result != 0 {
		return t, fmt.Errorf("security handshake failed: %s", rfbReason(conn))
	}
	if _, err := conn.Write([]byte{1}); err != nil { // ClientInit: shared
		return t, fmt.Errorf("write ClientInit: %w", err)
	}
	init := make([]byte, rfbServerInitFixedLength)
	if _, err := io.ReadFull(conn, init); err != nil {
		return t, fmt.Errorf("read ServerInit: %w", err)
	}
	t.Width, t.Height = binary.BigEndian.Uint16(init[0:]), binary.BigEndian.Uint16(init[2:])
	if _, err := io.CopyN(io.Discard, conn, int64(binary.BigEndian.Uint32(init[20:]))); err != nil {
		return t, fmt.Errorf("read ServerInit's name: %w", err)
	}
	t.ServerInit = time.Now()
	req := []byte{rfbSetEncodings, 0, 0, 1, 0, 0, 0, rfbEncodingRaw}
	req = append(req, rfbFramebufferUpdateReq, 0, 0, 0, 0, 0)
	req = binary.BigEndian.AppendUint16(req, t.Width)
	req = binary.BigEndian.AppendUint16(req, t.Height)
	if _, err := conn.Write(req); err != nil {
		return t, fmt.Errorf("request the framebuffer: %w", err)
	}
	for {
		var typ [1]byte
		if _, err := io.ReadFull(conn, typ[:]); err != nil {
			return t, fmt.Errorf("read server message: %w", err)
		}
		switch typ[0] {
		case rfbFramebufferUpdate:
			t.FirstUpdate = time.Now()
			return t, nil
		case rfbBell:
		case rfbSetColourMapEntries:
			var h [5]byte // padding, first colour, number of colours
			if _, err := io.ReadFull(conn, h[:]); err != nil {
				return t, fmt.Errorf("read SetColourMapEntries: %w", err)
			}
			if _, err := io.CopyN(io.Discard, conn, 6*int64(binary.BigEndian.Uint16(h[3:]))); err != nil {
				return t, fmt.Errorf("read SetColourMapEntries: %w", err)
			}
		case rfbServerCutText:
			var h [7]byte // padding (3), length
			if _, err := io.ReadFull(conn, h[:]); err != nil {
				return t, fmt.Errorf("read ServerCutText: %w", err)
			}
			l := binary.BigEndian.Uint32(h[3:])
			if l > rfbMaxCutText {
				return t, fmt.Errorf("ServerCutText of %d bytes", l)
			}
			if _, err := io.CopyN(io.Discard, conn, int64(l)); err != nil {
				return t, fmt.Errorf("read ServerCutText: %w", err)
			}
		default:
			return t, fmt.Errorf("unknown server message type %d", typ[0])
		}
	}
}

// rfbReason reads the reason string that follows a refusal.
func rfbReason(r io.Reader) string {
	var l uint32
	if err := binary.Read(r, binary.BigEndian, &l); err != nil {
		return "(no reason: " + err.Error() + ")"
	}
	if l > rfbMaxReason {
		return fmt.Sprintf("(a reason of %d bytes)", l)
	}
	b := make([]byte, l)
	if _, err := io.ReadFull(r, b); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return "(no reason: " + err.Error() + ")"
	}
	return string(b)
}

func containsByte(b []byte, c byte) bool {
	for _, x := range b {
		if x == c {
			return true
		}
	}
	return false
}
