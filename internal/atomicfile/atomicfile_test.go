package atomicfile

import (
	"errors"
	"io"
	"io/fs"
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

var errBoom = errors.New("boom")

// WriteFunc and CreateFunc give the file perm exactly (chmod, which the
// umask does not narrow) and leave no temp file; CreateFunc refuses a path
// that exists with an error wrapping fs.ErrExist and leaves it untouched.
func TestWriteAndCreateFunc(t *testing.T) {
	write := func(s string) func(io.Writer) error {
		return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
	}
	tests := []struct {
		name     string
		existing string // content of the path before; "" for none
		call     func(path string) error
		wantErr  error // nil: success
		want     string
	}{
		{"write a new file", "", func(p string) error { return WriteFunc(p, 0o600, write("new")) }, nil, "new"},
		{"write over a file", "old", func(p string) error { return WriteFunc(p, 0o600, write("new")) }, nil, "new"},
		{"create a new file", "", func(p string) error { return CreateFunc(p, 0o600, write("new")) }, nil, "new"},
		{"create over a file", "old", func(p string) error { return CreateFunc(p, 0o600, write("new")) }, fs.ErrExist, "old"},
		{"a failed write", "old", func(p string) error {
			return WriteFunc(p, 0o600, func(io.Writer) error { return errBoom })
		}, errBoom, "old"},
		{"a failed create", "", func(p string) error {
			return CreateFunc(p, 0o600, func(io.Writer) error { return errBoom })
		}, errBoom, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "obj")
			if tt.existing != "" {
				require.NoError(t, os.WriteFile(path, []byte(tt.existing), 0o600))
			}
			err := tt.call(path)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
			} else {
				require.NoError(t, err)
			}
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			if tt.want == "" {
				assert.Empty(t, entries, "nothing left behind")
				return
			}
			assert.Len(t, entries, 1, "no temp file left beside it")
			got, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(got))
			st, err := os.Stat(path)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
		})
	}
}

func TestRemove(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the path to remove
	}{
		{"a file", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "f")
			require.NoError(t, os.WriteFile(p, nil, 0o600))
			return p
		}},
		{"a missing file", func(t *testing.T, dir string) string { return filepath.Join(dir, "f") }},
		{"in a missing directory", func(t *testing.T, dir string) string { return filepath.Join(dir, "gone", "f") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.setup(t, t.TempDir())
			require.NoError(t, Remove(p))
			_, err := os.Lstat(p)
			assert.ErrorIs(t, err, fs.ErrNotExist)
		})
	}
}
