package kit

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/record"
)

// TestFailingKeyIsNeverDropped: a key whose sync fails far more often than
// the old retry limit still converges once the fault clears, without any
// other event enqueueing it again (informers run with resync 0).
func TestFailingKeyIsNeverDropped(t *testing.T) {
	tests := []struct {
		name     string
		failures int32
	}{
		{name: "a passing conflict", failures: 1},
		{name: "beyond the loud-log threshold", failures: loudAfterRetries + 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			saved := retryBackoff
			SetRetryBackoff(RetryBackoff{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond})
			t.Cleanup(func() { retryBackoff = saved })

			c := NewBaseController("test", "node-1", logrus.New(), nil, record.NewFakeRecorder(1))
			var calls atomic.Int32
			done := make(chan struct{})
			c.Sync = func(context.Context, string) error {
				if n := calls.Add(1); n <= tc.failures {
					return errors.New("injected API error")
				}
				close(done)
				return nil
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go c.Run(ctx, 1)
			c.Queue.Add("ns/obj")
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				require.FailNow(t, "the key was dropped", "sync ran %d times", calls.Load())
			}
			assert.Equal(t, tc.failures+1, calls.Load())
			require.Eventually(t, func() bool { return c.Queue.NumRequeues("ns/obj") == 0 }, 5*time.Second, time.Millisecond,
				"success forgets the failures")
		})
	}
}
