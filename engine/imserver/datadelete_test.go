package imserver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi"
)

func TestReplicaDataDelete(t *testing.T) {
	im := newTestIM(t, Options{})
	ctx := context.Background()
	im.createReplica(t, "live", 4*mib)

	// stopped makes the directory of a replica that ran and was stopped.
	stopped := func(t *testing.T, name string) string {
		im.createReplica(t, name, 4*mib)
		_, err := im.c.InstanceDelete(ctx, name)
		require.NoError(t, err)
		return im.replicaDir(name)
	}
	tests := []struct {
		name    string
		setup   func(t *testing.T) string // returns the data_dir to delete
		wantErr error
		gone    bool // the directory no longer exists afterwards
	}{
		{"missing directory is success", func(t *testing.T) string { return filepath.Join(t.TempDir(), "never") }, nil, true},
		{"stopped replica", func(t *testing.T) string { return stopped(t, "stopped") }, nil, true},
		{"empty directory", func(t *testing.T) string { return t.TempDir() }, nil, true},
		{"interrupted delete: only volume.meta left", func(t *testing.T) string {
			dir := stopped(t, "interrupted")
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			for _, e := range entries {
				if e.Name() != "volume.meta" {
					require.NoError(t, os.Remove(filepath.Join(dir, e.Name())))
				}
			}
			return dir
		}, nil, true},
		{"relative path", func(t *testing.T) string { return "disk/r1" }, engineapi.ErrInvalid, false},
		{"root", func(t *testing.T) string { return "/" }, engineapi.ErrInvalid, false},
		{"unrelated non-empty directory", func(t *testing.T) string {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "precious.txt"), []byte("x"), 0o644))
			return dir
		}, engineapi.ErrInvalid, false},
		{"a file, not a directory", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "file")
			require.NoError(t, os.WriteFile(p, []byte("x"), 0o644))
			return p
		}, engineapi.ErrInvalid, false},
		{"symbolic link to a stopped replica", func(t *testing.T) string {
			link := filepath.Join(t.TempDir(), "link")
			require.NoError(t, os.Symlink(stopped(t, "linked"), link))
			return link
		}, engineapi.ErrInvalid, false},
		{"live replica", func(t *testing.T) string { return im.replicaDir("live") }, engineapi.ErrBusy, false},
		{"live replica, unclean spelling", func(t *testing.T) string { return im.diskDir + "/./live/" }, engineapi.ErrBusy, false},
		{"directory holding a live replica", func(t *testing.T) string { return im.diskDir }, engineapi.ErrBusy, false},
		{"live replica through a symbolic link", func(t *testing.T) string {
			link := filepath.Join(t.TempDir(), "disk")
			require.NoError(t, os.Symlink(im.diskDir, link))
			return filepath.Join(link, "live")
		}, engineapi.ErrBusy, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.setup(t)
			err := im.c.ReplicaDataDelete(ctx, dir)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
			} else {
				require.NoError(t, err)
				require.NoError(t, im.c.ReplicaDataDelete(ctx, dir), "deleting again is success")
			}
			_, statErr := os.Lstat(dir)
			if tt.gone {
				assert.True(t, os.IsNotExist(statErr), "%s is gone", dir)
			} else if filepath.IsAbs(dir) && dir != "/" {
				assert.NoError(t, statErr, "%s is left alone", dir)
			}
		})
	}
	// The live replica still opens with its data after every refusal.
	_, err := os.Stat(filepath.Join(im.replicaDir("live"), "volume.meta"))
	assert.NoError(t, err)
}

// A replica cannot be created in a directory another replica instance uses
// or a delete is removing.
func TestReplicaDirectoryIsExclusive(t *testing.T) {
	im := newTestIM(t, Options{})
	ctx := context.Background()
	im.createReplica(t, "a", 4*mib)
	_, err := im.c.InstanceCreate(ctx, replicaReq("b", im.replicaDir("a"), 4*mib))
	assert.ErrorIs(t, err, engineapi.ErrBusy, "two replicas on one directory")

	dir := im.replicaDir("c")
	im.s.mu.Lock()
	im.s.deleting[dir] = true
	im.s.mu.Unlock()
	_, err = im.c.InstanceCreate(ctx, replicaReq("c", dir, 4*mib))
	assert.ErrorIs(t, err, engineapi.ErrBusy, "a replica in a directory being deleted")
	im.s.mu.Lock()
	delete(im.s.deleting, dir)
	im.s.mu.Unlock()
	im.createReplica(t, "c", 4*mib)
}
