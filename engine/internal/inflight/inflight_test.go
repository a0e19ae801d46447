package inflight

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

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
			time.Sleep(30 * time.Millisecond)
			assert.Equal(t, !tc.wantBlocked, got.Load())
			for _, h := range tc.held {
				l.Release(h)
			}
			assert.Eventually(t, got.Load, time.Second, time.Millisecond, "released capacity admits the waiter")
		})
	}
}
