package backup

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	"github.com/strata-storage/strata/types"
)

const (
	// DefaultBackupTargetName is the BackupTarget (in Strata's namespace)
	// every backup is taken to.
	DefaultBackupTargetName = "default"

	// AnnotationBackupMirrored marks a Backup the BackupTarget controller
	// created for a backup it found on the target: until the mirror has
	// written its status, the backup controller must not take it as a new
	// backup to make.
	AnnotationBackupMirrored = "strata.io/backup-mirrored"

	EventReasonBackupStarted   = "BackupStarted"
	EventReasonBackupCompleted = "BackupCompleted"
	EventReasonBackupFailed    = "BackupFailed"
	EventReasonBackupDeleted   = "BackupDeleted"

	// backupProgressStep: progress is written when it moved this much, so
	// a backup costs about ten status writes, not a hundred.
	backupProgressStep = 10
	// maxBackupAttempts bounds the retries of a backup job that failed
	// (an unreachable target, a replica lost mid-read); a refused backup
	// is never retried.
	maxBackupAttempts = 5
	// backupRetryBase is the wait before the first retry of a failed job,
	// doubled at each further one.
	backupRetryBase = 10 * time.Second
	// backupWaitTarget is how often a backup waiting for its target looks again.
	backupWaitTarget = time.Minute
	// backupWaitJob is how often a deleted backup whose job runs looks again.
	backupWaitJob = 5 * time.Second
)

// backupTicketID is the ticket a backup holds on its volume.
func backupTicketID(backup string) string { return "backup-" + backup }

// backupSync is what one sync of a backup knows.
type backupSync struct {
	b      *v1beta1.Backup // a copy; its status is written at the end
	target *v1beta1.BackupTarget
	vol    *v1beta1.Volume
	snap   *v1beta1.Snapshot
}

func (c *BackupController) syncBackup(ctx context.Context, key string) error {
	bRO, ok, err := kit.GetResponsible(c.BaseController, c.DS.Backups, key, c.backupOwnerAndNode)
	if err != nil || !ok {
		return err
	}
	if bRO.Status.State == "" && bRO.Annotations[AnnotationBackupMirrored] != "" && bRO.DeletionTimestamp == nil {
		return nil // the mirror is writing its status
	}
	if bRO.DeletionTimestamp != nil {
		return c.deleteBackup(ctx, bRO.DeepCopy())
	}
	if !slices.Contains(bRO.Finalizers, types.FinalizerName) {
		// The update event brings the backup back.
		_, err := c.DS.Backups.AddFinalizer(ctx, bRO, types.FinalizerName)
		return err
	}
	b := bRO.DeepCopy()
	b.Status.OwnerID = c.ControllerID
	actErr := c.reconcileBackup(ctx, b)
	if !equality.Semantic.DeepEqual(bRO.Status, b.Status) {
		if _, err := c.DS.Backups.UpdateStatus(ctx, b); err != nil {
			return errors.Join(actErr, err)
		}
	}
	if actErr != nil {
		return fmt.Errorf("backup %s: %w", b.Name, actErr)
	}
	return nil
}

// backupOwnerAndNode: a backup is taken by the manager of the node its
// volume is (or is being) attached to, which sees the engine's instance
// events. A finished one stays with its owner.
func (c *BackupController) backupOwnerAndNode(b *v1beta1.Backup) (string, string) {
	if kit.BackupFinished(b) && b.DeletionTimestamp == nil {
		return b.Status.OwnerID, ""
	}
	volume := backupVolumeName(b)
	if volume == "" && b.Spec.SnapshotName != "" {
		if s, err := c.DS.Snapshots.GetRO(b.Spec.SnapshotName); err == nil {
			volume = s.Spec.Volume
		}
	}
	if v, err := c.DS.Volumes.GetRO(volume); err == nil && volume != "" {
		if v.Status.CurrentNodeID != "" {
			return b.Status.OwnerID, v.Status.CurrentNodeID
		}
		return b.Status.OwnerID, v.Spec.NodeID
	}
	return b.Status.OwnerID, ""
}

func backupVolumeName(b *v1beta1.Backup) string {
	if b.Status.VolumeName != "" {
		return b.Status.VolumeName
	}
	return b.Labels[types.LabelVolume]
}

