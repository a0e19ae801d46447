package imserver

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/replicactl"
	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi/impb"
)

const testInterval = 200 * time.Millisecond

func headSize(i *impb.Instance) int64 { return i.Snapshots[replicactl.HeadName].GetSize() }

// reportClock counts the size reporter's rounds as events instead of
// waiting for a wall clock: each tick writes a fresh block to an engine of
// its own, and the round after the write publishes the grown head. Once n
// ticks are seen, n rounds have run, so what must not happen in a round (an
// event or a chain read for an idle engine) is checked against them.
type reportClock struct {
	eng    *replication.Engine
	blocks int
	size   int64
}

const clockBlock = 64 << 10

// newReportClock creates the clock's replica and engine; call it before
// watching, so that their creation is not among the events.
func newReportClock(t *testing.T, im *testIM) *reportClock {
	t.Helper()
	rep := im.createReplica(t, "clock-r", 4*mib)
	inst, err := im.c.InstanceCreate(context.Background(), engineReq("clock", 4*mib, map[string]string{"clock-r": rep.Address}))
	require.NoError(t, err)
	return &reportClock{eng: im.engine(t, "clock"), size: headSize(inst)}
}

// ticks waits for n reporter rounds and returns every event of another
// instance seen meanwhile. Each costs exactly one chain read, the clock's.
func (c *reportClock) ticks(t *testing.T, w *watcher, n int) []*impb.WatchEvent {
	t.Helper()
	var others []*impb.WatchEvent
	for range n {
		_, err := c.eng.WriteAt(pattern(0x5a, clockBlock), int64(c.blocks)*clockBlock)
		require.NoError(t, err)
		c.blocks++
		for ticked := false; !ticked; {
			select {
			case ev := <-w.events:
				if ev.Instance.GetName() != "clock" {
					others = append(others, ev)
				} else if size := headSize(ev.Instance); size > c.size {
					c.size, ticked = size, true
				}
			case err := <-w.errc:
				t.Fatalf("watch ended: %v", err)
			case <-time.After(time.Minute): // a hang guard, not a bound
				t.Fatalf("no reporter round published the clock's write")
			}
		}
	}
	return others
}

func namesOf(evs []*impb.WatchEvent) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Instance.GetName())
	}
	return out
}

// Writes grow the head's allocated size; the reporter publishes it soon
// after a burst ends and rarely during one, and an idle engine costs no
// read and no event.
func TestSizeReportIsRateLimited(t *testing.T) {
	im := newTestIM(t, Options{SizeReportInterval: testInterval})
	ctx := context.Background()
	rep := im.createReplica(t, "r", 16*mib)
	inst, err := im.c.InstanceCreate(ctx, engineReq("e", 16*mib, map[string]string{"r": rep.Address}))
	require.NoError(t, err)
	before := headSize(inst)
	clock := newReportClock(t, im)
	w := im.watch(t)
	eng := im.engine(t, "e")

	// Idle: nothing read, nothing sent, over three reporter rounds.
	assert.Empty(t, namesOf(clock.ticks(t, w, 3)), "no event for an idle engine")
	assert.EqualValues(t, 3, im.s.sizeReads.Load(), "no chain read for an idle engine: the clock's three only")

	// 128 writes of 64 KiB: far more writes than intervals.
	start := time.Now()
	for i := range 128 {
		_, err := eng.WriteAt(pattern(byte(i)|1, 64<<10), int64(i)*64<<10)
		require.NoError(t, err)
	}
	require.NoError(t, eng.Flush())
	wrote := time.Now()
	// The burst has ended: the head's new size is published within two
	// of the clock's ticks (each at least two rounds: the round after the
	// clock's write skips it as busy, the next reads it), not after a
	// busy volume's longer wait.
	var got *impb.Instance
	events := 0
	for _, ev := range clock.ticks(t, w, 2) {
		if ev.Instance.GetName() != "e" {
			continue
		}
		events++
		if headSize(ev.Instance) >= before+8*mib {
			got = ev.Instance
		}
	}
	require.NotNil(t, got, "the head's new size within two clock ticks of the burst's end")
	assert.EqualValues(t, 16*mib, got.Size)
	// A few more rounds: the last of the burst's events has been sent.
	events += len(clock.ticks(t, w, 3))
	// At most one event per busyRoundsPerRead ticks during the burst, plus
	// the one after it: normally the burst fits in one interval and this is
	// 1 or 2. (Ticks are counted from the elapsed time: a loaded machine
	// only loosens it.)
	ticks := int(wrote.Sub(start) / testInterval)
	assert.LessOrEqual(t, events, ticks/busyRoundsPerRead+2, "one event per busy period, not one per write")
	t.Logf("%d events for a burst of %v", events, wrote.Sub(start))

	reads := im.s.sizeReads.Load()
	assert.Empty(t, namesOf(clock.ticks(t, w, 3)), "idle again: no event")
	assert.Equal(t, reads+3, im.s.sizeReads.Load(), "idle again: no chain read but the clock's")

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
		_, err = im.c.SnapshotCreate(ctx, "e", name, true, nil, 0)
		require.NoError(t, err)
	}
	require.NoError(t, im.c.SnapshotRemove(ctx, "e", "s1"))
	clock := newReportClock(t, im)
	w := im.watch(t)
	require.NoError(t, im.c.SnapshotPurge(ctx, "e"))
	got := w.until(t, "e", "the purge complete and s1 gone", 50*testInterval, func(i *impb.Instance) bool {
		st := i.PurgeStatus["r"]
		_, s1 := i.Snapshots["s1"]
		return st != nil && !st.IsPurging && st.State == "complete" && !s1
	})
	assert.GreaterOrEqual(t, got.Snapshots["s2"].GetSize(), int64(2*mib), "s2 took s1's data")
	reads := im.s.sizeReads.Load()
	clock.ticks(t, w, 3)
	assert.Equal(t, reads+3, im.s.sizeReads.Load(), "a finished purge is no longer followed: the clock's reads only")
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
	clock := newReportClock(t, im)
	w := im.watch(t)
	for _, ev := range clock.ticks(t, w, 3) {
		assert.NotEqual(t, "r", ev.Instance.GetName(), "no event for reopened, unchanged replicas")
	}

	rep, err := im.c.InstanceGet(ctx, "r")
	require.NoError(t, err)
	_, err = im.c.InstanceCreate(ctx, engineReq("e", 4*mib, map[string]string{"r": rep.Address}))
	require.NoError(t, err)
	require.NoError(t, im.c.VolumeExpand(ctx, "e", 8*mib))
	w.until(t, "r", "the replica's new size", 20*testInterval, func(i *impb.Instance) bool { return i.Size == 8*mib })
}
