package dataplane

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi/impb"
	"github.com/strata-storage/strata/internal/devtools/fsalloc"
)

// dirAllocated is what the files of a replica's directory hold on disk.
func dirAllocated(t *testing.T, dir string) int64 {
	t.Helper()
	n, err := fsalloc.Dir(dir)
	require.NoError(t, err)
	return n
}

// Kill -9 every instance manager between a trim and the delete of the
// snapshot the trim went past: the replicas reopen from disk with their
// discard marks, so the delete and purge still give the space back. qemu-io
// sends NBD TRIM for the first half and WRITE_ZEROES for the second (-u:
// without NO_HOLE, which asks for allocated zeros, like a write).
func TestTrimOutlivesKilledInstanceManagers(t *testing.T) {
	nodes := threeNodes(t)
	ctx := context.Background()
	v := createVolume(t, "trimk", nodes)
	qemuIO(t, v.endpoint, "write -P 0x41 0 32M")
	v.snapshot(t, "s")
	qemuIO(t, v.endpoint, "discard 0 16M", "write -z -u 16M 16M")
	dirs := map[string]string{}
	for i, n := range nodes {
		rname := v.name + "-r" + string(rune('1'+i))
		dirs[rname] = filepath.Join(n.diskDir, rname)
		assert.Greater(t, dirAllocated(t, dirs[rname]), int64(32<<20), "%s holds the snapshot before the delete", rname)
	}

	for _, n := range nodes {
		require.NoError(t, n.proc.Kill(), "kill -9 %s's instance manager", n.name)
	}
	for _, n := range nodes {
		n.start(t)
		list, err := n.client(t).InstanceList(ctx)
		require.NoError(t, err)
		require.Len(t, list, 1, "%s reopens its replica; the engine is gone", n.name)
		assert.Equal(t, impb.InstanceState_INSTANCE_STATE_RUNNING, list[0].State, list[0].Error)
		v.replicas[list[0].Name] = list[0].Address
	}
	v.startEngine(t)

	require.NoError(t, v.im(t).SnapshotRemove(ctx, v.engine, "s"))
	v.purge(t)
	snaps, err := v.im(t).SnapshotList(ctx, v.engine)
	require.NoError(t, err)
	assert.NotContains(t, snaps, "s", "the emptied snapshot left the chain")
	for rname, dir := range dirs {
		n := dirAllocated(t, dir)
		t.Logf("%s: %.2f MiB allocated after the delete", rname, float64(n)/(1<<20))
		assert.Less(t, n, int64(1<<20), "%s gave the trimmed and zeroed 32 MiB back", rname)
	}
	out := qemuIO(t, v.endpoint, "read -P 0 16M 16M")
	assert.NotContains(t, out, "verification failed", "write-zeroes read as zeros")
}
