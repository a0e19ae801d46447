package imserver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/strata-storage/strata/engineapi"
)

// With a FUSE directory, an exported volume is also a file there holding
// the engine's bytes; stopping the frontend takes the file away, and an
// instance manager that starts finds no stale mount in its way.
func TestVolumeServedAsAFile(t *testing.T) {
	fuseDir := filepath.Join(t.TempDir(), "fuse")
	im := newTestIM(t, Options{FUSEDir: fuseDir})
	ctx := context.Background()
	rep := im.createReplica(t, "r", 4*mib)
	req := engineReq("e", 4*mib, map[string]string{"r": rep.Address})
	req.Frontend = "nbd"
	_, err := im.c.InstanceCreate(ctx, req)
	require.NoError(t, err)
	_, err = im.engine(t, "e").WriteAt(pattern(0x6b, mib), mib)
	require.NoError(t, err)

	file := engineapi.FUSEFile(fuseDir, "vol")
	st, err := os.Stat(file)
	require.NoError(t, err)
	assert.EqualValues(t, 4*mib, st.Size())
	// A plain blocking descriptor, as a loop device reads it.
	fd, err := unix.Open(file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	got := make([]byte, mib)
	_, err = unix.Pread(fd, got, mib)
	require.NoError(t, err)
	require.NoError(t, unix.Close(fd))
	assert.Equal(t, pattern(0x6b, mib), got, "the file reads the engine")

	_, err = im.c.FrontendStop(ctx, "e")
	require.NoError(t, err)
	_, err = os.Stat(file)
	assert.ErrorIs(t, err, os.ErrNotExist, "no file without a frontend")
	_, err = im.c.FrontendStart(ctx, "e", "nbd")
	require.NoError(t, err)
	_, err = os.Stat(file)
	require.NoError(t, err, "the file is back with the frontend")

	_, err = im.c.InstanceDelete(ctx, "e")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Dir(file))
	assert.ErrorIs(t, err, os.ErrNotExist, "an engine's deletion removes its directory")
}

// An instance manager refuses a relative FUSE directory.
func TestFUSEDirMustBeAbsolute(t *testing.T) {
	_, err := New(Options{StateDir: t.TempDir(), DiskPaths: []string{t.TempDir()}, NBDSocket: testNBDSocket, FUSEDir: "fuse"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--fuse-dir")
}
