package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/internal/devtools/fsalloc"
)

// dirAllocated is what every file of the replica's directory holds on disk.
func dirAllocated(t *testing.T, dir string) int64 {
	t.Helper()
	n, err := fsalloc.Dir(dir)
	require.NoError(t, err)
	return n
}

// TestPurgeFreesDiscardedBlocks: a trim (or write-zeroes) of data a
// snapshot holds frees it once the snapshot is deleted, unless a kept
// snapshot below holds the same blocks; what the user wrote since stays.
func TestPurgeFreesDiscardedBlocks(t *testing.T) {
	tests := []struct {
		name string
		// build leaves snapshot "s" removed under the head.
		build func(t *testing.T, r *Replica)
		// want: the chain after the purge (without the head), each
		// snapshot's allocated blocks, and what blocks read as.
		chain map[string]int64
		vals  []byte
		// kept: a snapshot to revert to at the end, and its content.
		kept     string
		keptVals []byte
	}{
		{"trim, then delete the snapshot", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 16, 1)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			require.NoError(t, r.Unmap(0, 16*bs))
			require.NoError(t, r.RemoveSnapshot("s"))
		}, map[string]int64{}, make([]byte, 16), "", nil},
		{"write-zeroes, then delete the snapshot", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 16, 1)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			require.NoError(t, r.WriteZeroes(0, 16*bs))
			require.NoError(t, r.RemoveSnapshot("s"))
		}, map[string]int64{}, make([]byte, 16), "", nil},
		{"trim of data rewritten in the head", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 16, 1)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			fillBlocks(t, r, 0, 8, 2)
			require.NoError(t, r.Unmap(0, 16*bs))
			require.NoError(t, r.RemoveSnapshot("s"))
		}, map[string]int64{}, make([]byte, 16), "", nil},
		{"a write after the trim stays", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 16, 1)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			require.NoError(t, r.Unmap(0, 16*bs))
			fillBlocks(t, r, 3, 1, 7)
			require.NoError(t, r.RemoveSnapshot("s"))
		}, map[string]int64{}, []byte{0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "", nil},
		{"part trimmed: the rest stays in the snapshot", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 16, 1)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			require.NoError(t, r.Unmap(4*bs, 8*bs))
			require.NoError(t, r.RemoveSnapshot("s"))
		}, map[string]int64{"s": 8}, []byte{1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1}, "", nil},
		{"a kept snapshot below keeps its blocks", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 8, 1)
			require.NoError(t, r.Snapshot("old", SnapshotOptions{UserCreated: true}))
			fillBlocks(t, r, 0, 2, 2) // over old's blocks
			fillBlocks(t, r, 8, 8, 3) // s's own
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			require.NoError(t, r.Unmap(0, 16*bs))
			require.NoError(t, r.RemoveSnapshot("s"))
		}, map[string]int64{"old": 8, "s": 2},
			[]byte{2, 2, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0},
			"old", []byte{1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"a snapshot after the trim keeps it unapplied", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 16, 1)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			require.NoError(t, r.Unmap(0, 16*bs))
			require.NoError(t, r.Snapshot("t", SnapshotOptions{UserCreated: true}))
			require.NoError(t, r.RemoveSnapshot("s"))
		}, map[string]int64{"t": 16}, bytes.Repeat([]byte{1}, 16), "t", bytes.Repeat([]byte{1}, 16)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, dir := newReplica(t, 16)
			tc.build(t, r)
			require.NoError(t, r.Purge(context.Background(), nil))
			got := layers(t, r)
			delete(got, HeadName)
			require.Len(t, got, len(tc.chain), "chain %v", got)
			var want int64
			for name, blocks := range tc.chain {
				require.Contains(t, got, name)
				assert.Equal(t, blocks*bs, got[name].Size, "allocated by %s", name)
				want += blocks * bs
			}
			assert.Equal(t, tc.vals, blockVals(t, r))
			head := layers(t, r)[HeadName].Size
			assert.LessOrEqual(t, dirAllocated(t, dir)-head, want+64<<10, "the snapshots' files and metadata")

			require.NoError(t, r.Close()) // what the purge did is on disk
			r2, err := Open(dir)
			require.NoError(t, err)
			defer r2.Close()
			assert.Equal(t, tc.vals, blockVals(t, r2), "after a reopen")
			if tc.kept != "" {
				require.NoError(t, r2.Revert(tc.kept))
				assert.Equal(t, tc.keptVals, blockVals(t, r2), "content of %s", tc.kept)
			}
		})
	}
}

