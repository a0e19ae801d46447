package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
)

// csiNodeClient is one node plugin and where it stages and publishes.
type csiNodeClient struct {
	node         string
	client       csispec.NodeClient
	stateDir     string
	stagingRoot  string
	publishRoots string
}

// newCSINodeClient talks to the node plugin the cluster runs beside the
// index-th kubelet, as that kubelet does.
func newCSINodeClient(t *testing.T, index int) csiNodeClient {
	strataNode, node := nodeNames[index], env.cluster.Nodes()[index]
	conn, err := grpc.NewClient("unix://"+node.CSISocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	dir := filepath.Join(env.runDir, "csi-paths", strataNode)
	return csiNodeClient{node: strataNode, client: csispec.NewNodeClient(conn),
		stateDir: node.CSIStateDir(), stagingRoot: filepath.Join(dir, "staging"), publishRoots: filepath.Join(dir, "pods")}
}

// use stages and publishes the volume on the node as the kubelet would,
// runs fn on the published path, then unpublishes and unstages, twice each
// (idempotent), and checks nothing of it is left on the node.
func (n csiNodeClient) use(t *testing.T, ctx context.Context, controller csispec.ControllerClient, volume string,
	capability *csispec.VolumeCapability, fn func(path string)) {
	t.Helper()
	published, err := controller.ControllerPublishVolume(ctx, &csispec.ControllerPublishVolumeRequest{
		VolumeId: volume, NodeId: n.node, VolumeCapability: capability})
	require.NoError(t, err)
	staging := filepath.Join(n.stagingRoot, volume)
	target := filepath.Join(n.publishRoots, volume, "mount")
	for range 2 {
		_, err = n.client.NodeStageVolume(ctx, &csispec.NodeStageVolumeRequest{VolumeId: volume,
			PublishContext: published.PublishContext, StagingTargetPath: staging, VolumeCapability: capability})
		require.NoError(t, err, "NodeStageVolume (idempotent)")
		_, err = n.client.NodePublishVolume(ctx, &csispec.NodePublishVolumeRequest{VolumeId: volume,
			PublishContext: published.PublishContext, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability})
		require.NoError(t, err, "NodePublishVolume (idempotent)")
	}
	stats, err := n.client.NodeGetVolumeStats(ctx, &csispec.NodeGetVolumeStatsRequest{VolumeId: volume, VolumePath: target})
	require.NoError(t, err)
	assert.Positive(t, stats.Usage[0].Total, "volume stats")
	fn(target)
	for range 2 {
		_, err = n.client.NodeUnpublishVolume(ctx, &csispec.NodeUnpublishVolumeRequest{VolumeId: volume, TargetPath: target})
		require.NoError(t, err, "NodeUnpublishVolume (idempotent)")
		_, err = n.client.NodeUnstageVolume(ctx, &csispec.NodeUnstageVolumeRequest{VolumeId: volume, StagingTargetPath: staging})
		require.NoError(t, err, "NodeUnstageVolume (idempotent)")
	}
	_, err = controller.ControllerUnpublishVolume(ctx, &csispec.ControllerUnpublishVolumeRequest{VolumeId: volume, NodeId: n.node})
	require.NoError(t, err)
	n.assertNothingLeft(t)
}

// assertNothingLeft: no mount under the node's paths or its connection
// records, no loop device on them, no nbdfuse serving them.
func (n csiNodeClient) assertNothingLeft(t *testing.T) {
	t.Helper()
	for _, dir := range []string{n.stagingRoot, n.publishRoots, n.stateDir} {
		assert.Empty(t, localcluster.MountsUnder(dir), "mounts under %s", dir)
	}
	for dev, file := range localcluster.LoopDevices() {
		assert.False(t, strings.HasPrefix(file, n.stateDir+"/"), "loop device %s on %s", dev, file)
	}
	out, _ := exec.Command("pgrep", "-af", "nbdfuse "+n.stateDir+"/").CombinedOutput()
	assert.Empty(t, strings.TrimSpace(string(out)), "nbdfuse processes")
}

// The node service for real: a filesystem volume is staged (formatted,
// mounted through nbdfuse and a loop device) and published on node-2, a file
// written; then the same volume on node-3 has the file. A block volume is
// published as a device that dd writes and reads back. Nothing is left on
// either node afterwards. In the long tier: make test stages and publishes
// through kubelets on the install (test/deployed), and csi/nbddev connects
// nbdfuse and loop devices for real.
func TestLongCSINodeStagesAndPublishesForReal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	controller := csispec.NewControllerClient(startCSIController(t))
	node2, node3 := newCSINodeClient(t, 1), newCSINodeClient(t, 2)

	for _, fs := range []string{"ext4", "xfs"} {
		t.Run(fs, func(t *testing.T) {
			volume := "pvc-e2e-node-" + fs
			mount := &csispec.VolumeCapability{AccessType: &csispec.VolumeCapability_Mount{Mount: &csispec.VolumeCapability_MountVolume{FsType: fs}},
				AccessMode: &csispec.VolumeCapability_AccessMode{Mode: csispec.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
			createCSIVolume(t, ctx, controller, volume, 320<<20, mount) // xfs wants 300 MiB at least
			data := make([]byte, 4<<20)
			_, _ = rand.Read(data)
			sum := sha256.Sum256(data)
			node2.use(t, ctx, controller, volume, mount, func(path string) {
				require.NoError(t, os.WriteFile(filepath.Join(path, "data"), data, 0o644))
			})
			node3.use(t, ctx, controller, volume, mount, func(path string) {
				got, err := os.ReadFile(filepath.Join(path, "data"))
				require.NoError(t, err, "the file written on node-2")
				gotSum := sha256.Sum256(got)
				assert.Equal(t, hex.EncodeToString(sum[:]), hex.EncodeToString(gotSum[:]))
			})
		})
	}

	t.Run("block", func(t *testing.T) {
		volume := "pvc-e2e-node-block"
		block := &csispec.VolumeCapability{AccessType: &csispec.VolumeCapability_Block{Block: &csispec.VolumeCapability_BlockVolume{}},
			AccessMode: &csispec.VolumeCapability_AccessMode{Mode: csispec.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
		createCSIVolume(t, ctx, controller, volume, 16<<20, block)
		node2.use(t, ctx, controller, volume, block, func(path string) {
			fi, err := os.Stat(path)
			require.NoError(t, err)
			assert.NotZero(t, fi.Mode()&os.ModeDevice, "the published path is a block device")
			out, err := exec.Command("dd", "if=/dev/urandom", "of="+path, "bs=1M", "count=4", "oflag=direct").CombinedOutput()
			require.NoError(t, err, "%s", out)
			first, err := exec.Command("sh", "-c", "dd if="+path+" bs=1M count=4 iflag=direct 2>/dev/null | sha256sum").Output()
			require.NoError(t, err)
			again, err := exec.Command("sh", "-c", "dd if="+path+" bs=1M count=4 iflag=direct 2>/dev/null | sha256sum").Output()
			require.NoError(t, err)
			assert.Equal(t, string(first), string(again), "dd round-trips through the device")
		})
	})
}

func createCSIVolume(t *testing.T, ctx context.Context, controller csispec.ControllerClient, name string, size int64,
	capability *csispec.VolumeCapability) {
	t.Helper()
	_, err := controller.CreateVolume(ctx, &csispec.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csispec.VolumeCapability{capability},
		CapacityRange: &csispec.CapacityRange{RequiredBytes: size}, Parameters: map[string]string{"numberOfReplicas": "2"}})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := controller.DeleteVolume(context.Background(), &csispec.DeleteVolumeRequest{VolumeId: name})
		assert.NoError(t, err)
		waitVolumeGone(t, name)
	})
}