// reconcileBackup moves an unfinished backup one step on; a finished one
// only lets its volume go.
func (c *BackupController) reconcileBackup(ctx context.Context, b *v1beta1.Backup) error {
	if kit.BackupFinished(b) {
		c.retries.Forget(b.UID)
		c.reconcileVerify(b)
		if b.Status.VolumeName == "" {
			return nil
		}
		return c.RemoveTicket(ctx, b.Status.VolumeName, backupTicketID(b.Name))
	}
	if b.Status.State == "" {
		b.Status.State = v1beta1.BackupStateNew
	}
	s := &backupSync{b: b}
	if refusal, err := c.resolveVolume(s); err != nil || refusal != "" {
		if refusal != "" {
			c.failBackup(b, refusal)
		}
		return err
	}
	if b.Status.State == v1beta1.BackupStateNew {
		b.Status.State = v1beta1.BackupStatePending
	}
	if msg := c.resolveTarget(s); msg != "" {
		b.Status.Error = msg
		c.Queue.AddAfter(c.DS.Namespace+"/"+b.Name, backupWaitTarget)
		return nil
	}
	b.Status.URL = s.target.Spec.BackupTargetURL
	if err := c.ensureBackupTicket(ctx, s); err != nil {
		return fmt.Errorf("attaching volume %s: %w", s.vol.Name, err)
	}
	if ready, err := c.backupSnapshotReady(ctx, s); !ready || err != nil {
		return err
	}
	return c.runBackupJob(ctx, s)
}

// resolveVolume finds the volume (and, for a named snapshot, the snapshot)
// a backup is of; a refusal says why it can never be taken.
func (c *BackupController) resolveVolume(s *backupSync) (string, error) {
	b := s.b
	volume := b.Labels[types.LabelVolume]
	if b.Spec.SnapshotName != "" {
		snap, err := c.DS.Snapshots.GetRO(b.Spec.SnapshotName)
		if apierrors.IsNotFound(err) {
			return fmt.Sprintf("snapshot %s not found", b.Spec.SnapshotName), nil
		}
		if err != nil {
			return "", err
		}
		volume = snap.Spec.Volume
		b.Status.SnapshotName = b.Spec.SnapshotName
	} else if volume == "" {
		return fmt.Sprintf("neither spec.snapshotName nor the label %s names what to back up", types.LabelVolume), nil
	} else {
		b.Status.SnapshotName = b.Name
	}
	vol, err := c.DS.Volumes.GetRO(volume)
	if apierrors.IsNotFound(err) || (err == nil && vol.DeletionTimestamp != nil) {
		return fmt.Sprintf("volume %s not found", volume), nil
	}
	if err != nil {
		return "", err
	}
	s.vol = vol
	b.Status.VolumeName, b.Status.Labels = vol.Name, b.Spec.Labels
	return "", nil
}

// resolveTarget finds the default BackupTarget, or says why it cannot be
// used yet (the backup waits for it).
func (c *BackupController) resolveTarget(s *backupSync) string {
	bt, err := c.DS.BackupTargets.GetRO(DefaultBackupTargetName)
	if err != nil {
		return fmt.Sprintf("no backup target: create BackupTarget %s/%s (%v)", c.DS.Namespace, DefaultBackupTargetName, err)
	}
	if !bt.Status.Available {
		msg := "not checked yet"
		for _, cond := range bt.Status.Conditions {
			if cond.Type == ConditionTypeAvailable && cond.Message != "" {
				msg = cond.Message
			}
		}
		return fmt.Sprintf("backup target %s is not available: %s", bt.Spec.BackupTargetURL, msg)
	}
	s.target = bt
	return ""
}

// ensureBackupTicket keeps the volume attached while the backup is made: on
// the node it is attached to, else on this manager's node.
func (c *BackupController) ensureBackupTicket(ctx context.Context, s *backupSync) error {
	b := s.b
	node := s.vol.Spec.NodeID
	if va, err := c.DS.VolumeAttachments.GetRO(s.vol.Name); err == nil {
		if t := va.Spec.AttachmentTickets[backupTicketID(b.Name)]; t != nil {
			node = t.NodeID // keep the node the ticket has
		}
	}
	if node == "" {
		node = c.ControllerID
	}
	return c.EnsureTicket(ctx, s.vol.Name, &v1beta1.AttachmentTicket{ID: backupTicketID(b.Name),
		Type: v1beta1.AttacherTypeBackupController, NodeID: node,
		OwnerRef: &v1beta1.TicketOwnerReference{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: "Backup",
			Namespace: b.Namespace, Name: b.Name, UID: string(b.UID)},
		Parameters: map[string]string{v1beta1.AttachmentParameterDisableFrontend: v1beta1.AnyValue}})
}

