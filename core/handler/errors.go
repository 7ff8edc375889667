package handler

import (
	"errors"

	"google.golang.org/grpc/status"
)

// reasonError is an error with the reason of the failed sync it causes (Reason* constants).
type reasonError struct {
	reason string
	err    error
}

func (e *reasonError) Error() string { return e.reason + ": " + e.err.Error() }
func (e *reasonError) Unwrap() error { return e.err }

// failed gives err a reason.
func failed(reason string, err error) error { return &reasonError{reason: reason, err: err} }

// internal says err is the handler's own failure (ReasonInternal): a state file not written, a
// directory not made.
func internal(err error) error { return failed(ReasonInternal, err) }

// classify returns the reason of an error of a sync step whose driver calls fail with reason:
// the reason the error was given (failed, internal), else reason for a driver's error (a gRPC
// status: every call to a driver plugin fails with one, core/plugin), else ReasonInternal.
func classify(reason string, err error) *reasonError {
	var re *reasonError
	if errors.As(err, &re) {
		return re
	}
	if _, ok := status.FromError(err); ok {
		return &reasonError{reason: reason, err: err}
	}
	return &reasonError{reason: ReasonInternal, err: err}
}
