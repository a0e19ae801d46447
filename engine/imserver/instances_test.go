package imserver

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

// Offline expansion: a stopped replica recreated at a larger size grows
// before it serves; the data stays and the new space reads zeros. A replica
// larger than asked for is refused, naming both sizes.
func TestReplicaCreateExpandsOffline(t *testing.T) {
	im := newTestIM(t, Options{})
	ctx := context.Background()
	rep := im.createReplica(t, "r", 4*mib)
	_, err := im.c.InstanceCreate(ctx, engineReq("e", 4*mib, map[string]string{"r": rep.Address}))
	require.NoError(t, err)
	eng := im.engine(t, "e")
	_, err = eng.WriteAt(pattern(0x5a, mib), 3*mib)
	require.NoError(t, err)
	require.NoError(t, eng.Flush())
	for _, name := range []string{"e", "r"} {
		_, err = im.c.InstanceDelete(ctx, name)
		require.NoError(t, err)
	}

	rep, err = im.c.InstanceCreate(ctx, replicaReq("r", im.replicaDir("r"), 8*mib))
	require.NoError(t, err)
	assert.EqualValues(t, 8*mib, rep.Size)
	inst, err := im.c.InstanceCreate(ctx, engineReq("e", 8*mib, map[string]string{"r": rep.Address}))
	require.NoError(t, err)
	assert.EqualValues(t, 8*mib, inst.Size)
	assert.Equal(t, impb.ReplicaMode_REPLICA_MODE_RW, inst.ReplicaModes["r"], "the engine takes the expanded replica")
	eng = im.engine(t, "e")
	assert.Equal(t, pattern(0x5a, mib), readAt(t, eng, 3*mib, mib), "data written before expansion")
	assert.Equal(t, pattern(0, 4*mib), readAt(t, eng, 4*mib, 4*mib), "the new space reads zeros")

	for _, name := range []string{"e", "r"} {
		_, err = im.c.InstanceDelete(ctx, name)
		require.NoError(t, err)
	}
	_, err = im.c.InstanceCreate(ctx, replicaReq("r", im.replicaDir("r"), 4*mib))
	require.ErrorIs(t, err, engineapi.ErrInvalid, "volumes do not shrink")
	assert.Contains(t, err.Error(), "8388608")
	assert.Contains(t, err.Error(), "4194304")
}

// An engine's VolumeExpand grows its replicas behind their instances'
// recorded specs: a restarted instance manager must still reopen them, and
// a manager retrying the create at either size gets the instance back.
func TestExpandedReplicaReopensAfterRestart(t *testing.T) {
	im := newTestIM(t, Options{})
	ctx := context.Background()
	rep := im.createReplica(t, "r", 4*mib)
	_, err := im.c.InstanceCreate(ctx, engineReq("e", 4*mib, map[string]string{"r": rep.Address}))
	require.NoError(t, err)
	require.NoError(t, im.c.VolumeExpand(ctx, "e", 8*mib))
	got, err := im.c.InstanceGet(ctx, "r")
	require.NoError(t, err)
	assert.EqualValues(t, 8*mib, got.Size, "the replica instance reports its real size")
	for _, size := range []int64{4 * mib, 8 * mib} {
		_, err = im.c.InstanceCreate(ctx, replicaReq("r", im.replicaDir("r"), size))
		assert.NoError(t, err, "retrying the create at %d", size)
	}

	im.stop(t)
	im.start(t)
	got, err = im.c.InstanceGet(ctx, "r")
	require.NoError(t, err)
	assert.Equal(t, impb.InstanceState_INSTANCE_STATE_RUNNING, got.State, got.Error)
	assert.EqualValues(t, 8*mib, got.Size)
}

