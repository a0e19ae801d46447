package benchscale

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

func cloneName(i int) string { return fmt.Sprintf("bench-clone-%03d", i) }

// stepClones fills -clones new volumes from the first snapshot of as many
// bench volumes, through the clone controller, and waits until every clone
// has completed and given its tickets back: the quiet window then holds
// finished clones, which must cost nothing either.
func (b *bench) stepClones(ctx context.Context) error {
	n := min(b.cfg.clones, b.cfg.volumes)
	if n == 0 || b.cfg.snapshots == 0 {
		b.log.Info("-clones 0 (or no snapshots): no clones")
		return nil
	}
	start := time.Now()
	err := parallel(ctx, n, b.cfg.workers, func(ctx context.Context, i int) error {
		v := &v1beta1.Volume{
			ObjectMeta: metav1.ObjectMeta{Name: cloneName(i), Namespace: ns},
			Spec: v1beta1.VolumeSpec{Size: b.cfg.size, NumberOfReplicas: int32(b.cfg.replicas),
				Frontend: v1beta1.VolumeFrontendNBD, DataSource: fmt.Sprintf("snap://%s/%s", volumeName(i), snapshotName(i, 0))},
		}
		return retryCreate(ctx, "create clone "+v.Name, func() error {
			_, err := b.strata.StrataV1beta1().Volumes(ns).Create(ctx, v, metav1.CreateOptions{})
			return err
		})
	})
	if err != nil {
		return err
	}
	done := func(v *v1beta1.Volume) bool {
		return v.Spec.DataSource != "" && v.Status.CloneStatus != nil &&
			v.Status.CloneStatus.State == v1beta1.VolumeCloneStateCompleted && v.Status.State == v1beta1.VolumeStateDetached
	}
	if _, err := b.waitCount(ctx, "clones completed and detached", n, b.countVolumes(done), b.describeVolumes(done)); err != nil {
		return err
	}
	b.info(fmt.Sprintf("clone %d volumes from snapshots", n), fmtDur(time.Since(start)))
	return nil
}
