package controller

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

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// engineWithRestore is v1's engine instance showing a restore job.
func engineWithRestore(st *engineapi.RestoreStatus) *engineapi.Instance {
	return &engineapi.Instance{Name: "v1-e-0", Type: engineapi.InstanceTypeEngine, VolumeName: "v1",
		State: engineapi.InstanceStateRunning, Revision: 7, RestoreStatus: st}
}

func restoreSyncFunc(instances ...*engineapi.Instance) syncFunc {
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
		v, err := env.Strata.StrataV1beta1().Volumes(testNS).Get(context.Background(), "v1", metav1.GetOptions{})
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
		va, err := env.Strata.StrataV1beta1().VolumeAttachments(testNS).Get(context.Background(), "v1", metav1.GetOptions{})
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
	im := &v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "im-node-1", Namespace: testNS},
		Status: v1beta1.InstanceManagerStatus{OwnerID: "node-1", CurrentState: v1beta1.InstanceStateRunning, Endpoint: "im-1:8500"}}
	b1 := completedBackup("b1", "s1", url, "2026-11-21T10:00:00Z")
	b1.Status.VolumeName = "src"
	onImage := b1.DeepCopy()
	onImage.Status.VolumeBackingImageName = "img"
	attached := func(extra ...runtime.Object) []runtime.Object {
		return withNodes(append([]runtime.Object{availableTarget(dir), runningEngine("v1"), im}, extra...)...)
	}
	job := func(state string, progress int32, errText string) *engineapi.RestoreStatus {
		return &engineapi.RestoreStatus{Backup: "b1", Volume: "src", State: state, Progress: progress, Error: errText}
	}
	cases := []struct {
		syncCase
		job *engineapi.RestoreStatus
	}{
		{syncCase: syncCase{name: "a new restore attaches the volume without a frontend and starts the job",
			objects:    attached(b1, restoringVolume(), testVA()),
			wantWrites: []string{"update volumeattachments v1", "update volumes/status v1"},
			wantCalls:  []string{"BackupRestore v1-e-0 b1 src " + url},
			wantEvents: []string{"Normal RestoreStarted"},
			check:      allChecks(wantRestore(v1beta1.VolumeRestoreStateRestoring, 0, ""), wantRestoreTicket(true))}},
		{syncCase: syncCase{name: "onto the backup's backing image its chunks are left to the image",
			objects:    attached(onImage, restoringVolume(func(v *v1beta1.Volume) { v.Spec.BackingImage = "img" }), testVA(restoreTicket())),
			wantWrites: []string{"update volumes/status v1"},
			wantCalls:  []string{"BackupRestore v1-e-0 b1 src " + url + " backing"},
			wantEvents: []string{"Normal RestoreStarted"}}},
		{syncCase: syncCase{name: "a detached volume waits for its ticket to attach it",
			objects: attached(b1, restoringVolume(func(v *v1beta1.Volume) {
				v.Spec.NodeID, v.Status.CurrentNodeID, v.Status.State = "", "", v1beta1.VolumeStateDetached
			}), testVA()),
			wantWrites: []string{"update volumeattachments v1", "update volumes/status v1"},
			check:      allChecks(wantRestore(v1beta1.VolumeRestoreStatePending, 0, "waiting for the volume to attach"), wantRestoreTicket(true))}},
		{syncCase: syncCase{name: "a missing backup fails the restore for good",
			objects:    attached(restoringVolume(), testVA(restoreTicket())),
			wantWrites: []string{"update volumes/status v1"}, wantEvents: []string{"Warning RestoreFailed"},
			check: wantRestore(v1beta1.VolumeRestoreStateFailed, 0, "backup b1 went away before the restore completed")}},
		{syncCase: syncCase{name: "progress below the step is not written",
			objects: attached(b1, restoringVolume(restoreState(v1beta1.VolumeRestoreStateRestoring, 10)), testVA(restoreTicket()))},
			job: job(engineapi.JobStateInProgress, 15, "")},
		{syncCase: syncCase{name: "progress past the step is written",
			objects:    attached(b1, restoringVolume(restoreState(v1beta1.VolumeRestoreStateRestoring, 10)), testVA(restoreTicket())),
			wantWrites: []string{"update volumes/status v1"},
			check:      wantRestore(v1beta1.VolumeRestoreStateRestoring, 40, "")},
			job: job(engineapi.JobStateInProgress, 40, "")},
		{syncCase: syncCase{name: "a completed job completes the restore; the ticket stays until that is stored",
			objects:    attached(b1, restoringVolume(restoreState(v1beta1.VolumeRestoreStateRestoring, 90)), testVA(restoreTicket())),
			wantWrites: []string{"update volumes/status v1"}, wantEvents: []string{"Normal RestoreCompleted"},
			check: allChecks(wantRestore(v1beta1.VolumeRestoreStateCompleted, 100, ""), wantRestoreTicket(true))},
			job: job(engineapi.JobStateCompleted, 100, "")},
		{syncCase: syncCase{name: "a completed restore releases its ticket",
			objects:    attached(b1, restoringVolume(restoreState(v1beta1.VolumeRestoreStateCompleted, 100)), testVA(restoreTicket())),
			wantWrites: []string{"update volumeattachments v1"}, check: wantRestoreTicket(false)}},
		{syncCase: syncCase{name: "a damaged chunk fails the restore for good, naming it",
			objects:    attached(b1, restoringVolume(restoreState(v1beta1.VolumeRestoreStateRestoring, 30)), testVA(restoreTicket())),
			wantWrites: []string{"update volumes/status v1"}, wantEvents: []string{"Warning RestoreFailed"},
			check: wantRestore(v1beta1.VolumeRestoreStateFailed, 30, "chunk 7 (offset 7340032")},
			job: job(engineapi.JobStateError, 30, "restore into engine v1-e-0: backup b1 of volume src: chunk 7 (offset 7340032, id ab) in pack cd: checksum mismatch")},
		{syncCase: syncCase{name: "an unreachable target is retried with backoff",
			objects:    attached(b1, restoringVolume(restoreState(v1beta1.VolumeRestoreStateRestoring, 30)), testVA(restoreTicket())),
			wantWrites: []string{"update volumes/status v1"}, wantEvents: []string{"Warning RestoreFailed"},
			check: wantRestore(v1beta1.VolumeRestoreStatePending, 30, "attempt 1 failed, retried in 10s: dial tcp: connection refused")},
			job: job(engineapi.JobStateError, 30, "dial tcp: connection refused")},
		{syncCase: syncCase{name: "a restore the instance manager refuses is not retried",
			objects:    attached(b1, restoringVolume(), testVA(restoreTicket())),
			dpErr:      map[string]error{"BackupRestore": fmt.Errorf("%w: engine v1-e-0 has snapshot s9", engineapi.ErrInvalid)},
			wantWrites: []string{"update volumes/status v1"}, wantEvents: []string{"Warning RestoreFailed"},
			wantCalls: []string{"BackupRestore v1-e-0 b1 src " + url},
			check:     wantRestore(v1beta1.VolumeRestoreStateFailed, 0, "the instance manager refused the restore")}},
		{syncCase: syncCase{name: "an engine on another node: that node's manager follows the job", me: "node-2",
			objects: attached(b1, restoringVolume(restoreState(v1beta1.VolumeRestoreStateRestoring, 30)), testVA(restoreTicket()))}},
		{syncCase: syncCase{name: "a deleted volume releases its ticket",
			objects: attached(b1, restoringVolume(func(v *v1beta1.Volume) { v.DeletionTimestamp = &metav1.Time{Time: dstest.Now} }),
				testVA(restoreTicket())),
			wantWrites: []string{"update volumeattachments v1"}, check: wantRestoreTicket(false)}},
	}
	for _, tc := range cases {
		runSyncCases(t, []syncCase{tc.syncCase}, restoreSyncFunc(engineWithRestore(tc.job)))
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
			Namespace: testNS, Name: "v1", UID: "uid-v1"},
		Parameters: map[string]string{v1beta1.AttachmentParameterDisableFrontend: v1beta1.TrueValue}}
}