// An engine starts when at least one replica connects; the others are in
// ERR. With none it fails, naming every replica's failure.
func TestEngineStartsWithUnreachableReplicas(t *testing.T) {
	im := newTestIM(t, Options{})
	ctx := context.Background()
	addrs := map[string]string{}
	for _, name := range []string{"r1", "r2", "r3"} {
		addrs[name] = im.createReplica(t, name, 4*mib).Address
	}
	rw, errMode := impb.ReplicaMode_REPLICA_MODE_RW, impb.ReplicaMode_REPLICA_MODE_ERR
	tests := []struct {
		name        string
		unreachable []string
		wantModes   map[string]impb.ReplicaMode // nil: the create fails
	}{
		{"all reachable", nil, map[string]impb.ReplicaMode{"r1": rw, "r2": rw, "r3": rw}},
		{"one unreachable", []string{"r2"}, map[string]impb.ReplicaMode{"r1": rw, "r2": errMode, "r3": rw}},
		{"two unreachable", []string{"r1", "r3"}, map[string]impb.ReplicaMode{"r1": errMode, "r2": rw, "r3": errMode}},
		{"none reachable", []string{"r1", "r2", "r3"}, nil},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			replicas := map[string]string{}
			for name, addr := range addrs {
				replicas[name] = addr
			}
			for _, name := range tt.unreachable {
				replicas[name] = unusedAddress(t)
			}
			engine := "e" + string(rune('0'+i))
			inst, err := im.c.InstanceCreate(ctx, engineReq(engine, 4*mib, replicas))
			if tt.wantModes == nil {
				require.Error(t, err)
				for _, name := range tt.unreachable {
					assert.Contains(t, err.Error(), "replica "+name+" at "+replicas[name])
				}
				_, err = im.c.InstanceGet(ctx, engine)
				assert.ErrorIs(t, err, engineapi.ErrNotFound, "a failed engine is not left behind")
				return
			}
			require.NoError(t, err)
			defer im.c.InstanceDelete(ctx, engine)
			assert.Equal(t, impb.InstanceState_INSTANCE_STATE_RUNNING, inst.State)
			assert.Equal(t, tt.wantModes, inst.ReplicaModes)
			for _, name := range tt.unreachable {
				assert.Contains(t, inst.Error, "replica "+name)
			}
			// The volume serves with the replicas it has.
			eng := im.engine(t, engine)
			_, err = eng.WriteAt(pattern(7, 4096), 0)
			require.NoError(t, err)
			assert.Equal(t, pattern(7, 4096), readAt(t, eng, 0, 4096))
			// An ERR replica is removed like any other, to be replaced.
			for _, name := range tt.unreachable {
				require.NoError(t, im.c.ReplicaRemove(ctx, engine, name))
			}
		})
	}
}

// A replica the engine marks ERR reaches watchers without polling.
func TestWatchPublishesReplicaERR(t *testing.T) {
	im := newTestIM(t, Options{})
	ctx := context.Background()
	r1, r2 := im.createReplica(t, "r1", 4*mib), im.createReplica(t, "r2", 4*mib)
	_, err := im.c.InstanceCreate(ctx, engineReq("e", 4*mib, map[string]string{"r1": r1.Address, "r2": r2.Address}))
	require.NoError(t, err)
	w := im.watch(t)

	_, err = im.c.InstanceDelete(ctx, "r2") // closes the engine's connection to it
	require.NoError(t, err)
	_, err = im.engine(t, "e").WriteAt(pattern(1, 4096), 0) // the write finds r2 gone
	require.NoError(t, err)
	got := w.until(t, "e", "r2 in ERR", 10*time.Second, func(i *impb.Instance) bool {
		return i.ReplicaModes["r2"] == impb.ReplicaMode_REPLICA_MODE_ERR
	})
	assert.Equal(t, impb.ReplicaMode_REPLICA_MODE_RW, got.ReplicaModes["r1"])
}

