package unixsock

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestListen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	path := filepath.Join(dir, "s.sock")
	l, err := Listen(path, Options{DirMode: 0o700, Mode: 0o600})
	require.NoError(t, err)
	for p, want := range map[string]os.FileMode{dir: os.ModeDir | 0o700, filepath.Dir(dir): os.ModeDir | 0o700, path: os.ModeSocket | 0o600} {
		st, err := os.Stat(p)
		require.NoError(t, err)
		assert.Equal(t, want, st.Mode()&(os.ModeType|os.ModePerm), p)
	}
	_, err = Listen(path, Options{DirMode: 0o700})
	require.ErrorContains(t, err, "another process serves this socket")
	l.SetUnlinkOnClose(false) // as a process killed with -9 leaves it
	require.NoError(t, l.Close())
	l, err = Listen(path, Options{DirMode: 0o700})
	require.NoError(t, err, "a stale socket is replaced")
	require.NoError(t, l.Close())
	assert.NoFileExists(t, path, "closing removes the socket")

	file := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	_, err = Listen(file, Options{DirMode: 0o700})
	require.ErrorContains(t, err, "exists and is not a socket")

	_, err = Listen("/tmp/"+strings.Repeat("x", MaxPath), Options{DirMode: 0o700})
	require.ErrorContains(t, err, "over the 107 a unix socket path may have")
}
