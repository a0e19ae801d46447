package imserver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

// confinedDirs is a node with one disk, its state directory beside it, and
// places outside: a sibling directory and links out of the disk.
type confinedDirs struct {
	base, disk, state, outside string
}

func newConfinedDirs(t *testing.T) confinedDirs {
	t.Helper()
	base := t.TempDir()
	d := confinedDirs{base: base, disk: filepath.Join(base, "disk"), state: filepath.Join(base, "disk", ".im-state"),
		outside: filepath.Join(base, "outside")}
	for _, dir := range []string{filepath.Join(d.disk, "replicas", "r1"), d.outside} {
		require.NoError(t, os.MkdirAll(dir, 0o700))
	}
	require.NoError(t, os.WriteFile(filepath.Join(d.disk, "image.raw"), nil, 0o600))
	require.NoError(t, os.Symlink(d.outside, filepath.Join(d.disk, "escape")))
	require.NoError(t, os.Symlink(filepath.Join(d.disk, "replicas"), filepath.Join(d.disk, "inner-link")))
	require.NoError(t, os.Symlink(filepath.Join(d.outside, "not-yet"), filepath.Join(d.disk, "dangling")))
	require.NoError(t, os.WriteFile(filepath.Join(d.outside, "secret"), nil, 0o600))
	require.NoError(t, os.Symlink(filepath.Join(d.outside, "secret"), filepath.Join(d.disk, "image-link.raw")))
	return d
}

func TestConfinementOfDiskPaths(t *testing.T) {
	d := newConfinedDirs(t)
	socket := filepath.Join(d.disk, "im-nbd", "nbd.sock")
	tlsDir := filepath.Join(d.disk, "im-tls")
	require.NoError(t, os.MkdirAll(tlsDir, 0o700))
	c, err := newConfinement(Options{DiskPaths: []string{d.disk}, StateDir: d.state, NBDSocket: socket, TLSDir: tlsDir})
	require.NoError(t, err)
	tests := []struct {
		name    string
		path    string
		wantMsg string // empty: allowed
	}{
		{"an existing replica directory", filepath.Join(d.disk, "replicas", "r1"), ""},
		{"a new directory under the disk", filepath.Join(d.disk, "replicas", "r2"), ""},
		{"several missing levels under the disk", filepath.Join(d.disk, "a", "b", "c"), ""},
		{"a file on the disk", filepath.Join(d.disk, "image.raw"), ""},
		{"a link that stays on the disk", filepath.Join(d.disk, "inner-link", "r1"), ""},
		{"unclean but inside", d.disk + "//replicas/./r1/", ""},
		{"empty", "", `data_dir is empty`},
		{"relative", "replicas/r1", `data_dir "replicas/r1" must be an absolute path`},
		{"the disk itself", d.disk, `is outside this node's disks`},
		{"outside", "/etc/passwd", `data_dir "/etc/passwd" is outside this node's disks: allowed are paths inside ` + d.disk},
		{"a sibling of the disk", d.outside, `is outside this node's disks`},
		{"a prefix that is not a parent", d.disk + "-other/r1", `is outside this node's disks`},
		{"dot-dot leaving the disk", filepath.Join(d.disk, "replicas") + "/../../outside", `must not contain ..`},
		{"dot-dot staying inside", d.disk + "/replicas/../replicas/r1", `must not contain ..`},
		{"symlink escape", filepath.Join(d.disk, "escape", "r1"), `(it resolves to ` + filepath.Join(d.outside, "r1") + `)`},
		{"a file link out of the disk", filepath.Join(d.disk, "image-link.raw"), `(it resolves to ` + filepath.Join(d.outside, "secret") + `)`},
		{"a dangling link a mkdir would follow out", filepath.Join(d.disk, "dangling", "r1"), `is a symbolic link to nowhere`},
		{"the state directory", filepath.Join(d.state, "replicas.json"), `overlaps the instance manager's state directory`},
		{"a directory holding the state", filepath.Join(d.disk, ".im-state"), `overlaps the instance manager's state directory`},
		{"the NBD socket", socket, `overlaps the instance manager's NBD socket ` + socket},
		{"a directory holding the NBD socket", filepath.Dir(socket), `overlaps the instance manager's NBD socket`},
		{"a sibling of the NBD socket's directory", filepath.Join(d.disk, "im-nbd-2"), ""},
		{"the TLS directory's key", filepath.Join(tlsDir, "identity.pem"), `overlaps the instance manager's TLS directory ` + tlsDir},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := c.disk("data_dir", tt.path)
			if tt.wantMsg == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, engineapi.ErrInvalid)
			assert.Contains(t, err.Error(), tt.wantMsg)
		})
	}
}

