package deployed

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
)

// Last of the package (this file sorts last): it uninstalls Strata.
// helm uninstall refuses while a volume exists, naming it, and deletes
// nothing; with every claim gone it removes every Pod, and nothing of
// Strata's stays mounted or in a replica directory on the nodes.
func TestUninstall(t *testing.T) {
	logsOnFailure(t)
	ctx := context.Background()
	claim(t, "keep", "")
	volume := volumeOfClaim(t, "keep")
	out, err := env.cluster.UninstallChart(ctx, ns, "")
	require.Error(t, err, "helm uninstall with a volume left:\n%s", out)
	assert.Contains(t, out, "strata-uninstall-check failed")
	// helm prints the hook's log (helm.sh/hook-output-log-policy), so its
	// own output names what blocks it.
	assert.Contains(t, out, "refusing to uninstall Strata")
	assert.Contains(t, out, volume)
	logs := kubectl(t, "-n", ns, "logs", "job/strata-uninstall-check")
	assert.Contains(t, logs, "refusing to uninstall Strata")
	assert.Contains(t, logs, volume)
	for _, node := range env.nodes {
		podOf(t, "strata-manager", node) // nothing was deleted
	}

	// Every claim of this package goes, and with them their volumes.
	kubectl(t, "-n", podNamespace, "delete", "pods", "--all", "--grace-period=1")
	kubectl(t, "-n", podNamespace, "delete", "volumesnapshots", "--all")
	kubectl(t, "-n", podNamespace, "delete", "pvc", "--all")
	require.Eventually(t, func() bool {
		vols, err := env.strata.StrataV1beta1().Volumes(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(vols.Items) == 0
	}, 3*time.Minute, 500*time.Millisecond, "every volume deleted")
	start := time.Now()
	out, err = env.cluster.UninstallChart(ctx, ns, "")
	require.NoError(t, err, "helm uninstall with no volume:\n%s", out)
	require.Eventually(t, func() bool {
		pods, err := env.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0
	}, 2*time.Minute, 500*time.Millisecond, "every Strata Pod gone")
	t.Logf("helm uninstall took %s", time.Since(start).Round(time.Millisecond))
	for _, n := range env.cluster.Nodes() {
		for _, dir := range []string{n.StrataDir(), n.KubeletRoot()} {
			var left []string
			for _, m := range localcluster.MountsUnder(dir) {
				if m != dir { // the directory's own (shared) mount stays with the node
					left = append(left, m)
				}
			}
			assert.Empty(t, left, "mounts left under %s", dir)
		}
		replicas, _ := filepath.Glob(filepath.Join(n.DiskDir(), "replicas", "*"))
		assert.Empty(t, replicas, "replica directories left on %s", n.Name)
		for dev, file := range localcluster.LoopDevices() {
			assert.False(t, strings.HasPrefix(file, n.StrataDir()+"/") || file == "/disk", "loop device %s on %s left", dev, file)
		}
		sockets, _ := filepath.Glob(filepath.Join(n.StrataDir(), "run", "nbd", "*"))
		assert.Empty(t, sockets, "NBD sockets left on %s", n.Name)
	}
	_, err = os.Stat(env.cluster.AdminKubeconfig)
	require.NoError(t, err)
}
