package replica

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
)

var _ blockdev.Device = (*Replica)(nil)

func newReplica(t *testing.T, blocks int64) (*Replica, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "r")
	r, err := Create(dir, blocks*bs, CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	return r, dir
}

// fillBlocks writes n blocks of val starting at block blk.
func fillBlocks(t *testing.T, r *Replica, blk, n int64, val byte) {
	t.Helper()
	_, err := r.WriteAt(bytes.Repeat([]byte{val}, int(n*bs)), blk*bs)
	require.NoError(t, err)
}

func readAll(t *testing.T, r *Replica) []byte {
	t.Helper()
	p := make([]byte, r.Size())
	_, err := r.ReadAt(p, 0)
	require.NoError(t, err)
	return p
}

// blockVals returns the first byte of every block, a compact content view.
func blockVals(t *testing.T, r *Replica) []byte {
	t.Helper()
	all := readAll(t, r)
	var out []byte
	for i := 0; i < len(all); i += bs {
		out = append(out, all[i])
	}
	return out
}

func layers(t *testing.T, r *Replica) map[string]LayerInfo {
	t.Helper()
	info, err := r.Chain()
	require.NoError(t, err)
	out := map[string]LayerInfo{}
	for _, l := range info.Layers {
		out[l.Name] = l
	}
	return out
}

// The rule itself is tested in types (TestValidateSnapshotName); here only
// that the replica applies it and its error is ErrInvalidName.
func TestSnapshotInvalidName(t *testing.T) {
	r, _ := newReplica(t, 4)
	assert.ErrorIs(t, r.Snapshot("a/b", SnapshotOptions{}), ErrInvalidName)
	assert.ErrorIs(t, r.Snapshot(HeadName, SnapshotOptions{}), ErrInvalidName)
}

func TestSnapshotDuplicate(t *testing.T) {
	r, dir := newReplica(t, 4)
	require.NoError(t, r.CheckSnapshot("a", SnapshotOptions{}))
	require.NoError(t, r.Snapshot("a", SnapshotOptions{}))
	require.ErrorIs(t, r.CheckSnapshot("a", SnapshotOptions{}), ErrSnapshotExists)
	err := r.Snapshot("a", SnapshotOptions{UserCreated: true})
	require.ErrorIs(t, err, ErrSnapshotExists)
	assert.Contains(t, err.Error(), `"a"`)
	// Removed but not purged is still a duplicate; so is one after reopen.
	require.NoError(t, r.RemoveSnapshot("a"))
	require.ErrorIs(t, r.Snapshot("a", SnapshotOptions{}), ErrSnapshotExists)
	require.NoError(t, r.Close())
	r, err = Open(dir)
	require.NoError(t, err)
	defer r.Close()
	require.ErrorIs(t, r.Snapshot("a", SnapshotOptions{}), ErrSnapshotExists)
	require.ErrorIs(t, r.RemoveSnapshot("nosuch"), ErrSnapshotNotFound)
	require.ErrorIs(t, r.Revert("nosuch"), ErrSnapshotNotFound)
	require.ErrorIs(t, r.Revert("a"), ErrSnapshotRemoved)
}

