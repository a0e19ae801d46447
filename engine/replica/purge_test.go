package replica

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPurgeCases(t *testing.T) {
	type want struct {
		parent  string
		removed bool
	}
	tests := []struct {
		name    string
		build   func(t *testing.T, r *Replica)
		chain   map[string]want // after purge, without the head
		reverts map[string][]byte
	}{
		{"coalesce, removed one smaller", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 1, 1) // R: block 0
			require.NoError(t, r.Snapshot("r", SnapshotOptions{}))
			fillBlocks(t, r, 1, 4, 2) // C: blocks 1-4
			require.NoError(t, r.Snapshot("c", SnapshotOptions{}))
			require.NoError(t, r.RemoveSnapshot("r"))
		}, map[string]want{"c": {}}, map[string][]byte{"c": {1, 2, 2, 2, 2, 0, 0, 0}}},
		{"coalesce, child smaller, child wins", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 6, 1) // R: blocks 0-5
			require.NoError(t, r.Snapshot("r", SnapshotOptions{}))
			fillBlocks(t, r, 2, 1, 2) // C: block 2
			require.NoError(t, r.Snapshot("c", SnapshotOptions{Labels: map[string]string{"k": "v"}}))
			fillBlocks(t, r, 3, 1, 3)
			require.NoError(t, r.RemoveSnapshot("r"))
		}, map[string]want{"c": {}}, map[string][]byte{"c": {1, 1, 2, 1, 1, 1, 0, 0}}},
		{"prune", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 8, 1)
			require.NoError(t, r.Snapshot("r", SnapshotOptions{}))
			fillBlocks(t, r, 0, 4, 2) // head overwrites half of r
			require.NoError(t, r.RemoveSnapshot("r"))
		}, map[string]want{"r": {removed: true}}, nil},
		{"leaf after revert is deleted", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 1, 1)
			require.NoError(t, r.Snapshot("a", SnapshotOptions{}))
			fillBlocks(t, r, 1, 1, 2)
			require.NoError(t, r.Snapshot("b", SnapshotOptions{}))
			require.NoError(t, r.Revert("a"))
			require.NoError(t, r.RemoveSnapshot("b"))
		}, map[string]want{"a": {}}, map[string][]byte{"a": {1, 0, 0, 0, 0, 0, 0, 0}}},
		{"several children: left alone", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 1, 1)
			require.NoError(t, r.Snapshot("a", SnapshotOptions{}))
			fillBlocks(t, r, 1, 1, 2)
			require.NoError(t, r.Snapshot("b", SnapshotOptions{}))
			require.NoError(t, r.Revert("a"))
			require.NoError(t, r.RemoveSnapshot("a"))
		}, map[string]want{"a": {removed: true}, "b": {parent: "a"}}, map[string][]byte{"b": {1, 2, 0, 0, 0, 0, 0, 0}}},
		{"chain of removed snapshots collapses into the survivor", func(t *testing.T, r *Replica) {
			for i, n := range []string{"a", "b", "c", "d"} {
				fillBlocks(t, r, int64(i), 2, byte(i+1))
				require.NoError(t, r.Snapshot(n, SnapshotOptions{}))
			}
			for _, n := range []string{"a", "b", "c"} {
				require.NoError(t, r.RemoveSnapshot(n))
			}
		}, map[string]want{"d": {}}, map[string][]byte{"d": {1, 2, 3, 4, 4, 0, 0, 0}}},
		{"removed leaf with removed parent: both go", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 1, 1)
			require.NoError(t, r.Snapshot("a", SnapshotOptions{}))
			require.NoError(t, r.Snapshot("b", SnapshotOptions{}))
			require.NoError(t, r.Snapshot("c", SnapshotOptions{}))
			require.NoError(t, r.Revert("a"))
			require.NoError(t, r.RemoveSnapshot("b"))
			require.NoError(t, r.RemoveSnapshot("c"))
		}, map[string]want{"a": {}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, dir := newReplica(t, 8)
			tc.build(t, r)
			before := blockVals(t, r)
			var pcts []int
			require.NoError(t, r.Purge(context.Background(), func(p int) { pcts = append(pcts, p) }))
			assert.Equal(t, 0, pcts[0])
			assert.Equal(t, 100, pcts[len(pcts)-1])
			assert.True(t, slices.IsSorted(pcts), "%v", pcts)
			assert.Equal(t, before, blockVals(t, r), "purge must not change what the head reads")
			check := func() {
				got := layers(t, r)
				delete(got, HeadName)
				require.Len(t, got, len(tc.chain), "%v", got)
				for n, w := range tc.chain {
					require.Contains(t, got, n)
					assert.Equal(t, w.parent, got[n].Parent, n)
					assert.Equal(t, w.removed, got[n].Removed, n)
				}
				entries, err := os.ReadDir(dir)
				require.NoError(t, err)
				assert.Len(t, entries, 1+2*(len(tc.chain)+1), "only the chain's files remain")
			}
			check()
			require.NoError(t, r.Close()) // the result survives a reopen
			r2, err := Open(dir)
			require.NoError(t, err)
			r = r2
			defer r.Close()
			check()
			assert.Equal(t, before, blockVals(t, r))
			for n, vals := range tc.reverts {
				require.NoError(t, r.Revert(n))
				assert.Equal(t, vals, blockVals(t, r), "content of %s", n)
			}
		})
	}
}

