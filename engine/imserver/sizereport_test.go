package imserver

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/replicactl"
	"github.com/strata-storage/strata/engineapi/impb"
)

const testInterval = 200 * time.Millisecond

func headSize(i *impb.Instance) int64 { return i.Snapshots[replicactl.HeadName].GetSize() }

// Writes grow the head's allocated size; the reporter publishes it at most
// once per interval, and an idle engine costs no read and no event.
func TestSizeReportIsRateLimited(t *testing.T) {
	im := newTestIM(t, Options{SizeReportInterval: testInterval})
	ctx := context.Background()
	rep := im.createReplica(t, "r", 16*mib)
	inst, err := im.c.InstanceCreate(ctx, engineReq("e", 16*mib, map[string]string{"r": rep.Address}))
	require.NoError(t, err)
	before := headSize(inst)
	w := im.watch(t)
	eng := im.engine(t, "e")

	// Idle: nothing read, nothing sent.
	assert.Empty(t, w.collect(5*testInterval), "no event for an idle engine")
	assert.Zero(t, im.s.sizeReads.Load(), "no chain read for an idle engine")

	// 128 writes of 64 KiB: far more writes than intervals.
	start := time.Now()
	for i := range 128 {
		_, err := eng.WriteAt(pattern(byte(i)|1, 64<<10), int64(i)*64<<10)
		require.NoError(t, err)
	}
	require.NoError(t, eng.Flush())
	wrote := time.Now()
	var got *impb.Instance
	events := 0
	timeout := time.After(25 * testInterval)
	for got == nil {
		select {
		case ev := <-w.events:
			events++
			if headSize(ev.Instance) >= before+8*mib {
				got = ev.Instance
			}
		case <-timeout:
			t.Fatalf("no Watch event with the head's new size")
		}
	}
	assert.Less(t, time.Since(wrote), 10*testInterval, "published within a few intervals")
	assert.EqualValues(t, 16*mib, got.Size)
	events += len(w.collect(5 * testInterval))
	// At most one event per tick during the burst, plus the one after it:
	// normally the burst fits in one interval and this is 1 or 2.
	ticks := int(wrote.Sub(start) / testInterval)
	assert.LessOrEqual(t, events, ticks+2, "one event per interval, not one per write")
	t.Logf("%d events for a burst of %v", events, wrote.Sub(start))

	reads := im.s.sizeReads.Load()
	assert.Empty(t, w.collect(5*testInterval), "idle again: no event")
	assert.Equal(t, reads, im.s.sizeReads.Load(), "idle again: no chain read")

	cur, err := im.c.InstanceGet(ctx, "e")
	require.NoError(t, err)
	assert.GreaterOrEqual(t, headSize(cur), before+8*mib, "InstanceGet reports the size too")
}

// After SnapshotPurge, watchers see the purge end and the chain it leaves
// without polling SnapshotPurgeStatus.
func TestSizeReportFollowsPurge(t *testing.T) {
	im := newTestIM(t, Options{SizeReportInterval: testInterval})
	ctx := context.Background()
	rep := im.createReplica(t, "r", 4*mib)
	_, err := im.c.InstanceCreate(ctx, engineReq("e", 4*mib, map[string]string{"r": rep.Address}))
	require.NoError(t, err)
	eng := im.engine(t, "e")
	for i, name := range []string{"s1", "s2"} {
		_, err = eng.WriteAt(pattern(byte(i+1), mib), int64(i)*mib)
		require.NoError(t, err)
		_, err = im.c.SnapshotCreate(ctx, "e", name, true, nil)
		require.NoError(t, err)
	}
	require.NoError(t, im.c.SnapshotRemove(ctx, "e", "s1"))
	w := im.watch(t)
	require.NoError(t, im.c.SnapshotPurge(ctx, "e"))
	got := w.until(t, "e", "the purge complete and s1 gone", 50*testInterval, func(i *impb.Instance) bool {
		st := i.PurgeStatus["r"]
		_, s1 := i.Snapshots["s1"]
		return st != nil && !st.IsPurging && st.State == "complete" && !s1
	})
	assert.GreaterOrEqual(t, got.Snapshots["s2"].GetSize(), int64(2*mib), "s2 took s1's data")
	reads := im.s.sizeReads.Load()
	time.Sleep(5 * testInterval)
	assert.Equal(t, reads, im.s.sizeReads.Load(), "a finished purge is no longer followed")
}

// Replica instances: an engine's VolumeExpand grows them without an
// operation on them, and the reporter tells their watchers; after a
// restart, reopened replicas are not re-sent as news.
func TestSizeReportReplicas(t *testing.T) {
	im := newTestIM(t, Options{SizeReportInterval: testInterval})
	ctx := context.Background()
	rep := im.createReplica(t, "r", 4*mib)
	im.stop(t)
	im.start(t)
	w := im.watch(t)
	assert.Empty(t, w.collect(5*testInterval), "no event for reopened, unchanged replicas")

	rep, err := im.c.InstanceGet(ctx, "r")
	require.NoError(t, err)
	_, err = im.c.InstanceCreate(ctx, engineReq("e", 4*mib, map[string]string{"r": rep.Address}))
	require.NoError(t, err)
	require.NoError(t, im.c.VolumeExpand(ctx, "e", 8*mib))
	w.until(t, "r", "the replica's new size", 20*testInterval, func(i *impb.Instance) bool { return i.Size == 8*mib })
}
