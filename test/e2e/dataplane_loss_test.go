package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	stypes "github.com/strata-storage/strata/types"
)

// killIM kills a node's instance manager and waits until its manager reports
// it in error. The returned function starts it again (same addresses) and
// waits for running; it is also called when the test ends, if not before.
func killIM(t *testing.T, node string) (restart func()) {
	t.Helper()
	mgr := env.managers[node]
	require.NoError(t, mgr.IM.Kill())
	require.Eventually(t, func() bool {
		st, _ := imState(t, node)
		return st == v1beta1.InstanceStateError
	}, time.Minute, 100*time.Millisecond, "im-%s in error after the kill", node)
	restarted := false
	restart = func() {
		if restarted {
			return
		}
		restarted = true
		im, err := localcluster.StartInstanceManager(env.managerOpts, node, mgr.IM)
		require.NoError(t, err)
		mgr.IM = im
		require.Eventually(t, func() bool {
			st, _ := imState(t, node)
			return st == v1beta1.InstanceStateRunning
		}, time.Minute, 100*time.Millisecond, "im-%s running again", node)
	}
	t.Cleanup(restart)
	return restart
}

func holdersOf(t *testing.T, volume string) []string {
	var nodes []string
	for _, r := range replicasOf(t, volume) {
		if r.DeletionTimestamp == nil && r.Spec.FailedAt == "" {
			nodes = append(nodes, r.Spec.NodeID)
		}
	}
	slices.Sort(nodes)
	return nodes
}

func otherNode(exclude ...string) string {
	for _, n := range nodeNames {
		if !slices.Contains(exclude, n) {
			return n
		}
	}
	return ""
}

// A node's instance manager dies and stays dead (its manager runs on): a
// 2-replica volume is rebuilt on the third node and healthy again; a
// 3-replica volume has no node left, and its Scheduled condition names the
// dead instance manager until it is back; the failed replica's data left on
// the dead node is removed once its instance manager returns.
func TestLostInstanceManagerVolumeRebuiltElsewhere(t *testing.T) {
	defer setSetting(t, stypes.SettingReplicaReplenishmentWaitInterval, "1")()
	createVolume(t, "e2e-imloss", "32Mi", 2)
	createVolume(t, "e2e-imloss3", "16Mi", 3)
	waitVolume(t, "e2e-imloss", time.Minute, "detached", isDetached)
	waitVolume(t, "e2e-imloss3", time.Minute, "detached", isDetached)
	holders := holdersOf(t, "e2e-imloss")
	require.Len(t, holders, 2)
	attachNode, victim := holders[0], holders[1]
	third := otherNode(holders...)

	updateTickets(t, "e2e-imloss", addTicket("admin", v1beta1.AttacherTypeStrataAPI, attachNode))
	updateTickets(t, "e2e-imloss3", addTicket("admin", v1beta1.AttacherTypeStrataAPI, attachNode))
	v := waitVolume(t, "e2e-imloss", time.Minute, "attached", attachedTo(attachNode))
	v3 := waitVolume(t, "e2e-imloss3", time.Minute, "attached", attachedTo(attachNode))
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x5a 0 8M")
	qemuIO(t, v3.Status.FrontendEndpoint, "write -P 0x5b 0 4M")
	lostDir := replicaDirOn(t, "e2e-imloss", victim)

	restart := killIM(t, victim)
	// Writes make the engines notice the lost replica.
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x5c 8M 1M")
	qemuIO(t, v3.Status.FrontendEndpoint, "write -P 0x5d 4M 1M")

	v = waitVolume(t, "e2e-imloss", 2*time.Minute, "healthy again with a replica on "+third, func(v *v1beta1.Volume) bool {
		return v.Status.Robustness == v1beta1.VolumeRobustnessHealthy && slices.Equal(holdersOf(t, "e2e-imloss"), sorted(attachNode, third))
	})
	qemuIO(t, v.Status.FrontendEndpoint, "read -P 0x5a 0 8M", "read -P 0x5c 8M 1M")

	v3 = waitVolume(t, "e2e-imloss3", time.Minute, "Scheduled=False naming the dead instance manager", func(v *v1beta1.Volume) bool {
		c := meta.FindStatusCondition(v.Status.Conditions, "Scheduled")
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "instance manager im-"+victim)
	})
	assert.Equal(t, v1beta1.VolumeRobustnessDegraded, v3.Status.Robustness)

	restart()
	waitVolume(t, "e2e-imloss3", 2*time.Minute, "healthy with a replica on "+victim+" again", func(v *v1beta1.Volume) bool {
		return v.Status.Robustness == v1beta1.VolumeRobustnessHealthy && len(holdersOf(t, "e2e-imloss3")) == 3 &&
			meta.IsStatusConditionTrue(v.Status.Conditions, "Scheduled")
	})
	qemuIO(t, v3.Status.FrontendEndpoint, "read -P 0x5b 0 4M", "read -P 0x5d 4M 1M")
	waitGone(t, lostDir, "the lost replica's data is removed once its instance manager is back")
	waitNoOrphans(t, victim)
}

