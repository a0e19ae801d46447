package replica

import (
	"bytes"
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// headAllocated is what the head takes on disk: its image and its zero
// marks file, by st_blocks.
func headAllocated(t *testing.T, r *Replica) int64 {
	t.Helper()
	r.mu.RLock()
	defer r.mu.RUnlock()
	n, err := r.layerAllocated(r.head)
	require.NoError(t, err)
	return n
}

// fileAllocated is st_blocks*512 of dir/name, 0 if it does not exist.
func fileAllocated(t *testing.T, dir, name string) int64 {
	t.Helper()
	var st unix.Stat_t
	err := unix.Stat(filepath.Join(dir, name), &st)
	if os.IsNotExist(err) {
		return 0
	}
	require.NoError(t, err)
	return st.Blocks * 512
}

// sumOf is the SHA-256 of n bytes of the volume at off, or of a layer's
// own content when layer is not "".
func sumOf(t *testing.T, r *Replica, layer string, off, n int64) [32]byte {
	t.Helper()
	p := make([]byte, n)
	var err error
	if layer == "" {
		_, err = r.ReadAt(p, off)
	} else {
		_, err = r.ReadLayer(layer, p, off)
	}
	require.NoError(t, err)
	return sha256.Sum256(p)
}

const (
	zmVolume = 128 << 20 // the claim of issue 43
	zmData   = 64 << 20  // written, synced, snapshotted, then trimmed
)

// zmSetup writes zmData of random data at the start of a zmVolume replica
// and takes snapshot "s" of it; it returns the data's checksum.
func zmSetup(t *testing.T) (*Replica, string, [32]byte) {
	t.Helper()
	r, dir := newReplica(t, zmVolume/bs)
	p := make([]byte, 1<<20)
	h := sha256.New()
	for off := int64(0); off < zmData; off += int64(len(p)) {
		fillRandom(p, uint64(off)+1)
		_, err := r.WriteAt(p, off)
		require.NoError(t, err)
		h.Write(p)
	}
	require.NoError(t, r.Flush())
	require.NoError(t, r.Snapshot("s", SnapshotOptions{UserCreated: true}))
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return r, dir, sum
}

// TestWriteZeroesOverSnapshotAllocatesNothing is issue 43 point 2: zeroing
// (a trim through the loop device) data a kept snapshot holds must not
// allocate it again in the head; the range reads zeros, the snapshot its
// data, also after a reopen and in a snapshot taken afterwards; deleting
// the snapshot then frees everything.
func TestWriteZeroesOverSnapshotAllocatesNothing(t *testing.T) {
	zeroSum := sha256.Sum256(make([]byte, zmData))
	tests := []struct {
		name string
		// before runs after the snapshot, before the zeroing.
		before func(t *testing.T, r *Replica)
		zero   func(r *Replica) error
	}{
		{"one write-zeroes over all of it", nil, func(r *Replica) error { return r.WriteZeroes(0, zmData) }},
		{"in 1 MiB pieces, as fstrim sends them", nil, func(r *Replica) error {
			for off := int64(0); off < zmData; off += 1 << 20 {
				if err := r.WriteZeroes(off, 1<<20); err != nil {
					return err
				}
			}
			return nil
		}},
		{"the head rewrote 8 MiB first: its data goes too", func(t *testing.T, r *Replica) {
			_, err := r.WriteAt(bytes.Repeat([]byte{9}, 8<<20), 16<<20)
			require.NoError(t, err)
		}, func(r *Replica) error { return r.WriteZeroes(0, zmData) }},
		{"zeroed twice", nil, func(r *Replica) error {
			if err := r.WriteZeroes(0, zmData); err != nil {
				return err
			}
			return r.WriteZeroes(4<<20, 8<<20)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, dir, dataSum := zmSetup(t)
			before := headAllocated(t, r)
			if tc.before != nil {
				tc.before(t, r)
			}
			require.NoError(t, tc.zero(r))
			after := headAllocated(t, r)
			t.Logf("head allocated: %d KiB before the zeroing, %d KiB after (marks file %d KiB); snapshot s %d KiB",
				before>>10, after>>10, fileAllocated(t, dir, zeroFileName(r.head.file))>>10, layers(t, r)["s"].Size>>10)
			assert.Less(t, after-before, int64(1<<20), "the head grows by less than 1 MiB")
			check := func(r *Replica, what string) {
				t.Helper()
				assert.Equal(t, zeroSum, sumOf(t, r, "", 0, zmData), "%s: the range reads zeros", what)
				assert.Equal(t, dataSum, sumOf(t, r, "s", 0, zmData), "%s: the snapshot keeps its data", what)
				exts, err := r.Extents(HeadName)
				require.NoError(t, err)
				assert.Equal(t, []Extent{{0, zmData}}, exts, "%s: the head holds the range (as zeros)", what)
			}
			check(r, "live")

			require.NoError(t, r.Close())
			r, err := Open(dir)
			require.NoError(t, err)
			t.Cleanup(func() { r.Close() })
			check(r, "after a reopen")
			assert.Equal(t, after, headAllocated(t, r), "a reopen allocates nothing")

			// Writes over zeroed blocks read back, whole or partial.
			fillBlocks(t, r, 5<<8, 1, 7) // block at 5 MiB
			_, err = r.WriteAt([]byte("partial"), 7<<20+10)
			require.NoError(t, err)
			got := make([]byte, 2*bs)
			_, err = r.ReadAt(got, 5<<20)
			require.NoError(t, err)
			assert.Equal(t, append(bytes.Repeat([]byte{7}, bs), make([]byte, bs)...), got)
			_, err = r.ReadAt(got, 7<<20)
			require.NoError(t, err)
			want := make([]byte, 2*bs)
			copy(want[10:], "partial")
			assert.Equal(t, want, got, "a partial write over a zeroed block: the rest reads zeros")

			require.NoError(t, r.RemoveSnapshot("s"))
			require.NoError(t, r.Purge(context.Background(), nil))
			assert.Empty(t, r.snaps, "the snapshot is gone")
			total := dirAllocated(t, dir)
			t.Logf("after the snapshot's delete and purge: %d KiB in the replica directory", total>>10)
			assert.Less(t, total, int64(1<<20), "deleting the snapshot frees everything")
			_, err = r.ReadAt(got, 5<<20)
			require.NoError(t, err)
			assert.Equal(t, append(bytes.Repeat([]byte{7}, bs), make([]byte, bs)...), got, "the write stays")
			got = make([]byte, zmData)
			_, err = r.ReadAt(got, 0)
			require.NoError(t, err)
			clear(got[5<<20 : 5<<20+bs])
			clear(got[7<<20 : 7<<20+bs])
			assert.Equal(t, -1, firstDiff(got, make([]byte, zmData)), "the rest reads zeros")
		})
	}
}

// TestZeroMarksThroughSnapshotsAndPurge: zero marks taken into snapshots
// read as zeros in them, through revert, purge (prune and coalesce, both
// ways) and reopen, and the space goes once no kept snapshot needs it.
func TestZeroMarksThroughSnapshotsAndPurge(t *testing.T) {
	const (
		n    = 64 // blocks
		half = 32
	)
	zeros := make([]byte, n)
	ones := bytes.Repeat([]byte{1}, n)
	zeroHalf := append(make([]byte, half), bytes.Repeat([]byte{1}, half)...)
	tests := []struct {
		name string
		// run works on a replica where snapshot "s" holds 1s in every
		// block and the head zeroed the first half.
		run func(t *testing.T, r *Replica)
		// chain: snapshots left after a final purge, with their content
		// (first byte of each block); vals: what the volume reads.
		chain map[string][]byte
		vals  []byte
		// maxData: data blocks every layer together may still allocate.
		maxData int64
	}{
		{"delete s: the prune frees the zeroed half", func(t *testing.T, r *Replica) {
			require.NoError(t, r.RemoveSnapshot("s"))
		}, map[string][]byte{"s": zeroHalf}, zeroHalf, half},
		{"snapshot t after the zeroing keeps zeros", func(t *testing.T, r *Replica) {
			require.NoError(t, r.Snapshot("t", SnapshotOptions{}))
		}, map[string][]byte{"s": ones, "t": zeroHalf}, zeroHalf, n},
		{"snapshot t, delete s: coalesce (into s's file) keeps t's zeros", func(t *testing.T, r *Replica) {
			require.NoError(t, r.Snapshot("t", SnapshotOptions{}))
			require.NoError(t, r.RemoveSnapshot("s"))
		}, map[string][]byte{"t": zeroHalf}, zeroHalf, half},
		{"snapshot t with more data than s, delete s: coalesce into t keeps t's zeros", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, n, 3*n, 2) // t gets more data than s
			require.NoError(t, r.Snapshot("t", SnapshotOptions{}))
			require.NoError(t, r.RemoveSnapshot("s"))
			require.NoError(t, r.WriteZeroes(n*bs, 3*n*bs)) // and the head hides it again
		}, map[string][]byte{"t": append(zeroHalf, bytes.Repeat([]byte{2}, 3*n)...)}, zeroHalf, half + 3*n},
		{"snapshot t, delete t: its marks over s stay", func(t *testing.T, r *Replica) {
			require.NoError(t, r.Snapshot("t", SnapshotOptions{}))
			require.NoError(t, r.RemoveSnapshot("t"))
		}, map[string][]byte{"s": ones, "t": nil}, zeroHalf, n},
		{"snapshot t, delete both: the zeroed half goes", func(t *testing.T, r *Replica) {
			require.NoError(t, r.Snapshot("t", SnapshotOptions{}))
			require.NoError(t, r.RemoveSnapshot("s"))
			require.NoError(t, r.RemoveSnapshot("t"))
		}, map[string][]byte{"t": zeroHalf}, zeroHalf, half},
		{"snapshot t, zero the rest, delete both: everything goes", func(t *testing.T, r *Replica) {
			require.NoError(t, r.Snapshot("t", SnapshotOptions{}))
			require.NoError(t, r.WriteZeroes(0, n*bs))
			require.NoError(t, r.RemoveSnapshot("s"))
			require.NoError(t, r.RemoveSnapshot("t"))
		}, map[string][]byte{}, zeros, 0},
		{"revert to s brings the data back", func(t *testing.T, r *Replica) {
			require.NoError(t, r.Revert("s"))
		}, map[string][]byte{"s": ones}, ones, n},
		{"a write after the zeroing stays through the purge", func(t *testing.T, r *Replica) {
			fillBlocks(t, r, 3, 1, 7)
			require.NoError(t, r.Snapshot("t", SnapshotOptions{}))
			require.NoError(t, r.RemoveSnapshot("s"))
			require.NoError(t, r.RemoveSnapshot("t"))
		}, map[string][]byte{"t": nil}, func() []byte { v := slices.Clone(zeroHalf); v[3] = 7; return v }(), half + 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Twice the blocks: room for the cases that write past n.
			r, dir := newReplica(t, 4*n)
			fillBlocks(t, r, 0, n, 1)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			require.NoError(t, r.WriteZeroes(0, half*bs))
			tc.run(t, r)
			check := func(r *Replica, what string) {
				t.Helper()
				require.NoError(t, r.Purge(context.Background(), nil), what)
				assert.Equal(t, tc.vals, blockVals(t, r)[:len(tc.vals)], "%s: the volume", what)
				got := layers(t, r)
				delete(got, HeadName)
				assert.Len(t, got, len(tc.chain), "%s: chain %v", what, got)
				var data int64
				for name := range got {
					exts, err := dataExtents(r.snaps[name].f, r.size)
					require.NoError(t, err)
					data += extentBytes(exts)
					want, ok := tc.chain[name]
					require.True(t, ok, "%s: unexpected snapshot %s", what, name)
					if want == nil {
						continue
					}
					p := make([]byte, int64(len(want))*bs)
					require.NoError(t, readChain(r, name, p))
					var vals []byte
					for i := 0; i < len(p); i += bs {
						vals = append(vals, p[i])
					}
					assert.Equal(t, want, vals, "%s: content of %s", what, name)
				}
				exts, err := dataExtents(r.head.f, r.size)
				require.NoError(t, err)
				data += extentBytes(exts)
				assert.LessOrEqual(t, data, tc.maxData*bs, "%s: data blocks left", what)
			}
			check(r, "live")
			require.NoError(t, r.Close())
			r2, err := Open(dir)
			require.NoError(t, err)
			defer r2.Close()
			check(r2, "after a reopen")
		})
	}
}

