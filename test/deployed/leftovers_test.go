package deployed

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The instance-manager Pod of the node where a claim is staged is deleted
// (its DaemonSet brings a new one): the loop device the node plugin bound
// to the old Pod's file outlives that file. Once the workload Pod goes and
// the claim is unstaged, the device is released, and a new Pod on the same
// node stages the claim afresh and reads what was written before. The
// package's TestMain then checks that the teardown leaves no loop device
// behind either (localcluster.HostResidue).
func TestInstanceManagerReplacedUnderAStagedClaimLeavesNoLoopDevice(t *testing.T) {
	logsOnFailure(t)
	const node = "127.0.0.1"
	claim(t, "iml", "")
	pod(t, "iml", node, "iml", "echo kept > /data/before && sync && exec sleep 3600")
	volume := volumeOfClaim(t, "iml")
	dev := loopDeviceOf(t, node, volume)

	replaceNodePod(t, "strata-instance-manager", node)
	deletePod(t, "iml")
	// The node plugin unstages before the attacher lets the volume go.
	require.Eventually(t, func() bool { return !volumeAttachedTo(t, volume, node) }, 3*time.Minute, 250*time.Millisecond,
		"the claim is unstaged and detached from %s", node)
	// The kernel names a file whose FUSE mount is gone relative to it.
	assert.NotEqual(t, "/"+engineapi.FUSEFileName, localcluster.LoopDevices()[dev],
		"%s is released, not left on the old instance manager's dead file", dev)

	pod(t, "iml2", node, "iml", "exec sleep 3600")
	assert.Equal(t, "kept", strings.TrimSpace(exec1(t, "iml2", "cat /data/before")), "the claim stages again and holds its data")
	loopDeviceOf(t, node, volume) // on the new instance manager's file
}

// volumeAttachedTo tells whether a VolumeAttachment of volume (its PV's
// name too) to node remains.
func volumeAttachedTo(t *testing.T, volume, node string) bool {
	t.Helper()
	vas, err := env.kube.StorageV1().VolumeAttachments().List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	for _, va := range vas.Items {
		pv := va.Spec.Source.PersistentVolumeName
		if va.Spec.NodeName == node && pv != nil && *pv == volume {
			return true
		}
	}
	return false
}
