package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// conn is Host.Conn: a grpc.ClientConnInterface that sends each call to the process serving
// the driver at that moment.
type conn struct {
	h    *Host
	name string
}

var _ grpc.ClientConnInterface = (*conn)(nil)

// Invoke implements grpc.ClientConnInterface.
func (c *conn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	_, inst, err := c.h.current(c.name)
	if err != nil {
		return err
	}
	if err := inst.rpc.Conn.Invoke(ctx, method, args, reply, opts...); err != nil {
		return callError(ctx, c.name, inst, err)
	}
	return nil
}

// NewStream implements grpc.ClientConnInterface.
func (c *conn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	_, inst, err := c.h.current(c.name)
	if err != nil {
		return nil, err
	}
	s, err := inst.rpc.Conn.NewStream(ctx, desc, method, opts...)
	if err != nil {
		return nil, callError(ctx, c.name, inst, err)
	}
	return &clientStream{ClientStream: s, ctx: ctx, name: c.name, inst: inst}, nil
}

// clientStream names the driver in the errors of a stream. io.EOF, the normal end of a stream,
// is passed as it is.
type clientStream struct {
	grpc.ClientStream
	ctx  context.Context // the caller's: the stream's own is done once the stream fails
	name string
	inst *instance
}

func (s *clientStream) Header() (metadata.MD, error) {
	md, err := s.ClientStream.Header()
	if err != nil {
		err = callError(s.ctx, s.name, s.inst, err)
	}
	return md, err
}

func (s *clientStream) SendMsg(m any) error {
	err := s.ClientStream.SendMsg(m)
	if err != nil && !errors.Is(err, io.EOF) {
		err = callError(s.ctx, s.name, s.inst, err)
	}
	return err
}

func (s *clientStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil && !errors.Is(err, io.EOF) {
		err = callError(s.ctx, s.name, s.inst, err)
	}
	return err
}

// callError puts the driver's name in front of a call's error message, keeping its status
// code and details. When the call failed with Unavailable it waits a little for the plugin
// process's exit to be seen (the connection breaks a moment before the process is gone), and if
// the process did exit, says why (a panic's first line, for one). So does a Canceled the caller
// did not ask for: the host closes the connection of a process that is gone, which can reach a
// call before the broken connection does.
func callError(ctx context.Context, name string, inst *instance, err error) error {
	st := status.Convert(err)
	if st.Code() == codes.Unavailable || st.Code() == codes.Canceled && ctx.Err() == nil {
		grace := exitGrace
		if inst.rpc.Conn.GetState() == connectivity.Ready {
			grace = readyGrace // most likely the driver's own Unavailable
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-inst.exited:
			return status.Errorf(codes.Unavailable, "driver %q exited during the call: %s", name, inst.cause)
		case <-t.C:
		case <-ctx.Done():
		}
	}
	p := st.Proto()
	p.Message = fmt.Sprintf("driver %q: %s", name, p.Message)
	return status.ErrorProto(p)
}