// replicaDataDir is where replica r keeps its layers.
func replicaDataDir(r v1beta1.Replica) string {
	return filepath.Join(env.managers[r.Spec.NodeID].DiskDir, "replicas", r.Spec.DataDirectoryName)
}

// replicaDirOn is the data directory of volume's replica on node, which
// must exist.
func replicaDirOn(t *testing.T, volume, node string) string {
	t.Helper()
	for _, r := range replicasOf(t, volume) {
		if r.Spec.NodeID == node {
			dir := replicaDataDir(r)
			require.DirExists(t, dir)
			return dir
		}
	}
	require.FailNow(t, "no replica on the node", "volume %s has no replica on %s", volume, node)
	return ""
}

// waitGone waits until path no longer exists.
func waitGone(t *testing.T, path, what string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := os.Stat(path)
		return os.IsNotExist(err)
	}, time.Minute, 200*time.Millisecond, "%s: %s", path, what)
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

func waitNoOrphans(t *testing.T, node string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, st := range getNode(t, node).Status.DiskStatus {
			if len(st.OrphanedReplicaDirectories) > 0 {
				return false
			}
		}
		return true
	}, time.Minute, 200*time.Millisecond, "node %s lists no orphaned replica data", node)
}

// Deleting a volume while one node's instance manager is dead (and nothing
// restarts it) finishes within a minute; the data left on that node is
// listed as orphaned, and removed once the instance manager is back.
func TestVolumeDeleteWithDeadInstanceManager(t *testing.T) {
	createVolume(t, "e2e-deldead", "16Mi", 3)
	waitVolume(t, "e2e-deldead", time.Minute, "detached", isDetached)
	useOn(t, "e2e-deldead", "node-1", "write -P 0x42 0 1M")

	victim := "node-3"
	deadDir := replicaDirOn(t, "e2e-deldead", victim)
	restart := killIM(t, victim)

	start := time.Now()
	deleteVolume(t, "e2e-deldead") // fails the test if the volume is not gone within a minute
	t.Logf("volume deleted in %s with im-%s down", time.Since(start).Round(time.Millisecond), victim)
	require.Eventually(t, func() bool {
		_, err := env.adminStrata.StrataV1beta1().VolumeAttachments(ns).Get(context.Background(), "e2e-deldead", metav1.GetOptions{})
		return err != nil
	}, time.Minute, 200*time.Millisecond, "the VolumeAttachment goes with the volume")
	require.DirExists(t, deadDir, "nothing deletes data without the instance manager")
	require.Eventually(t, func() bool {
		for _, st := range getNode(t, victim).Status.DiskStatus {
			if slices.Contains(st.OrphanedReplicaDirectories, filepath.Base(deadDir)) {
				return true
			}
		}
		return false
	}, time.Minute, 200*time.Millisecond, "node %s lists %s as orphaned", victim, deadDir)

	restart()
	waitGone(t, deadDir, "orphaned data is removed once im-"+victim+" is back")
	waitNoOrphans(t, victim)
}

