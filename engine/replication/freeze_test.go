package replication

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// seqWriter writes 1, 2, 3, ... to engine a, then each to b once a
// acknowledged it: b is never ahead of a, at most one behind.
func seqWriter(t *testing.T, a, b *Engine) (stop func()) {
	var done atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p := make([]byte, 4096)
		for n := 1; !done.Load(); n++ {
			p[0], p[1] = byte(n), byte(n>>8)
			_, err := a.WriteAt(p, 0)
			assert.NoError(t, err)
			_, err = b.WriteAt(p, 0)
			assert.NoError(t, err)
		}
	}()
	return func() { done.Store(true); wg.Wait() }
}

// taken is how many writes replica 0 of e had completed at snapshot name.
func taken(t *testing.T, reps []*memReplica, name string) int64 {
	reps[0].mu.Lock()
	defer reps[0].mu.Unlock()
	n, ok := reps[0].snapshots[name]
	require.True(t, ok, "snapshot %s taken", name)
	return n
}

// TestGroupCutIsConsistent: snapshots of two engines taken in one cut never
// show b ahead of a; taken one after the other, they do (so the check can
// fail).
func TestGroupCutIsConsistent(t *testing.T) {
	ctx := context.Background()
	a, aReps, _ := newTestEngine(t, ModeRW, ModeRW)
	b, bReps, _ := newTestEngine(t, ModeRW)
	stop := seqWriter(t, a, b)
	defer stop()
	const rounds = 50
	violations := 0
	for i := range rounds {
		cut := fmt.Sprintf("cut-%d", i)
		require.NoError(t, a.Freeze(ctx, cut, 10*time.Second))
		require.NoError(t, b.Freeze(ctx, cut, 10*time.Second))
		require.NoError(t, a.SnapshotInCut(ctx, cut, cut, SnapshotOptions{}))
		require.NoError(t, b.SnapshotInCut(ctx, cut, cut, SnapshotOptions{}))
		require.True(t, a.Thaw(cut))
		require.True(t, b.Thaw(cut))
		na, nb := taken(t, aReps, cut), taken(t, bReps, cut)
		require.Contains(t, []int64{nb, nb + 1}, na, "cut %d: a at %d, b at %d", i, na, nb)

		plain := fmt.Sprintf("plain-%d", i)
		require.NoError(t, a.Snapshot(ctx, plain, SnapshotOptions{}))
		time.Sleep(time.Millisecond) // the writer goes on between the two
		require.NoError(t, b.Snapshot(ctx, plain, SnapshotOptions{}))
		if taken(t, bReps, plain) > taken(t, aReps, plain) {
			violations++
		}
	}
	t.Logf("%d cuts consistent; one snapshot after the other: b ahead of a in %d of %d", rounds, violations, rounds)
	assert.Positive(t, violations, "snapshots taken one after the other must show b ahead at least once")
}

func TestFreeze(t *testing.T) {
	ctx := context.Background()
	t.Run("the same cut again is a no-op, another cut is refused", func(t *testing.T) {
		e, _, _ := newTestEngine(t, ModeRW)
		require.NoError(t, e.Freeze(ctx, "c1", time.Minute))
		require.NoError(t, e.Freeze(ctx, "c1", time.Minute))
		require.ErrorIs(t, e.Freeze(ctx, "c2", time.Minute), ErrBusy)
		require.ErrorIs(t, e.SnapshotInCut(ctx, "c2", "s", SnapshotOptions{}), ErrFreezeLost)
		require.ErrorIs(t, e.Snapshot(ctx, "s", SnapshotOptions{}), ErrBusy, "refused at once, not waiting out the freeze")
		assert.False(t, e.Thaw("c2"), "another cut's thaw ends nothing")
		assert.True(t, e.Thaw("c1"))
		assert.False(t, e.Thaw("c1"), "thaw is idempotent")
		require.NoError(t, e.Freeze(ctx, "c2", time.Minute), "free again")
		e.ThawAny()
		_, err := e.WriteAt(make([]byte, 512), 0)
		require.NoError(t, err, "I/O runs after ThawAny")
	})
	t.Run("bad arguments", func(t *testing.T) {
		e, _, _ := newTestEngine(t, ModeRW)
		assert.ErrorContains(t, e.Freeze(ctx, "", time.Second), "cut: required")
		assert.ErrorContains(t, e.Freeze(ctx, "c", 0), "timeout 0s")
		assert.ErrorContains(t, e.Freeze(ctx, "c", 2*MaxFreeze), "at most")
	})
	t.Run("a freeze ends on its own; a snapshot after it is refused", func(t *testing.T) {
		e, reps, _ := newTestEngine(t, ModeRW)
		// Taken before the freeze's timer starts, so a write that waited
		// for it cannot have taken less than its timeout (after Freeze,
		// the timer had already run for a moment: 98.6 ms in one run).
		start := time.Now()
		require.NoError(t, e.Freeze(ctx, "c", 100*time.Millisecond))
		_, err := e.WriteAt(make([]byte, 512), 0) // waits for the thaw
		require.NoError(t, err)
		assert.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "the write waited for the freeze")
		require.ErrorIs(t, e.SnapshotInCut(ctx, "c", "s", SnapshotOptions{}), ErrFreezeLost)
		assert.Empty(t, reps[0].snapshots, "nothing taken")
	})
	t.Run("writes wait for the thaw, in-flight ones are drained first", func(t *testing.T) {
		e, reps, _ := newTestEngine(t, ModeRW)
		require.NoError(t, e.Freeze(ctx, "c", time.Minute))
		before := reps[0].writes.Load()
		wrote := make(chan error)
		go func() {
			_, err := e.WriteAt(make([]byte, 512), 0)
			wrote <- err
		}()
		require.NoError(t, e.SnapshotInCut(ctx, "c", "s", SnapshotOptions{}))
		assert.Equal(t, before, taken(t, reps, "s"), "the snapshot holds no write issued during the freeze")
		require.True(t, e.Thaw("c"))
		require.NoError(t, <-wrote)
		assert.Equal(t, before+1, reps[0].writes.Load())
	})
}
