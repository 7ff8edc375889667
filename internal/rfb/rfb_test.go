package rfb_test

import (
	"bytes"
	"encoding/binary"
	"image"
	"image/color"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/kubevisor/kubevisor/internal/rfb"
	"github.com/kubevisor/kubevisor/internal/rfb/rfbtest"
)

// testImage has a different colour at every pixel, so that a shifted or swapped channel shows.
func testImage(w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.SetRGBA(x, y, color.RGBA{R: uint8(x * 7), G: uint8(y * 13), B: uint8(x + y), A: 0xff})
		}
	}
	return img
}

func TestScreenshotDecodesTheServersFramebuffer(t *testing.T) {
	want := testImage(37, 21)
	client, server := net.Pipe()
	defer client.Close()
	errc := make(chan error, 1)
	go func() { errc <- rfbtest.Serve(server, want); server.Close() }()

	got, err := rfb.Screenshot(client)
	if err != nil {
		t.Fatal(err)
	}
	if got.Bounds() != want.Bounds() || !bytes.Equal(got.Pix, want.Pix) {
		t.Fatalf("screenshot differs from the framebuffer (bounds %v, want %v)", got.Bounds(), want.Bounds())
	}
	client.Close()
	if err := <-errc; err != nil {
		t.Fatalf("fake server: %v", err)
	}
}

// scriptedServer answers the handshake for a w×h framebuffer with the given security types, then
// writes extra after the client's first update request.
func scriptedServer(t *testing.T, conn net.Conn, version string, security []byte, w, h int, extra []byte) {
	t.Helper()
	go func() {
		defer conn.Close()
		_, _ = io.WriteString(conn, version)
		if _, err := io.ReadFull(conn, make([]byte, 12)); err != nil {
			return
		}
		_, _ = conn.Write(append([]byte{byte(len(security))}, security...))
		if _, err := io.ReadFull(conn, make([]byte, 1)); err != nil {
			return
		}
		_, _ = conn.Write([]byte{0, 0, 0, 0})
		_, _ = io.ReadFull(conn, make([]byte, 1))
		init := binary.BigEndian.AppendUint16(nil, uint16(w))
		init = binary.BigEndian.AppendUint16(init, uint16(h))
		init = append(init, rfb.TrueColour32.Marshal()...)
		init = append(init, 0, 0, 0, 0)
		_, _ = conn.Write(init)
		// SetPixelFormat (20) + SetEncodings (4+8) + FramebufferUpdateRequest (10).
		if _, err := io.ReadFull(conn, make([]byte, 20+12+10)); err != nil {
			return
		}
		_, _ = conn.Write(extra)
		_, _ = io.Copy(io.Discard, conn)
	}()
}

func TestCopyRectCopiesWithinTheFramebuffer(t *testing.T) {
	img := testImage(8, 4)
	// One update: the whole image raw, a bell before it, then the top-left 2×2 copied to (5,2).
	update := rfbtest.RawUpdate(img, img.Bounds())
	update[3] = 2 // two rectangles
	copyRect := binary.BigEndian.AppendUint16(nil, 5)
	copyRect = binary.BigEndian.AppendUint16(copyRect, 2)
	copyRect = binary.BigEndian.AppendUint16(copyRect, 2)
	copyRect = binary.BigEndian.AppendUint16(copyRect, 2)
	copyRect = binary.BigEndian.AppendUint32(copyRect, uint32(rfb.EncodingCopyRect))
	copyRect = append(copyRect, 0, 0, 0, 0) // from (0,0)
	msg := append([]byte{2}, append(update, copyRect...)...)

	client, server := net.Pipe()
	defer client.Close()
	scriptedServer(t, server, rfb.ProtocolVersion, []byte{2, rfb.SecurityNone}, 8, 4, msg)
	got, err := rfb.Screenshot(client)
	if err != nil {
		t.Fatal(err)
	}
	for y := 0; y < 4; y++ {
		for x := 0; x < 8; x++ {
			want := img.RGBAAt(x, y)
			if x >= 5 && x < 7 && y >= 2 {
				want = img.RGBAAt(x-5, y-2)
			}
			if got.RGBAAt(x, y) != want {
				t.Fatalf("pixel (%d,%d) = %v, want %v", x, y, got.RGBAAt(x, y), want)
			}
		}
	}
}

func TestHandshakeRefusals(t *testing.T) {
	tests := []struct {
		name     string
		version  string
		security []byte
		want     string
	}{
		{"old version", "RFB 003.003\n", []byte{rfb.SecurityNone}, "only \"RFB 003.008\" is supported"},
		{"no None security", rfb.ProtocolVersion, []byte{2, 19}, "only None (1) is supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, server := net.Pipe()
			defer client.Close()
			scriptedServer(t, server, tt.version, tt.security, 4, 4, nil)
			_, err := rfb.Handshake(client)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestRectangleOutsideTheFramebufferIsAnError(t *testing.T) {
	big := testImage(8, 8)
	client, server := net.Pipe()
	defer client.Close()
	scriptedServer(t, server, rfb.ProtocolVersion, []byte{rfb.SecurityNone}, 4, 4, rfbtest.RawUpdate(big, big.Bounds()))
	if _, err := rfb.Screenshot(client); err == nil || !strings.Contains(err.Error(), "outside the framebuffer") {
		t.Fatalf("err = %v, want a rectangle outside the framebuffer", err)
	}
}

func TestPixelFormatRoundTrips(t *testing.T) {
	if got := rfb.UnmarshalPixelFormat(rfb.TrueColour32.Marshal()); got != rfb.TrueColour32 {
		t.Fatalf("round trip = %+v", got)
	}
}