// A disk path that is itself a link (a mount point reached through one)
// confines to where it leads.
func TestConfinementFollowsALinkedDisk(t *testing.T) {
	d := newConfinedDirs(t)
	link := filepath.Join(d.base, "disk-link")
	require.NoError(t, os.Symlink(d.disk, link))
	c, err := newConfinement(Options{DiskPaths: []string{link}, StateDir: d.state})
	require.NoError(t, err)
	assert.NoError(t, c.disk("data_dir", filepath.Join(d.disk, "replicas", "r1")), "spelt without the link")
	assert.NoError(t, c.disk("data_dir", filepath.Join(link, "replicas", "r9")), "spelt through the link")
	assert.ErrorIs(t, c.disk("data_dir", filepath.Join(link, "escape", "r1")), engineapi.ErrInvalid)
}

func TestConfinementOptions(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantMsg string
	}{
		{"a disk", Options{DiskPaths: []string{"/var/lib/strata"}}, ""},
		{"no disk", Options{}, "no disk paths"},
		{"a relative disk", Options{DiskPaths: []string{"disk"}}, `--disk-path "disk": must be an absolute path`},
		{"the root as a disk", Options{DiskPaths: []string{"/"}}, `--disk-path "/": is the root directory`},
		{"dot-dot in a backup path", Options{DiskPaths: []string{"/d"}, BackupPaths: []string{"/mnt/../etc"}}, `--backup-path "/mnt/../etc": must not contain ..`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := newConfinement(tt.opts)
			if tt.wantMsg == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantMsg)
		})
	}
}

func TestConfinementOfBackupTargets(t *testing.T) {
	d := newConfinedDirs(t)
	backups := filepath.Join(d.base, "backups")
	with, err := newConfinement(Options{DiskPaths: []string{d.disk}, BackupPaths: []string{backups}, StateDir: d.state})
	require.NoError(t, err)
	without, err := newConfinement(Options{DiskPaths: []string{d.disk}, StateDir: d.state})
	require.NoError(t, err)
	tests := []struct {
		name    string
		c       confinement
		url     string
		wantMsg string
	}{
		{"s3 names no local path", without, "s3://bucket@us-east-1/prefix", ""},
		{"file:// under a backup path", with, "file://" + filepath.Join(backups, "nfs"), ""},
		{"file:// on the backup path itself", with, "file://" + backups, ""},
		{"file:// elsewhere", with, "file:///etc", `target.url "/etc" is outside the backup paths`},
		{"file:// on a disk is not a backup path", with, "file://" + d.disk + "/replicas", `is outside the backup paths`},
		{"escaped dot-dot", with, "file://" + backups + "/%2e%2e/disk", `must not contain ..`},
		{"file:// with no backup path", without, "file:///backups", `file:// targets are not allowed here`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.backupTarget(&impb.BackupTarget{Url: tt.url})
			if tt.wantMsg == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, engineapi.ErrInvalid)
			assert.Contains(t, err.Error(), tt.wantMsg)
		})
	}
}

// The NBD socket is required, and absolute: endpoints name it.
func TestNewRefusesABadNBDSocket(t *testing.T) {
	for _, tt := range []struct{ socket, wantMsg string }{
		{"", "no NBD socket"},
		{"run/nbd.sock", `--nbd-socket "run/nbd.sock": must be an absolute path`},
		{"/run/../tmp/nbd.sock", "without .."},
	} {
		_, err := New(Options{StateDir: t.TempDir(), DiskPaths: []string{t.TempDir()}, NBDSocket: tt.socket, Log: quietLog()})
		require.Error(t, err, tt.socket)
		assert.Contains(t, err.Error(), tt.wantMsg)
	}
}

