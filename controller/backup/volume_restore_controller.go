package backup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Event reasons and the condition of the restore controller.
const (
	EventReasonRestoreStarted   = "RestoreStarted"
	EventReasonRestoreCompleted = "RestoreCompleted"
	EventReasonRestoreFailed    = "RestoreFailed"

	// VolumeConditionRestored is true once the backup is restored into the volume.
	VolumeConditionRestored = "Restored"

	// maxRestoreAttempts bounds the restarts of a restore that failed for a
	// reason that may pass (the target unreachable, a replica lost); damaged
	// data fails it at once.
	maxRestoreAttempts = 5
)

// restoreTicketID is the ticket a volume being restored holds on itself.
func restoreTicketID(volume string) string { return "restore-" + volume }

// restoreSync is what one sync of a volume being restored knows.
type restoreSync struct {
	vol    *v1beta1.Volume // a copy; its status is written at the end
	status *v1beta1.VolumeRestoreStatus
	backup *v1beta1.Backup
	target *v1beta1.BackupTarget
}

func (c *VolumeRestoreController) syncRestore(ctx context.Context, key string) error {
	vRO, ok, err := kit.GetResponsible(c.BaseController, c.DS.Volumes, key, restoreOwnerAndNode)
	if err != nil || !ok || vRO.Spec.FromBackup == "" {
		return err
	}
	v := vRO.DeepCopy()
	if v.DeletionTimestamp != nil {
		c.retries.Forget(v.UID)
		return c.RemoveTicket(ctx, v.Name, restoreTicketID(v.Name))
	}
	if v.Status.RestoreStatus == nil {
		v.Status.RestoreStatus = &v1beta1.VolumeRestoreStatus{State: v1beta1.VolumeRestoreStatePending, Backup: v.Spec.FromBackup}
	}
	s := &restoreSync{vol: v, status: v.Status.RestoreStatus}
	actErr := c.reconcileRestore(ctx, s)
	setRestoredCondition(v)
	if !equality.Semantic.DeepEqual(vRO.Status, v.Status) {
		if _, err := c.DS.Volumes.UpdateStatus(ctx, v); err != nil {
			return errors.Join(actErr, err)
		}
	}
	if actErr != nil {
		return fmt.Errorf("restore of volume %s: %w", v.Name, actErr)
	}
	return nil
}

// restoreOwnerAndNode: the manager of the node the volume is (being)
// attached to follows the job in its instance cache; before that, the
// volume's owner, whose node the ticket asks for.
func restoreOwnerAndNode(v *v1beta1.Volume) (string, string) {
	if v.Status.CurrentNodeID != "" {
		return v.Status.OwnerID, v.Status.CurrentNodeID
	}
	if v.Spec.NodeID != "" {
		return v.Status.OwnerID, v.Spec.NodeID
	}
	return v.Status.OwnerID, v.Status.OwnerID
}

func finalRestoreState(s v1beta1.VolumeRestoreState) bool {
	return s == v1beta1.VolumeRestoreStateCompleted || s == v1beta1.VolumeRestoreStateFailed
}

func (c *VolumeRestoreController) reconcileRestore(ctx context.Context, s *restoreSync) error {
	if finalRestoreState(s.status.State) {
		// Written last sync: the volume may detach now.
		c.retries.Forget(s.vol.UID)
		return c.RemoveTicket(ctx, s.vol.Name, restoreTicketID(s.vol.Name))
	}
	if ok, err := c.restoreSource(s); !ok || err != nil {
		return err
	}
	if err := c.ensureRestoreTicket(ctx, s.vol); apierrors.IsNotFound(err) {
		// The volume controller creates the VolumeAttachment with the
		// volume; its creation enqueues nobody here, so look again soon
		// rather than fail the sync.
		s.status.Message = "waiting for the volume's VolumeAttachment"
		c.Queue.AddAfter(s.vol.Namespace+"/"+s.vol.Name, time.Second)
		return nil
	} else if err != nil {
		return err
	}
	return c.runRestoreJob(ctx, s)
}

// restoreSource finds the backup and its target, or says why not.
func (c *VolumeRestoreController) restoreSource(s *restoreSync) (bool, error) {
	name := s.vol.Spec.FromBackup
	b, err := c.DS.Backups.GetRO(name)
	switch {
	case apierrors.IsNotFound(err) || (err == nil && b.DeletionTimestamp != nil):
		c.failRestore(s, fmt.Sprintf("backup %s went away before the restore completed", name))
		return false, nil
	case err != nil:
		return false, err
	case b.Status.State != v1beta1.BackupStateCompleted:
		c.failRestore(s, fmt.Sprintf("backup %s is %s, not Completed", name, kit.OrUnknown(string(b.Status.State))))
		return false, nil
	}
	s.backup = b
	s.status.Backup, s.status.BackupVolume = name, b.Status.VolumeName
	bt, err := c.DS.BackupTargets.GetRO(DefaultBackupTargetName)
	switch {
	case apierrors.IsNotFound(err):
		s.status.Message = fmt.Sprintf("waiting for the backup target %s to be created", DefaultBackupTargetName)
		return false, nil
	case err != nil:
		return false, err
	case b.Status.URL != "" && b.Status.URL != bt.Spec.BackupTargetURL:
		c.failRestore(s, fmt.Sprintf("backup %s is on %s, but the backup target %s is now %s",
			name, b.Status.URL, DefaultBackupTargetName, bt.Spec.BackupTargetURL))
		return false, nil
	case !bt.Status.Available:
		s.status.Message = fmt.Sprintf("waiting for the backup target %s to be available", DefaultBackupTargetName)
		return false, nil
	}
	s.target = bt
	return true, nil
}

