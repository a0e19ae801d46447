package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/util/retry"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func getNode(t *testing.T, name string) *v1beta1.Node {
	t.Helper()
	n, err := env.adminStrata.StrataV1beta1().Nodes(types.DefaultNamespace).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return n
}

func nodeReady(t *testing.T, name string) metav1.ConditionStatus {
	t.Helper()
	n, err := env.adminStrata.StrataV1beta1().Nodes(types.DefaultNamespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return metav1.ConditionUnknown
	}
	if c := meta.FindStatusCondition(n.Status.Conditions, v1beta1.ConditionTypeReady); c != nil {
		return c.Status
	}
	return metav1.ConditionUnknown
}

func TestNodesRegisterReadyWithDisks(t *testing.T) {
	for _, name := range nodeNames {
		require.Eventually(t, func() bool { return nodeReady(t, name) == metav1.ConditionTrue },
			time.Minute, 100*time.Millisecond, "%s becomes Ready", name)
	}
	for _, name := range nodeNames {
		t.Run(name, func(t *testing.T) {
			require.Eventually(t, func() bool {
				ds := getNode(t, name).Status.DiskStatus["disk-1"]
				return ds != nil && ds.DiskUUID != ""
			}, 30*time.Second, 100*time.Millisecond)
			n := getNode(t, name)
			mgr := env.managers[name]
			assert.Equal(t, mgr.DiskDir, n.Spec.Disks["disk-1"].Path)
			ds := n.Status.DiskStatus["disk-1"]
			assert.Positive(t, ds.StorageMaximum)
			assert.True(t, meta.IsStatusConditionTrue(ds.Conditions, v1beta1.ConditionTypeReady))
			cfg, err := os.ReadFile(filepath.Join(mgr.DiskDir, types.DiskConfigFile))
			require.NoError(t, err)
			assert.Contains(t, string(cfg), ds.DiskUUID, "the UUID in status is the one in the disk's file")

			events, err := env.adminKube.CoreV1().Events(types.DefaultNamespace).List(context.Background(), metav1.ListOptions{
				FieldSelector: fields.Set{"involvedObject.name": name, "reason": "Registered"}.String()})
			require.NoError(t, err)
			assert.NotEmpty(t, events.Items, "a Registered event is recorded under the manager's RBAC")
		})
	}
}

func TestDefaultSettingsExistAndAreChecked(t *testing.T) {
	settings := env.adminStrata.StrataV1beta1().Settings(types.DefaultNamespace)
	ctx := context.Background()
	for _, name := range types.SettingNames() {
		want, ok := localcluster.LocalSettings[name]
		if !ok {
			want = types.SettingDefinitions[name].Default
		}
		require.Eventually(t, func() bool {
			s, err := settings.Get(ctx, string(name), metav1.GetOptions{})
			return err == nil && s.Value == want && s.Status.Applied
		}, 30*time.Second, 100*time.Millisecond, "setting %s exists with its default (or the suite's value) and is applied", name)
	}

	name := string(types.SettingDefaultReplicaCount)
	set := func(value string) {
		require.NoError(t, retryOnConflict(func() error {
			s, err := settings.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			s.Value = value
			_, err = settings.Update(ctx, s, metav1.UpdateOptions{})
			return err
		}))
	}
	set("lots")
	t.Cleanup(func() { set(types.SettingDefinitions[types.SettingDefaultReplicaCount].Default) })
	require.Eventually(t, func() bool {
		s, err := settings.Get(ctx, name, metav1.GetOptions{})
		return err == nil && !s.Status.Applied &&
			s.Status.Message == `setting default-replica-count: value "lots" is not an integer`
	}, 30*time.Second, 100*time.Millisecond, "a bad value is reported in status")
}

func retryOnConflict(fn func() error) error { return retry.RetryOnConflict(retry.DefaultRetry, fn) }

// A manager killed with SIGKILL stops renewing its lease; a peer marks its
// node not Ready once the lease runs out. Restarted, it marks itself Ready.
func TestKilledManagerMarksNodeDownThenBackUp(t *testing.T) {
	const victim = "node-3"
	require.Eventually(t, func() bool { return nodeReady(t, victim) == metav1.ConditionTrue },
		time.Minute, 100*time.Millisecond)

	require.NoError(t, env.managers[victim].Kill())
	killed := time.Now()
	t.Cleanup(func() {
		if env.managers[victim].Exited() {
			if m, err := env.managers[victim].Restart(env.managerOpts); err == nil {
				env.managers[victim] = m
			}
		}
	})

	// The lease runs out leaseDuration after its last renewal, and renewals
	// come four times per lease duration: a peer may mark the node down no
	// sooner than 3/4 of a lease duration after the kill. How much later
	// depends on the machine's load; the wait is only bounded so that a
	// broken run ends.
	require.Eventually(t, func() bool { return nodeReady(t, victim) == metav1.ConditionFalse },
		2*time.Minute, 50*time.Millisecond, "node turns not Ready once its lease has expired")
	down := time.Since(killed)
	t.Logf("node %s not Ready %.1fs after its manager was killed (lease %s)", victim, down.Seconds(), leaseDuration)
	assert.GreaterOrEqual(t, down, leaseDuration*3/4, "not marked down before its lease could have expired")
	c := meta.FindStatusCondition(getNode(t, victim).Status.Conditions, v1beta1.ConditionTypeReady)
	assert.Equal(t, v1beta1.NodeConditionReasonManagerDown, c.Reason)
	assert.Contains(t, c.Message, "heartbeat lease expired")
	for _, peer := range []string{"node-1", "node-2"} {
		assert.Equal(t, metav1.ConditionTrue, nodeReady(t, peer), "%s stays Ready", peer)
	}

	mgr, err := env.managers[victim].Restart(env.managerOpts)
	require.NoError(t, err)
	env.managers[victim] = mgr
	restarted := time.Now()
	require.Eventually(t, func() bool { return nodeReady(t, victim) == metav1.ConditionTrue },
		30*time.Second, 50*time.Millisecond, "restarted manager marks its node Ready again")
	t.Logf("node %s Ready %.1fs after its manager restarted", victim, time.Since(restarted).Seconds())
	n := getNode(t, victim)
	assert.Equal(t, mgr.DiskDir, n.Spec.Disks["disk-1"].Path, "the node keeps its disk across the restart")
}