func TestLimits(t *testing.T) {
	type step struct {
		op   string // "user", "system", "remove", "purge", "write"
		name string
		want error
	}
	tests := []struct {
		name     string
		maxCount int
		maxSize  int64
		steps    []step
		msg      string // in the last refusal
	}{
		{"count", 2, 0, []step{
			{"user", "u1", nil}, {"user", "u2", nil}, {"user", "u3", ErrSnapshotLimitExceeded},
			{"system", "s1", nil}, {"system", "s2", nil}, // exempt
			{"remove", "u1", nil}, {"user", "u3", nil}, // removed ones do not count
			{"user", "u4", ErrSnapshotLimitExceeded},
		}, "2 user snapshots, at most 2 allowed"},
		{"size", 0, 8 * bs, []step{
			{"write", "", nil}, {"user", "u1", nil}, // 8 blocks now in snapshots
			{"user", "u2", ErrSnapshotLimitExceeded},
			{"system", "s1", nil},
			{"remove", "u1", nil}, {"user", "u2", ErrSnapshotLimitExceeded}, // removed data still counts
			{"purge", "", nil}, {"user", "u2", ErrSnapshotLimitExceeded}, // u1 merged into s1: same data
		}, ""},
		{"no limits", 0, 0, []step{{"user", "a", nil}, {"user", "b", nil}, {"user", "c", nil}}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := newReplica(t, 16)
			r.SetLimits(tc.maxCount, tc.maxSize)
			var last error
			for i, s := range tc.steps {
				var err error
				switch s.op {
				case "user", "system":
					opts := SnapshotOptions{UserCreated: s.op == "user"}
					// The dry run agrees with the real thing.
					check := r.CheckSnapshot(s.name, opts)
					err = r.Snapshot(s.name, opts)
					assert.Equal(t, err == nil, check == nil, "step %d: check %v, snapshot %v", i, check, err)
				case "remove":
					err = r.RemoveSnapshot(s.name)
				case "purge":
					err = r.Purge(context.Background(), nil)
				case "write":
					fillBlocks(t, r, 0, 8, 1)
				}
				if s.want == nil {
					require.NoError(t, err, "step %d %v", i, s)
				} else {
					require.ErrorIs(t, err, s.want, "step %d %v", i, s)
					last = err
				}
			}
			if tc.msg != "" {
				assert.Contains(t, last.Error(), tc.msg)
			}
		})
	}
}

func TestLimitsSizeCountsAllocatedBytes(t *testing.T) {
	r, _ := newReplica(t, 64)
	fillBlocks(t, r, 0, 4, 1)
	require.NoError(t, r.Snapshot("a", SnapshotOptions{UserCreated: true}))
	r.SetLimits(0, 4*bs+1)
	require.NoError(t, r.Snapshot("b", SnapshotOptions{UserCreated: true}), "4 blocks < limit")
	fillBlocks(t, r, 10, 1, 2)
	require.NoError(t, r.Snapshot("c", SnapshotOptions{}))
	err := r.Snapshot("d", SnapshotOptions{UserCreated: true})
	require.ErrorIs(t, err, ErrSnapshotLimitExceeded)
	assert.Contains(t, err.Error(), "snapshots take 20480 bytes, at most 16385 allowed")
}

func TestChainInfo(t *testing.T) {
	r, dir := newReplica(t, 64)
	fillBlocks(t, r, 0, 5, 1)
	created := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	require.NoError(t, r.Snapshot("a", SnapshotOptions{UserCreated: true, Created: created, Labels: map[string]string{"x": "y"}}))
	fillBlocks(t, r, 10, 2, 1)
	l := layers(t, r)
	stat := func(file string) int64 {
		st, err := os.Stat(filepath.Join(dir, file))
		require.NoError(t, err)
		return st.Sys().(*syscall.Stat_t).Blocks * 512
	}
	a := l["a"]
	assert.Equal(t, stat("volume-snap-a.img"), a.Size)
	assert.GreaterOrEqual(t, a.Size, int64(5*bs))
	assert.Less(t, a.Size, int64(64*bs), "sparse")
	assert.Equal(t, stat("volume-head-001.img"), l[HeadName].Size)
	assert.GreaterOrEqual(t, l[HeadName].Size, int64(2*bs))
	assert.True(t, a.UserCreated)
	assert.True(t, a.Created.Equal(created))
	assert.Equal(t, map[string]string{"x": "y"}, a.Labels)
	assert.Equal(t, []string{HeadName}, a.Children)
	assert.Equal(t, "a", l[HeadName].Parent)
	info, err := r.Chain()
	require.NoError(t, err)
	assert.Equal(t, int64(64*bs), info.Size)
}