// backupSnapshotReady makes sure the snapshot exists and is ready; a backup
// of a whole volume takes it first (a Snapshot CR owned by the Backup: a
// system snapshot, never refused by the volume's limits).
func (c *BackupController) backupSnapshotReady(ctx context.Context, s *backupSync) (bool, error) {
	b := s.b
	snap, err := c.DS.Snapshots.GetRO(b.Status.SnapshotName)
	switch {
	case apierrors.IsNotFound(err) && b.Spec.SnapshotName == "":
		b.Status.Error = ""
		return false, c.createBackupSnapshot(ctx, s)
	case apierrors.IsNotFound(err) || (err == nil && snap.DeletionTimestamp != nil):
		c.failBackup(b, fmt.Sprintf("snapshot %s went away before the backup was taken", b.Status.SnapshotName))
		return false, nil
	case err != nil:
		return false, err
	case snap.Spec.Volume != s.vol.Name:
		c.failBackup(b, fmt.Sprintf("snapshot %s belongs to volume %s, not %s", snap.Name, snap.Spec.Volume, s.vol.Name))
		return false, nil
	case snap.Status.Error != "" && !snap.Status.ReadyToUse:
		c.failBackup(b, fmt.Sprintf("snapshot %s: %s", snap.Name, snap.Status.Error))
		return false, nil
	case !snap.Status.ReadyToUse:
		return false, nil
	}
	s.snap = snap
	b.Status.SnapshotCreatedAt = snap.Status.CreationTime
	return true, nil
}

func (c *BackupController) createBackupSnapshot(ctx context.Context, s *backupSync) error {
	b := s.b
	_, err := c.DS.Snapshots.Create(ctx, &v1beta1.Snapshot{
		ObjectMeta: metav1.ObjectMeta{Name: b.Name, Namespace: b.Namespace,
			Labels: map[string]string{types.LabelVolume: s.vol.Name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: "Backup",
				Name: b.Name, UID: b.UID}}},
		Spec: v1beta1.SnapshotSpec{Volume: s.vol.Name, CreateSnapshot: true}})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// runBackupJob starts the instance manager's job once the volume's engine
// runs on this node, and follows it through the instance cache.
func (c *BackupController) runBackupJob(ctx context.Context, s *backupSync) error {
	b := s.b
	e, err := c.VolumeEngine(s.vol)
	if err != nil {
		return err
	}
	if s.vol.Status.State != v1beta1.VolumeStateAttached || e == nil || !kit.EngineRunning(e) ||
		e.Spec.NodeID != s.vol.Status.CurrentNodeID {
		return nil // the volume's update brings the backup back
	}
	if e.Spec.NodeID != c.ControllerID || c.instances == nil {
		return nil // the manager of the engine's node takes it (backupOwnerAndNode)
	}
	inst, found, synced := c.instances.Get(e.Name)
	if !synced || !found {
		return nil // the cache's sync brings the backup back
	}
	st := inst.BackupStatus[b.Name]
	if st != nil && c.retries.PreviousError(b.UID, st.State, inst.Revision) {
		st = nil // the new attempt has not shown yet
	}
	switch {
	case st == nil:
		if wait := c.retries.BackoffLeft(b.UID, c.DS.Clock.Now()); wait > 0 {
			c.Queue.AddAfter(c.DS.Namespace+"/"+b.Name, wait)
			return nil
		}
		return c.startBackupJob(ctx, s, e, inst.Revision)
	case st.State == engineapi.JobStateInProgress:
		if b.Status.State != v1beta1.BackupStateInProgress || st.Progress >= b.Status.Progress+backupProgressStep {
			b.Status.Progress, b.Status.BytesDone, b.Status.BytesTotal = st.Progress, st.BytesDone, st.BytesTotal
		}
		b.Status.State, b.Status.Error = v1beta1.BackupStateInProgress, ""
		return nil
	case st.State == engineapi.JobStateCompleted:
		return c.completeBackup(ctx, s, st.BaseBackup)
	}
	return c.jobFailed(ctx, s, st.Error, inst.Revision)
}