// TestUnmapAfterPruneFreesHeadBlocks: once a prune left nothing below a
// head block, a trim frees it.
func TestUnmapAfterPruneFreesHeadBlocks(t *testing.T) {
	r, _ := newReplica(t, 16)
	fillBlocks(t, r, 0, 16, 1)
	require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
	fillBlocks(t, r, 0, 8, 2)
	require.NoError(t, r.RemoveSnapshot("s"))
	require.NoError(t, r.Purge(context.Background(), nil))
	require.NoError(t, r.Unmap(0, 8*bs))
	assert.Zero(t, layers(t, r)[HeadName].Size, "the head's blocks over nothing are freed")
	assert.Equal(t, []byte{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}, blockVals(t, r))
}

func TestUnionExtents(t *testing.T) {
	e := func(off, n int64) Extent { return Extent{Offset: off, Length: n} }
	tests := []struct {
		a, b, want []Extent
	}{
		{nil, nil, []Extent{}},
		{[]Extent{e(0, 4)}, nil, []Extent{e(0, 4)}},
		{[]Extent{e(0, 4), e(10, 2)}, []Extent{e(2, 4), e(12, 1)}, []Extent{e(0, 6), e(10, 3)}},
		{[]Extent{e(5, 1)}, []Extent{e(0, 1), e(9, 1)}, []Extent{e(0, 1), e(5, 1), e(9, 1)}},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, unionExtents(tc.a, tc.b))
	}
	assert.Equal(t, []Extent{e(2, 2), e(9, 2)}, intersectExtents([]Extent{e(0, 4), e(9, 3)}, []Extent{e(2, 9)}))
}

// TestChainExclusive: each snapshot's Exclusive is what a purge frees once
// it is deleted; the table deletes and purges to check that.
func TestChainExclusive(t *testing.T) {
	tests := []struct {
		name   string
		build  func(t *testing.T, r *Replica)
		target string
		want   int64 // blocks
	}{
		{"newest, the head overwrote part", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 8, 1)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			fillBlocks(t, r, 0, 3, 2)
		}, "s", 3},
		{"newest, the head trimmed part, nothing below", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 8, 1)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			require.NoError(t, r.Unmap(2*bs, 4*bs))
		}, "s", 4},
		{"newest, trimmed over a kept snapshot's blocks", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 4, 1)
			require.NoError(t, r.Snapshot("old", SnapshotOptions{}))
			fillBlocks(t, r, 0, 8, 2)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			require.NoError(t, r.Unmap(0, 8*bs))
		}, "s", 4},
		{"older, merged into its child", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 8, 1)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			fillBlocks(t, r, 4, 2, 2)
			require.NoError(t, r.Snapshot("c", SnapshotOptions{}))
		}, "s", 2},
		{"a leaf left by a revert", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 2, 1)
			require.NoError(t, r.Snapshot("a", SnapshotOptions{}))
			fillBlocks(t, r, 2, 5, 2)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			require.NoError(t, r.Revert("a"))
		}, "s", 5},
		{"several children", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 2, 1)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			fillBlocks(t, r, 0, 2, 2)
			require.NoError(t, r.Snapshot("b", SnapshotOptions{}))
			require.NoError(t, r.Revert("s"))
			fillBlocks(t, r, 0, 1, 3)
		}, "s", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := newReplica(t, 16)
			tc.build(t, r)
			l := layers(t, r)
			require.Equal(t, tc.want*bs, l[tc.target].Exclusive)
			total := func() (n int64) {
				for _, li := range layers(t, r) {
					n += li.Size
				}
				return n
			}
			before := total()
			require.NoError(t, r.RemoveSnapshot(tc.target))
			require.NoError(t, r.Purge(context.Background(), nil))
			assert.Equal(t, tc.want*bs, before-total(), "what the purge freed")
		})
	}
}