func TestUnmapWriteZeroes(t *testing.T) {
	// Snapshot s holds blocks 0-1 (1s); the head holds blocks 1-4 (2s), so
	// block 1 is the only head block with data below it.
	tests := []struct {
		name     string
		op       func(r *Replica) error
		vals     []byte // first byte of each block afterwards
		headExts []Extent
	}{
		{"unmap frees head blocks with nothing below", func(r *Replica) error { return r.Unmap(3*bs, 5*bs) },
			[]byte{1, 2, 2, 0, 0, 0, 0, 0}, []Extent{{bs, 2 * bs}}},
		{"unmap keeps head blocks over a snapshot", func(r *Replica) error { return r.Unmap(0, 3*bs) },
			[]byte{1, 2, 0, 2, 2, 0, 0, 0}, []Extent{{bs, bs}, {3 * bs, 2 * bs}}},
		{"unmap ignores partial blocks", func(r *Replica) error { return r.Unmap(2*bs+1, bs) },
			[]byte{1, 2, 2, 2, 2, 0, 0, 0}, []Extent{{bs, 4 * bs}}},
		{"writeZeroes punches head blocks with nothing below", func(r *Replica) error { return r.WriteZeroes(3*bs, 5*bs) },
			[]byte{1, 2, 2, 0, 0, 0, 0, 0}, []Extent{{bs, 2 * bs}}},
		{"writeZeroes writes zero blocks over a snapshot", func(r *Replica) error { return r.WriteZeroes(0, 3*bs) },
			[]byte{0, 0, 0, 2, 2, 0, 0, 0}, []Extent{{0, 2 * bs}, {3 * bs, 2 * bs}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, dir := newReplica(t, 8)
			fillBlocks(t, r, 0, 2, 1)
			require.NoError(t, r.Snapshot("s", SnapshotOptions{}))
			fillBlocks(t, r, 1, 4, 2)
			require.NoError(t, tc.op(r))
			check := func() {
				assert.Equal(t, tc.vals, blockVals(t, r))
				exts, err := r.Extents(HeadName)
				require.NoError(t, err)
				assert.Equal(t, tc.headExts, exts)
				snap := make([]byte, 2*bs)
				_, err = r.ReadLayer("s", snap, 0)
				require.NoError(t, err)
				assert.Equal(t, bytes.Repeat([]byte{1}, 2*bs), snap, "the snapshot is never touched")
			}
			check()
			require.NoError(t, r.Close())
			r2, err := Open(dir)
			require.NoError(t, err)
			r = r2
			defer r.Close()
			check()
		})
	}
}

func TestWriteZeroesPartial(t *testing.T) {
	back := filepath.Join(t.TempDir(), "backing")
	require.NoError(t, os.WriteFile(back, bytes.Repeat([]byte{7}, 3*bs+100), 0o644))
	r, err := Create(filepath.Join(t.TempDir(), "r"), 8*bs, CreateOptions{BackingFile: back})
	require.NoError(t, err)
	defer r.Close()
	want := make([]byte, 8*bs)
	copy(want, bytes.Repeat([]byte{7}, 3*bs+100))
	require.Equal(t, want, readAll(t, r))
	require.NoError(t, r.WriteZeroes(100, 3*bs))
	clear(want[100 : 100+3*bs])
	require.Equal(t, want, readAll(t, r))
	require.NoError(t, r.Unmap(0, 8*bs)) // everything is over the backing file or zero: a no-op
	require.Equal(t, want, readAll(t, r))
}

