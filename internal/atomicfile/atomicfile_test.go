package atomicfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWriteFileReplacesAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "record")
	for _, content := range []string{"first\n", "second\n"} {
		require.NoError(t, WriteFile(path, []byte(content)))
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, content, string(got))
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temp file left beside it")

	require.Error(t, WriteFile(filepath.Join(dir, "missing", "x"), nil), "a missing directory is an error")
}
