package driver

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	domainv1 "github.com/kubevisor/kubevisor/core/domain/v1"
	basev1 "github.com/kubevisor/kubevisor/core/driver/base/v1"
	hypervisorv1 "github.com/kubevisor/kubevisor/core/driver/hypervisor/v1"
)

// hypervisorServer serves the Hypervisor service from a Hypervisor implementation. Optional
// operations the implementation does not offer answer Unimplemented.
type hypervisorServer struct {
	hypervisorv1.UnimplementedHypervisorServer
	impl Hypervisor
}

func (s *hypervisorServer) Create(ctx context.Context, req *hypervisorv1.CreateRequest) (*hypervisorv1.CreateResponse, error) {
	if req.GetDomain() == nil {
		return nil, status.Error(codes.InvalidArgument, "domain: required")
	}
	h, err := s.impl.Create(ctx, req.GetDomain())
	if err != nil {
		return nil, err
	}
	return &hypervisorv1.CreateResponse{Handle: h}, nil
}

func (s *hypervisorServer) Start(ctx context.Context, req *hypervisorv1.StartRequest) (*hypervisorv1.StartResponse, error) {
	return &hypervisorv1.StartResponse{}, s.impl.Start(ctx, req.GetId())
}

func (s *hypervisorServer) Shutdown(ctx context.Context, req *hypervisorv1.ShutdownRequest) (*hypervisorv1.ShutdownResponse, error) {
	graceful, err := s.impl.Shutdown(ctx, req.GetId(), req.GetTimeout().AsDuration())
	if err != nil {
		return nil, err
	}
	return &hypervisorv1.ShutdownResponse{Graceful: graceful}, nil
}

func (s *hypervisorServer) Kill(ctx context.Context, req *hypervisorv1.KillRequest) (*hypervisorv1.KillResponse, error) {
	return &hypervisorv1.KillResponse{}, s.impl.Kill(ctx, req.GetId())
}

func (s *hypervisorServer) Delete(ctx context.Context, req *hypervisorv1.DeleteRequest) (*hypervisorv1.DeleteResponse, error) {
	return &hypervisorv1.DeleteResponse{}, s.impl.Delete(ctx, req.GetId())
}