func (c *BackupController) startBackupJob(ctx context.Context, s *backupSync, e *v1beta1.Engine, revision uint64) error {
	b := s.b
	target, err := c.engineTarget(ctx, s.target)
	if err != nil {
		b.Status.Error = err.Error()
		return err
	}
	args := engineapi.SnapshotBackupArgs{Engine: e.Name, Snapshot: s.snap.Name, Backup: b.Name, Volume: s.vol.Name,
		Target: target, Labels: b.Spec.Labels}
	args.BaseBackup, args.BaseSnapshot = c.baseBackup(s)
	ref, err := c.DS.BackingImageRefOf(s.vol)
	if err != nil {
		b.Status.Error = err.Error()
		return err
	}
	if ref.Name != "" {
		args.BackingImage = &engineapi.BackingImageRef{Name: ref.Name, URL: ref.URL, Checksum: ref.Checksum}
		b.Status.VolumeBackingImageName = ref.Name
	}
	dp, err := c.EngineDataPlane(e)
	if err != nil {
		return err
	}
	err = dp.SnapshotBackup(ctx, args)
	switch {
	case errors.Is(err, engineapi.ErrInvalid) || errors.Is(err, engineapi.ErrNotFound):
		c.failBackup(b, "the instance manager refused the backup: "+err.Error())
		return nil
	case errors.Is(err, engineapi.ErrBusy):
		b.Status.Error = fmt.Sprintf("waiting: another backup or restore of volume %s runs", s.vol.Name)
		return err
	case err != nil:
		b.Status.Error = "starting the backup: " + err.Error()
		return err
	}
	c.retries.Started(b.UID, revision)
	if b.Status.State != v1beta1.BackupStateInProgress {
		base := "a full backup"
		if args.BaseBackup != "" {
			base = "incremental on " + args.BaseBackup
		}
		c.Recorder.Eventf(b, corev1.EventTypeNormal, EventReasonBackupStarted, "backing up snapshot %s of volume %s to %s (%s)",
			s.snap.Name, s.vol.Name, s.target.Spec.BackupTargetURL, base)
	}
	b.Status.State, b.Status.Progress, b.Status.Error = v1beta1.BackupStateInProgress, 0, ""
	b.Status.BytesDone, b.Status.BytesTotal = 0, 0
	return nil
}

// baseBackup is the newest completed backup of the same volume on the same
// target whose snapshot still exists: only what changed since is read.
func (c *BackupController) baseBackup(s *backupSync) (string, string) {
	backups, err := c.DS.Backups.ListByIndexRO(datastore.IndexByVolume, s.vol.Name)
	if err != nil {
		return "", ""
	}
	var best *v1beta1.Backup
	for _, o := range backups {
		if o.Name == s.b.Name || o.Status.State != v1beta1.BackupStateCompleted || o.DeletionTimestamp != nil ||
			o.Status.VolumeName != s.vol.Name || o.Status.URL != s.target.Spec.BackupTargetURL {
			continue
		}
		snap, err := c.DS.Snapshots.GetRO(o.Status.SnapshotName)
		if err != nil || snap.DeletionTimestamp != nil || snap.Spec.Volume != s.vol.Name || snap.Status.MarkRemoved {
			continue
		}
		if best == nil || o.Status.BackupCreatedAt > best.Status.BackupCreatedAt ||
			(o.Status.BackupCreatedAt == best.Status.BackupCreatedAt && o.Name > best.Name) {
			best = o
		}
	}
	if best == nil {
		return "", ""
	}
	return best.Name, best.Status.SnapshotName
}

// completeBackup records a finished job from its manifest, as the
// BackupTarget controller's mirror would, so the mirror never rewrites it.
// jobBase is the base the job reported using.
func (c *BackupController) completeBackup(ctx context.Context, s *backupSync, jobBase string) error {
	b := s.b
	m, err := c.loadManifest(ctx, s.target, s.vol.Name, b.Name)
	if err != nil {
		b.Status.Error = "reading the backup's manifest: " + err.Error()
		return err
	}
	c.setCompleted(b, s.target, m.Header, jobBase)
	return nil
}

