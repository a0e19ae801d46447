package replica

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A replica whose backing file moved (its disk remounted at another path)
// opens on the new path, which is recorded; a wrong file is refused and
// changes nothing.
func TestOpenWithBackingFileFollowsAMove(t *testing.T) {
	base := t.TempDir()
	img := make([]byte, 1<<20)
	for i := range img {
		img[i] = byte(i % 251)
	}
	oldPath := filepath.Join(base, "old", "backing")
	require.NoError(t, os.MkdirAll(filepath.Dir(oldPath), 0o755))
	require.NoError(t, os.WriteFile(oldPath, img, 0o644))
	dir := filepath.Join(base, "replica")
	r, err := Create(dir, 4<<20, CreateOptions{BackingFile: oldPath})
	require.NoError(t, err)
	require.NoError(t, r.Close())

	newPath := filepath.Join(base, "new", "backing")
	require.NoError(t, os.MkdirAll(filepath.Dir(newPath), 0o755))
	require.NoError(t, os.Rename(oldPath, newPath))
	_, err = Open(dir)
	require.Error(t, err, "the recorded path is gone")

	tooBig := filepath.Join(base, "big")
	require.NoError(t, os.WriteFile(tooBig, make([]byte, 8<<20), 0o644))
	_, err = OpenWithBackingFile(dir, tooBig)
	require.ErrorContains(t, err, "larger than the volume")

	r, err = OpenWithBackingFile(dir, newPath)
	require.NoError(t, err)
	buf := make([]byte, 4096)
	_, err = r.ReadAt(buf, 8192)
	require.NoError(t, err)
	assert.Equal(t, img[8192:8192+4096], buf, "reads come from the moved file")
	require.NoError(t, r.Close())

	r, err = Open(dir)
	require.NoError(t, err, "the new path was recorded")
	assert.Equal(t, newPath, r.vol.BackingFile)
	require.NoError(t, r.Close())
}