func (s *hypervisorServer) Status(ctx context.Context, req *hypervisorv1.StatusRequest) (*hypervisorv1.StatusResponse, error) {
	st, err := s.impl.Status(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return &hypervisorv1.StatusResponse{Status: st}, nil
}

func (s *hypervisorServer) Events(req *hypervisorv1.EventsRequest, stream grpc.ServerStreamingServer[hypervisorv1.Event]) error {
	return s.impl.Events(stream.Context(), req.GetId(), stream.Send)
}

func (s *hypervisorServer) Pause(ctx context.Context, req *hypervisorv1.PauseRequest) (*hypervisorv1.PauseResponse, error) {
	p, ok := s.impl.(Pauser)
	if !ok {
		return nil, unimplemented("pause")
	}
	return &hypervisorv1.PauseResponse{}, p.Pause(ctx, req.GetId())
}

func (s *hypervisorServer) Resume(ctx context.Context, req *hypervisorv1.ResumeRequest) (*hypervisorv1.ResumeResponse, error) {
	p, ok := s.impl.(Pauser)
	if !ok {
		return nil, unimplemented("resume")
	}
	return &hypervisorv1.ResumeResponse{}, p.Resume(ctx, req.GetId())
}

func (s *hypervisorServer) Reboot(ctx context.Context, req *hypervisorv1.RebootRequest) (*hypervisorv1.RebootResponse, error) {
	r, ok := s.impl.(Rebooter)
	if !ok {
		return nil, unimplemented("reboot")
	}
	return &hypervisorv1.RebootResponse{}, r.Reboot(ctx, req.GetId())
}

func (s *hypervisorServer) SoftReboot(ctx context.Context, req *hypervisorv1.SoftRebootRequest) (*hypervisorv1.SoftRebootResponse, error) {
	r, ok := s.impl.(SoftRebooter)
	if !ok {
		return nil, unimplemented("soft reboot")
	}
	return &hypervisorv1.SoftRebootResponse{}, r.SoftReboot(ctx, req.GetId())
}

func (s *hypervisorServer) GuestAgentInfo(ctx context.Context, req *hypervisorv1.GuestAgentInfoRequest) (*hypervisorv1.GuestAgentInfoResponse, error) {
	g, ok := s.impl.(GuestAgent)
	if !ok {
		return nil, unimplemented("guest agent info")
	}
	return g.GuestAgentInfo(ctx, req.GetId())
}

func (s *hypervisorServer) GuestAgentPing(ctx context.Context, req *hypervisorv1.GuestAgentPingRequest) (*hypervisorv1.GuestAgentPingResponse, error) {
	g, ok := s.impl.(GuestExecer)
	if !ok {
		return nil, unimplemented("guest agent ping")
	}
	return g.GuestAgentPing(ctx, req.GetId())
}

func (s *hypervisorServer) GuestAgentExec(ctx context.Context, req *hypervisorv1.GuestAgentExecRequest) (*hypervisorv1.GuestAgentExecResponse, error) {
	g, ok := s.impl.(GuestExecer)
	if !ok {
		return nil, unimplemented("guest agent exec")
	}
	if len(req.GetCommand()) == 0 || req.GetCommand()[0] == "" {
		return nil, status.Error(codes.InvalidArgument, "guest agent exec: command is required")
	}
	return g.GuestAgentExec(ctx, req.GetId(), req.GetCommand(), req.GetTimeout().AsDuration())
}

func (s *hypervisorServer) Recover(ctx context.Context, req *hypervisorv1.RecoverRequest) (*hypervisorv1.RecoverResponse, error) {
	r, ok := s.impl.(Recoverer)
	if !ok {
		return nil, unimplemented("recover")
	}
	if req.GetHandle() == nil {
		return nil, status.Error(codes.InvalidArgument, "handle: required")
	}
	st, err := r.Recover(ctx, req.GetHandle())
	if err != nil {
		return nil, err
	}
	return &hypervisorv1.RecoverResponse{Status: st}, nil
}

func (s *hypervisorServer) Migrate(ctx context.Context, req *hypervisorv1.MigrateRequest) (*hypervisorv1.MigrateResponse, error) {
	m, ok := s.impl.(Migrator)
	if !ok {
		return nil, unimplemented("migrate")
	}
	switch {
	case req.GetTargetUri() == "" && req.GetTargetSocketPath() == "":
		return nil, status.Error(codes.InvalidArgument, "targetSocketPath: required (or targetUri)")
	case req.GetTargetUri() != "" && req.GetTargetSocketPath() != "":
		return nil, status.Error(codes.InvalidArgument, "targetUri: not with targetSocketPath")
	}
	return &hypervisorv1.MigrateResponse{}, m.Migrate(ctx, req)
}

func (s *hypervisorServer) MigrationStatus(ctx context.Context, req *hypervisorv1.MigrationStatusRequest) (*hypervisorv1.MigrationStatusResponse, error) {
	m, ok := s.impl.(Migrator)
	if !ok {
		return nil, unimplemented("migration status")
	}
	info, err := m.MigrationStatus(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return &hypervisorv1.MigrationStatusResponse{Migration: info}, nil
}

func (s *hypervisorServer) CancelMigration(ctx context.Context, req *hypervisorv1.CancelMigrationRequest) (*hypervisorv1.CancelMigrationResponse, error) {
	m, ok := s.impl.(Migrator)
	if !ok {
		return nil, unimplemented("cancel migration")
	}
	return &hypervisorv1.CancelMigrationResponse{}, m.CancelMigration(ctx, req.GetId())
}

func (s *hypervisorServer) Console(stream grpc.BidiStreamingServer[hypervisorv1.ConsoleInput, hypervisorv1.ConsoleOutput]) error {
	c, ok := s.impl.(Consoler)
	if !ok {
		return unimplemented("console")
	}
	return serveBytes(stream.Context(), "console", stream.Recv,
		func(p []byte) error { return stream.Send(&hypervisorv1.ConsoleOutput{Data: p}) }, c.Console)
}

func (s *hypervisorServer) Display(stream grpc.BidiStreamingServer[hypervisorv1.DisplayInput, hypervisorv1.DisplayOutput]) error {
	d, ok := s.impl.(Displayer)
	if !ok {
		return unimplemented("display")
	}
	return serveBytes(stream.Context(), "display", stream.Recv,
		func(p []byte) error { return stream.Send(&hypervisorv1.DisplayOutput{Data: p}) }, d.Display)
}

// byteInput is the first and later messages of a byte stream (ConsoleInput, DisplayInput).
type byteInput interface {
	GetId() string
	GetData() []byte
}

// serveBytes runs a byte-stream RPC on the driver's side: the first message names the VM, the
// data of every message is copied into run's in, and what run writes to out is sent.
func serveBytes[In byteInput](ctx context.Context, what string, recv func() (In, error), send func([]byte) error,
	run func(ctx context.Context, id string, in io.Reader, out io.Writer) error) error {
	first, err := recv()
	if err != nil {
		return err
	}
	if first.GetId() == "" {
		return status.Errorf(codes.InvalidArgument, "id: required in the first %s message", what)
	}
	in, inW := io.Pipe()
	go func() {
		if len(first.GetData()) > 0 {
			if _, err := inW.Write(first.GetData()); err != nil {
				return
			}
		}
		for {
			msg, err := recv()
			if err != nil {
				inW.CloseWithError(io.EOF)
				return
			}
			if _, err := inW.Write(msg.GetData()); err != nil {
				return
			}
		}
	}()
	defer in.Close()
	return run(ctx, first.GetId(), in, writerFunc(func(p []byte) (int, error) {
		// The stream keeps a reference to what it sends until it is sent; copy.
		if err := send(append([]byte(nil), p...)); err != nil {
			return 0, err
		}
		return len(p), nil
	}))
}

// HypervisorClient is the host's Hypervisor: it calls a hypervisor plugin over gRPC. It
// implements Hypervisor only; the optional interfaces of what the driver declared are reached
// through Optional (Optional[Pauser](ctx, client), ...), so that a client of a driver without a
// feature does not offer it. Create checks the spec against the driver's Capabilities first
// (CheckDomain), without reaching the plugin when it fails.
type HypervisorClient struct {
	baseClient
	hv hypervisorv1.HypervisorClient
}

var (
	_ Hypervisor = (*HypervisorClient)(nil)
	_ gated      = (*HypervisorClient)(nil)

	_ Pauser       = hvPauser{}
	_ Rebooter     = hvRebooter{}
	_ SoftRebooter = hvSoftRebooter{}
	_ GuestAgent   = hvGuestAgent{}
	_ GuestExecer  = hvGuestExecer{}
	_ Consoler     = hvConsoler{}
	_ Displayer    = hvDisplayer{}
	_ Recoverer    = hvRecoverer{}
	_ Migrator     = hvMigrator{}
)

// NewHypervisorClient returns a client for the hypervisor plugin served on conn.
func NewHypervisorClient(conn grpc.ClientConnInterface) *HypervisorClient {
	return &HypervisorClient{baseClient: baseClient{base: basev1.NewDriverClient(conn)}, hv: hypervisorv1.NewHypervisorClient(conn)}
}

// optional implements gated.
func (c *HypervisorClient) optional(f basev1.Feature) any {
	switch f {
	case basev1.Feature_FEATURE_HYPERVISOR_PAUSE:
		return hvPauser{c}
	case basev1.Feature_FEATURE_HYPERVISOR_REBOOT:
		return hvRebooter{c}
	case basev1.Feature_FEATURE_HYPERVISOR_SOFT_REBOOT:
		return hvSoftRebooter{c}
	case basev1.Feature_FEATURE_HYPERVISOR_GUEST_AGENT:
		return hvGuestAgent{c}
	case basev1.Feature_FEATURE_HYPERVISOR_GUEST_EXEC:
		return hvGuestExecer{c}
	case basev1.Feature_FEATURE_HYPERVISOR_CONSOLE:
		return hvConsoler{c}
	case basev1.Feature_FEATURE_HYPERVISOR_DISPLAY:
		return hvDisplayer{c}
	case basev1.Feature_FEATURE_HYPERVISOR_RECOVER:
		return hvRecoverer{c}
	case basev1.Feature_FEATURE_HYPERVISOR_MIGRATE:
		return hvMigrator{c}
	}
	return nil
}

// Create implements Hypervisor. A spec that asks for what the driver does not declare is
// InvalidArgument (CheckDomain) without a call to the plugin.
func (c *HypervisorClient) Create(ctx context.Context, spec *domainv1.DomainSpec) (*hypervisorv1.Handle, error) {
	caps, err := c.Capabilities(ctx)
	if err != nil {
		return nil, err
	}
	if err := CheckDomain(caps, spec); err != nil {
		return nil, err
	}
	resp, err := c.hv.Create(ctx, &hypervisorv1.CreateRequest{Domain: spec})
	return resp.GetHandle(), err
}

// Start implements Hypervisor.
func (c *HypervisorClient) Start(ctx context.Context, id string) error {
	_, err := c.hv.Start(ctx, &hypervisorv1.StartRequest{Id: id})
	return err
}

// Shutdown implements Hypervisor.
func (c *HypervisorClient) Shutdown(ctx context.Context, id string, timeout time.Duration) (bool, error) {
	resp, err := c.hv.Shutdown(ctx, &hypervisorv1.ShutdownRequest{Id: id, Timeout: durationpb.New(timeout)})
	return resp.GetGraceful(), err
}

// Kill implements Hypervisor.
func (c *HypervisorClient) Kill(ctx context.Context, id string) error {
	_, err := c.hv.Kill(ctx, &hypervisorv1.KillRequest{Id: id})
	return err
}

// Delete implements Hypervisor.
func (c *HypervisorClient) Delete(ctx context.Context, id string) error {
	_, err := c.hv.Delete(ctx, &hypervisorv1.DeleteRequest{Id: id})
	return err
}

// Status implements Hypervisor.
func (c *HypervisorClient) Status(ctx context.Context, id string) (*hypervisorv1.VMStatus, error) {
	resp, err := c.hv.Status(ctx, &hypervisorv1.StatusRequest{Id: id})
	return resp.GetStatus(), err
}

// Events implements Hypervisor.
func (c *HypervisorClient) Events(ctx context.Context, id string, send func(*hypervisorv1.Event) error) error {
	stream, err := c.hv.Events(ctx, &hypervisorv1.EventsRequest{Id: id})
	if err != nil {
		return err
	}
	return recvAll(ctx, stream.Recv, send)
}

// The optional interfaces of a HypervisorClient, which Optional hands out only for what the
// driver declared.
type (
	hvPauser       struct{ c *HypervisorClient }
	hvRebooter     struct{ c *HypervisorClient }
	hvSoftRebooter struct{ c *HypervisorClient }
	hvGuestAgent   struct{ c *HypervisorClient }
	hvGuestExecer  struct{ c *HypervisorClient }
	hvConsoler     struct{ c *HypervisorClient }
	hvDisplayer    struct{ c *HypervisorClient }
	hvRecoverer    struct{ c *HypervisorClient }
	hvMigrator     struct{ c *HypervisorClient }
)

// Pause implements Pauser.
func (p hvPauser) Pause(ctx context.Context, id string) error {
	c := p.c
	_, err := c.hv.Pause(ctx, &hypervisorv1.PauseRequest{Id: id})
	return err
}

// Resume implements Pauser.
func (p hvPauser) Resume(ctx context.Context, id string) error {
	c := p.c
	_, err := c.hv.Resume(ctx, &hypervisorv1.ResumeRequest{Id: id})
	return err
}

// Reboot implements Rebooter.
func (r hvRebooter) Reboot(ctx context.Context, id string) error {
	c := r.c
	_, err := c.hv.Reboot(ctx, &hypervisorv1.RebootRequest{Id: id})
	return err
}

// SoftReboot implements SoftRebooter.
func (r hvSoftRebooter) SoftReboot(ctx context.Context, id string) error {
	_, err := r.c.hv.SoftReboot(ctx, &hypervisorv1.SoftRebootRequest{Id: id})
	return err
}

// GuestAgentInfo implements GuestAgent.
func (g hvGuestAgent) GuestAgentInfo(ctx context.Context, id string) (*hypervisorv1.GuestAgentInfoResponse, error) {
	return g.c.hv.GuestAgentInfo(ctx, &hypervisorv1.GuestAgentInfoRequest{Id: id})
}

// GuestAgentPing implements GuestExecer.
func (g hvGuestExecer) GuestAgentPing(ctx context.Context, id string) (*hypervisorv1.GuestAgentPingResponse, error) {
	return g.c.hv.GuestAgentPing(ctx, &hypervisorv1.GuestAgentPingRequest{Id: id})
}

// GuestAgentExec implements GuestExecer.
func (g hvGuestExecer) GuestAgentExec(ctx context.Context, id string, command []string, timeout time.Duration) (*hypervisorv1.GuestAgentExecResponse, error) {
	req := &hypervisorv1.GuestAgentExecRequest{Id: id, Command: command}
	if timeout > 0 {
		req.Timeout = durationpb.New(timeout)
	}
	return g.c.hv.GuestAgentExec(ctx, req)
}

// Recover implements Recoverer.
func (r hvRecoverer) Recover(ctx context.Context, handle *hypervisorv1.Handle) (*hypervisorv1.VMStatus, error) {
	c := r.c
	resp, err := c.hv.Recover(ctx, &hypervisorv1.RecoverRequest{Handle: handle})
	return resp.GetStatus(), err
}

// Migrate implements Migrator.
func (m hvMigrator) Migrate(ctx context.Context, req *hypervisorv1.MigrateRequest) error {
	c := m.c
	if len(req.GetDisks()) > 0 {
		// Copying disks is declared apart from migration: not sent to a driver without it.
		caps, err := c.Capabilities(ctx)
		if err != nil {
			return err
		}
		if !caps.GetMigrationDisks() {
			return status.Errorf(codes.InvalidArgument, "disks: copying disk %q in a migration is not declared by the driver (Capabilities.migration_disks)", req.GetDisks()[0].GetName())
		}
	}
	_, err := c.hv.Migrate(ctx, req)
	return err
}

// MigrationStatus implements Migrator.
func (m hvMigrator) MigrationStatus(ctx context.Context, id string) (*hypervisorv1.MigrationInfo, error) {
	resp, err := m.c.hv.MigrationStatus(ctx, &hypervisorv1.MigrationStatusRequest{Id: id})
	return resp.GetMigration(), err
}

// CancelMigration implements Migrator.
func (m hvMigrator) CancelMigration(ctx context.Context, id string) error {
	_, err := m.c.hv.CancelMigration(ctx, &hypervisorv1.CancelMigrationRequest{Id: id})
	return err
}

// Console implements Consoler. It returns when ctx is done, the VM's console closes, or in
// ends (after which output still in flight is dropped).
func (cs hvConsoler) Console(ctx context.Context, id string, in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cs.c.hv.Console(ctx)
	if err != nil {
		return err
	}
	return callBytes(ctx, id, in, out,
		func(id string, p []byte) error { return stream.Send(&hypervisorv1.ConsoleInput{Id: id, Data: p}) },
		stream.CloseSend,
		func() ([]byte, error) { m, err := stream.Recv(); return m.GetData(), err })
}

// Display implements Displayer, as Console does for the console.
func (d hvDisplayer) Display(ctx context.Context, id string, in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := d.c.hv.Display(ctx)
	if err != nil {
		return err
	}
	return callBytes(ctx, id, in, out,
		func(id string, p []byte) error { return stream.Send(&hypervisorv1.DisplayInput{Id: id, Data: p}) },
		stream.CloseSend,
		func() ([]byte, error) { m, err := stream.Recv(); return m.GetData(), err })
}

// callBytes runs a byte-stream RPC on the host's side: the first message names the VM, in is
// sent as it comes (CloseSend when it ends), and what arrives is written to out until the
// stream ends; the end of ctx or of the stream is not an error.
func callBytes(ctx context.Context, id string, in io.Reader, out io.Writer,
	send func(id string, p []byte) error, closeSend func() error, recv func() ([]byte, error)) error {
	if err := send(id, nil); err != nil {
		return err
	}
	if in != nil {
		go func() {
			buf := make([]byte, 4096)
			for {
				n, err := in.Read(buf)
				if n > 0 {
					if send("", append([]byte(nil), buf[:n]...)) != nil {
						return
					}
				}
				if err != nil {
					_ = closeSend()
					return
				}
			}
		}()
	}
	for {
		data, err := recv()
		if err != nil {
			if ctx.Err() != nil || isEOF(err) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		if _, err := out.Write(data); err != nil {
			return err
		}
	}
}

func unimplemented(op string) error {
	return status.Errorf(codes.Unimplemented, "%s is not offered by this driver", op)
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
