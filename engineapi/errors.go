// Package engineapi is how controllers reach the data plane: a client for the
// instance-manager gRPC API (impb) with one pooled connection per instance
// manager, timeouts, and typed errors to branch on.
package engineapi

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Errors a caller can branch on with errors.Is. The instance manager returns
// them as gRPC codes (ToStatus); the client turns the codes back (FromStatus).
var (
	ErrNotFound      = errors.New("not found")
	ErrAlreadyExists = errors.New("already exists")
	ErrLimitExceeded = errors.New("limit exceeded")
	ErrBusy          = errors.New("busy")
	ErrInvalid       = errors.New("invalid argument")
	ErrUnavailable   = errors.New("instance manager unavailable")
	// ErrFreezeLost: a snapshot of a group cut asked of an engine that is
	// no longer frozen for it (timed out or thawed); nothing was taken.
	ErrFreezeLost = errors.New("freeze lost")
)

var errorCodes = []struct {
	err  error
	code codes.Code
}{
	{ErrNotFound, codes.NotFound},
	{ErrAlreadyExists, codes.AlreadyExists},
	{ErrLimitExceeded, codes.ResourceExhausted},
	{ErrBusy, codes.Aborted},
	{ErrInvalid, codes.InvalidArgument},
	{ErrUnavailable, codes.Unavailable},
	{ErrFreezeLost, codes.FailedPrecondition},
}

// Error is a failure reported by an instance manager: the message it sent
// and the class of failure.
type Error struct {
	Kind    error
	Message string
}

func (e *Error) Error() string { return e.Message }

// Is makes errors.Is(err, ErrNotFound) and friends work.
func (e *Error) Is(target error) bool { return e.Kind != nil && target == e.Kind }

// ToStatus converts a server-side error to a gRPC status with the code of
// its class; unclassified errors are codes.Internal.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	for _, ec := range errorCodes {
		if errors.Is(err, ec.err) {
			return status.Error(ec.code, err.Error())
		}
	}
	return status.Error(codes.Internal, err.Error())
}

// FromStatus converts a gRPC error from an instance manager to an *Error
// whose class can be tested with errors.Is.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.DeadlineExceeded:
		return &Error{Kind: context.DeadlineExceeded, Message: st.Message()}
	case codes.Canceled:
		return &Error{Kind: context.Canceled, Message: st.Message()}
	}
	for _, ec := range errorCodes {
		if st.Code() == ec.code {
			return &Error{Kind: ec.err, Message: st.Message()}
		}
	}
	return &Error{Message: st.Message()}
}
