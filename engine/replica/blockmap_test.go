package replica

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The paged maps behave as flat ones would, across page boundaries, and
// allocate pages only where bits are set or owners are non-zero.
func TestBitmapMatchesFlatModel(t *testing.T) {
	const n = 3*pageBlocks + 100 // a partial last page
	type op struct {
		set  bool
		b, e int64
	}
	tests := []struct {
		name      string
		ops       []op
		wantPages int
	}{
		{"empty", nil, 0},
		{"one bit", []op{{true, 5, 6}}, 1},
		{"a run across a page boundary", []op{{true, pageBlocks - 3, pageBlocks + 70}}, 2},
		{"set then cleared keeps its page", []op{{true, 2 * pageBlocks, 2*pageBlocks + 64}, {false, 2 * pageBlocks, 2*pageBlocks + 64}}, 1},
		{"clear over missing pages allocates none", []op{{false, 0, n}}, 0},
		{"the last, partial page", []op{{true, n - 10, n}}, 1},
		{"holes punched in a long run", []op{{true, 10, n - 10}, {false, pageBlocks, pageBlocks + 1}, {false, 2*pageBlocks - 63, 2*pageBlocks + 2}}, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, flat := newBitmap(n), make([]bool, n)
			for _, o := range tt.ops {
				if o.set {
					m.set(o.b, o.e)
				} else {
					m.clear(o.b, o.e)
				}
				for b := o.b; b < o.e; b++ {
					flat[b] = o.set
				}
			}
			for b := int64(0); b < n; b++ {
				require.Equal(t, flat[b], m.has(b), "bit %d", b)
			}
			// runEnd from a few starts, both polarities, against the model.
			for _, start := range []int64{0, 5, 10, pageBlocks - 3, pageBlocks, 2*pageBlocks - 63, n - 10, n - 1} {
				for _, set := range []bool{true, false} {
					want := start
					for want < n && flat[want] == set {
						want++
					}
					assert.Equal(t, want, m.runEnd(start, n, set), "runEnd(%d, %v)", start, set)
				}
			}
			assert.Equal(t, tt.wantPages, allocatedBitPages(m))
		})
	}
}

func allocatedBitPages(m *bitmap) int {
	n := 0
	for i := range m.pages {
		if m.pages[i].Load() != nil {
			n++
		}
	}
	return n
}

func TestOwnerMapMatchesFlatModel(t *testing.T) {
	const n = 2*pageBlocks + 7
	type fill struct {
		b, e int64
		v    uint16
	}
	tests := []struct {
		name      string
		fills     []fill
		replace   [2]uint16 // from, to; zero: none
		wantPages int
	}{
		{"empty", nil, [2]uint16{}, 0},
		{"zeros allocate nothing", []fill{{0, n, 0}}, [2]uint16{}, 0},
		{"a layer across a page boundary", []fill{{pageBlocks - 2, pageBlocks + 2, 3}}, [2]uint16{}, 2},
		{"a higher layer over part", []fill{{0, 100, 1}, {50, 60, 2}}, [2]uint16{}, 1},
		{"coalesce replaces a slot", []fill{{0, 100, 1}, {50, 60, 2}, {n - 3, n, 1}}, [2]uint16{1, 4}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, flat := newOwnerMap(n), make([]uint16, n)
			for _, f := range tt.fills {
				m.fill(f.b, f.e, f.v)
				for b := f.b; b < f.e; b++ {
					flat[b] = f.v
				}
			}
			if from, to := tt.replace[0], tt.replace[1]; from != 0 {
				m.replace(from, to)
				for b := range flat {
					if flat[b] == from {
						flat[b] = to
					}
				}
			}
			for b := int64(0); b < n; b++ {
				require.Equal(t, flat[b], m.get(b), "block %d", b)
			}
			for _, start := range []int64{0, 49, 50, pageBlocks - 2, pageBlocks, n - 3} {
				want, lower := start, flat[start] != 0
				for want < n && flat[want] == flat[start] {
					want++
				}
				assert.Equal(t, want, m.runEnd(start, n, flat[start]), "runEnd(%d)", start)
				want = start
				for want < n && (flat[want] != 0) == lower {
					want++
				}
				assert.Equal(t, want, m.lowerRunEnd(start, n, lower), "lowerRunEnd(%d)", start)
			}
			pages := 0
			for _, p := range m.pages {
				if p != nil {
					pages++
				}
			}
			assert.Equal(t, tt.wantPages, pages)
		})
	}
}

// Issue 24: an Expand to about 15 TiB allocated about 8 GiB (a flat
// location map) and got the instance manager killed. Now it costs the page
// tables, and the data stays readable.
func TestExpandToHugeSizeAllocatesLittle(t *testing.T) {
	r, _ := newReplica(t, 256)
	fillBlocks(t, r, 10, 4, 0x5a)
	const huge = 15 << 40
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	require.NoError(t, r.Expand(huge))
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	assert.Less(t, allocated, uint64(16<<20), "Expand to 15 TiB allocated %d bytes", allocated)
	assert.EqualValues(t, huge, r.Size())

	p := make([]byte, bs)
	_, err := r.ReadAt(p, 11*bs)
	require.NoError(t, err)
	assert.Equal(t, byte(0x5a), p[0], "data written before the expand")
	_, err = r.WriteAt(p, huge-bs)
	require.NoError(t, err, "the last block of the new size takes a write")
	_, err = r.ReadAt(p, huge-2*bs)
	require.NoError(t, err)
	assert.Equal(t, make([]byte, bs), p, "new space reads zeros")
}

// Issue 24: layers were 0644 in 0755 directories, readable by every local
// user. New replicas are the owner's only, and opening an older replica
// takes group and other access away.
func TestReplicaFileModes(t *testing.T) {
	tests := []struct {
		name  string
		older bool // made with the old modes, then reopened
	}{
		{"created", false},
		{"reopened from before", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, dir := newReplica(t, 16)
			fillBlocks(t, r, 0, 1, 1)
			require.NoError(t, r.Snapshot("s1", SnapshotOptions{}))
			if tt.older {
				require.NoError(t, r.Close())
				loosen(t, dir)
				var err error
				r, err = Open(dir)
				require.NoError(t, err)
				t.Cleanup(func() { r.Close() })
			}
			assertMode(t, dir, dirMode)
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			require.NotEmpty(t, entries)
			for _, e := range entries {
				assertMode(t, filepath.Join(dir, e.Name()), fileMode)
			}
		})
	}
}

func loosen(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, os.Chmod(dir, 0o755))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		require.NoError(t, os.Chmod(filepath.Join(dir, e.Name()), 0o644))
	}
}

func assertMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, want, st.Mode().Perm(), path)
}