// ensureRestoreTicket attaches the volume with its frontend off on the
// node of the ticket already there while that node lives, else on this
// manager's node.
func (c *VolumeRestoreController) ensureRestoreTicket(ctx context.Context, v *v1beta1.Volume) error {
	node := c.ControllerID
	if va, err := c.DS.VolumeAttachments.GetRO(v.Name); err == nil {
		if t := va.Spec.AttachmentTickets[restoreTicketID(v.Name)]; t != nil && c.DS.IsNodeAlive(t.NodeID) {
			node = t.NodeID
		}
	}
	owner := &v1beta1.TicketOwnerReference{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: "Volume",
		Namespace: v.Namespace, Name: v.Name, UID: string(v.UID)}
	return c.EnsureTicket(ctx, v.Name, &v1beta1.AttachmentTicket{ID: restoreTicketID(v.Name),
		Type: v1beta1.AttacherTypeVolumeRestoreController, NodeID: node, OwnerRef: owner,
		Parameters: map[string]string{v1beta1.AttachmentParameterDisableFrontend: v1beta1.TrueValue}})
}

// runRestoreJob starts the instance manager's job once the volume's engine
// runs here without a frontend, and follows it through the instance cache.
func (c *VolumeRestoreController) runRestoreJob(ctx context.Context, s *restoreSync) error {
	v := s.vol
	e, err := c.VolumeEngine(v)
	if err != nil {
		return err
	}
	switch {
	case v.Status.State != v1beta1.VolumeStateAttached || e == nil || !kit.EngineRunning(e) || e.Spec.NodeID != v.Status.CurrentNodeID:
		s.status.Message = fmt.Sprintf("waiting for the volume to attach for the restore (now %s)", kit.OrUnknown(string(v.Status.State)))
		return nil
	case e.Status.Endpoint != "":
		s.status.Message = "waiting for the volume's frontend to stop"
		return nil
	case e.Spec.NodeID != c.ControllerID || c.instances == nil:
		return nil // the manager of the engine's node follows it (restoreOwnerAndNode)
	}
	inst, found, synced := c.instances.Get(e.Name)
	if !synced || !found {
		return nil // the cache's sync brings the volume back
	}
	st := inst.RestoreStatus
	if st != nil && (st.Backup != s.backup.Name || st.Volume != s.backup.Status.VolumeName) {
		st = nil // another restore's, which this one replaces
	}
	if st != nil && c.retries.PreviousError(v.UID, st.State, inst.Revision) {
		st = nil // the new attempt has not shown yet
	}
	switch {
	case st == nil:
		if wait := c.retries.BackoffLeft(v.UID, c.DS.Clock.Now()); wait > 0 {
			c.Queue.AddAfter(v.Namespace+"/"+v.Name, wait)
			return nil
		}
		return c.startRestoreJob(ctx, s, e, inst.Revision)
	case st.State == engineapi.JobStateInProgress:
		if s.status.State != v1beta1.VolumeRestoreStateRestoring || st.Progress >= s.status.Progress+backupProgressStep {
			s.status.Progress, s.status.BytesDone, s.status.BytesTotal = st.Progress, st.BytesDone, st.BytesTotal
		}
		s.status.State, s.status.Message = v1beta1.VolumeRestoreStateRestoring, ""
		return nil
	case st.State == engineapi.JobStateCompleted:
		s.status.State, s.status.Progress, s.status.Message = v1beta1.VolumeRestoreStateCompleted, 100, ""
		s.status.BytesDone, s.status.BytesTotal = st.BytesTotal, st.BytesTotal
		c.Recorder.Eventf(v, corev1.EventTypeNormal, EventReasonRestoreCompleted, "restored backup %s of volume %s (%d bytes fetched)",
			s.backup.Name, s.backup.Status.VolumeName, st.BytesTotal)
		return nil
	}
	return c.restoreJobFailed(s, st.Error, inst.Revision)
}