func TestDamagedMeta(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, dir string)
		file   string // the error must name it
	}{
		{"volume.meta missing", func(t *testing.T, dir string) { rm(t, dir, "volume.meta") }, "volume.meta"},
		{"volume.meta torn", func(t *testing.T, dir string) { truncate(t, dir, "volume.meta", 20) }, "volume.meta"},
		{"volume.meta garbage", func(t *testing.T, dir string) { put(t, dir, "volume.meta", "\x00\x01garbage") }, "volume.meta"},
		{"volume.meta unknown field", func(t *testing.T, dir string) { edit(t, dir, "volume.meta", `"size"`, `"sise"`) }, "volume.meta"},
		{"snapshot meta missing", func(t *testing.T, dir string) { rm(t, dir, "volume-snap-a.img.meta") }, "volume-snap-a.img.meta"},
		{"snapshot meta torn", func(t *testing.T, dir string) { truncate(t, dir, "volume-snap-a.img.meta", 10) }, "volume-snap-a.img.meta"},
		{"snapshot meta empty", func(t *testing.T, dir string) { truncate(t, dir, "volume-snap-b.img.meta", 0) }, "volume-snap-b.img.meta"},
		{"snapshot image missing", func(t *testing.T, dir string) { rm(t, dir, "volume-snap-a.img") }, "volume-snap-a.img"},
		{"head meta missing", func(t *testing.T, dir string) { rm(t, dir, "volume-head-002.img.meta") }, "volume-head-002.img.meta"},
		{"head image missing", func(t *testing.T, dir string) { rm(t, dir, "volume-head-002.img") }, "volume-head-002.img"},
		{"parent unknown", func(t *testing.T, dir string) {
			edit(t, dir, "volume-snap-b.img.meta", `"parent": "a"`, `"parent": "zz"`)
		}, "volume-snap-b.img.meta"},
		{"name mismatch", func(t *testing.T, dir string) { edit(t, dir, "volume-snap-a.img.meta", `"name": "a"`, `"name": "q"`) }, "volume-snap-a.img.meta"},
		{"parent cycle", func(t *testing.T, dir string) {
			edit(t, dir, "volume-snap-a.img.meta", `"parent": ""`, `"parent": "b"`)
		}, "volume-snap-"},
		{"bad created", func(t *testing.T, dir string) {
			edit(t, dir, "volume-snap-a.img.meta", `"created": "`, `"created": "x`)
		}, "volume-snap-a.img.meta"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, dir := newReplica(t, 4)
			fillBlocks(t, r, 0, 1, 1)
			require.NoError(t, r.Snapshot("a", SnapshotOptions{}))
			require.NoError(t, r.Snapshot("b", SnapshotOptions{}))
			require.NoError(t, r.Close())
			tc.damage(t, dir)
			_, err := Open(dir)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrBadMeta)
			assert.Contains(t, err.Error(), tc.file)
			// Nothing of the chain was deleted while failing.
			for _, f := range []string{"volume-snap-a.img", "volume-snap-b.img", "volume-head-002.img"} {
				if !strings.Contains(tc.name, "missing") || !strings.HasSuffix(tc.file, f) {
					_, err := os.Stat(filepath.Join(dir, f))
					assert.NoError(t, err, f)
				}
			}
		})
	}
}

func rm(t *testing.T, dir, f string) { require.NoError(t, os.Remove(filepath.Join(dir, f))) }
func truncate(t *testing.T, dir, f string, n int64) {
	require.NoError(t, os.Truncate(filepath.Join(dir, f), n))
}
func put(t *testing.T, dir, f, s string) {
	require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte(s), 0o644))
}
func edit(t *testing.T, dir, f, old, new string) {
	data, err := os.ReadFile(filepath.Join(dir, f))
	require.NoError(t, err)
	require.Contains(t, string(data), old)
	put(t, dir, f, strings.Replace(string(data), old, new, 1))
}

func TestOpenRemovesLeftovers(t *testing.T) {
	r, dir := newReplica(t, 4)
	fillBlocks(t, r, 0, 1, 1)
	require.NoError(t, r.Snapshot("a", SnapshotOptions{}))
	require.NoError(t, r.Close())
	leftovers := []string{"volume-snap-x.img", "volume-snap-x.img.meta", "volume-head-000.img",
		"volume-head-009.img.meta", ".volume.meta.tmp", ".volume-snap-a.img.purge.tmp"}
	for _, f := range append(leftovers, "notes.txt") {
		put(t, dir, f, "x")
	}
	r, err := Open(dir)
	require.NoError(t, err)
	defer r.Close()
	for _, f := range leftovers {
		_, err := os.Stat(filepath.Join(dir, f))
		assert.ErrorIs(t, err, os.ErrNotExist, f)
	}
	_, err = os.Stat(filepath.Join(dir, "notes.txt"))
	assert.NoError(t, err, "files that are not ours stay")
	assert.Equal(t, []byte{1, 0, 0, 0}, blockVals(t, r))
}