// Issue 24's first finding, over real gRPC: a replica on the host's
// /etc/passwd, or with its data outside the disks, is refused with
// InvalidArgument naming the field and the path, and nothing is created.
func TestInstanceManagerRefusesPathsOutsideItsDisks(t *testing.T) {
	d := newConfinedDirs(t)
	im := newTestIM(t, Options{DiskPaths: []string{d.disk}, BackupPaths: []string{}, StateDir: d.state})
	ctx := context.Background()
	inside := filepath.Join(d.disk, "replicas", "r2")
	tests := []struct {
		name        string
		dataDir     string
		backingFile string
		wantMsg     string
	}{
		{"backing file /etc/passwd", inside, "/etc/passwd", `backing_file "/etc/passwd" is outside this node's disks`},
		{"backing file through a link out", inside, filepath.Join(d.disk, "escape", "x.raw"), `backing_file`},
		{"data directory outside", filepath.Join(d.outside, "r2"), "", `data_dir "` + filepath.Join(d.outside, "r2") + `" is outside`},
		{"data directory with dot-dot", filepath.Join(d.disk, "replicas") + "/../../outside/r2", "", `must not contain ..`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := replicaReq("r2", tt.dataDir, 4*mib)
			req.BackingFile = tt.backingFile
			_, err := im.c.InstanceCreate(ctx, req)
			require.ErrorIs(t, err, engineapi.ErrInvalid)
			assert.Contains(t, err.Error(), tt.wantMsg)
			_, err = im.c.InstanceGet(ctx, "r2")
			assert.ErrorIs(t, err, engineapi.ErrNotFound, "no instance is left behind")
		})
	}
	_, err := os.Stat(filepath.Join(d.outside, "r2"))
	assert.True(t, os.IsNotExist(err), "nothing was created outside the disk")

	err = im.c.ReplicaDataDelete(ctx, d.outside)
	require.ErrorIs(t, err, engineapi.ErrInvalid)
	assert.Contains(t, err.Error(), `data_dir "`+d.outside+`" is outside`)
	assert.DirExists(t, d.outside)

	err = im.c.SnapshotBackup(ctx, engineapi.SnapshotBackupArgs{Engine: "e", Snapshot: "s1", Backup: "b1", Volume: "vol",
		Target: fileTarget(d.outside)})
	require.ErrorIs(t, err, engineapi.ErrInvalid)
	assert.Contains(t, err.Error(), "file:// targets are not allowed here")

	ok := filepath.Join(d.disk, "replicas", "r3")
	inst, err := im.c.InstanceCreate(ctx, replicaReq("r3", ok, 4*mib))
	require.NoError(t, err, "a replica inside the disk")
	assert.Equal(t, impb.InstanceState_INSTANCE_STATE_RUNNING, inst.State)
}

// Issue 24: replicas.json's rename was not followed by a directory fsync
// (atomicfile does it now) and the files were readable by every local
// user. The state and the replica directories are the owner's only.
func TestStateAndReplicaFileModes(t *testing.T) {
	d := newConfinedDirs(t)
	im := newTestIM(t, Options{DiskPaths: []string{d.disk}, StateDir: d.state})
	dir := filepath.Join(d.disk, "replicas", "new", "r1")
	_, err := im.c.InstanceCreate(context.Background(), replicaReq("r1", dir, 4*mib))
	require.NoError(t, err)
	for path, want := range map[string]os.FileMode{
		d.state: 0o700, filepath.Join(d.state, specsFile): 0o600,
		filepath.Dir(dir): 0o700, dir: 0o700, filepath.Join(dir, "volume.meta"): 0o600,
	} {
		st, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, want, st.Mode().Perm(), path)
	}
	entries, err := os.ReadDir(d.state)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "only %s, no temp file", specsFile)
}

// A replica recorded before its disk was confined (or whose disk is no
// longer given) is not opened at a restart: it is listed in ERROR, naming
// why, and its data stays.
func TestReopenRefusesARecordOutsideTheDisks(t *testing.T) {
	d := newConfinedDirs(t)
	wide := newTestIM(t, Options{DiskPaths: []string{d.base}, StateDir: d.state})
	dir := filepath.Join(d.outside, "r1")
	_, err := wide.c.InstanceCreate(context.Background(), replicaReq("r1", dir, 4*mib))
	require.NoError(t, err)
	wide.stop(t)

	narrow := newTestIM(t, Options{DiskPaths: []string{d.disk}, StateDir: d.state})
	got, err := narrow.c.InstanceGet(context.Background(), "r1")
	require.NoError(t, err)
	assert.Equal(t, impb.InstanceState_INSTANCE_STATE_ERROR, got.State)
	assert.Contains(t, got.Error, `data_dir "`+dir+`" is outside this node's disks`)
	assert.FileExists(t, filepath.Join(dir, "volume.meta"), "its data stays")
}