func (c *VolumeRestoreController) startRestoreJob(ctx context.Context, s *restoreSync, e *v1beta1.Engine, revision uint64) error {
	target, err := engineBackupTarget(ctx, c.DS, s.target)
	if err != nil {
		s.status.Message = err.Error()
		return err
	}
	args := engineapi.BackupRestoreArgs{Engine: e.Name, Backup: s.backup.Name, Volume: s.backup.Status.VolumeName,
		Target: target, Backing: restoreOntoBackingImage(s.vol, s.backup)}
	dp, err := c.EngineDataPlane(e)
	if err != nil {
		return err
	}
	err = dp.BackupRestore(ctx, args)
	switch {
	case errors.Is(err, engineapi.ErrInvalid) || errors.Is(err, engineapi.ErrNotFound):
		c.failRestore(s, "the instance manager refused the restore: "+err.Error())
		return nil
	case errors.Is(err, engineapi.ErrBusy):
		s.status.Message = "waiting: " + err.Error()
		return err
	case err != nil:
		s.status.Message = "starting the restore: " + err.Error()
		return err
	}
	c.retries.Started(s.vol.UID, revision)
	s.status.Attempts++
	c.Recorder.Eventf(s.vol, corev1.EventTypeNormal, EventReasonRestoreStarted,
		"restoring backup %s of volume %s from %s (attempt %d, backing image kept: %t)",
		s.backup.Name, s.backup.Status.VolumeName, s.target.Spec.BackupTargetURL, s.status.Attempts, args.Backing)
	s.status.State, s.status.Progress, s.status.Message = v1beta1.VolumeRestoreStateRestoring, 0, ""
	return nil
}

// restoreOntoBackingImage: the volume's replicas sit on the image the
// backup was taken over (the webhook checked the checksums), so its chunks
// are left to the backing file.
func restoreOntoBackingImage(v *v1beta1.Volume, b *v1beta1.Backup) bool {
	return v.Spec.BackingImage != "" && b.Status.VolumeBackingImageName != ""
}

// restoreErrorFinal tells the job errors no retry can cure: the backup's
// data is damaged or does not fit. The instance manager reports them as
// text (engine/imserver/restore.go and internal/backupstore name them).
func restoreErrorFinal(msg string) bool {
	for _, s := range []string{backupstore.ErrChecksum.Error(), backupstore.ErrCorruptManifest.Error(), ", the volume only "} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

func (c *VolumeRestoreController) restoreJobFailed(s *restoreSync, msg string, revision uint64) error {
	if restoreErrorFinal(msg) {
		c.failRestore(s, msg)
		return nil
	}
	attempts, wait := c.retries.Failed(s.vol.UID, revision, c.DS.Clock.Now(), backupRetryBase)
	if attempts >= maxRestoreAttempts {
		c.failRestore(s, fmt.Sprintf("failed %d times, last: %s", attempts, msg))
		return nil
	}
	s.status.State = v1beta1.VolumeRestoreStatePending
	s.status.Message = fmt.Sprintf("attempt %d failed, retried in %s: %s", attempts, wait.Round(time.Second), msg)
	c.Recorder.Event(s.vol, corev1.EventTypeWarning, EventReasonRestoreFailed, s.status.Message)
	c.Queue.AddAfter(s.vol.Namespace+"/"+s.vol.Name, wait)
	return nil
}

// failRestore ends the restore for good: the volume serves nothing and
// says why; deleting it is the way out. The ticket goes on the next sync,
// once the state is stored.
func (c *VolumeRestoreController) failRestore(s *restoreSync, msg string) {
	if s.status.State != v1beta1.VolumeRestoreStateFailed {
		c.Recorder.Event(s.vol, corev1.EventTypeWarning, EventReasonRestoreFailed, msg)
	}
	s.status.State, s.status.Message = v1beta1.VolumeRestoreStateFailed, msg
}

func setRestoredCondition(v *v1beta1.Volume) {
	rs := v.Status.RestoreStatus
	now := metav1.NewTime(time.Now())
	switch rs.State {
	case v1beta1.VolumeRestoreStateCompleted:
		kit.SetCondition(&v.Status.Conditions, VolumeConditionRestored, true, "RestoreCompleted",
			fmt.Sprintf("restored from backup %s", v.Spec.FromBackup), now)
	case v1beta1.VolumeRestoreStateFailed:
		kit.SetCondition(&v.Status.Conditions, VolumeConditionRestored, false, "RestoreFailed", rs.Message, now)
	default:
		kit.SetCondition(&v.Status.Conditions, VolumeConditionRestored, false, "RestoreInProgress",
			fmt.Sprintf("restoring from backup %s: %s", v.Spec.FromBackup, kit.OrUnknown(string(rs.State))), now)
	}
}

// engineBackupTarget is a BackupTarget as an instance manager takes it:
// the URL and the keys from its credential Secret.
func engineBackupTarget(ctx context.Context, ds *datastore.DataStore, bt *v1beta1.BackupTarget) (engineapi.BackupTarget, error) {
	secret, err := targetCredentials(ctx, ds, bt)
	if err != nil {
		return engineapi.BackupTarget{}, err
	}
	return engineapi.BackupTarget{URL: bt.Spec.BackupTargetURL,
		S3Endpoint: strings.TrimSpace(string(secret[backupstore.SecretEndpoint])),
		AccessKey:  string(secret[backupstore.SecretAccessKey]), SecretKey: string(secret[backupstore.SecretSecretKey])}, nil
}
