package plugin

import (
	"context"
	"testing"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func TestCallError(t *testing.T) {
	cc, err := grpc.NewClient("passthrough:///unused", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	dead := &instance{rpc: &plugin.GRPCClient{Conn: cc}, exited: make(chan struct{}), cause: "exited (exit status 2): panic: boom"}
	close(dead.exited)
	alive := &instance{rpc: &plugin.GRPCClient{Conn: cc}, exited: make(chan struct{})}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	withDetails, _ := status.New(codes.InvalidArgument, "bad spec").WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "cpu.cores"}},
	})

	tests := []struct {
		name     string
		ctx      context.Context
		inst     *instance
		err      error
		wantCode codes.Code
		wantMsg  string
	}{
		{"driver's own error", context.Background(), alive, status.Error(codes.NotFound, `vm "x" not found`), codes.NotFound, `driver "d": vm "x" not found`},
		{"plain error", context.Background(), alive, context.DeadlineExceeded, codes.Unknown, `driver "d": context deadline exceeded`},
		{"unavailable, process alive", context.Background(), alive, status.Error(codes.Unavailable, "busy"), codes.Unavailable, `driver "d": busy`},
		{"unavailable, process exited", context.Background(), dead, status.Error(codes.Unavailable, "error reading from server: EOF"), codes.Unavailable, `driver "d" exited during the call: exited (exit status 2): panic: boom`},
		{"connection closed under a call", context.Background(), dead, status.Error(codes.Canceled, "grpc: the client connection is closing"), codes.Unavailable, `driver "d" exited during the call: exited (exit status 2): panic: boom`},
		{"cancelled by the caller", cancelled, dead, status.Error(codes.Canceled, "context canceled"), codes.Canceled, `driver "d": context canceled`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := status.Convert(callError(tt.ctx, "d", tt.inst, tt.err))
			if got.Code() != tt.wantCode || got.Message() != tt.wantMsg {
				t.Errorf("got %s %q, want %s %q", got.Code(), got.Message(), tt.wantCode, tt.wantMsg)
			}
		})
	}
	got := status.Convert(callError(context.Background(), "d", alive, withDetails.Err()))
	if got.Code() != codes.InvalidArgument || got.Message() != `driver "d": bad spec` || len(got.Details()) != 1 {
		t.Errorf("details lost: %v %q %v", got.Code(), got.Message(), got.Details())
	}
}
