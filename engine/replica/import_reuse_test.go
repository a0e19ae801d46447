package replica

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// copyReplicaDir copies a closed or flushed replica directory block for
// block: layer images keep exactly their allocated blocks (zero blocks
// included, which cp --sparse=always would turn into holes).
func copyReplicaDir(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dst, 0o755))
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if !strings.HasSuffix(e.Name(), imgSuffix) {
			data, err := os.ReadFile(from)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(to, data, 0o644))
			continue
		}
		in, err := os.Open(from)
		require.NoError(t, err)
		st, err := in.Stat()
		require.NoError(t, err)
		out, err := os.Create(to)
		require.NoError(t, err)
		require.NoError(t, out.Truncate(st.Size()))
		exts, err := dataExtents(in, st.Size())
		require.NoError(t, err)
		for _, x := range exts {
			buf := make([]byte, x.Length)
			require.NoError(t, readFull(in, buf, x.Offset))
			_, err := out.WriteAt(buf, x.Offset)
			require.NoError(t, err)
		}
		require.NoError(t, in.Close())
		require.NoError(t, out.Close())
	}
}

// TestImportReuse rebuilds a replica T that failed after it and S took
// snapshots s1 and s2 (with the same IDs, as an engine sends them) and
// diverged in its head: S then goes on as each case says, takes the rebuild
// snapshot, and T imports it keeping what it has with the same name and ID.
// T must end up with S's chain and content, its kept layers still being its
// own files, and nothing else of its own.
func TestImportReuse(t *testing.T) {
	snap := func(t *testing.T, r *Replica, name string, id string) {
		t.Helper()
		require.NoError(t, r.Snapshot(name, SnapshotOptions{UserCreated: true, ID: id}))
	}
	purge := func(t *testing.T, r *Replica) { require.NoError(t, r.Purge(t.Context(), nil)) }
	cases := []struct {
		name         string
		both         func(t *testing.T, r *Replica, id string) // before T fails, with a shared ID
		onT, onS     func(t *testing.T, r *Replica)
		kept, copied []string
	}{
		{name: "nothing new on S but writes",
			kept: []string{"s1", "s2"}, copied: []string{"rebuild-x"}},
		{name: "S took another snapshot",
			onS:  func(t *testing.T, s *Replica) { fillBlocks(t, s, 50, 2, 0x33); snap(t, s, "s3", NewLayerID()) },
			kept: []string{"s1", "s2"}, copied: []string{"s3", "rebuild-x"}},
		{name: "S removed s2 without purging: kept, removed as on S",
			onS:  func(t *testing.T, s *Replica) { require.NoError(t, s.RemoveSnapshot("s2")) },
			kept: []string{"s1", "s2"}, copied: []string{"rebuild-x"}},
		{name: "S coalesced s1 into s2: s2 is copied, T's s1 dropped",
			onS:  func(t *testing.T, s *Replica) { require.NoError(t, s.RemoveSnapshot("s1")); purge(t, s) },
			kept: nil, copied: []string{"s2", "rebuild-x"}},
		{name: "S pruned s2 under its head: s2 is copied",
			onS: func(t *testing.T, s *Replica) {
				require.NoError(t, s.RemoveSnapshot("s2"))
				fillBlocks(t, s, 8, 4, 0x44) // over s2's blocks: pruned from s2
				purge(t, s)
			},
			kept: []string{"s1"}, copied: []string{"s2", "rebuild-x"}},
		{name: "T has snapshots S never had: dropped",
			onT: func(t *testing.T, tr *Replica) {
				snap(t, tr, "t-only", NewLayerID())
				fillBlocks(t, tr, 60, 2, 0x55)
				snap(t, tr, "t-only2", NewLayerID())
			},
			kept: []string{"s1", "s2"}, copied: []string{"rebuild-x"}},
		{name: "S reused the name s2 for other content",
			onS: func(t *testing.T, s *Replica) {
				require.NoError(t, s.RemoveSnapshot("s2"))
				fillBlocks(t, s, 20, 2, 0x66)
				snap(t, s, "s3", NewLayerID())
				purge(t, s) // s2 into s3
				fillBlocks(t, s, 22, 2, 0x67)
				snap(t, s, "s2", NewLayerID())
			},
			kept: []string{"s1"}, copied: []string{"s3", "s2", "rebuild-x"}},
		{name: "a snapshot each replica took without a shared ID is copied",
			both: func(t *testing.T, r *Replica, _ string) { fillBlocks(t, r, 45, 1, 0x12); snap(t, r, "s3", "") },
			kept: []string{"s1", "s2"}, copied: []string{"s3", "rebuild-x"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const size = 64 * bs
			base := t.TempDir()
			s, err := Create(filepath.Join(base, "s"), size, CreateOptions{})
			require.NoError(t, err)
			defer s.Close()
			tr, err := Create(filepath.Join(base, "t"), size, CreateOptions{})
			require.NoError(t, err)
			defer func() { tr.Close() }()
			for _, r := range []*Replica{s, tr} {
				fillBlocks(t, r, 0, 16, 0x11)
			}
			id := NewLayerID()
			for _, r := range []*Replica{s, tr} {
				snap(t, r, "s1", id)
			}
			id = NewLayerID()
			for _, r := range []*Replica{s, tr} {
				fillBlocks(t, r, 8, 16, 0x22)
				require.NoError(t, r.WriteZeroes(2*bs, bs)) // a zero block hiding s1's
				snap(t, r, "s2", id)
				fillBlocks(t, r, 30, 2, 0x23)
			}
			if tc.both != nil {
				id = NewLayerID()
				for _, r := range []*Replica{s, tr} {
					tc.both(t, r, id)
				}
			}
			// T fails; its head took a write S never saw.
			fillBlocks(t, tr, 40, 2, 0x99)
			if tc.onT != nil {
				tc.onT(t, tr)
			}
			fillBlocks(t, s, 12, 2, 0x24)
			if tc.onS != nil {
				tc.onS(t, s)
			}
			before := map[string]os.FileInfo{}
			for name, l := range chainView(t, tr) {
				if name != HeadName {
					st, err := os.Stat(filepath.Join(base, "t", snapFileName(l.Name)))
					require.NoError(t, err)
					before[name] = st
				}
			}

			require.ErrorIs(t, tr.BeginImport(ImportOptions{}), ErrNotEmpty, "only with Reuse")
			require.NoError(t, tr.BeginImport(ImportOptions{Reuse: true}))
			snap(t, s, "rebuild-x", NewLayerID())
			buf := make([]byte, size)
			for _, op := range []importOp{{'w', 41 * bs, 3 * bs, 1}, {'w', 5, 100, 2}, {'z', 9 * bs, bs, 0}, {'u', 30 * bs, 2 * bs, 0}} {
				require.NoError(t, both(s, tr, op, buf))
			}
			imported, err := copyLayers(s, tr, func() {})
			require.NoError(t, err)
			var kept, copied []string
			for _, l := range imported {
				if l.Keep {
					kept = append(kept, l.Name)
				} else {
					copied = append(copied, l.Name)
				}
			}
			require.ElementsMatch(t, tc.kept, kept, "kept")
			require.ElementsMatch(t, tc.copied, copied, "copied")
			require.NoError(t, tr.CommitImport(imported, "rebuild-x"))
			fillBlocks(t, s, 3, 1, 0x31)
			fillBlocks(t, tr, 3, 1, 0x31)
			requireSameReplica(t, s, tr, nil)
			for _, name := range kept {
				st, err := os.Stat(filepath.Join(base, "t", snapFileName(name)))
				require.NoError(t, err)
				require.True(t, os.SameFile(before[name], st), "kept layer %s is T's own file", name)
			}

			require.NoError(t, tr.Close())
			tr, err = Open(filepath.Join(base, "t"))
			require.NoError(t, err)
			requireSameReplica(t, s, tr, nil)
			info, err := tr.Chain()
			require.NoError(t, err)
			assertNoLeftovers(t, filepath.Join(base, "t"), info)
		})
	}
}