// The supervisor `make run` uses brings a killed instance manager back, and
// notes the restart in its log.
func TestSupervisorRestartsKilledInstanceManager(t *testing.T) {
	node := "node-2"
	sup := localcluster.Supervise(logrus.New(), env.managerOpts, env.managers[node])
	defer func() { env.managers[node] = sup.Release() }()
	oldPid := sup.Manager().IM.Pid()
	require.NoError(t, sup.Manager().IM.Kill())
	require.Eventually(t, func() bool { return sup.Restarts("instance-manager") == 1 }, time.Minute, 100*time.Millisecond)
	im := sup.Manager().IM
	assert.NotEqual(t, oldPid, im.Pid())
	require.Eventually(t, func() bool {
		st, _ := imState(t, node)
		return st == v1beta1.InstanceStateRunning && !im.Exited()
	}, time.Minute, 100*time.Millisecond, "im-%s running again", node)
	assert.Contains(t, im.LogTail(200), fmt.Sprintf("(pid %d) exited", oldPid), "the restart is noted in the log")
	assert.Equal(t, 0, sup.Restarts("manager"))
}

// A key that fails many times in a row (the API server forbids the volume's
// status writes for a while) is still retried, and the volume converges
// once the fault clears: no controller drops a key. In the long tier:
// make test has controller.TestFailingKeyIsNeverDropped.
func TestLongFailingKeyConvergesAfterTheFaultClears(t *testing.T) {
	ctx := context.Background()
	roles := env.adminKube.RbacV1().Roles(stypes.DefaultNamespace)
	orig, err := roles.Get(ctx, stypes.ManagerServiceAccount, metav1.GetOptions{})
	require.NoError(t, err)
	restore := func() {
		require.NoError(t, retryOnConflict(func() error {
			cur, err := roles.Get(ctx, orig.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Rules = orig.Rules
			_, err = roles.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		}))
	}
	defer restore()
	forbidVolumeStatusWrites(t)

	before := sumMetric(t, `workqueue_retries_total{name="strata-volume"}`)
	createVolume(t, "e2e-retry", "16Mi", 1)
	require.Eventually(t, func() bool {
		return sumMetric(t, `workqueue_retries_total{name="strata-volume"}`)-before > 20
	}, 2*time.Minute, 500*time.Millisecond, "the volume's key fails more than 20 times")
	assert.Empty(t, getVolume(t, "e2e-retry").Status.State, "no status could be written")

	restore()
	waitVolume(t, "e2e-retry", time.Minute, "detached once the fault cleared", isDetached)
}

// forbidVolumeStatusWrites takes volumes/status out of the rules of the
// manager's Role in strata-system (where Strata's kinds are granted), so
// every status write of a volume is Forbidden.
func forbidVolumeStatusWrites(t *testing.T) {
	ctx := context.Background()
	roles := env.adminKube.RbacV1().Roles(stypes.DefaultNamespace)
	require.NoError(t, retryOnConflict(func() error {
		role, err := roles.Get(ctx, stypes.ManagerServiceAccount, metav1.GetOptions{})
		if err != nil {
			return err
		}
		found := false
		for i, rule := range role.Rules {
			if slices.Contains(rule.APIGroups, v1beta1.SchemeGroupVersion.Group) && slices.Contains(rule.Resources, "volumes/status") {
				role.Rules[i].Resources = slices.DeleteFunc(slices.Clone(rule.Resources), func(r string) bool { return r == "volumes/status" })
				found = true
			}
		}
		require.True(t, found, "Role %s grants volumes/status", role.Name)
		_, err = roles.Update(ctx, role, metav1.UpdateOptions{})
		return err
	}))
}

// metricsClient scrapes the managers as the admin (HTTPS, a bearer token).
var metricsClient = sync.OnceValues(func() (*http.Client, error) {
	return env.cluster.ManagerMetricsClient(context.Background(), ns)
})

// sumMetric adds up one metric series over every manager's /metrics.
func sumMetric(t *testing.T, series string) float64 {
	t.Helper()
	client, err := metricsClient()
	require.NoError(t, err)
	var total float64
	for _, mgr := range env.managers {
		resp, err := client.Get("https://" + mgr.MetricsAddr + "/metrics")
		if err != nil {
			continue // a manager being restarted by another test's leftovers
		}
		require.Equal(t, http.StatusOK, resp.StatusCode, "GET /metrics of %s", mgr.Node)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
				if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
					total += v
				}
			}
		}
		resp.Body.Close()
	}
	return total
}
