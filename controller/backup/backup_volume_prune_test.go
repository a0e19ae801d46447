package backup

import (
	"context"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// testBackupVolume is the BackupVolume of volume, naming lastBackup (or
// empty, with none).
func testBackupVolume(volume, lastBackup string) *v1beta1.BackupVolume {
	bv := &v1beta1.BackupVolume{ObjectMeta: metav1.ObjectMeta{Name: volume, Namespace: fixture.NS, UID: k8stypes.UID("uid-bv-" + volume),
		Labels: map[string]string{types.LabelVolume: volume}}}
	if lastBackup != "" {
		bv.Status = v1beta1.BackupVolumeStatus{Size: 300000, LastBackupName: lastBackup, LastBackupAt: "2026-11-20T10:00:00Z"}
	}
	return bv
}

// backupOfVolume is a Backup CR that names volume (by its label, as one
// being taken or a mirrored one does).
func backupOfVolume(name, volume string, state v1beta1.BackupState) *v1beta1.Backup {
	return fixture.Backup(name, "", func(b *v1beta1.Backup) {
		b.Labels = map[string]string{types.LabelVolume: volume}
		b.Status.State = state
	})
}

func volumeNamed(name string) *v1beta1.Volume {
	return fixture.Volume(func(v *v1beta1.Volume) { v.Name = name })
}

func TestDecideBackupVolume(t *testing.T) {
	deleting := backupOfVolume("b3", "v1", v1beta1.BackupStateCompleted)
	deleting.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
	cases := []struct {
		name    string
		backups []*v1beta1.Backup
		vol     *v1beta1.Volume
		want    backupVolumeFate
	}{
		{name: "nothing: it goes"},
		{name: "a completed Backup (of another target, maybe): left as it is",
			backups: []*v1beta1.Backup{backupOfVolume("b1", "v1", v1beta1.BackupStateCompleted),
				backupOfVolume("b2", "v1", v1beta1.BackupStateError)},
			want: backupVolumeFate{asIs: true, hold: "completed Backup b1 names the volume"}},
		{name: "Backups failed, being taken or deleted: kept, shown empty",
			backups: []*v1beta1.Backup{backupOfVolume("b2", "v1", v1beta1.BackupStateError),
				backupOfVolume("b1", "v1", v1beta1.BackupStateInProgress), deleting},
			want: backupVolumeFate{hold: "Backup b1, b2, b3 names the volume"}},
		{name: "the volume exists: kept, shown empty", vol: volumeNamed("v1"), want: backupVolumeFate{hold: "the volume exists"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := decideBackupVolume(tc.backups, tc.vol)
			assert.Equal(t, tc.want, got)
		})
	}
}

// After a listing, a BackupVolume the target holds no backup of goes when
// nothing holds it; a Backup or the volume keeps it, shown empty; a short
// listing never costs one whose backups the target still holds.
func TestPruneBackupVolumes(t *testing.T) {
	dir := oldTarget(t) // vol-a: bk-a1, bk-a2; vol-b: bk-b1
	fs, err := backupstore.NewFileStore(dir)
	require.NoError(t, err)
	tgt, err := backupstore.Open(context.Background(), fs, backupstore.Options{})
	require.NoError(t, err)
	full, err := tgt.ListBackups(context.Background())
	require.NoError(t, err)
	short := full[2:] // vol-b's only: the listing of a hiccup
	require.Equal(t, "vol-b", short[0].Volume)

	cases := []struct {
		name       string
		objects    []runtime.Object
		listing    []backupstore.BackupInfo
		wantWrites []string
		wantEvents []string
		wantLast   string // the last backup a kept vol-gone names
	}{
		{name: "its backups, its Backups and its volume gone: it goes", listing: full,
			objects:    []runtime.Object{testBackupVolume("vol-gone", "bk-x")},
			wantWrites: []string{"delete backupvolumes vol-gone"}, wantEvents: []string{"Normal BackupVolumeRemoved"}},
		{name: "a completed Backup names the volume (another target holds it): untouched", listing: full,
			objects: []runtime.Object{testBackupVolume("vol-gone", "bk-x"),
				backupOfVolume("bk-x", "vol-gone", v1beta1.BackupStateCompleted)}, wantLast: "bk-x"},
		{name: "a failed Backup still names the volume: kept, shown empty", listing: full,
			objects:    []runtime.Object{testBackupVolume("vol-gone", "bk-x"), backupOfVolume("bk-x", "vol-gone", v1beta1.BackupStateError)},
			wantWrites: []string{"update backupvolumes/status vol-gone"}},
		{name: "the volume exists: kept, shown empty", listing: full,
			objects:    []runtime.Object{testBackupVolume("vol-gone", "bk-x"), volumeNamed("vol-gone")},
			wantWrites: []string{"update backupvolumes/status vol-gone"}},
		{name: "kept and already empty: nothing written", listing: full,
			objects: []runtime.Object{testBackupVolume("vol-gone", ""), volumeNamed("vol-gone")}},
		{name: "a short listing: the target still holds vol-a's backups, it stays as it is", listing: short,
			objects:    []runtime.Object{testBackupVolume("vol-a", "bk-a2"), testBackupVolume("vol-gone", "")},
			wantWrites: []string{"delete backupvolumes vol-gone"}, wantEvents: []string{"Normal BackupVolumeRemoved"}},
		{name: "the listing names it: untouched", listing: full,
			objects: []runtime.Object{testBackupVolume("vol-a", "bk-a2")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, append([]runtime.Object{availableTarget(dir)}, tc.objects...), nil)
			rec := record.NewFakeRecorder(10)
			c, err := NewBackupTargetController(logrus.New(), env.DS, rec, "node-1")
			require.NoError(t, err)
			bt, err := env.DS.BackupTargets.GetRO("default")
			require.NoError(t, err)
			env.ClearActions()
			c.pruneBackupVolumes(context.Background(), bt, tgt, tc.listing)
			assert.Equal(t, tc.wantWrites, fixture.Writes(env.Strata.Actions()))
			fixture.AssertEvents(t, tc.wantEvents, rec)
			bvs := env.Strata.StrataV1beta1().BackupVolumes(fixture.NS)
			if bv, err := bvs.Get(context.Background(), "vol-gone", metav1.GetOptions{}); err == nil {
				assert.Equal(t, tc.wantLast, bv.Status.LastBackupName)
			}
			if bv, err := bvs.Get(context.Background(), "vol-a", metav1.GetOptions{}); err == nil {
				assert.Equal(t, "bk-a2", bv.Status.LastBackupName, "the target still holds vol-a's backups")
			}
		})
	}
}