// readChain reads p from the start of snapshot name as the volume would
// after a revert to it, through Extents and ReadLayer the way export and
// clone read (the topmost layer holding a block gives it).
func readChain(r *Replica, name string, p []byte) error {
	clear(p)
	var covered []Extent
	for layer := name; ; {
		exts, err := r.Extents(layer)
		if err != nil {
			return err
		}
		for _, e := range subtractExtents(exts, covered) {
			if e.Offset >= int64(len(p)) {
				continue
			}
			end := min(e.End(), int64(len(p)))
			if _, err := r.ReadLayer(layer, p[e.Offset:end], e.Offset); err != nil {
				return err
			}
		}
		covered = unionExtents(covered, exts)
		if layer == BackingName {
			return nil
		}
		l, err := r.layerByName(layer)
		if err != nil {
			return err
		}
		switch {
		case l.meta.Parent != "":
			layer = l.meta.Parent
		case r.backing != nil:
			layer = BackingName
		default:
			return nil
		}
	}
}

// TestZeroMarksOverBackingFile: a backing file's data is hidden by marks
// the same way, without allocating.
func TestZeroMarksOverBackingFile(t *testing.T) {
	back := filepath.Join(t.TempDir(), "backing")
	require.NoError(t, os.WriteFile(back, bytes.Repeat([]byte{7}, 4<<20), 0o644))
	dir := filepath.Join(t.TempDir(), "r")
	r, err := Create(dir, 8<<20, CreateOptions{BackingFile: back})
	require.NoError(t, err)
	defer func() { r.Close() }()
	require.NoError(t, r.WriteZeroes(0, 4<<20))
	assert.Less(t, headAllocated(t, r), int64(64<<10))
	assert.Equal(t, make([]byte, 8<<20), readAll(t, r))
	require.NoError(t, r.Close())
	r, err = Open(dir)
	require.NoError(t, err)
	assert.Equal(t, make([]byte, 8<<20), readAll(t, r))
}

