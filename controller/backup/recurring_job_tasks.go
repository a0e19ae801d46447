package backup

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// runTask does the job's task on one volume (docs/recurring-jobs.md).
func (c *RecurringJobController) runTask(ctx context.Context, job *v1beta1.RecurringJob, vol *v1beta1.Volume,
	tick time.Time) error {
	switch job.Spec.Task {
	case v1beta1.RecurringJobTaskSnapshot:
		name := recurringObjectName(job.Name, vol.Name, tick)
		if err := c.takeJobSnapshot(ctx, job, vol, name); err != nil {
			return err // no pruning: the one taken now is not there to count
		}
		return c.pruneJobSnapshots(ctx, job, vol.Name)
	case v1beta1.RecurringJobTaskBackup:
		return c.backupTask(ctx, job, vol, tick)
	case v1beta1.RecurringJobTaskSnapshotDelete:
		return c.snapshotDeleteTask(ctx, job, vol)
	case v1beta1.RecurringJobTaskSnapshotCleanup:
		return c.snapshotCleanupTask(ctx, vol)
	}
	return fmt.Errorf("unknown task %q", job.Spec.Task)
}

// backupTask takes the tick's snapshot, backs it up, waits a bounded time
// for the backup, then applies retention to the job's backups and
// snapshots.
func (c *RecurringJobController) backupTask(ctx context.Context, job *v1beta1.RecurringJob, vol *v1beta1.Volume,
	tick time.Time) error {
	name := recurringObjectName(job.Name, vol.Name, tick)
	if err := c.takeJobSnapshot(ctx, job, vol, name); err != nil {
		return err
	}
	if err := c.createJobBackup(ctx, job, vol, name); err != nil {
		return err
	}
	backupErr := c.waitBackup(ctx, name)
	return errors.Join(backupErr, c.pruneJobBackups(ctx, job, vol.Name), c.pruneJobSnapshots(ctx, job, vol.Name))
}

// jobLabels are the labels of what job makes of volume: the job's own
// spec.labels, then the job's name and the volume (which win).
func jobLabels(job *v1beta1.RecurringJob, volume string) map[string]string {
	l := maps.Clone(job.Spec.Labels)
	if l == nil {
		l = map[string]string{}
	}
	l[types.LabelRecurringJob] = job.Name
	if volume != "" {
		l[types.LabelVolume] = volume
	}
	return l
}

// takeJobSnapshot creates the tick's snapshot and waits until it is taken.
func (c *RecurringJobController) takeJobSnapshot(ctx context.Context, job *v1beta1.RecurringJob, vol *v1beta1.Volume,
	name string) error {
	_, err := c.DS.Snapshots.Create(ctx, &v1beta1.Snapshot{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: vol.Namespace, Labels: jobLabels(job, vol.Name)},
		Spec:       v1beta1.SnapshotSpec{Volume: vol.Name, CreateSnapshot: true, Labels: jobLabels(job, "")}})
	if apierrors.IsAlreadyExists(err) {
		err = c.madeByJob(ctx, job, name) // a retried run: it is ours
	}
	if err != nil {
		return fmt.Errorf("creating snapshot %s: %w", name, err)
	}
	return c.waitSnapshotReady(ctx, name)
}

func (c *RecurringJobController) madeByJob(ctx context.Context, job *v1beta1.RecurringJob, name string) error {
	s, err := c.DS.Snapshots.GetROOrLive(ctx, name)
	if err != nil {
		return err
	}
	if s.Labels[types.LabelRecurringJob] != job.Name {
		return fmt.Errorf("the name is taken by a snapshot recurring job %q did not make", job.Name)
	}
	return nil
}

func (c *RecurringJobController) waitSnapshotReady(ctx context.Context, name string) error {
	return c.waitTaken(ctx, "snapshot "+name, func() (bool, error) {
		s, err := c.DS.Snapshots.GetRO(name)
		switch {
		case apierrors.IsNotFound(err):
			return false, nil // the cache has not seen it yet
		case err != nil:
			return false, err
		case s.DeletionTimestamp != nil:
			return false, fmt.Errorf("snapshot %s is being deleted", name)
		case s.Status.ReadyToUse:
			return true, nil
		case s.Status.Error != "":
			return false, fmt.Errorf("snapshot %s: %s", name, s.Status.Error)
		}
		return false, nil
	})
}

// waitTaken waits up to the snapshot wait for taken to say what (a
// snapshot, a group) is taken: a run cancelled meanwhile is
// errRunCancelled, one past the wait says so.
func (c *RecurringJobController) waitTaken(ctx context.Context, what string, taken func() (bool, error)) error {
	err := c.waitFor(ctx, c.snapshotWait, taken)
	if ctx.Err() != nil {
		return errRunCancelled
	}
	if wait.Interrupted(err) {
		return fmt.Errorf("%s not taken within %s", what, c.snapshotWait)
	}
	return err
}

