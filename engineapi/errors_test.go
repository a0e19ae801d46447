package engineapi

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestErrorsSurviveTheWire(t *testing.T) {
	tests := []struct {
		name     string
		server   error
		wantCode codes.Code
		wantIs   error
	}{
		{"not found", fmt.Errorf("engine e1: %w", ErrNotFound), codes.NotFound, ErrNotFound},
		{"exists", fmt.Errorf("replica r1: %w", ErrAlreadyExists), codes.AlreadyExists, ErrAlreadyExists},
		{"limit", fmt.Errorf("250 snapshots: %w", ErrLimitExceeded), codes.ResourceExhausted, ErrLimitExceeded},
		{"busy", fmt.Errorf("purge running: %w", ErrBusy), codes.Aborted, ErrBusy},
		{"invalid", fmt.Errorf("size -1: %w", ErrInvalid), codes.InvalidArgument, ErrInvalid},
		{"deadline", context.DeadlineExceeded, codes.DeadlineExceeded, context.DeadlineExceeded},
		{"anything else", errors.New("disk on fire"), codes.Internal, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := ToStatus(tc.server)
			assert.Equal(t, tc.wantCode, status.Code(st))
			got := FromStatus(st)
			assert.Equal(t, tc.server.Error(), got.Error(), "the message travels unchanged")
			if tc.wantIs != nil {
				assert.ErrorIs(t, got, tc.wantIs)
			}
			for _, other := range []error{ErrNotFound, ErrAlreadyExists, ErrLimitExceeded, ErrBusy} {
				if other != tc.wantIs {
					assert.NotErrorIs(t, got, other)
				}
			}
		})
	}
	assert.NoError(t, ToStatus(nil))
	assert.NoError(t, FromStatus(nil))
}