func (c *BackupController) setCompleted(b *v1beta1.Backup, bt *v1beta1.BackupTarget, h backupstore.Header, jobBase string) {
	st := completedBackupStatus(bt.Spec.BackupTargetURL, h)
	st.OwnerID, st.LastSyncedAt, st.SnapshotCreatedAt = b.Status.OwnerID, b.Status.LastSyncedAt, b.Status.SnapshotCreatedAt
	st.Verification = b.Status.Verification
	if st.IncrementalOn == "" {
		// The manifest of an instance manager older than Header.Base names
		// no base; the job's status does (the mirror keeps it).
		st.IncrementalOn = jobBase
	}
	if b.Status.State != v1beta1.BackupStateCompleted {
		BackupDuration.Observe(c.DS.Clock.Since(b.CreationTimestamp.Time).Seconds())
		BackupUploadedBytes.Add(float64(h.Stats.NewBytes))
	}
	b.Status = st
	c.retries.Forget(b.UID)
	how := "a full backup"
	if st.IncrementalOn != "" {
		how = "incremental on " + st.IncrementalOn
	}
	c.Recorder.Eventf(b, corev1.EventTypeNormal, EventReasonBackupCompleted,
		"backed up snapshot %s of volume %s (%s): %d bytes uploaded, %d stored", h.Snapshot, h.Volume, how,
		h.Stats.NewBytes, h.Stats.StoredBytes)
}

// jobFailed handles a job that ended in error: a manifest on the target
// means it was made after all (an earlier attempt's); otherwise it is
// retried with backoff, up to maxBackupAttempts.
func (c *BackupController) jobFailed(ctx context.Context, s *backupSync, msg string, revision uint64) error {
	b := s.b
	if m, err := c.loadManifest(ctx, s.target, s.vol.Name, b.Name); err == nil {
		c.setCompleted(b, s.target, m.Header, "")
		return nil
	}
	attempts, wait := c.retries.Failed(b.UID, revision, c.DS.Clock.Now(), backupRetryBase)
	if attempts >= maxBackupAttempts {
		c.failBackup(b, fmt.Sprintf("failed %d times, last: %s", attempts, msg))
		return nil
	}
	BackupFailures.WithLabelValues("false").Inc()
	b.Status.State = v1beta1.BackupStatePending
	b.Status.Error = fmt.Sprintf("attempt %d failed, retried in %s: %s", attempts, wait, msg)
	c.Recorder.Event(b, corev1.EventTypeWarning, EventReasonBackupFailed, b.Status.Error)
	c.Queue.AddAfter(c.DS.Namespace+"/"+b.Name, wait)
	return nil
}

// failBackup ends a backup for good; its ticket goes on the next sync.
func (c *BackupController) failBackup(b *v1beta1.Backup, msg string) {
	if b.Status.State != v1beta1.BackupStateError {
		BackupFailures.WithLabelValues("true").Inc()
	}
	if b.Status.State != v1beta1.BackupStateError || b.Status.Error != msg {
		c.Recorder.Event(b, corev1.EventTypeWarning, EventReasonBackupFailed, msg)
	}
	b.Status.State, b.Status.Error = v1beta1.BackupStateError, msg
	c.retries.Forget(b.UID)
}