// createJobBackup backs up the tick's snapshot to the default target.
func (c *RecurringJobController) createJobBackup(ctx context.Context, job *v1beta1.RecurringJob, vol *v1beta1.Volume,
	name string) error {
	_, err := c.DS.Backups.Create(ctx, &v1beta1.Backup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.DS.Namespace, Labels: jobLabels(job, vol.Name)},
		Spec:       v1beta1.BackupSpec{SnapshotName: name, Labels: jobLabels(job, "")}})
	if apierrors.IsAlreadyExists(err) {
		return nil // a retried run; its name says it is the tick's
	}
	if err != nil {
		return fmt.Errorf("creating backup %s: %w", name, err)
	}
	return nil
}

// waitBackup waits a bounded time for the backup to end. One still going
// then is left to the backup controller: not an error.
func (c *RecurringJobController) waitBackup(ctx context.Context, name string) error {
	err := c.waitFor(ctx, c.backupWait, func() (bool, error) {
		b, err := c.DS.Backups.GetRO(name)
		switch {
		case apierrors.IsNotFound(err):
			return false, nil
		case err != nil:
			return false, err
		case b.Status.State == v1beta1.BackupStateCompleted:
			return true, nil
		case b.Status.State == v1beta1.BackupStateError:
			return false, fmt.Errorf("backup %s failed: %s", name, b.Status.Error)
		}
		return false, nil
	})
	if ctx.Err() != nil {
		return errRunCancelled
	}
	if wait.Interrupted(err) {
		c.Logger.WithField("backup", name).Info("Backup still running; left to the backup controller")
		return nil
	}
	return err
}

// pruneJobSnapshots keeps the newest spec.retain of the job's snapshots of
// volume. Retain 0 (refused by the webhook for snapshot and backup jobs)
// keeps all: nothing is deleted on a value no one could have meant.
func (c *RecurringJobController) pruneJobSnapshots(ctx context.Context, job *v1beta1.RecurringJob, volume string) error {
	if job.Spec.Retain <= 0 {
		return nil
	}
	snaps, err := c.DS.Snapshots.ListByIndexRO(datastore.IndexByVolume, volume)
	if err != nil {
		return err
	}
	var items []retainItem
	for _, s := range snaps {
		if s.Labels[types.LabelRecurringJob] == job.Name && s.DeletionTimestamp == nil {
			items = append(items, retainItem{name: s.Name, at: snapshotTakenAt(s), state: snapshotRetainState(s)})
		}
	}
	return c.deleteSnapshots(ctx, retentionVictims(items, int(job.Spec.Retain)), c.snapshotsInUse(volume))
}

func snapshotRetainState(s *v1beta1.Snapshot) retainState {
	switch {
	case s.Status.ReadyToUse:
		return retainGood
	case s.Status.Error != "" || s.Status.MarkRemoved:
		return retainFailed
	}
	return retainPending
}

// snapshotTakenAt is when the engine took the snapshot, or, before it says,
// when the CR was made.
func snapshotTakenAt(s *v1beta1.Snapshot) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, s.Status.CreationTime); err == nil {
		return t
	}
	return s.CreationTimestamp.Time
}

// pruneJobBackups keeps the newest spec.retain Completed backups the job
// made of volume; deleting a Backup deletes it from the target. Backups
// still running are neither counted nor deleted.
func (c *RecurringJobController) pruneJobBackups(ctx context.Context, job *v1beta1.RecurringJob, volume string) error {
	if job.Spec.Retain <= 0 {
		return nil
	}
	backups, err := c.DS.Backups.ListByIndexRO(datastore.IndexByVolume, volume)
	if err != nil {
		return err
	}
	var items []retainItem
	for _, b := range backups {
		if b.Labels[types.LabelRecurringJob] != job.Name || b.DeletionTimestamp != nil {
			continue
		}
		it := retainItem{name: b.Name, at: b.CreationTimestamp.Time}
		if t, err := time.Parse(time.RFC3339Nano, b.Status.BackupCreatedAt); err == nil {
			it.at = t
		}
		switch b.Status.State {
		case v1beta1.BackupStateCompleted:
			it.state = retainGood
		case v1beta1.BackupStateError:
			it.state = retainFailed
		}
		items = append(items, it)
	}
	var errs []error
	for _, name := range retentionVictims(items, int(job.Spec.Retain)) {
		if err := c.DS.Backups.Delete(ctx, name); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting backup %s: %w", name, err))
			continue
		}
		c.Logger.WithFields(map[string]any{"recurringJob": job.Name, "backup": name}).Info("Deleted a backup beyond retain")
	}
	return errors.Join(errs...)
}

