package dataplane

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi/impb"
)

// watchUntil reads Watch events until cond holds for the engine's instance.
func watchUntil(t *testing.T, next func() (*impb.WatchEvent, error), engine string, what string, cond func(*impb.Instance) bool) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		for {
			ev, err := next()
			if err != nil {
				done <- err
				return
			}
			if ev.Instance.GetName() == engine && cond(ev.Instance) {
				done <- nil
				return
			}
		}
	}()
	select {
	case err := <-done:
		require.NoError(t, err, what)
	case <-time.After(30 * time.Second):
		t.Fatalf("no Watch event with %s", what)
	}
}

// Watch starts with the current state and then reports snapshot and
// replica changes as they happen, so managers never poll.
func TestWatchReportsChanges(t *testing.T) {
	nodes := threeNodes(t)
	v := createVolume(t, "watched", nodes)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	next, err := v.im(t).Watch(ctx)
	require.NoError(t, err)

	watchUntil(t, next, v.engine, "the engine's current state first", func(i *impb.Instance) bool {
		return i.State == impb.InstanceState_INSTANCE_STATE_RUNNING && i.FrontendEndpoint != ""
	})

	v.snapshot(t, "w1")
	watchUntil(t, next, v.engine, "snapshot w1 in the chain", func(i *impb.Instance) bool {
		s, ok := i.Snapshots["w1"]
		return ok && s.UserCreated && i.Snapshots["volume-head"].GetParent() == "w1"
	})

	require.NoError(t, nodes[2].proc.Kill())
	qemuIO(t, v.endpoint, "write -P 0x5 0 1M") // the next write finds the replica gone
	watchUntil(t, next, v.engine, "the killed node's replica in ERR", func(i *impb.Instance) bool {
		return i.ReplicaModes["watched-r3"] == impb.ReplicaMode_REPLICA_MODE_ERR &&
			i.ReplicaModes["watched-r1"] == impb.ReplicaMode_REPLICA_MODE_RW
	})
}

// Sizes grow with writes and reach watchers: the size reporter publishes
// the grown head without anyone asking (how soon is the size reporter's
// unit tests' business, not a wall-clock bound on a shared machine).
func TestWatchReportsGrowingSizes(t *testing.T) {
	v := createVolume(t, "sized", threeNodes(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inst, err := v.im(t).InstanceGet(ctx, v.engine)
	require.NoError(t, err)
	before := inst.Snapshots["volume-head"].GetSize()
	next, err := v.im(t).Watch(ctx)
	require.NoError(t, err)

	qemuIO(t, v.endpoint, "write -P 0x7 0 16M", "flush")
	start := time.Now()
	watchUntil(t, next, v.engine, "the head grown by 16 MiB", func(i *impb.Instance) bool {
		return i.Snapshots["volume-head"].GetSize() >= before+16<<20
	})
	t.Logf("published %s after the write (report interval %s)", time.Since(start).Round(time.Millisecond), sizeReportInterval)
}