func TestPurgePruneFreesSpace(t *testing.T) {
	r, _ := newReplica(t, 64)
	fillBlocks(t, r, 0, 32, 1)
	require.NoError(t, r.Snapshot("r", SnapshotOptions{}))
	fillBlocks(t, r, 0, 24, 2)
	require.NoError(t, r.RemoveSnapshot("r"))
	require.NoError(t, r.Purge(context.Background(), nil))
	exts, err := r.Extents("r")
	require.NoError(t, err)
	assert.Equal(t, []Extent{{Offset: 24 * bs, Length: 8 * bs}}, exts)
	// Unmap may not free head blocks the stale entries still cover, but
	// WriteZeroes still reads zeros.
	require.NoError(t, r.WriteZeroes(0, 32*bs))
	assert.Equal(t, make([]byte, 32*bs), readAll(t, r)[:32*bs])
}

func TestPurgeCancel(t *testing.T) {
	r, _ := newReplica(t, 1024)
	fillBlocks(t, r, 0, 1024, 1)
	require.NoError(t, r.Snapshot("a", SnapshotOptions{}))
	fillBlocks(t, r, 0, 1, 2)
	require.NoError(t, r.Snapshot("b", SnapshotOptions{}))
	require.NoError(t, r.RemoveSnapshot("a"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, r.Purge(ctx, nil), context.Canceled)
	assert.Len(t, layers(t, r), 3, "nothing purged")
	require.NoError(t, r.Purge(context.Background(), nil))
	assert.Len(t, layers(t, r), 2)
}

func TestRevertKeepsBranch(t *testing.T) {
	r, dir := newReplica(t, 4)
	for i, n := range []string{"s1", "s2", "s3"} {
		fillBlocks(t, r, int64(i), 1, byte(i+1))
		require.NoError(t, r.Snapshot(n, SnapshotOptions{}))
	}
	fillBlocks(t, r, 3, 1, 9) // discarded by the revert
	require.NoError(t, r.Revert("s1"))
	assert.Equal(t, []byte{1, 0, 0, 0}, blockVals(t, r))
	fillBlocks(t, r, 2, 1, 7)
	require.NoError(t, r.Snapshot("s4", SnapshotOptions{}))
	l := layers(t, r)
	assert.Equal(t, []string{"s2", "s4"}, l["s1"].Children)
	assert.Equal(t, []string{"s3"}, l["s2"].Children)
	assert.Equal(t, "s4", l[HeadName].Parent)
	require.NoError(t, r.Revert("s3"))
	assert.Equal(t, []byte{1, 2, 3, 0}, blockVals(t, r))
	require.NoError(t, r.Close())
	r, err := Open(dir)
	require.NoError(t, err)
	defer r.Close()
	assert.Equal(t, []byte{1, 2, 3, 0}, blockVals(t, r))
	require.NoError(t, r.Revert("s4"))
	assert.Equal(t, []byte{1, 0, 7, 0}, blockVals(t, r))
}
