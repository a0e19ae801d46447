package deployed

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/internal/devtools/fsalloc"
	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// What the flows read of Strata's objects and of the replicas' files,
// which are on this host: the chart's disks are directories of the
// nodes (disks.perNode), mounted into the instance managers' Pods at the
// same paths.

// waitVolumeStatus waits until cond holds for the volume and returns it;
// on a timeout it says what the volume looked like last. cond must not
// stop the test (it runs on Eventually's goroutine).
func waitVolumeStatus(t *testing.T, volume string, timeout time.Duration, what string, cond func(*v1beta1.Volume) bool) *v1beta1.Volume {
	t.Helper()
	var last *v1beta1.Volume
	ok := assert.Eventually(t, func() bool {
		v, err := env.strata.StrataV1beta1().Volumes(ns).Get(context.Background(), volume, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = v
		return cond(v)
	}, timeout, 200*time.Millisecond)
	if !ok {
		status := "never read"
		if last != nil {
			status = fmt.Sprintf("%+v", last.Status)
		}
		require.FailNowf(t, "volume wait timed out", "volume %s: %s: timed out after %s; last status: %s", volume, what, timeout, status)
	}
	return last
}

// waitVolumeGone waits until the volume is deleted with its engine and
// replicas.
func waitVolumeGone(t *testing.T, volume string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := env.strata.StrataV1beta1().Volumes(ns).Get(context.Background(), volume, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 2*time.Minute, 200*time.Millisecond, "volume %s is deleted", volume)
}

// volumesOfClaimIn lists the Strata volumes the CSI driver made for the
// claim.
func volumesOfClaimIn(t *testing.T, namespace, claimName string) []string {
	t.Helper()
	volumes, err := localcluster.VolumesOfClaim(context.Background(), env.strata, ns, namespace, claimName)
	require.NoError(t, err)
	return volumes
}

// waitCloned waits for the volume's fill from its data source to complete.
// Until then nothing may serve it to a workload.
func waitCloned(t *testing.T, volume string) {
	t.Helper()
	var failed string
	waitVolumeStatus(t, volume, 5*time.Minute, "clone completed", func(v *v1beta1.Volume) bool {
		cs := v.Status.CloneStatus
		if cs == nil {
			return false
		}
		if v.Status.State == v1beta1.VolumeStateAttached && cs.State != v1beta1.VolumeCloneStateCompleted {
			assert.True(t, v.Spec.DisableFrontend, "volume %s attached with a frontend before its clone completed", volume)
			assert.Empty(t, v.Status.FrontendEndpoint, "volume %s served before its clone completed", volume)
		}
		if cs.State == v1beta1.VolumeCloneStateFailed {
			failed = cs.Message
			return true
		}
		return cs.State == v1beta1.VolumeCloneStateCompleted
	})
	require.Empty(t, failed, "the clone of %s failed", volume)
}

// replicasOf lists the volume's Replica objects.
func replicasOf(volume string) ([]v1beta1.Replica, error) {
	list, err := env.strata.StrataV1beta1().Replicas(ns).List(context.Background(),
		metav1.ListOptions{LabelSelector: types.LabelVolume + "=" + volume})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// replicaDataDir is the replica's directory on its node's disk.
func replicaDataDir(r v1beta1.Replica) string {
	return filepath.Join(r.Spec.DiskPath, "replicas", r.Spec.DataDirectoryName)
}

// replicaBytes is what each replica of the volume holds on its disk: the
// allocated bytes (st_blocks) of every file in its data directory.
func replicaBytes(volume string) (map[string]int64, error) {
	replicas, err := replicasOf(volume)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, r := range replicas {
		files, err := fsalloc.Files(replicaDataDir(r))
		if err != nil {
			return nil, fmt.Errorf("replica %s: %w", r.Name, err)
		}
		out[r.Name] = 0
		for _, n := range files {
			out[r.Name] += n
		}
	}
	return out, nil
}

func requireReplicaBytes(t *testing.T, volume string) map[string]int64 {
	t.Helper()
	out, err := replicaBytes(volume)
	require.NoError(t, err)
	return out
}

// waitReplicaBytes waits until every replica's bytes satisfy ok.
func waitReplicaBytes(t *testing.T, volume, what string, ok func(replica string, n int64) bool) map[string]int64 {
	t.Helper()
	var got map[string]int64
	var lastErr error
	done := assert.Eventually(t, func() bool {
		got, lastErr = replicaBytes(volume)
		if lastErr != nil || len(got) == 0 {
			return false
		}
		for r, n := range got {
			if !ok(r, n) {
				return false
			}
		}
		return true
	}, time.Minute, 200*time.Millisecond)
	require.True(t, done, "replicas of %s: %s; last %v (%v)", volume, what, mibOf(got), lastErr)
	return got
}

// mibOf shows bytes by replica as MiB, each replica by its name's last part.
func mibOf(m map[string]int64) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k[strings.LastIndex(k, "-")+1:]] = fmt.Sprintf("%.2fMiB", float64(v)/(1<<20))
	}
	return out
}

