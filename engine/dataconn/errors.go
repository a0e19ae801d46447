package dataconn

import (
	"errors"
	"fmt"

	"github.com/strata-storage/strata/engine/blockdev"
)

// Status is a response's outcome: 0 is success, anything else an error
// code. Unknown codes are kept and reported as a generic remote error, so a
// newer server can add codes without breaking older clients.
type Status uint32

const (
	StatusOK Status = iota
	StatusError
	StatusOutOfRange
	StatusUnknownMethod
	StatusInvalidArgument
	StatusNotFound
	StatusAlreadyExists
	StatusLimitExceeded
)

var (
	// ErrConnectionClosed is returned by every pending and later call once
	// the connection has failed or been closed; the engine marks the replica
	// ERR on it. The wrapped cause says why.
	ErrConnectionClosed = errors.New("dataconn: connection closed")
	// ErrTimeout is returned when a call exceeds Options.Timeout. It also
	// matches context.DeadlineExceeded.
	ErrTimeout = errors.New("dataconn: call timed out")
	// ErrServerClosed is returned by Serve after Close.
	ErrServerClosed = errors.New("dataconn: server closed")

	// ErrRemote matches every error reported by the remote side, as opposed
	// to a transport failure.
	ErrRemote = errors.New("dataconn: remote error")
	// Control handlers wrap these so the client can tell them apart.
	ErrUnknownMethod   = errors.New("unknown control method")
	ErrInvalidArgument = errors.New("invalid argument")
	ErrNotFound        = errors.New("not found")
	ErrAlreadyExists   = errors.New("already exists")
	// ErrLimitExceeded: the request would break a limit (snapshot count or size).
	ErrLimitExceeded = errors.New("limit exceeded")
)

// statusSentinels maps codes to the errors they stand for, both ways.
var statusSentinels = []struct {
	status Status
	err    error
}{
	{StatusOutOfRange, blockdev.ErrOutOfRange},
	{StatusUnknownMethod, ErrUnknownMethod},
	{StatusInvalidArgument, ErrInvalidArgument},
	{StatusNotFound, ErrNotFound},
	{StatusAlreadyExists, ErrAlreadyExists},
	{StatusLimitExceeded, ErrLimitExceeded},
}

// statusOf picks the code a handler error travels with.
func statusOf(err error) Status {
	for _, s := range statusSentinels {
		if errors.Is(err, s.err) {
			return s.status
		}
	}
	return StatusError
}

// RemoteError is an error the server reported for one request. It matches
// ErrRemote and, for a known code, the sentinel the code stands for
// (blockdev.ErrOutOfRange, ErrUnknownMethod, ...).
type RemoteError struct {
	Op      Op
	Status  Status
	Message string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("dataconn: remote %s failed: %s", e.Op, e.Message)
}

func (e *RemoteError) Unwrap() []error {
	for _, s := range statusSentinels {
		if s.status == e.Status {
			return []error{ErrRemote, s.err}
		}
	}
	return []error{ErrRemote}
}

// errorMessage is the text sent for a failed request, cut to fit a frame.
func errorMessage(err error) []byte {
	msg := err.Error()
	if msg == "" {
		msg = "unknown error"
	}
	if len(msg) > MaxErrorLen {
		msg = msg[:MaxErrorLen]
	}
	return []byte(msg)
}