func TestExtentsAndReadLayer(t *testing.T) {
	r, _ := newReplica(t, 16)
	fillBlocks(t, r, 1, 2, 1)
	fillBlocks(t, r, 8, 1, 2)
	require.NoError(t, r.Snapshot("a", SnapshotOptions{}))
	_, err := r.WriteAt([]byte{3}, 8*bs+5) // read-modify-write of a block of a
	require.NoError(t, err)
	exts, err := r.Extents("a")
	require.NoError(t, err)
	assert.Equal(t, []Extent{{bs, 2 * bs}, {8 * bs, bs}}, exts)
	exts, err = r.Extents(HeadName)
	require.NoError(t, err)
	assert.Equal(t, []Extent{{8 * bs, bs}}, exts)
	p := make([]byte, bs)
	_, err = r.ReadLayer(HeadName, p, 8*bs)
	require.NoError(t, err)
	want := bytes.Repeat([]byte{2}, bs)
	want[5] = 3
	assert.Equal(t, want, p, "the head holds the whole block")
	_, err = r.ReadLayer("a", p, 8*bs)
	require.NoError(t, err)
	assert.Equal(t, bytes.Repeat([]byte{2}, bs), p)
	_, err = r.Extents("nosuch")
	assert.ErrorIs(t, err, ErrSnapshotNotFound)
	_, err = r.ReadLayer("a", p, 16*bs)
	assert.ErrorIs(t, err, blockdev.ErrOutOfRange)
}

// The backing file reads as a layer of its own (BackingName): its data
// extents, partly used last block whole, and zeros past its end.
func TestExtentsAndReadLayerOfBackingFile(t *testing.T) {
	back := filepath.Join(t.TempDir(), "backing")
	f, err := os.Create(back)
	require.NoError(t, err)
	_, err = f.WriteAt(bytes.Repeat([]byte{5}, bs), 0)
	require.NoError(t, err)
	_, err = f.WriteAt(bytes.Repeat([]byte{6}, 100), 4*bs) // blocks 1-3 a hole, 4 partly used
	require.NoError(t, err)
	require.NoError(t, f.Close())
	r, err := Create(filepath.Join(t.TempDir(), "r"), 8*bs, CreateOptions{BackingFile: back})
	require.NoError(t, err)
	defer r.Close()
	fillBlocks(t, r, 0, 1, 9) // the head's data does not show in the backing layer

	exts, err := r.Extents(BackingName)
	require.NoError(t, err)
	assert.Equal(t, []Extent{{0, bs}, {4 * bs, bs}}, exts)
	p := make([]byte, 2*bs)
	_, err = r.ReadLayer(BackingName, p, 4*bs)
	require.NoError(t, err)
	want := make([]byte, 2*bs)
	copy(want, bytes.Repeat([]byte{6}, 100))
	assert.Equal(t, want, p, "the backing file's bytes, then zeros past its end")
	_, err = r.ReadLayer(BackingName, p, 0)
	require.NoError(t, err)
	assert.Equal(t, bytes.Repeat([]byte{5}, bs), p[:bs])
	info, err := r.Chain()
	require.NoError(t, err)
	assert.Equal(t, int64(4*bs+100), info.BackingSize)
	assert.Equal(t, back, info.BackingFile)

	plain, _ := newReplica(t, 8)
	_, err = plain.Extents(BackingName)
	assert.ErrorIs(t, err, ErrSnapshotNotFound, "no backing file, no backing layer")
	_, err = plain.ReadLayer(BackingName, p, 0)
	assert.ErrorIs(t, err, ErrSnapshotNotFound)
}

