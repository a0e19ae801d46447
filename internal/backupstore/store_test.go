package backupstore

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPutIfAbsentRaceHasOneWinner(t *testing.T) {
	fs, err := NewFileStore(t.TempDir())
	require.NoError(t, err)
	for round := range 20 {
		key := fmt.Sprintf("backups/v/b%d.manifest", round)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[w] = fs.PutIfAbsent(context.Background(), key, []byte{byte(w)})
			}()
		}
		wg.Wait()
		wins := 0
		for w, err := range errs {
			if err == nil {
				wins++
				rc, err := fs.Get(context.Background(), key)
				require.NoError(t, err)
				got, _ := io.ReadAll(rc)
				rc.Close()
				assert.Equal(t, []byte{byte(w)}, got, "the winner's content is stored")
			} else {
				assert.ErrorIs(t, err, ErrExists)
			}
		}
		assert.Equal(t, 1, wins)
	}
}

func TestFileStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	fs, err := NewFileStore(dir)
	require.NoError(t, err)
	require.NoError(t, fs.Put(ctx, "a/b/c", bytes.NewReader([]byte("hello")), 5))
	require.NoError(t, fs.Put(ctx, "a/bc", bytes.NewReader([]byte("x")), 1))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a", ".tmp-partial"), []byte("x"), 0o644))

	objs, err := fs.List(ctx, "a/b")
	require.NoError(t, err)
	assert.Equal(t, []string{"a/b/c", "a/bc"}, keys(objs), "temp files are not listed")
	objs, err = fs.List(ctx, "nothing/")
	require.NoError(t, err)
	assert.Empty(t, objs)

	rc, err := fs.GetRange(ctx, "a/b/c", 1, 3)
	require.NoError(t, err)
	got, _ := io.ReadAll(rc)
	rc.Close()
	assert.Equal(t, "ell", string(got))

	_, err = fs.Get(ctx, "a/missing")
	assert.ErrorIs(t, err, ErrNotFound)
	_, err = fs.Stat(ctx, "a/missing")
	assert.ErrorIs(t, err, ErrNotFound)
	assert.NoError(t, fs.Delete(ctx, "a/missing"), "deleting a missing key is not an error")
	assert.ErrorContains(t, fs.Put(ctx, "a/short", bytes.NewReader([]byte("ab")), 3), "wrote 2 bytes, want 3")
	_, err = fs.Stat(ctx, "a/short")
	assert.ErrorIs(t, err, ErrNotFound, "a failed put leaves nothing")

	for _, bad := range []string{"", "/abs", "a/../b", "a//b", ".hidden", "a/./b"} {
		assert.Error(t, fs.Put(ctx, bad, bytes.NewReader(nil), 0), "key %q", bad)
	}

	require.NoError(t, os.RemoveAll(dir))
	_, err = fs.List(ctx, "a/")
	assert.Error(t, err, "a vanished root is an error, not an empty listing")
}

func keys(objs []ObjectInfo) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.Key)
	}
	return out
}

func TestOpenKeepsTheTargetsChunkSize(t *testing.T) {
	fs, err := NewFileStore(t.TempDir())
	require.NoError(t, err)
	ctx := context.Background()
	tgt, err := Open(ctx, fs, Options{ChunkSize: 128 << 10})
	require.NoError(t, err)
	assert.Equal(t, int64(128<<10), tgt.Format().ChunkSize)
	again, err := Open(ctx, fs, Options{})
	require.NoError(t, err)
	assert.Equal(t, int64(128<<10), again.Format().ChunkSize)
	_, err = Open(ctx, fs, Options{ChunkSize: 1 << 20})
	assert.ErrorContains(t, err, "chunk size is fixed")
	_, err = Open(ctx, fs, Options{ChunkSize: 100})
	assert.ErrorContains(t, err, "chunkSize 100")
}

// Issue 46: a file:// target holds the users' volume data, so everything
// the store writes is its owner's only: every file 0600 and every
// directory it created 0700, whatever the umask (which only narrows) and
// whatever the write path (Put, PutIfAbsent, a whole backup through a
// Target). Directories that were there before are left as they are.
func TestFileStoreWritesPrivately(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		existing []string // directories made (0755) before the writes
		write    func(t *testing.T, s *FileStore)
	}{
		{"put", nil, func(t *testing.T, s *FileStore) {
			require.NoError(t, s.Put(ctx, "a/b/c", bytes.NewReader([]byte("hello")), 5))
		}},
		{"put again over the object", nil, func(t *testing.T, s *FileStore) {
			for _, data := range []string{"one", "two"} {
				require.NoError(t, s.Put(ctx, "inflight/v/b", bytes.NewReader([]byte(data)), int64(len(data))))
			}
		}},
		{"put if absent", nil, func(t *testing.T, s *FileStore) {
			require.NoError(t, s.PutIfAbsent(ctx, "backups/v/b.manifest", []byte("{}")))
			assert.ErrorIs(t, s.PutIfAbsent(ctx, "backups/v/b.manifest", []byte("{}")), ErrExists)
		}},
		{"under a directory that was there", []string{"packs"}, func(t *testing.T, s *FileStore) {
			require.NoError(t, s.Put(ctx, "packs/ab/x", bytes.NewReader([]byte("x")), 1))
		}},
		{"a backup, then a GC", nil, func(t *testing.T, s *FileStore) {
			tgt, err := Open(ctx, s, Options{ChunkSize: testChunk, PackSize: 4 * testChunk})
			require.NoError(t, err)
			for _, b := range []string{"b1", "b2"} {
				data := volume(30, 8*testChunk)
				_, err := tgt.Backup(ctx, BackupInput{Volume: "v", Backup: b, Snapshot: "s-" + b, Size: int64(len(data)),
					Source: bytes.NewReader(data)})
				require.NoError(t, err)
			}
			require.NoError(t, tgt.DeleteBackup(ctx, "v", "b1"))
			_, err = tgt.GC(ctx, GCOptions{Now: time.Now().Add(48 * time.Hour)})
			require.NoError(t, err)
			m, err := tgt.LoadManifest(ctx, "v", "b2")
			require.NoError(t, err)
			_, err = tgt.Verify(ctx, m, 2)
			require.NoError(t, err, "what the store wrote reads back")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			before := map[string]bool{root: true}
			for _, d := range tt.existing {
				p := filepath.Join(root, d)
				require.NoError(t, os.Mkdir(p, 0o755))
				before[p] = true
			}
			s, err := NewFileStore(root)
			require.NoError(t, err)
			tt.write(t, s)

			files := 0
			require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				require.NoError(t, err)
				fi, err := d.Info()
				require.NoError(t, err)
				switch {
				case d.IsDir() && before[p]:
				case d.IsDir():
					assert.Equal(t, fs.FileMode(0o700), fi.Mode().Perm(), "directory %s", p)
				default:
					files++
					assert.Equal(t, fs.FileMode(0o600), fi.Mode().Perm(), "file %s", p)
					assert.False(t, strings.HasPrefix(d.Name(), "."), "no temp file left: %s", p)
				}
				return nil
			}))
			assert.NotZero(t, files)
			for _, d := range tt.existing {
				fi, err := os.Stat(filepath.Join(root, d))
				require.NoError(t, err)
				assert.Equal(t, fs.FileMode(0o755), fi.Mode().Perm(), "a directory that was there keeps its mode")
			}
		})
	}
}
