package e2e

import (
	"bytes"
	"fmt"
	"image"
	"image/png"
	"regexp"
	"strconv"
)

// Screenshot is what a spec checks of a screenshot: its size and how many distinct colours it
// has (a blank screen has one).
type Screenshot struct {
	Width, Height int
	Colours       int
}

// maxColours bounds the count of distinct colours ReadScreenshot makes: the specs need only
// to tell one colour from several.
const maxColours = 256

// ReadScreenshot decodes a PNG and measures it; anything but a PNG is an error.
func ReadScreenshot(data []byte) (Screenshot, error) {
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		return Screenshot{}, fmt.Errorf("not a PNG: %w", err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		return Screenshot{}, fmt.Errorf("decode PNG: %w", err)
	}
	return Screenshot{Width: cfg.Width, Height: cfg.Height, Colours: colours(img, maxColours)}, nil
}

// colours counts the distinct colours of img, up to max.
func colours(img image.Image, max int) int {
	seen := map[[4]uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, a := img.At(x, y).RGBA()
			seen[[4]uint32{r, g, bl, a}] = true
			if len(seen) >= max {
				return len(seen)
			}
		}
	}
	return len(seen)
}

// Plausible says whether a screenshot looks like a guest's display: between 320×200 and
// 4096×4096, and more than one colour.
func (s Screenshot) Plausible() error {
	switch {
	case s.Width < 320 || s.Height < 200 || s.Width > 4096 || s.Height > 4096:
		return fmt.Errorf("size %dx%d is not a display's", s.Width, s.Height)
	case s.Colours < 2:
		return fmt.Errorf("%dx%d of one colour: a blank screen", s.Width, s.Height)
	}
	return nil
}

// heartbeat matches what the guest's heartbeat loop prints: HB-<uptime seconds>. It is not
// anchored to a line, since the shell's prompt may come before it.
var heartbeat = regexp.MustCompile(`HB-([0-9]+\.[0-9]+)`)

// Heartbeats returns the guest uptimes of the heartbeat lines in console output, in order.
// The echo of the command that starts the loop does not match (it has no number after HB-).
func Heartbeats(out string) []float64 {
	var ups []float64
	for _, m := range heartbeat.FindAllStringSubmatch(out, -1) {
		if v, err := strconv.ParseFloat(m[1], 64); err == nil {
			ups = append(ups, v)
		}
	}
	return ups
}
