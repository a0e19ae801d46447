package controller

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Each manager reports the objects it is responsible for, from the
// caches: node-1 reports its volume (snapshots, bytes, robustness, clone
// progress) and not node-2's, while node-2 is alive.
func TestMetricsCollector(t *testing.T) {
	mine := fixture.Volume(func(v *v1beta1.Volume) {
		v.Status.Robustness = v1beta1.VolumeRobustnessDegraded
		v.Status.ActualSize = 3 << 20
		v.Status.HeadSize, v.Status.SnapshotsSize, v.Status.RemovedSnapshotsSize = 1<<20, 2<<20-4096, 4096
		v.Status.CloneStatus = &v1beta1.VolumeCloneStatus{Progress: 40}
	})
	theirs := fixture.Volume(func(v *v1beta1.Volume) { v.Name, v.Status.OwnerID = "v2", "node-2" })
	snap := func(name, volume string, size int64) *v1beta1.Snapshot {
		return fixture.Snapshot(name, true, func(s *v1beta1.Snapshot) { s.Spec.Volume, s.Status.Size = volume, size })
	}
	quota := &v1beta1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.DefaultResourceQuotaName, Namespace: "apps"},
		Spec: v1beta1.ResourceQuotaSpec{SnapshotLimit: v1beta1.SnapshotLimit{NamespaceTotalSnapshotSizeQuota: new(resource.MustParse("10Gi"))}}}
	env := dstest.New(t, []runtime.Object{fixture.Node("node-1", nil, fixture.ReadyTrue()), fixture.Node("node-2", nil, fixture.ReadyTrue()), mine, theirs,
		snap("s1", "v1", 10<<20), snap("s2", "v1", 5<<20), snap("s3", "v2", 1<<20), quota},
		[]runtime.Object{fixture.Lease("node-1", 0), fixture.Lease("node-2", 0)})

	c := NewMetricsCollector(env.DS, "node-1")
	want := `
# HELP strata_volume_snapshot_bytes The sum of the sizes of the volume's snapshots.
# TYPE strata_volume_snapshot_bytes gauge
strata_volume_snapshot_bytes{volume="v1"} 1.572864e+07
# HELP strata_volume_snapshots The volume's snapshots (Snapshot CRs).
# TYPE strata_volume_snapshots gauge
strata_volume_snapshots{volume="v1"} 2
# HELP strata_volume_robustness 1 for the volume's robustness (healthy, degraded, faulted, unknown), 0 for the others.
# TYPE strata_volume_robustness gauge
strata_volume_robustness{robustness="degraded",volume="v1"} 1
strata_volume_robustness{robustness="faulted",volume="v1"} 0
strata_volume_robustness{robustness="healthy",volume="v1"} 0
strata_volume_robustness{robustness="unknown",volume="v1"} 0
# HELP strata_volume_space_bytes The volume's actual size on one replica by layer kind: the live head, snapshots, and removed snapshots still in the chain.
# TYPE strata_volume_space_bytes gauge
strata_volume_space_bytes{kind="head",volume="v1"} 1.048576e+06
strata_volume_space_bytes{kind="removed",volume="v1"} 4096
strata_volume_space_bytes{kind="snapshots",volume="v1"} 2.093056e+06
# HELP strata_volume_clone_progress_percent How much of the clone's source is copied; absent for a volume not cloned.
# TYPE strata_volume_clone_progress_percent gauge
strata_volume_clone_progress_percent{volume="v1"} 40
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "strata_volume_snapshot_bytes",
		"strata_volume_snapshots", "strata_volume_robustness", "strata_volume_space_bytes", "strata_volume_clone_progress_percent"))
	// The quota has no owner: exactly one of the two managers reports it.
	other := NewMetricsCollector(env.DS, "node-2")
	require.Equal(t, 1, testutil.CollectAndCount(c, "strata_quota_snapshot_limit_bytes")+
		testutil.CollectAndCount(other, "strata_quota_snapshot_limit_bytes"))
	require.Equal(t, 1, testutil.CollectAndCount(other, "strata_volume_snapshots"), "node-2 reports v2 alone")
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems)
}