// TestDiscardMarksSurviveReopen: an instance manager restarted between a
// trim and the snapshot's delete still frees the trimmed blocks; a block
// written after the trim keeps its data though the discard file still
// marks it.
func TestDiscardMarksSurviveReopen(t *testing.T) {
	tests := []struct {
		name  string
		build func(t *testing.T, r *Replica)
		// fileMarks: the first word of the discard file before the reopen
		// (0: no file); chain and vals: after the delete and purge.
		fileMarks uint64
		chain     map[string]int64
		vals      []byte
	}{
		{"trim", func(t *testing.T, r *Replica) {
			require.NoError(t, r.Unmap(0, 16*bs))
		}, 0xffff, map[string]int64{}, make([]byte, 16)},
		{"write-zeroes", func(t *testing.T, r *Replica) {
			require.NoError(t, r.WriteZeroes(0, 16*bs))
		}, 0xffff, map[string]int64{}, make([]byte, 16)},
		{"a write after the trim: the stale mark is dropped", func(t *testing.T, r *Replica) {
			require.NoError(t, r.Unmap(0, 16*bs))
			fillBlocks(t, r, 3, 1, 7)
		}, 0xffff, map[string]int64{}, []byte{0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"zeros written after the trim read as zeros", func(t *testing.T, r *Replica) {
			require.NoError(t, r.Unmap(0, 16*bs))
			fillBlocks(t, r, 3, 1, 0)
		}, 0xffff, map[string]int64{}, make([]byte, 16)},
		{"a trim of head data keeps it: Open cannot tell it from a later write", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 0, 4, 2)
			require.NoError(t, r.Unmap(0, 16*bs))
		}, 0xffff, map[string]int64{}, []byte{2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"part trimmed", func(t *testing.T, r *Replica) {
			require.NoError(t, r.Unmap(4*bs, 8*bs))
		}, 0x0ff0, map[string]int64{"s": 8}, []byte{1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1}},
		{"a snapshot after the trim starts without marks", func(t *testing.T, r *Replica) {
			require.NoError(t, r.Unmap(0, 16*bs))
			require.NoError(t, r.Snapshot("t", SnapshotOptions{UserCreated: true}))
		}, 0, map[string]int64{"t": 16}, bytes.Repeat([]byte{1}, 16)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, dir := newReplica(t, 16)
			fillBlocks(t, r, 0, 16, 1)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			tc.build(t, r)
			assert.Equal(t, tc.fileMarks, discardFileWord(t, dir, r.head.file), "the discard file")
			require.NoError(t, r.Close())

			r2, err := Open(dir)
			require.NoError(t, err)
			defer r2.Close()
			require.NoError(t, r2.RemoveSnapshot("s"))
			require.NoError(t, r2.Purge(context.Background(), nil))
			got := layers(t, r2)
			delete(got, HeadName)
			require.Len(t, got, len(tc.chain), "chain %v", got)
			for name, blocks := range tc.chain {
				require.Contains(t, got, name)
				assert.Equal(t, blocks*bs, got[name].Size, "allocated by %s", name)
			}
			assert.Equal(t, tc.vals, blockVals(t, r2))
			assert.Zero(t, discardFileWord(t, dir, r2.head.file)&^tc.fileMarks, "marks the purge cleared stay cleared")
		})
	}
}

// discardFileWord is the first word of head's discard file, 0 if none.
func discardFileWord(t *testing.T, dir, head string) uint64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, discardFileName(head)))
	if os.IsNotExist(err) {
		return 0
	}
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(data), 8)
	return binary.LittleEndian.Uint64(data)
}

// TestDiscardFileDamaged: a discard file Open cannot use costs its marks,
// never the replica.
func TestDiscardFileDamaged(t *testing.T) {
	for name, content := range map[string][]byte{"short": {0xff, 0x01}, "empty": {}, "too long": bytes.Repeat([]byte{0xff}, 1<<20)} {
		t.Run(name, func(t *testing.T) {
			r, dir := newReplica(t, 16)
			fillBlocks(t, r, 0, 16, 1)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			fillBlocks(t, r, 0, 2, 2)
			head := r.head.file
			require.NoError(t, r.Close())
			require.NoError(t, os.WriteFile(filepath.Join(dir, discardFileName(head)), content, fileMode))
			r2, err := Open(dir)
			require.NoError(t, err)
			defer r2.Close()
			assert.Equal(t, []byte{2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, blockVals(t, r2))
		})
	}
}

// TestPersistDiscardedInPieces: marks over more than one piece (32 GiB of
// volume) reach the file whole.
func TestPersistDiscardedInPieces(t *testing.T) {
	const size = 80 << 30 // sparse: only the bitmap is written
	r, dir := newReplica(t, size/bs)
	nblocks := int64(size / bs)
	r.mu.Lock()
	r.discarded.set(0, nblocks-1)
	r.persistDiscarded(0, nblocks-1)
	r.mu.Unlock()
	data, err := os.ReadFile(filepath.Join(dir, discardFileName(r.head.file)))
	require.NoError(t, err)
	require.Len(t, data, int(nblocks/8))
	assert.True(t, bytes.Equal(data[:len(data)-8], bytes.Repeat([]byte{0xff}, len(data)-8)), "every word but the last all set")
	assert.Equal(t, uint64(1)<<63-1, binary.LittleEndian.Uint64(data[len(data)-8:]), "the last block unmarked")
}