// deleteBackup deletes the backup's manifest from the target (its chunks
// stay until a GC of the target), releases its ticket and snapshot, then
// lets the CR go. A target that cannot be reached keeps the finalizer.
func (c *BackupController) deleteBackup(ctx context.Context, b *v1beta1.Backup) error {
	if !slices.Contains(b.Finalizers, types.FinalizerName) {
		return nil
	}
	volume := backupVolumeName(b)
	if c.backupJobRunning(b, volume) {
		// Its manifest would be written after the delete: wait for the end.
		c.Queue.AddAfter(c.DS.Namespace+"/"+b.Name, backupWaitJob)
		return nil
	}
	c.retries.Forget(b.UID)
	c.cancelVerify(b)
	if volume != "" {
		if err := c.RemoveTicket(ctx, volume, backupTicketID(b.Name)); err != nil {
			return fmt.Errorf("backup %s: releasing its ticket: %w", b.Name, err)
		}
	}
	if err := c.deleteBackupSnapshot(ctx, b); err != nil {
		return fmt.Errorf("backup %s: deleting its snapshot: %w", b.Name, err)
	}
	if err := c.deleteManifest(ctx, b, volume); err != nil {
		msg := "deleting the backup from the target: " + err.Error()
		if b.Status.Error != msg {
			b.Status.Error = msg
			if _, uerr := c.DS.Backups.UpdateStatus(ctx, b); uerr != nil {
				return errors.Join(err, uerr)
			}
		}
		return fmt.Errorf("backup %s: %w", b.Name, err)
	}
	_, err := c.DS.Backups.RemoveFinalizer(ctx, b, types.FinalizerName)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// backupJobRunning tells whether this node's instance manager runs the
// backup's job now.
func (c *BackupController) backupJobRunning(b *v1beta1.Backup, volume string) bool {
	vol, err := c.DS.Volumes.GetRO(volume)
	if err != nil || volume == "" || c.instances == nil {
		return false
	}
	e, err := c.VolumeEngine(vol)
	if err != nil || e == nil || e.Spec.NodeID != c.ControllerID {
		return false
	}
	inst, found, _ := c.instances.Get(e.Name)
	if !found {
		return false
	}
	st := inst.BackupStatus[b.Name]
	return st != nil && st.State == engineapi.JobStateInProgress
}

// deleteManifest deletes the backup from the default target when it is
// the one the backup was taken to. No target (or another one now): there
// is nothing this cluster can delete, and the CR goes.
func (c *BackupController) deleteManifest(ctx context.Context, b *v1beta1.Backup, volume string) error {
	bt, err := c.DS.BackupTargets.GetRO(DefaultBackupTargetName)
	if apierrors.IsNotFound(err) || volume == "" || (err == nil && b.Status.URL != "" && b.Status.URL != bt.Spec.BackupTargetURL) {
		c.Logger.WithField("backup", b.Name).Info("Backup deleted without touching a target: not taken to the default one")
		return nil
	}
	if err != nil {
		return err
	}
	callCtx, cancel := context.WithTimeout(ctx, backupTargetCallTimeout)
	defer cancel()
	tgt, err := c.openTarget(callCtx, bt)
	if err != nil {
		return err
	}
	if err := tgt.DeleteBackup(callCtx, volume, b.Name); err != nil {
		return err
	}
	// Its packs go with the target owner's GC, asked for now; a failed ask
	// is retried with the (idempotent) delete.
	if err := requestBackupTargetGC(ctx, c.DS, bt); err != nil {
		return err
	}
	c.Recorder.Eventf(b, corev1.EventTypeNormal, EventReasonBackupDeleted, "deleted backup %s of volume %s from %s",
		b.Name, volume, bt.Spec.BackupTargetURL)
	return nil
}

// deleteBackupSnapshot deletes the snapshot taken for the backup. The
// Backup owns it, but so does the volume (the snapshot webhook adds it), so
// garbage collection alone would keep it as long as the volume lives.
func (c *BackupController) deleteBackupSnapshot(ctx context.Context, b *v1beta1.Backup) error {
	if b.Spec.SnapshotName != "" {
		return nil
	}
	snap, err := c.DS.Snapshots.GetRO(b.Name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if snap.DeletionTimestamp != nil || !slices.ContainsFunc(snap.OwnerReferences, func(o metav1.OwnerReference) bool {
		return o.Kind == "Backup" && o.UID == b.UID
	}) {
		return nil
	}
	err = c.DS.Snapshots.Delete(ctx, snap.Name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// engineTarget is the target as the instance manager takes it.
func (c *BackupController) engineTarget(ctx context.Context, bt *v1beta1.BackupTarget) (engineapi.BackupTarget, error) {
	return engineBackupTarget(ctx, c.DS, bt)
}

func (c *BackupController) openTarget(ctx context.Context, bt *v1beta1.BackupTarget) (*backupstore.Target, error) {
	secret, err := targetCredentials(ctx, c.DS, bt)
	if err != nil {
		return nil, err
	}
	store, err := c.storeFor(bt.Spec.BackupTargetURL, secret)
	if err != nil {
		return nil, err
	}
	return backupstore.Open(ctx, store, backupstore.Options{})
}

func (c *BackupController) loadManifest(ctx context.Context, bt *v1beta1.BackupTarget, volume, backup string) (*backupstore.Manifest, error) {
	callCtx, cancel := context.WithTimeout(ctx, backupTargetCallTimeout)
	defer cancel()
	tgt, err := c.openTarget(callCtx, bt)
	if err != nil {
		return nil, err
	}
	return tgt.LoadManifest(callCtx, volume, backup)
}
