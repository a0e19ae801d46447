package backupstore

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

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