func TestExpand(t *testing.T) {
	r, dir := newReplica(t, 4)
	fillBlocks(t, r, 3, 1, 1)
	require.NoError(t, r.Snapshot("a", SnapshotOptions{}))
	assert.Error(t, r.Expand(2*bs), "shrink")
	assert.Error(t, r.Expand(8*bs+1), "unaligned")
	require.NoError(t, r.Expand(8*bs))
	assert.Equal(t, int64(8*bs), r.Size())
	fillBlocks(t, r, 7, 1, 2)
	require.NoError(t, r.Close())
	r, err := Open(dir)
	require.NoError(t, err)
	defer r.Close()
	assert.Equal(t, []byte{0, 0, 0, 1, 0, 0, 0, 2}, blockVals(t, r))
	require.NoError(t, r.Revert("a"))
	assert.Equal(t, []byte{0, 0, 0, 1, 0, 0, 0, 0}, blockVals(t, r), "the new space of an older snapshot reads zeros")
}

func TestCreateAndIOErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := Create(filepath.Join(dir, "a"), bs+1, CreateOptions{})
	assert.Error(t, err)
	_, err = Create(filepath.Join(dir, "b"), 0, CreateOptions{})
	assert.Error(t, err)
	back := filepath.Join(dir, "back")
	require.NoError(t, os.WriteFile(back, make([]byte, 2*bs), 0o644))
	_, err = Create(filepath.Join(dir, "c"), bs, CreateOptions{BackingFile: back})
	assert.ErrorContains(t, err, "larger than the volume")
	_, err = Create(filepath.Join(dir, "d"), bs, CreateOptions{BackingFile: filepath.Join(dir, "nosuch")})
	assert.Error(t, err)

	r, err := Create(filepath.Join(dir, "e"), 4*bs, CreateOptions{})
	require.NoError(t, err)
	_, err = Create(filepath.Join(dir, "e"), 4*bs, CreateOptions{})
	assert.ErrorIs(t, err, ErrExists)
	for _, f := range []func() error{
		func() error { _, err := r.WriteAt([]byte{1}, 4*bs); return err },
		func() error { _, err := r.ReadAt(make([]byte, 2), 4*bs-1); return err },
		func() error { return r.WriteZeroes(-1, 1) },
		func() error { return r.Unmap(0, 4*bs+1) },
	} {
		assert.ErrorIs(t, f(), blockdev.ErrOutOfRange)
	}
	n, err := r.WriteAt(nil, 4*bs)
	assert.NoError(t, err)
	assert.Zero(t, n)
	require.NoError(t, r.Close())
	require.NoError(t, r.Close())
	_, err = r.ReadAt(make([]byte, 1), 0)
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, r.Snapshot("x", SnapshotOptions{}), ErrClosed)
	assert.ErrorIs(t, r.Flush(), ErrClosed)
}

func TestOpenGrowsShortHead(t *testing.T) {
	// An expand that crashed after committing volume.meta, or a head whose
	// size was not yet durable: Open makes the head whole.
	r, dir := newReplica(t, 4)
	fillBlocks(t, r, 0, 1, 1)
	require.NoError(t, r.Close())
	truncate(t, dir, "volume-head-000.img", bs)
	r, err := Open(dir)
	require.NoError(t, err)
	defer r.Close()
	fillBlocks(t, r, 3, 1, 2)
	assert.Equal(t, []byte{1, 0, 0, 2}, blockVals(t, r))
}

func TestSnapshotIsALink(t *testing.T) {
	// O(1): the snapshot is the old head's inode, not a copy of it.
	r, dir := newReplica(t, 256)
	fillBlocks(t, r, 0, 256, 1)
	ino := func(f string) uint64 {
		st, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err)
		return st.Sys().(*syscall.Stat_t).Ino
	}
	head := ino("volume-head-000.img")
	require.NoError(t, r.Snapshot("a", SnapshotOptions{}))
	assert.Equal(t, head, ino("volume-snap-a.img"))
	_, err := os.Stat(filepath.Join(dir, "volume-head-000.img"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the old head's name is gone")
	exts, err := r.Extents(HeadName)
	require.NoError(t, err)
	assert.Empty(t, exts, "the new head is empty")
}
