package streams

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	subv1 "github.com/kubevisor/kubevisor/core/api/subresources/v1alpha1"
	"github.com/kubevisor/kubevisor/core/handler"
	"github.com/kubevisor/kubevisor/core/wsstream"
)

// vmiRequest is the VMI a request is for.
type vmiRequest struct {
	uid             types.UID
	namespace, name string
}

func (v vmiRequest) String() string { return v.namespace + "/" + v.name }

// console serves a VMI's serial console: input from the stream to the guest's serial port, the
// port's output (the driver's backlog first) to the stream. An interactive console takes over
// from the VMI's earlier one (TakeOverMessage).
func (s *Server) console(w http.ResponseWriter, r *http.Request, v vmiRequest) {
	if err := s.b.CheckStream(r.Context(), v.uid, handler.StreamConsole); err != nil {
		writeError(w, err)
		return
	}
	conn, err := wsstream.Upgrade(w, r)
	if err != nil {
		s.log.Debug("console upgrade", "vmi", v, "error", err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	sess := &session{conn: conn, cancel: cancel}
	s.consoles.attach(v.uid, sess)
	defer s.consoles.detach(v.uid, sess)
	s.log.Info("console opened", "vmi", v, "remote", r.RemoteAddr)
	err = s.b.Console(ctx, v.uid, conn, conn)
	_ = conn.Close()
	s.log.Info("console closed", "vmi", v, "error", err)
}

// vnc serves one RFB session with a VMI's display.
func (s *Server) vnc(w http.ResponseWriter, r *http.Request, v vmiRequest) {
	if err := s.b.CheckStream(r.Context(), v.uid, handler.StreamVNC); err != nil {
		writeError(w, err)
		return
	}
	conn, err := wsstream.Upgrade(w, r)
	if err != nil {
		s.log.Debug("vnc upgrade", "vmi", v, "error", err)
		return
	}
	s.log.Info("vnc opened", "vmi", v, "remote", r.RemoteAddr)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	err = s.b.Display(ctx, v.uid, conn, conn)
	_ = conn.Close()
	s.log.Info("vnc closed", "vmi", v, "error", err)
}

// portForward carries one TCP connection to a guest port: it dials the guest first, so that a
// refused connection is an HTTP error, then upgrades and copies both ways until either side
// ends.
func (s *Server) portForward(w http.ResponseWriter, r *http.Request, v vmiRequest, port int) {
	if err := s.b.CheckStream(r.Context(), v.uid, handler.StreamPortForward); err != nil {
		writeError(w, err)
		return
	}
	tcp, err := s.b.DialGuest(r.Context(), v.uid, port)
	if err != nil {
		writeError(w, err)
		return
	}
	conn, err := wsstream.Upgrade(w, r)
	if err != nil {
		_ = tcp.Close()
		s.log.Debug("portforward upgrade", "vmi", v, "error", err)
		return
	}
	s.log.Debug("portforward opened", "vmi", v, "port", port, "remote", r.RemoteAddr)
	splice(r.Context(), conn, tcp)
}

// splice copies a to b and b to a until either ends or ctx is done, then closes both.
func splice(ctx context.Context, a, b net.Conn) {
	var once sync.Once
	closeBoth := func() { once.Do(func() { _ = a.Close(); _ = b.Close() }) }
	defer context.AfterFunc(ctx, closeBoth)()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(a, b); closeBoth() })
	wg.Go(func() { _, _ = io.Copy(b, a); closeBoth() })
	wg.Wait()
}

// action runs a VMI action (PUT pause, unpause, reset, softreboot).
func (s *Server) action(w http.ResponseWriter, r *http.Request, v vmiRequest, what string) {
	do := map[string]func(context.Context, types.UID) error{
		subv1.SubresourcePause:      s.b.Pause,
		subv1.SubresourceUnpause:    s.b.Unpause,
		subv1.SubresourceReset:      s.b.Reset,
		subv1.SubresourceSoftReboot: s.b.SoftReboot,
	}[what]
	if err := do(r.Context(), v.uid); err != nil {
		s.log.Info("VMI action refused or failed", "vmi", v, "action", what, "error", err)
		writeError(w, err)
		return
	}
	writeStatus(w, http.StatusOK, fmt.Sprintf("virtualmachineinstance %s: %s done", v, what))
}

// guestOSInfo answers what is known of the guest's operating system.
func (s *Server) guestOSInfo(w http.ResponseWriter, r *http.Request, v vmiRequest) {
	info, err := s.b.GuestOSInfo(r.Context(), v.uid)
	if err != nil {
		writeError(w, err)
		return
	}
	info.APIVersion, info.Kind = subv1.GroupVersion.String(), "GuestOSInfo"
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(info)
}
