package bench

import (
	"fmt"
	"image"
	"io"
	"time"

	"github.com/kubevisor/kubevisor/internal/rfb"
)

// rfbTimes are the moments of one RFB session's start, from the client's side.
type rfbTimes struct {
	// ServerInit is when the server's ServerInit (the framebuffer's size) had arrived.
	ServerInit time.Time
	// FirstUpdate is when the server's first FramebufferUpdate, of the whole framebuffer, had
	// arrived in full.
	FirstUpdate time.Time
	// Width and Height are the framebuffer's, from ServerInit.
	Width, Height uint16
}

// rfbFirstUpdate runs an RFB session on conn with vmctl's client (internal/rfb): the RFB 3.8
// handshake with no authentication, 32-bit true colour, a request for the whole framebuffer,
// and the first FramebufferUpdate read in full (as a viewer needs it to draw the screen).
func rfbFirstUpdate(conn io.ReadWriter) (rfbTimes, error) {
	var t rfbTimes
	c, err := rfb.Handshake(conn)
	if err != nil {
		return t, err
	}
	t.ServerInit = time.Now()
	size := c.Size()
	t.Width, t.Height = uint16(size.X), uint16(size.Y)
	if err := c.SetPixelFormat(); err != nil {
		return t, err
	}
	if err := c.RequestUpdate(false, image.Rectangle{}); err != nil {
		return t, err
	}
	if _, err := c.ReadUpdate(); err != nil {
		return t, fmt.Errorf("first framebuffer update: %w", err)
	}
	t.FirstUpdate = time.Now()
	return t, nil
}