// TestZeroMarksFile: the marks file holds a page per 128 MiB where marks
// are, is punched where they all go, and a damaged one fails Open rather
// than show older data.
func TestZeroMarksFile(t *testing.T) {
	r, dir := newReplica(t, 3*pageBlocks) // 384 MiB: three pages of marks
	fillBlocks(t, r, 0, 1, 1)
	fillBlocks(t, r, 2*pageBlocks+5, 1, 1)
	require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
	require.NoError(t, r.WriteZeroes(0, r.Size()))
	name := zeroFileName(r.head.file)
	assert.Equal(t, int64(2*4096), fileAllocated(t, dir, name), "pages where the marks are")
	assert.Equal(t, make([]byte, 2), []byte{blockVals(t, r)[0], blockVals(t, r)[2*pageBlocks+5]})

	fillBlocks(t, r, 2*pageBlocks+5, 1, 3) // data wins over the mark
	require.NoError(t, r.Close())
	r2, err := Open(dir)
	require.NoError(t, err)
	assert.Equal(t, byte(3), blockVals(t, r2)[2*pageBlocks+5], "data written over a mark reads back")
	assert.Equal(t, byte(0), blockVals(t, r2)[0])
	require.NoError(t, r2.RemoveSnapshot("s"))
	require.NoError(t, r2.Purge(context.Background(), nil))
	// The prune freed block 0 from every layer, so its mark went and its
	// page was punched; the mark under the block written since stays
	// (data wins over it, and a write never clears a mark).
	assert.Equal(t, int64(4096), fileAllocated(t, dir, name), "one page of marks left")
	f, err := os.Open(filepath.Join(dir, name))
	require.NoError(t, err)
	off, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_DATA)
	f.Close()
	require.NoError(t, err)
	assert.Equal(t, int64(2*4096), off, "the first page is a hole again")
	require.NoError(t, r2.Close())

	// An unreadable marks file (here a directory in its place) fails Open.
	r3, dir3 := newReplica(t, 16)
	fillBlocks(t, r3, 0, 4, 1)
	require.NoError(t, r3.Snapshot("s", SnapshotOptions{}))
	require.NoError(t, r3.WriteZeroes(0, 4*bs))
	head := r3.head.file
	require.NoError(t, r3.Close())
	require.NoError(t, os.Remove(filepath.Join(dir3, zeroFileName(head))))
	require.NoError(t, os.Mkdir(filepath.Join(dir3, zeroFileName(head)), 0o700))
	_, err = Open(dir3)
	assert.ErrorIs(t, err, ErrBadMeta)
}

