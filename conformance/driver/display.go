package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"

	"github.com/kubevisor/kubevisor/core/driver"
	"github.com/kubevisor/kubevisor/internal/rfb"
)

// vncSocket is the VNC server's socket in a VM's run directory.
const vncSocket = "vnc.sock"

// checkDisplayRFBSessions: a VM with a VNC display (domain spec vnc) serves RFB sessions through
// Display: two at once, each with the RFB 3.8 handshake, security None and a framebuffer of a
// plausible size that a full update fills.
func (s *vmSuite) checkDisplayRFBSessions(t T) {
	_, caps := s.hypervisor(t)
	requireFeature(t, caps, basev1.Feature_FEATURE_HYPERVISOR_DISPLAY)
	if !caps.GetVnc() {
		t.Fatalf("the hypervisor declares FEATURE_HYPERVISOR_DISPLAY but not Capabilities.vnc: a domain spec cannot ask for the display it serves")
	}
	var runDir string
	vm := s.bootWith(t, "", func(spec *domainv1.DomainSpec) {
		runDir = filepath.Dir(spec.GetSerial().GetSocketPath())
		spec.Vnc = &domainv1.VNC{SocketPath: filepath.Join(runDir, vncSocket)}
	})
	d := optional[driver.Displayer](t, vm.d, basev1.Feature_FEATURE_HYPERVISOR_DISPLAY)
	ctx, cancel := context.WithTimeout(s.ctx(t), commandWithin)
	defer cancel()
	type result struct {
		size string
		err  error
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			img, err := displaySession(ctx, d, vm.id)
			if err != nil {
				results <- result{err: err}
				return
			}
			results <- result{size: fmt.Sprintf("%dx%d", img.Dx(), img.Dy())}
		}()
	}
	for range 2 {
		r := <-results
		if r.err != nil {
			t.Fatalf("an RFB session through Display: %v", r.err)
		}
		var w, h int
		if _, err := fmt.Sscanf(r.size, "%dx%d", &w, &h); err != nil || w < 320 || h < 200 || w > 8192 || h > 8192 {
			t.Errorf("the display's framebuffer is %s, want at least 320x200", r.size)
		}
	}
}

// size is what checkDisplayRFBSessions needs of a screenshot.
type size interface {
	Dx() int
	Dy() int
}

// displaySession runs one RFB session through Display and takes a screenshot with it.
func displaySession(ctx context.Context, d driver.Displayer, id string) (size, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := d.Display(ctx, id, inR, outW)
		outW.CloseWithError(errors.Join(err, io.EOF))
		done <- err
	}()
	type shot struct {
		img size
		err error
	}
	got := make(chan shot, 1)
	go func() {
		img, err := rfb.Screenshot(struct {
			io.Reader
			io.Writer
		}{outR, inW})
		if err != nil {
			got <- shot{err: err}
			return
		}
		got <- shot{img: img.Bounds()}
	}()
	select {
	case r := <-got:
		inW.Close()
		cancel()
		select {
		case err := <-done:
			if err != nil && r.err == nil {
				return nil, fmt.Errorf("display returned %s after the session", describe(err))
			}
		case <-time.After(10 * time.Second):
			return nil, errors.New("display did not return 10s after its context ended")
		}
		return r.img, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("no screenshot within %s", commandWithin)
	}
}
