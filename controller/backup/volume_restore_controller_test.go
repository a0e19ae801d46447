package backup

import (
	"context"
	"fmt"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// engineWithRestore is v1's engine instance showing a restore job.
func engineWithRestore(st *engineapi.RestoreStatus) *engineapi.Instance {
	return &engineapi.Instance{Name: "v1-e-0", Type: engineapi.InstanceTypeEngine, VolumeName: "v1",
		State: engineapi.InstanceStateRunning, Revision: 7, RestoreStatus: st}
}

func restoreSyncFunc(instances ...*engineapi.Instance) fixture.SyncFunc {
	return func(env *dstest.Env, rec record.EventRecorder, me string, dp engineapi.Connector) (func(context.Context, string) error, error) {
		c, err := NewVolumeRestoreController(logrus.New(), env.DS, rec, me, dp, syncedInstanceCache(instances...))
		if err != nil {
			return nil, err
		}
		return c.syncRestore, nil
	}
}

func wantRestore(state v1beta1.VolumeRestoreState, progress int32, msg string) func(*testing.T, *dstest.Env) {
	return func(t *testing.T, env *dstest.Env) {
		v, err := env.Strata.StrataV1beta1().Volumes(fixture.NS).Get(context.Background(), "v1", metav1.GetOptions{})
		require.NoError(t, err)
		rs := v.Status.RestoreStatus
		require.NotNil(t, rs)
		assert.Equal(t, state, rs.State)
		assert.Equal(t, progress, rs.Progress)
		assert.Contains(t, rs.Message, msg)
	}
}

func wantRestoreTicket(present bool) func(*testing.T, *dstest.Env) {
	return func(t *testing.T, env *dstest.Env) {
		va, err := env.Strata.StrataV1beta1().VolumeAttachments(fixture.NS).Get(context.Background(), "v1", metav1.GetOptions{})
		require.NoError(t, err)
		tk := va.Spec.AttachmentTickets[restoreTicketID("v1")]
		if !present {
			assert.Nil(t, tk, "the restore ticket is released")
			return
		}
		require.NotNil(t, tk)
		assert.Equal(t, restoreTicket().Parameters, tk.Parameters)
		assert.Equal(t, v1beta1.AttacherTypeVolumeRestoreController, tk.Type)
	}
}

func TestSyncRestore(t *testing.T) {
	dir := backupTargetDir(t, false)
	url := "file://" + dir
	im := &v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "im-node-1", Namespace: fixture.NS},
		Status: v1beta1.InstanceManagerStatus{OwnerID: "node-1", CurrentState: v1beta1.InstanceStateRunning, Endpoint: "im-1:8500"}}
	b1 := completedBackup("b1", "s1", url, "2026-11-21T10:00:00Z")
	b1.Status.VolumeName = "src"
	onImage := b1.DeepCopy()
	onImage.Status.VolumeBackingImageName = "img"
	attached := func(extra ...runtime.Object) []runtime.Object {
		return fixture.WithNodes(append([]runtime.Object{availableTarget(dir), fixture.RunningEngine("v1"), im}, extra...)...)
	}
	job := func(state string, progress int32, errText string) *engineapi.RestoreStatus {
		return &engineapi.RestoreStatus{Backup: "b1", Volume: "src", State: state, Progress: progress, Error: errText}
	}
	cases := []struct {
		fixture.SyncCase
		job *engineapi.RestoreStatus
	}{
		{SyncCase: fixture.SyncCase{Name: "a new restore attaches the volume without a frontend and starts the job",
			Objects:    attached(b1, fixture.RestoringVolume(), fixture.VA()),
			WantWrites: []string{"update volumeattachments v1", "update volumes/status v1"},
			WantCalls:  []string{"BackupRestore v1-e-0 b1 src " + url},
			WantEvents: []string{"Normal RestoreStarted"},
			Check:      fixture.AllChecks(wantRestore(v1beta1.VolumeRestoreStateRestoring, 0, ""), wantRestoreTicket(true))}},
		{SyncCase: fixture.SyncCase{Name: "onto the backup's backing image its chunks are left to the image",
			Objects:    attached(onImage, fixture.RestoringVolume(func(v *v1beta1.Volume) { v.Spec.BackingImage = "img" }), fixture.VA(restoreTicket())),
			WantWrites: []string{"update volumes/status v1"},
			WantCalls:  []string{"BackupRestore v1-e-0 b1 src " + url + " backing"},
			WantEvents: []string{"Normal RestoreStarted"}}},
		{SyncCase: fixture.SyncCase{Name: "a detached volume waits for its ticket to attach it",
			Objects: attached(b1, fixture.RestoringVolume(func(v *v1beta1.Volume) {
				v.Spec.NodeID, v.Status.CurrentNodeID, v.Status.State = "", "", v1beta1.VolumeStateDetached
			}), fixture.VA()),
			WantWrites: []string{"update volumeattachments v1", "update volumes/status v1"},
			Check:      fixture.AllChecks(wantRestore(v1beta1.VolumeRestoreStatePending, 0, "waiting for the volume to attach"), wantRestoreTicket(true))}},
		{SyncCase: fixture.SyncCase{Name: "a missing backup fails the restore for good",
			Objects:    attached(fixture.RestoringVolume(), fixture.VA(restoreTicket())),
			WantWrites: []string{"update volumes/status v1"}, WantEvents: []string{"Warning RestoreFailed"},
			Check: wantRestore(v1beta1.VolumeRestoreStateFailed, 0, "backup b1 went away before the restore completed")}},
		{SyncCase: fixture.SyncCase{Name: "progress below the step is not written",
			Objects: attached(b1, fixture.RestoringVolume(restoreState(v1beta1.VolumeRestoreStateRestoring, 10)), fixture.VA(restoreTicket()))},
			job: job(engineapi.JobStateInProgress, 15, "")},
		{SyncCase: fixture.SyncCase{Name: "progress past the step is written",
			Objects:    attached(b1, fixture.RestoringVolume(restoreState(v1beta1.VolumeRestoreStateRestoring, 10)), fixture.VA(restoreTicket())),
			WantWrites: []string{"update volumes/status v1"},
			Check:      wantRestore(v1beta1.VolumeRestoreStateRestoring, 40, "")},
			job: job(engineapi.JobStateInProgress, 40, "")},
		{SyncCase: fixture.SyncCase{Name: "a completed job completes the restore; the ticket stays until that is stored",
			Objects:    attached(b1, fixture.RestoringVolume(restoreState(v1beta1.VolumeRestoreStateRestoring, 90)), fixture.VA(restoreTicket())),
			WantWrites: []string{"update volumes/status v1"}, WantEvents: []string{"Normal RestoreCompleted"},
			Check: fixture.AllChecks(wantRestore(v1beta1.VolumeRestoreStateCompleted, 100, ""), wantRestoreTicket(true))},
			job: job(engineapi.JobStateCompleted, 100, "")},
		{SyncCase: fixture.SyncCase{Name: "a completed restore releases its ticket",
			Objects:    attached(b1, fixture.RestoringVolume(restoreState(v1beta1.VolumeRestoreStateCompleted, 100)), fixture.VA(restoreTicket())),
			WantWrites: []string{"update volumeattachments v1"}, Check: wantRestoreTicket(false)}},
		{SyncCase: fixture.SyncCase{Name: "a damaged chunk fails the restore for good, naming it",
			Objects:    attached(b1, fixture.RestoringVolume(restoreState(v1beta1.VolumeRestoreStateRestoring, 30)), fixture.VA(restoreTicket())),
			WantWrites: []string{"update volumes/status v1"}, WantEvents: []string{"Warning RestoreFailed"},
			Check: wantRestore(v1beta1.VolumeRestoreStateFailed, 30, "chunk 7 (offset 7340032")},
			job: job(engineapi.JobStateError, 30, "restore into engine v1-e-0: backup b1 of volume src: chunk 7 (offset 7340032, id ab) in pack cd: checksum mismatch")},
		{SyncCase: fixture.SyncCase{Name: "an unreachable target is retried with backoff",
			Objects:    attached(b1, fixture.RestoringVolume(restoreState(v1beta1.VolumeRestoreStateRestoring, 30)), fixture.VA(restoreTicket())),
			WantWrites: []string{"update volumes/status v1"}, WantEvents: []string{"Warning RestoreFailed"},
			Check: wantRestore(v1beta1.VolumeRestoreStatePending, 30, "attempt 1 failed, retried in 10s: dial tcp: connection refused")},
			job: job(engineapi.JobStateError, 30, "dial tcp: connection refused")},
		{SyncCase: fixture.SyncCase{Name: "a restore the instance manager refuses is not retried",
			Objects:    attached(b1, fixture.RestoringVolume(), fixture.VA(restoreTicket())),
			DPErr:      map[string]error{"BackupRestore": fmt.Errorf("%w: engine v1-e-0 has snapshot s9", engineapi.ErrInvalid)},
			WantWrites: []string{"update volumes/status v1"}, WantEvents: []string{"Warning RestoreFailed"},
			WantCalls: []string{"BackupRestore v1-e-0 b1 src " + url},
			Check:     wantRestore(v1beta1.VolumeRestoreStateFailed, 0, "the instance manager refused the restore")}},
		{SyncCase: fixture.SyncCase{Name: "an engine on another node: that node's manager follows the job", Me: "node-2",
			Objects: attached(b1, fixture.RestoringVolume(restoreState(v1beta1.VolumeRestoreStateRestoring, 30)), fixture.VA(restoreTicket()))}},
		{SyncCase: fixture.SyncCase{Name: "a deleted volume releases its ticket",
			Objects: attached(b1, fixture.RestoringVolume(func(v *v1beta1.Volume) { v.DeletionTimestamp = &metav1.Time{Time: dstest.Now} }),
				fixture.VA(restoreTicket())),
			WantWrites: []string{"update volumeattachments v1"}, Check: wantRestoreTicket(false)}},
	}
	for _, tc := range cases {
		fixture.RunSyncCases(t, []fixture.SyncCase{tc.SyncCase}, restoreSyncFunc(engineWithRestore(tc.job)))
	}
}

func restoreState(state v1beta1.VolumeRestoreState, progress int32) func(*v1beta1.Volume) {
	return func(v *v1beta1.Volume) {
		v.Status.RestoreStatus = &v1beta1.VolumeRestoreStatus{Backup: "b1", BackupVolume: "src", State: state, Progress: progress}
		setRestoredCondition(v)
	}
}

func restoreTicket() *v1beta1.AttachmentTicket {
	return &v1beta1.AttachmentTicket{ID: restoreTicketID("v1"), Type: v1beta1.AttacherTypeVolumeRestoreController, NodeID: "node-1",
		OwnerRef: &v1beta1.TicketOwnerReference{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: "Volume",
			Namespace: fixture.NS, Name: "v1", UID: "uid-v1"},
		Parameters: map[string]string{v1beta1.AttachmentParameterDisableFrontend: v1beta1.TrueValue}}
}
