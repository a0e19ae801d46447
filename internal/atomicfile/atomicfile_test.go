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

func TestMkdirAll(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, base string) string // returns the directory to make
		wantErr bool
		perm    os.FileMode // of the directory afterwards
	}{
		{"new, with missing parents", func(t *testing.T, base string) string {
			return filepath.Join(base, "a", "b", "c")
		}, false, 0o700},
		{"existing is left as it is", func(t *testing.T, base string) string {
			dir := filepath.Join(base, "kept")
			require.NoError(t, os.Mkdir(dir, 0o755))
			return dir
		}, false, 0o755},
		{"through a regular file", func(t *testing.T, base string) string {
			require.NoError(t, os.WriteFile(filepath.Join(base, "file"), nil, 0o600))
			return filepath.Join(base, "file", "d")
		}, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.setup(t, t.TempDir())
			err := MkdirAll(dir, 0o700)
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			st, err := os.Stat(dir)
			require.NoError(t, err)
			assert.True(t, st.IsDir())
			assert.Equal(t, tt.perm, st.Mode().Perm())
		})
	}
}
