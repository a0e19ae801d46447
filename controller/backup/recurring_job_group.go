package backup

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// groupVolumeName stands for "all the selected volumes" in a group job's
// object names.
const groupVolumeName = "group"

// groupTask takes one SnapshotGroup of every selected volume for the tick:
// a crash-consistent cut of them all (docs/recurring-jobs.md), then keeps
// the job's newest spec.retain groups; a group's member snapshots go with
// it.
func (c *RecurringJobController) groupTask(ctx context.Context, job *v1beta1.RecurringJob, volumes []*v1beta1.Volume,
	tick time.Time) error {
	if len(volumes) == 0 {
		return nil
	}
	if len(volumes) > v1beta1.SnapshotGroupMaxVolumes {
		return fmt.Errorf("the job selects %d volumes; a group snapshot takes at most %d", len(volumes),
			v1beta1.SnapshotGroupMaxVolumes)
	}
	names := make([]string, 0, len(volumes))
	for _, v := range volumes {
		names = append(names, v.Name)
	}
	name := recurringObjectName(job.Name, groupVolumeName, tick)
	_, err := c.DS.SnapshotGroups.Create(ctx, &v1beta1.SnapshotGroup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.DS.Namespace, Labels: jobLabels(job, "")},
		Spec:       v1beta1.SnapshotGroupSpec{Volumes: names, Labels: jobLabels(job, "")}})
	if apierrors.IsAlreadyExists(err) {
		err = c.groupMadeByJob(ctx, job, name) // a retried run: it is ours
	}
	if err != nil {
		return fmt.Errorf("creating snapshot group %s: %w", name, err)
	}
	if err := c.waitGroupReady(ctx, name); err != nil {
		return err // no pruning: the one taken now is not there to count
	}
	return c.pruneJobGroups(ctx, job)
}

func (c *RecurringJobController) groupMadeByJob(ctx context.Context, job *v1beta1.RecurringJob, name string) error {
	g, err := c.DS.SnapshotGroups.GetROOrLive(ctx, name)
	if err != nil {
		return err
	}
	if g.Labels[types.LabelRecurringJob] != job.Name {
		return fmt.Errorf("the name is taken by a snapshot group recurring job %q did not make", job.Name)
	}
	return nil
}

func (c *RecurringJobController) waitGroupReady(ctx context.Context, name string) error {
	return c.waitTaken(ctx, "snapshot group "+name, func() (bool, error) {
		g, err := c.DS.SnapshotGroups.GetRO(name)
		switch {
		case apierrors.IsNotFound(err):
			return false, nil // the cache has not seen it yet
		case err != nil:
			return false, err
		case g.DeletionTimestamp != nil:
			return false, fmt.Errorf("snapshot group %s is being deleted", name)
		case g.Status.State == v1beta1.SnapshotGroupReady:
			return true, nil
		case g.Status.State == v1beta1.SnapshotGroupFailed:
			return false, fmt.Errorf("snapshot group %s: %s", name, g.Status.Error)
		}
		return false, nil
	})
}

// pruneJobGroups keeps the job's newest spec.retain Ready groups.
func (c *RecurringJobController) pruneJobGroups(ctx context.Context, job *v1beta1.RecurringJob) error {
	groups, err := c.DS.SnapshotGroups.ListByIndexRO(datastore.IndexByMakingJob, job.Name)
	if err != nil {
		return err
	}
	var items []retainItem
	for _, g := range groups {
		if g.DeletionTimestamp == nil {
			items = append(items, retainItem{name: g.Name, at: g.CreationTimestamp.Time, state: groupRetainState(g)})
		}
	}
	var errs []error
	for _, name := range retentionVictims(items, int(job.Spec.Retain)) {
		if err := c.DS.SnapshotGroups.Delete(ctx, name); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting snapshot group %s: %w", name, err))
			continue
		}
		c.Logger.WithField("snapshotGroup", name).Info("Deleted a snapshot group")
	}
	return errors.Join(errs...)
}

func groupRetainState(g *v1beta1.SnapshotGroup) retainState {
	switch g.Status.State {
	case v1beta1.SnapshotGroupReady:
		return retainGood
	case v1beta1.SnapshotGroupFailed:
		return retainFailed
	}
	return retainPending
}
