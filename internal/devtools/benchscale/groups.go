package benchscale

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

func groupName(i int) string { return fmt.Sprintf("bench-group-%03d", i) }

// stepGroups takes -groups SnapshotGroups, each of two attached bench
// volumes (i and i + V/2), and waits until every one is Ready: the quiet
// window then holds Ready groups and their member snapshots, which must
// cost nothing.
func (b *bench) stepGroups(ctx context.Context) error {
	n := min(b.cfg.groups, b.cfg.volumes/2)
	if n == 0 {
		b.log.Info("-groups 0 (or fewer than 2 volumes): no group step")
		return nil
	}
	half := b.cfg.volumes / 2
	for i := range n {
		g := &v1beta1.SnapshotGroup{ObjectMeta: metav1.ObjectMeta{Name: groupName(i), Namespace: ns},
			Spec: v1beta1.SnapshotGroupSpec{Volumes: []string{volumeName(i), volumeName(i + half)}}}
		if err := retryCreate(ctx, "create snapshot group", func() error {
			_, err := b.strata.StrataV1beta1().SnapshotGroups(ns).Create(ctx, g, metav1.CreateOptions{})
			return err
		}); err != nil {
			return err
		}
	}
	var last string
	took, err := b.waitCount(ctx, "snapshot groups ready", n, func() int {
		list, err := b.strata.StrataV1beta1().SnapshotGroups(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			last = err.Error()
			return 0
		}
		ready := 0
		for _, g := range list.Items {
			if g.Status.State == v1beta1.SnapshotGroupReady {
				ready++
			} else {
				last = fmt.Sprintf("%s: %s %s", g.Name, g.Status.State, g.Status.Error)
			}
		}
		return ready
	}, func() string { return last })
	if err != nil {
		return err
	}
	b.info(fmt.Sprintf("%d snapshot groups of 2 volumes Ready", n), fmtDur(took))
	return nil
}