// CommitImport keeps only what the replica has with the ID the source
// gives; anything else is refused and the import aborted, the replica's
// snapshots untouched.
func TestImportReuseRefusals(t *testing.T) {
	tr, _ := newReplica(t, 16)
	fillBlocks(t, tr, 0, 2, 1)
	id := NewLayerID()
	require.NoError(t, tr.Snapshot("s1", SnapshotOptions{ID: id}))
	require.NoError(t, tr.Snapshot("s2", SnapshotOptions{}))
	for _, tc := range []struct {
		name   string
		layers []ImportLayer
	}{
		{"another ID", []ImportLayer{{Name: "s1", ID: NewLayerID(), Keep: true}}},
		{"no ID", []ImportLayer{{Name: "s1", Keep: true}}},
		{"a layer it lacks", []ImportLayer{{Name: "s9", ID: id, Keep: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, tr.BeginImport(ImportOptions{Reuse: true}))
			require.ErrorIs(t, tr.CommitImport(tc.layers, tc.layers[0].Name), ErrBadImport)
			require.False(t, tr.Importing())
			ls := layers(t, tr)
			require.Contains(t, ls, "s1")
			require.Contains(t, ls, "s2")
			require.Equal(t, id, ls["s1"].ID)
		})
	}
	require.ErrorIs(t, tr.Purge(t.Context(), nil), nil)
	require.NoError(t, tr.BeginImport(ImportOptions{Reuse: true}))
	require.ErrorIs(t, tr.Purge(t.Context(), nil), ErrImporting)
	require.ErrorIs(t, tr.Revert("s1"), ErrImporting)
}
