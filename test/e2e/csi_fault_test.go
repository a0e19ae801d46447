package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
)

// The node plugin killed with -9 while a Pod uses its volume: the Pod keeps
// its filesystem (the loop device on the instance manager's file outlives
// the plugin); the restarted plugin unpublishes and unstages it from the
// mount table when the Pod goes, leaving no mount or loop device.
func TestCSINodePluginKilledWhileVolumeInUse(t *testing.T) {
	node := nodeByName(t, "127.0.0.2")
	plugin := "csi-node-node-2"
	pvc := createPVC(t, "survives-plugin", "32Mi")
	volume := boundVolume(t, pvc)
	pod := podWithClaim("uses-volume", node.Name, pvc.Name, "echo before > /data/f; sleep 3600")
	createPod(t, pod)
	waitPodRunning(t, pod.Name)

	p := env.cluster.CSIProcess(plugin)
	require.NotNil(t, p)
	require.NoError(t, p.Kill())
	t.Cleanup(func() { ensureCSIRunning(t) })
	kubectl(t, "-n", podNamespace, "exec", pod.Name, "--", "sh", "-c", "echo after >> /data/f; sync")
	assert.Equal(t, "before\nafter", strings.TrimSpace(kubectl(t, "-n", podNamespace, "exec", pod.Name, "--", "cat", "/data/f")),
		"the Pod's volume works while its plugin is down")
	require.Len(t, loopsOnTheInstanceManagersFile(volume), 1, "the loop device outlives the plugin")

	require.NoError(t, env.cluster.RestartCSI(plugin))
	deletePod(t, pod.Name)
	require.Eventually(t, func() bool { return len(loopsOnTheInstanceManagersFile(volume)) == 0 }, time.Minute,
		200*time.Millisecond, "the restarted plugin unstages the volume")
	assert.Empty(t, localcluster.MountsUnder(node.CSIStateDir()), "no nbdfuse mount")
	assert.Empty(t, localcluster.MountsUnder(node.KubeletRoot()+"/plugins/kubernetes.io/csi"), "no staging or publish mount left")
	for dev, file := range localcluster.LoopDevices() {
		assert.False(t, strings.HasPrefix(file, node.CSIStateDir()+"/"), "loop device %s on %s", dev, file)
	}
}