// TestImportKeepsZeroBlocksAsMarks: a rebuild copies a layer's zero
// blocks (marks on the source, or zeros a user wrote) as marks, so the
// target allocates no more than the source and reads the same.
func TestImportKeepsZeroBlocksAsMarks(t *testing.T) {
	s, _ := newReplica(t, 1024)
	fillBlocks(t, s, 0, 1024, 1)
	require.NoError(t, s.Snapshot("a", SnapshotOptions{ID: NewLayerID()}))
	require.NoError(t, s.WriteZeroes(0, 512*bs))  // marks
	fillBlocks(t, s, 600, 8, 0)                   // zeros written as data
	require.NoError(t, s.WriteZeroes(900*bs, bs)) // one more mark
	require.NoError(t, s.Snapshot("b", SnapshotOptions{ID: NewLayerID()}))

	tr, tdir := newReplica(t, 1024)
	require.NoError(t, tr.BeginImport(ImportOptions{}))
	ls, err := copyLayers(s, tr, func() {})
	require.NoError(t, err)
	require.NoError(t, tr.CommitImport(ls, "b"))
	requireSameReplica(t, s, tr, nil)
	sb, tb := layers(t, s)["b"], layers(t, tr)["b"]
	t.Logf("layer b: %d KiB on the source, %d KiB on the target", sb.Size>>10, tb.Size>>10)
	assert.Less(t, tb.Size, int64(64<<10), "zero blocks cost no data on the target")
	tr.Close()
	tr2, err := Open(tdir)
	require.NoError(t, err)
	defer tr2.Close()
	requireSameReplica(t, s, tr2, nil)
}

// TestOpenUpgradesFormat: a replica of format version 1 (no zero marks)
// opens and is rewritten as version 2, which a version-1 build refuses
// rather than read through marks; a version from the future is refused.
func TestOpenUpgradesFormat(t *testing.T) {
	r, dir := newReplica(t, 16)
	fillBlocks(t, r, 0, 4, 1)
	require.NoError(t, r.Close())
	path := filepath.Join(dir, volumeMetaFile)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(data), `"formatVersion": 2`)
	require.NoError(t, os.WriteFile(path, bytes.Replace(data, []byte(`"formatVersion": 2`), []byte(`"formatVersion": 1`), 1), fileMode))
	r2, err := Open(dir)
	require.NoError(t, err)
	assert.Equal(t, []byte{1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, blockVals(t, r2))
	require.NoError(t, r2.Close())
	data, err = os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, string(data), `"formatVersion": 2`, "upgraded")

	require.NoError(t, os.WriteFile(path, bytes.Replace(data, []byte(`"formatVersion": 2`), []byte(`"formatVersion": 3`), 1), fileMode))
	_, err = Open(dir)
	assert.ErrorIs(t, err, ErrBadMeta)
}
