package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/csi"
	"github.com/strata-storage/strata/scripts/localcluster"
)

// The node plugin registers itself with each kubelet (no
// node-driver-registrar): the kubelet fills CSINode with the Strata node
// name as the driver's node id and labels the Node with its topology.
func TestCSINodePluginRegistersWithKubelet(t *testing.T) {
	ctx := context.Background()
	for i, node := range env.cluster.Nodes() {
		strataNode := nodeNames[i]
		csiSocket := filepath.Join(node.KubeletRoot(), "plugins", csi.DriverName, "csi.sock")
		p, err := localcluster.StartProcess("csi-"+strataNode, filepath.Join(env.runDir, "logs", "csi-"+strataNode+".log"),
			env.managerOpts.Bin, "csi", "--mode", "node", "--node-name", strataNode, "--csi-address", csiSocket,
			"--kubelet-root", node.KubeletRoot(), "--kubeconfig", env.managerKubeconfig)
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Stop(10 * time.Second) })

		var csiNode *storagev1.CSINode
		require.Eventually(t, func() bool {
			csiNode, err = env.adminKube.StorageV1().CSINodes().Get(ctx, node.Name, metav1.GetOptions{})
			return err == nil && len(csiNode.Spec.Drivers) == 1
		}, time.Minute, 200*time.Millisecond, "CSINode %s lists the driver (plugin log: %s)", node.Name, fmt.Sprint(p.LogTail(10)))
		driver := csiNode.Spec.Drivers[0]
		assert.Equal(t, csi.DriverName, driver.Name)
		assert.Equal(t, strataNode, driver.NodeID, "the Strata node is the driver's node id")
		assert.Equal(t, []string{csi.TopologyNodeKey}, driver.TopologyKeys)
		k8sNode, err := env.adminKube.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, strataNode, k8sNode.Labels[csi.TopologyNodeKey], "the Node carries the topology label")
	}
}
