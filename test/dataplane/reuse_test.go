package dataplane

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

// waitRebuild waits until the replica's rebuild ends and returns its status.
func waitRebuild(t *testing.T, c *engineapi.Client, engine, replica string) *impb.RebuildStatus {
	t.Helper()
	var st *impb.RebuildStatus
	require.Eventually(t, func() bool {
		all, err := c.ReplicaRebuildStatus(context.Background(), engine)
		require.NoError(t, err)
		st = all[replica]
		return st != nil && !st.IsRebuilding
	}, 2*time.Minute, 20*time.Millisecond, "rebuild of %s ends", replica)
	return st
}

// A replica that failed (its instance deleted, its directory kept) and is
// recreated on the same directory is rebuilt by copying only what it
// lacks: snapshots s1 and s2, taken while it was there, are kept unless the
// healthy replicas purged s1 into s2 meanwhile. A new replica, rebuilt
// next for comparison, copies everything. Then the returning replica alone
// must read every write. In the kill case its instance manager is killed
// right after the rebuild starts: the replica reopens, and a second
// rebuild, still keeping what it has, completes it.
func TestReturningReplicaRebuildKeepsItsSnapshots(t *testing.T) {
	cases := []struct {
		name        string
		purge, kill bool
		kept        int32
	}{
		{name: "writes and a snapshot since", kept: 2},
		{name: "s1 purged meanwhile", purge: true, kept: 0},
		{name: "killed during the rebuild", kill: true, kept: 2},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nodes := threeNodes(t)
			v := createVolume(t, "rr"+string(rune('a'+i)), nodes)
			ctx := context.Background()
			c := v.im(t)
			r3 := v.name + "-r3"
			r3dir := filepath.Join(nodes[2].diskDir, r3)

			cmds := []string{"write -P 0x11 0 16M"} // A
			qemuIO(t, v.endpoint, cmds...)
			v.snapshot(t, "s1")
			more := []string{"write -P 0x22 8M 16M", "write -z 30M 1M", "write -P 0x23 31M 7000"} // B
			qemuIO(t, v.endpoint, more...)
			cmds = append(cmds, more...)
			v.snapshot(t, "s2")

			// The replica fails: out of the engine, instance gone, data kept.
			require.NoError(t, c.ReplicaRemove(ctx, v.engine, r3))
			_, err := nodes[2].client(t).InstanceDelete(ctx, r3)
			require.NoError(t, err)
			delete(v.replicas, r3)
			more = []string{"write -P 0x33 40M 2M", "write -P 0x34 5M 100k", "write -z 9M 4096"} // C
			qemuIO(t, v.endpoint, more...)
			cmds = append(cmds, more...)
			v.snapshot(t, "s3")
			if tc.purge {
				require.NoError(t, c.SnapshotRemove(ctx, v.engine, "s1"))
				v.purge(t)
			}
			more = []string{"write -P 0x35 50M 1M"}
			qemuIO(t, v.endpoint, more...)
			cmds = append(cmds, more...)

			// It comes back on the same directory and is rebuilt.
			inst, err := nodes[2].client(t).InstanceCreate(ctx, &impb.InstanceCreateRequest{
				Name: r3, Type: impb.InstanceType_INSTANCE_TYPE_REPLICA, VolumeName: v.name, Size: volSize,
				DataDir: r3dir})
			require.NoError(t, err)
			require.NoError(t, c.ReplicaAdd(ctx, v.engine, r3, inst.Address, true))
			if tc.kill {
				require.NoError(t, nodes[2].proc.Kill())
				st := waitRebuild(t, c, v.engine, r3)
				t.Logf("rebuild at the kill: %s %s", st.State, st.Error)
				nodes[2].start(t)
				require.Eventually(t, func() bool {
					inst, err = nodes[2].client(t).InstanceGet(ctx, r3)
					return err == nil && inst.State == impb.InstanceState_INSTANCE_STATE_RUNNING
				}, time.Minute, 50*time.Millisecond, "the replica reopens after the kill")
				require.NoError(t, c.ReplicaRemove(ctx, v.engine, r3))
				require.NoError(t, c.ReplicaAdd(ctx, v.engine, r3, inst.Address, true))
			}
			st := waitRebuild(t, c, v.engine, r3)
			require.Equal(t, "complete", st.State, st.Error)
			assert.Equal(t, tc.kept, st.KeptLayers, "layers kept")

			// A new replica copies everything.
			r4 := v.name + "-r4"
			fresh, err := nodes[2].client(t).InstanceCreate(ctx, &impb.InstanceCreateRequest{
				Name: r4, Type: impb.InstanceType_INSTANCE_TYPE_REPLICA, VolumeName: v.name, Size: volSize,
				DataDir: filepath.Join(nodes[2].diskDir, r4)})
			require.NoError(t, err)
			require.NoError(t, c.ReplicaAdd(ctx, v.engine, r4, fresh.Address, true))
			full := waitRebuild(t, c, v.engine, r4)
			require.Equal(t, "complete", full.State, full.Error)
			assert.Zero(t, full.KeptLayers)
			t.Logf("returning replica: copied %d bytes in %d layers, kept %d bytes in %d layers; new replica: copied %d bytes in %d layers",
				st.CopiedBytes, st.CopiedLayers, st.KeptBytes, st.KeptLayers, full.CopiedBytes, full.CopiedLayers)
			if tc.kept > 0 {
				assert.Less(t, st.CopiedBytes, full.CopiedBytes/3, "far less copied into the returning replica")
				assert.GreaterOrEqual(t, st.KeptBytes, int64(24<<20), "s1 and s2 kept")
			} else {
				assert.Greater(t, st.CopiedBytes, int64(24<<20), "the coalesced s2 is copied")
			}

			// Through the returning replica alone, every block as expected.
			want := sha256File(t, expected(t, volSize, "want", cmds...))
			assert.Equal(t, want, readVolume(t, v.endpoint))
			chain, err := c.SnapshotList(ctx, v.engine)
			require.NoError(t, err)
			_, err = c.InstanceDelete(ctx, v.engine)
			require.NoError(t, err)
			only := crashEngine(t, nodes[0], v.name+"-only", v.name, map[string]string{r3: inst.Address})
			assert.Equal(t, want, readVolume(t, only), "the returning replica alone holds every write")
			onlyChain, err := c.SnapshotList(ctx, v.name+"-only")
			require.NoError(t, err)
			assert.Equal(t, snapshotsView(chain), snapshotsView(onlyChain), "it has the volume's chain")
		})
	}
}