// engineChain is the snapshot chain the volume's one engine reports.
func engineChain(volume string) (map[string]*v1beta1.SnapshotInfo, error) {
	list, err := env.strata.StrataV1beta1().Engines(ns).List(context.Background(),
		metav1.ListOptions{LabelSelector: types.LabelVolume + "=" + volume})
	if err != nil {
		return nil, err
	}
	if len(list.Items) != 1 {
		return nil, fmt.Errorf("volume %s has %d engines", volume, len(list.Items))
	}
	return list.Items[0].Status.Snapshots, nil
}

// engineSnapshotBytes is the independent figure of what the snapshots of
// the volumes hold: the sizes of those not removed (never the head) in the
// engines' own chains.
func engineSnapshotBytes(volumes ...string) (int64, error) {
	var total int64
	for _, v := range volumes {
		chain, err := engineChain(v)
		if err != nil {
			return 0, err
		}
		for name, s := range chain {
			if name != types.VolumeHeadName && s != nil && !s.Removed {
				total += s.Size
			}
		}
	}
	return total, nil
}

// createSnapshot asks for a Strata snapshot of the volume by its object,
// as an admin does with kubectl; deleted when the test ends unless the
// test did.
func createSnapshot(t *testing.T, volume, name string) {
	t.Helper()
	_, err := env.strata.StrataV1beta1().Snapshots(ns).Create(context.Background(), &v1beta1.Snapshot{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1beta1.SnapshotSpec{Volume: volume, CreateSnapshot: true},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = env.strata.StrataV1beta1().Snapshots(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func deleteSnapshot(t *testing.T, name string) {
	t.Helper()
	require.NoError(t, env.strata.StrataV1beta1().Snapshots(ns).Delete(context.Background(), name, metav1.DeleteOptions{}))
}

// waitSnapshotsReady waits until n of the snapshots asked for (with
// spec.createSnapshot, VolumeSnapshots' among them) are ready; the
// system's own, mirrored from the chain, are not counted.
func waitSnapshotsReady(t *testing.T, volume string, n int) {
	t.Helper()
	var ready int
	ok := assert.Eventually(t, func() bool {
		list, err := env.strata.StrataV1beta1().Snapshots(ns).List(context.Background(),
			metav1.ListOptions{LabelSelector: types.LabelVolume + "=" + volume})
		if err != nil {
			return false
		}
		ready = 0
		for _, s := range list.Items {
			if s.Spec.CreateSnapshot && s.Status.ReadyToUse {
				ready++
			}
		}
		return ready == n
	}, time.Minute, 200*time.Millisecond)
	require.True(t, ok, "%d snapshots of %s ready (%d are)", n, volume, ready)
}
