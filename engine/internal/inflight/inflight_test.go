package inflight

import (
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// parkedInAcquire tells whether a goroutine waits on the condition inside
// Limiter.Acquire.
func parkedInAcquire() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "sync.(*Cond).Wait") && strings.Contains(g, "inflight.(*Limiter).Acquire") {
			return true
		}
	}
	return false
}

func TestLimiterBoundsOpsAndBytes(t *testing.T) {
	tests := []struct {
		name        string
		maxOps      int
		maxBytes    int64
		held        []int64
		next        int64
		wantBlocked bool
	}{
		{"room for another", 2, 100, []int64{10}, 10, false},
		{"op limit", 1, 100, []int64{10}, 1, true},
		{"byte limit", 10, 100, []int64{60}, 50, true},
		{"oversized waits for the bytes", 10, 100, []int64{1}, 500, true},
		{"oversized alone runs", 10, 100, nil, 500, false},
		{"zero-byte request beside bytes", 10, 100, []int64{100}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := New(tc.maxOps, tc.maxBytes)
			for _, h := range tc.held {
				l.Acquire(h)
			}
			var got atomic.Bool
			go func() { l.Acquire(tc.next); got.Store(true) }()
			if tc.wantBlocked {
				// Parked in Acquire's wait, the waiter can only be woken by
				// a Release: seeing it there proves it blocked, no sleep
				// needed. Admitted by mistake, it never parks.
				require.Eventually(t, func() bool { return got.Load() || parkedInAcquire() },
					time.Minute, time.Millisecond)
				require.False(t, got.Load(), "admitted while the limiter was full")
			} else {
				require.Eventually(t, got.Load, time.Minute, time.Millisecond, "admitted at once")
			}
			for _, h := range tc.held {
				l.Release(h)
			}
			assert.Eventually(t, got.Load, time.Minute, time.Millisecond, "released capacity admits the waiter")
		})
	}
}
