package backupstore

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gcEnv has two backups of two volumes, the first then deleted, so its
// packs are garbage; now is well past any grace.
func gcEnv(t *testing.T) (*env, *Manifest, time.Time) {
	e := newEnv(t, 4*testChunk)
	a, b := volume(20, 8*testChunk), volume(21, 8*testChunk)
	ma := e.backup(BackupInput{Volume: "va", Backup: "b1", Size: int64(len(a)), Source: bytes.NewReader(a)})
	e.backup(BackupInput{Volume: "vb", Backup: "b1", Size: int64(len(b)), Source: bytes.NewReader(b)})
	require.NoError(t, e.tgt.DeleteBackup(context.Background(), "va", "b1"))
	return e, ma, time.Now().Add(48 * time.Hour)
}

func TestGCDeletesUnreferencedPacksWithTheirIndex(t *testing.T) {
	e, ma, now := gcEnv(t)
	before := len(e.objects(packsPrefix))
	rep, err := e.tgt.GC(context.Background(), GCOptions{Now: now})
	require.NoError(t, err)
	assert.Equal(t, len(ma.Packs), rep.PacksDeleted)
	assert.Equal(t, before-len(ma.Packs), len(e.objects(packsPrefix)))
	assert.Equal(t, len(e.objects(packsPrefix)), len(e.objects(indexPrefix)))
	for _, p := range ma.Packs {
		_, err := e.files.Stat(context.Background(), indexKey(p))
		assert.ErrorIs(t, err, ErrNotFound)
	}
	mb, err := e.tgt.LoadManifest(context.Background(), "vb", "b1")
	require.NoError(t, err)
	_, err = e.tgt.Verify(context.Background(), mb, 2)
	assert.NoError(t, err, "the surviving backup is intact")
}

func TestGCRefusesAnEmptyListing(t *testing.T) {
	e, _, now := gcEnv(t)
	require.NoError(t, e.tgt.DeleteBackup(context.Background(), "vb", "b1"))
	packs := len(e.objects(packsPrefix))
	_, err := e.tgt.GC(context.Background(), GCOptions{Now: now})
	assert.ErrorContains(t, err, "refusing to delete anything on an empty listing")
	assert.Equal(t, packs, len(e.objects(packsPrefix)))

	rep, err := e.tgt.GC(context.Background(), GCOptions{Now: now, ConfirmEmpty: true})
	require.NoError(t, err)
	assert.Equal(t, packs, rep.PacksDeleted)
}

func TestGCRefusesWithoutTheMarker(t *testing.T) {
	e, _, now := gcEnv(t)
	packs := len(e.objects(packsPrefix))
	require.NoError(t, e.files.Delete(context.Background(), markerKey))
	_, err := e.tgt.GC(context.Background(), GCOptions{Now: now})
	assert.ErrorContains(t, err, "refusing to collect without the target's strata-backupstore.json")
	assert.Equal(t, packs, len(e.objects(packsPrefix)))
}

func TestGCDefersWhileABackupIsInFlight(t *testing.T) {
	e, ma, _ := gcEnv(t)
	// A backup in flight (its marker written a minute ago) may have
	// deduped onto va's packs.
	require.NoError(t, e.files.Put(context.Background(), "inflight/vc/b1-0011", bytes.NewReader(nil), 0))
	marker := e.objects(inflightPfx)[0].ModTime
	rep, err := e.tgt.GC(context.Background(), GCOptions{Grace: time.Minute, MaxBackupDuration: time.Hour, Now: marker.Add(2 * time.Minute)})
	require.NoError(t, err)
	assert.Contains(t, rep.Deferred, "backup in flight (vc/b1-0011")
	assert.Zero(t, rep.PacksDeleted)
	for _, p := range ma.Packs {
		_, err := e.files.Stat(context.Background(), indexKey(p))
		assert.NoError(t, err, "nothing swept, not even index objects")
	}

	// Once the marker is stale it is deleted and the sweep proceeds.
	rep, err = e.tgt.GC(context.Background(), GCOptions{Grace: time.Minute, MaxBackupDuration: time.Hour, Now: marker.Add(2 * time.Hour)})
	require.NoError(t, err)
	assert.Equal(t, 1, rep.MarkersDeleted)
	assert.Equal(t, len(ma.Packs), rep.PacksDeleted)
}

func TestGCAbortsOnAnUnreadableManifest(t *testing.T) {
	e, _, now := gcEnv(t)
	require.NoError(t, e.files.Put(context.Background(), "backups/vb/b2.manifest", bytes.NewReader([]byte("junk")), 4))
	packs := len(e.objects(packsPrefix))
	_, err := e.tgt.GC(context.Background(), GCOptions{Now: now})
	assert.ErrorContains(t, err, "backups/vb/b2.manifest")
	assert.ErrorContains(t, err, "nothing deleted")
	assert.Equal(t, packs, len(e.objects(packsPrefix)))
}

func TestListBackupsIsOneListing(t *testing.T) {
	e := newEnv(t, 4*testChunk)
	for _, v := range []string{"va", "vb"} {
		for _, b := range []string{"b1", "b2", "b3"} {
			d := volume(uint64(len(v+b)), 3*testChunk)
			e.backup(BackupInput{Volume: v, Backup: b, Size: int64(len(d)), Source: bytes.NewReader(d),
				Labels: map[string]string{"app": "db"}, BackingImage: &BackingImage{Name: "img"}})
		}
	}
	e.count.Reset()
	list, err := e.reopen().ListBackups(context.Background())
	require.NoError(t, err)
	require.Len(t, list, 6)
	assert.Equal(t, "va", list[0].Volume)
	assert.Equal(t, "db", list[0].Labels["app"])
	assert.Equal(t, "img", list[5].BackingImage.Name)
	cs := e.count.Counts()
	assert.Equal(t, int64(1), cs["List"].Calls, "one listing, whatever the number of backups")
	assert.Equal(t, int64(6), cs["GetRange"].Calls, "one ranged read of each manifest's header")
}

// VolumeHasBackups asks the target about one volume alone: a prefix of
// another volume's name is not the volume, and an inflight marker is no
// backup.
func TestVolumeHasBackups(t *testing.T) {
	e := newEnv(t, 4*testChunk)
	d := volume(1, 2*testChunk)
	e.backup(BackupInput{Volume: "vol-a", Backup: "b1", Size: int64(len(d)), Source: bytes.NewReader(d)})
	require.NoError(t, e.files.Put(context.Background(), inflightPfx+"vol-c/b1-0123", bytes.NewReader(nil), 0))
	cases := []struct {
		volume string
		want   bool
	}{
		{"vol-a", true},
		{"vol", false},
		{"vol-b", false},
		{"vol-c", false},
	}
	for _, tc := range cases {
		got, err := e.tgt.VolumeHasBackups(context.Background(), tc.volume)
		require.NoError(t, err)
		assert.Equal(t, tc.want, got, tc.volume)
	}
	require.NoError(t, e.tgt.DeleteBackup(context.Background(), "vol-a", "b1"))
	got, err := e.tgt.VolumeHasBackups(context.Background(), "vol-a")
	require.NoError(t, err)
	assert.False(t, got, "its last backup deleted")
}