// Deleting the last Backup of a volume that is gone brings the poll
// forward, and so does one that leaves the BackupVolume to be shown empty;
// while a completed Backup holds it, or it is empty already, nothing is
// enqueued.
func TestEmptiedBackupVolumeBringsThePollForward(t *testing.T) {
	cases := []struct {
		name    string
		objects []runtime.Object
		want    int
	}{
		{name: "nothing holds it: every target is polled", want: 1,
			objects: []runtime.Object{testBackupVolume("vol-gone", "bk-x")}},
		{name: "the volume exists: polled to show it empty", want: 1,
			objects: []runtime.Object{testBackupVolume("vol-gone", "bk-x"), volumeNamed("vol-gone")}},
		{name: "the volume exists, already shown empty", objects: []runtime.Object{testBackupVolume("vol-gone", ""),
			volumeNamed("vol-gone")}},
		{name: "a completed Backup names the volume", objects: []runtime.Object{testBackupVolume("vol-gone", "bk-x"),
			backupOfVolume("bk-y", "vol-gone", v1beta1.BackupStateCompleted)}},
		{name: "no BackupVolume", objects: nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, append([]runtime.Object{availableTarget(t.TempDir())}, tc.objects...), nil)
			c, err := NewBackupTargetController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1")
			require.NoError(t, err)
			drainQueue(t, c)
			c.enqueueIfBackupVolumeEmptied("vol-gone")
			assert.Equal(t, tc.want, c.Queue.Len())
		})
	}

	// Through the informer: the delete of the last Backup.
	env := dstest.New(t, []runtime.Object{availableTarget(t.TempDir()), testBackupVolume("vol-gone", "bk-x"),
		backupOfVolume("bk-x", "vol-gone", v1beta1.BackupStateCompleted)}, nil)
	c, err := NewBackupTargetController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1")
	require.NoError(t, err)
	drainQueue(t, c)
	require.NoError(t, env.Strata.StrataV1beta1().Backups(fixture.NS).Delete(context.Background(), "bk-x", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return c.Queue.Len() == 1 }, 5*time.Second, 10*time.Millisecond,
		"the target's poll is enqueued")
	key, _ := c.Queue.Get()
	c.Queue.Done(key)
	assert.Equal(t, fixture.NS+"/default", key)
}

// drainQueue waits for the initial add of the target, then empties the
// poll queue.
func drainQueue(t *testing.T, c *BackupTargetController) {
	t.Helper()
	require.Eventually(t, func() bool { return c.Queue.Len() == 1 }, 5*time.Second, 10*time.Millisecond, "the initial add")
	for c.Queue.Len() > 0 {
		key, _ := c.Queue.Get()
		c.Queue.Done(key)
	}
}