// Live migration: a second engine, on another instance manager, attaches
// to the replicas of a running engine; it reads what the first wrote and
// keeps working once the first is deleted.
func TestTwoEnginesShareReplicas(t *testing.T) {
	src, dst := newTestIM(t, Options{}), newTestIM(t, Options{})
	ctx := context.Background()
	replicas := map[string]string{}
	for _, name := range []string{"r1", "r2"} {
		replicas[name] = src.createReplica(t, name, 4*mib).Address
	}
	a, err := src.c.InstanceCreate(ctx, engineReq("vol-e-a", 4*mib, replicas))
	require.NoError(t, err)
	b, err := dst.c.InstanceCreate(ctx, engineReq("vol-e-b", 4*mib, replicas))
	require.NoError(t, err)
	for _, inst := range []*impb.Instance{a, b} {
		for name, mode := range inst.ReplicaModes {
			require.Equal(t, impb.ReplicaMode_REPLICA_MODE_RW, mode, "%s: replica %s", inst.Name, name)
		}
	}

	engA, engB := src.engine(t, "vol-e-a"), dst.engine(t, "vol-e-b")
	_, err = engA.WriteAt(pattern(0xa1, 64<<10), mib)
	require.NoError(t, err)
	require.NoError(t, engA.Flush())
	for i := 0; i < 4; i++ { // reads go round robin: both replicas have it
		assert.Equal(t, pattern(0xa1, 64<<10), readAt(t, engB, mib, 64<<10), "B reads what A wrote")
	}

	_, err = src.c.InstanceDelete(ctx, "vol-e-a")
	require.NoError(t, err)
	_, err = engB.WriteAt(pattern(0xb2, 64<<10), 2*mib)
	require.NoError(t, err)
	require.NoError(t, engB.Flush())
	assert.Equal(t, pattern(0xb2, 64<<10), readAt(t, engB, 2*mib, 64<<10))
	assert.Equal(t, pattern(0xa1, 64<<10), readAt(t, engB, mib, 64<<10))
	inst, err := dst.c.InstanceGet(ctx, "vol-e-b")
	require.NoError(t, err)
	for name, mode := range inst.ReplicaModes {
		assert.Equal(t, impb.ReplicaMode_REPLICA_MODE_RW, mode, "replica %s after A is gone", name)
	}
}

// On one instance manager the NBD export is named after the volume, so two
// engines of a volume cannot both serve it: the second waits for the first.
func TestOneFrontendPerVolumePerInstanceManager(t *testing.T) {
	im := newTestIM(t, Options{})
	ctx := context.Background()
	addr := im.createReplica(t, "r", 4*mib).Address
	reqA := engineReq("a", 4*mib, map[string]string{"r": addr})
	reqA.Frontend = "nbd"
	_, err := im.c.InstanceCreate(ctx, reqA)
	require.NoError(t, err)

	reqB := engineReq("b", 4*mib, map[string]string{"r": addr})
	reqB.Frontend = "nbd"
	_, err = im.c.InstanceCreate(ctx, reqB)
	require.ErrorIs(t, err, engineapi.ErrBusy)
	assert.True(t, strings.Contains(err.Error(), "engine a"), err.Error())

	_, err = im.c.InstanceCreate(ctx, engineReq("b", 4*mib, map[string]string{"r": addr}))
	require.NoError(t, err, "without a frontend it may start")
	_, err = im.c.FrontendStart(ctx, "b", "nbd")
	require.ErrorIs(t, err, engineapi.ErrBusy)
	_, err = im.c.FrontendStop(ctx, "a")
	require.NoError(t, err)
	inst, err := im.c.FrontendStart(ctx, "b", "nbd")
	require.NoError(t, err)
	assert.Equal(t, "nbd+unix:///vol?socket=/run/strata/nbd.sock", inst.FrontendEndpoint)
}

// A replica is never made afresh where its data or its disk should be: on
// reopen (the data is gone) or under a disk root that is not there (an
// unmounted or moved disk).
func TestCheckCanCreate(t *testing.T) {
	base := t.TempDir()
	tests := []struct {
		name    string
		dataDir string
		reopen  bool
		wantErr string
	}{
		{"new replica on a present disk", filepath.Join(base, "replicas", "r1"), false, ""},
		{"reopen of vanished data", filepath.Join(base, "replicas", "r1"), true, "is gone"},
		{"disk root missing", filepath.Join(base, "gone-disk", "replicas", "r1"), false, "is not there"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkCanCreate(tc.dataDir, tc.reopen)
			if tc.wantErr == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, tc.wantErr)
			}
		})
	}
}