// snapshotDeleteTask keeps the newest spec.retain user snapshots of the
// volume, whoever took them, and deletes the rest (retain 0: all of them).
// Never touched: system snapshots, snapshots Strata took for a backup, a
// clone or an export (TakenForStrata), and snapshots a running backup or
// clone reads.
func (c *RecurringJobController) snapshotDeleteTask(ctx context.Context, job *v1beta1.RecurringJob, vol *v1beta1.Volume) error {
	snaps, err := c.DS.Snapshots.ListByIndexRO(datastore.IndexByVolume, vol.Name)
	if err != nil {
		return err
	}
	inUse := c.snapshotsInUse(vol.Name)
	var items []retainItem
	for _, s := range snaps {
		if s.DeletionTimestamp == nil && s.Status.UserCreated && s.Status.ReadyToUse && !s.TakenForStrata() && !inUse[s.Name] {
			items = append(items, retainItem{name: s.Name, at: snapshotTakenAt(s), state: retainGood})
		}
	}
	return c.deleteSnapshots(ctx, retentionVictims(items, int(job.Spec.Retain)), inUse)
}

// snapshotCleanupTask does what Longhorn's snapshot-cleanup does, in
// Strata's terms: it deletes the CRs of system snapshots (a rebuild's, say
// — userCreated false, in the chain, not taken for a backup, clone or
// export) and of snapshots the engine holds removed, so the snapshot
// controller removes and purges them; then, on an attached volume, it
// purges the removed snapshots the chain still holds without a CR (those
// a delete left under the live head, now coalescible). A rebuilding volume
// keeps its system snapshots: the rebuild reads them.
func (c *RecurringJobController) snapshotCleanupTask(ctx context.Context, vol *v1beta1.Volume) error {
	e, err := c.VolumeEngine(vol)
	if err != nil {
		return err
	}
	rebuilding := e != nil && isRebuilding(e)
	snaps, err := c.DS.Snapshots.ListByIndexRO(datastore.IndexByVolume, vol.Name)
	if err != nil {
		return err
	}
	inUse := c.snapshotsInUse(vol.Name)
	var doomed []string
	for _, s := range snaps {
		if s.DeletionTimestamp != nil || s.TakenForStrata() || s.Status.CreationTime == "" {
			continue
		}
		if s.Status.MarkRemoved || (!s.Status.UserCreated && !rebuilding) {
			doomed = append(doomed, s.Name)
		}
	}
	if err := c.deleteSnapshots(ctx, doomed, inUse); err != nil {
		return err
	}
	return c.purgeRemoved(ctx, vol, e)
}

func isRebuilding(e *v1beta1.Engine) bool {
	for _, r := range e.Status.RebuildStatus {
		if r != nil && r.IsRebuilding {
			return true
		}
	}
	return false
}

// purgeRemoved asks the engine of an attached volume to purge when its
// chain holds a removed snapshot a purge would drop. A detached volume is
// not attached for it: its next snapshot delete, or a run while it is
// attached, purges.
func (c *RecurringJobController) purgeRemoved(ctx context.Context, vol *v1beta1.Volume, e *v1beta1.Engine) error {
	if e == nil || !kit.EngineRunning(e) || vol.Status.State != v1beta1.VolumeStateAttached ||
		e.Spec.NodeID != vol.Status.CurrentNodeID || kit.IsPurging(e) {
		return nil
	}
	if noPurge, _ := c.DS.GetSettingBool(types.SettingDisableSnapshotPurge); noPurge {
		return nil
	}
	droppable := false
	for name, info := range e.Status.Snapshots {
		droppable = droppable || (name != types.VolumeHeadName && info != nil && info.Removed && kit.PurgeDrops(info))
	}
	if !droppable {
		return nil
	}
	client, err := c.EngineDataPlane(e)
	if err != nil {
		return err
	}
	if err := client.SnapshotPurge(ctx, e.Name); err != nil && !errors.Is(err, engineapi.ErrBusy) {
		return fmt.Errorf("purging: %w", err)
	}
	return nil
}

func (c *RecurringJobController) snapshotsInUse(volume string) map[string]bool {
	return kit.SnapshotReaders(c.DS, volume).Names()
}

// deleteSnapshots deletes the named Snapshot CRs but those in use; the
// snapshot controller removes them from the chain and purges.
func (c *RecurringJobController) deleteSnapshots(ctx context.Context, names []string, inUse map[string]bool) error {
	var errs []error
	for _, name := range names {
		if inUse[name] {
			continue
		}
		if err := c.DS.Snapshots.Delete(ctx, name); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting snapshot %s: %w", name, err))
			continue
		}
		c.Logger.WithField("snapshot", name).Info("Deleted a snapshot")
	}
	return errors.Join(errs...)
}
