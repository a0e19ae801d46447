package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/csi"
	"github.com/strata-storage/strata/internal/devtools/localcluster"
)

// The node plugins the cluster runs (localcluster.StartCSI) register
// themselves with each kubelet (no node-driver-registrar): the kubelet fills CSINode with the Strata node
// name as the driver's node id and labels the Node with its topology.
func TestCSINodePluginRegistersWithKubelet(t *testing.T) {
	ctx := context.Background()
	for i, node := range env.cluster.Nodes() {
		strataNode := nodeNames[i]
		var csiNode *storagev1.CSINode
		var err error
		require.Eventually(t, func() bool {
			csiNode, err = env.adminKube.StorageV1().CSINodes().Get(ctx, node.Name, metav1.GetOptions{})
			return err == nil && len(csiNode.Spec.Drivers) == 1
		}, time.Minute, 200*time.Millisecond, "CSINode %s lists the driver", node.Name)
		driver := csiNode.Spec.Drivers[0]
		assert.Equal(t, csi.DriverName, driver.Name)
		assert.Equal(t, strataNode, driver.NodeID, "the Strata node is the driver's node id")
		assert.Equal(t, []string{csi.TopologyNodeKey}, driver.TopologyKeys)
		k8sNode, err := env.adminKube.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, strataNode, k8sNode.Labels[csi.TopologyNodeKey], "the Node carries the topology label")
	}
}

// The controller service against the real managers: CreateVolume returns a
// scheduled, detached volume and is idempotent by name; an impossible size is
// refused with the scheduler's reason and leaves no volume; DeleteVolume is
// idempotent.
func TestCSIControllerCreatesAndDeletesVolumes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	controller := csispec.NewControllerClient(startCSIController(t))

	rwo := []*csispec.VolumeCapability{{AccessType: &csispec.VolumeCapability_Mount{Mount: &csispec.VolumeCapability_MountVolume{}},
		AccessMode: &csispec.VolumeCapability_AccessMode{Mode: csispec.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}
	req := &csispec.CreateVolumeRequest{Name: "pvc-e2e-create", VolumeCapabilities: rwo,
		CapacityRange: &csispec.CapacityRange{RequiredBytes: 10 << 20}, Parameters: map[string]string{"numberOfReplicas": "2"}}
	created, err := controller.CreateVolume(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, int64(10<<20), created.Volume.CapacityBytes)
	again, err := controller.CreateVolume(ctx, req)
	require.NoError(t, err, "the same request again is answered with the same volume")
	assert.Equal(t, created.Volume.VolumeId, again.Volume.VolumeId)
	vol := getVolume(t, "pvc-e2e-create")
	assert.Equal(t, int32(2), vol.Spec.NumberOfReplicas)
	assert.Len(t, replicasOf(t, "pvc-e2e-create"), 2, "replicas placed")

	huge := &csispec.CreateVolumeRequest{Name: "pvc-e2e-huge", VolumeCapabilities: rwo,
		CapacityRange: &csispec.CapacityRange{RequiredBytes: 1 << 50}}
	_, err = controller.CreateVolume(ctx, huge)
	require.Error(t, err)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	t.Logf("a size beyond every disk: %v", err)
	waitVolumeGone(t, "pvc-e2e-huge") // not left behind

	// Publish attaches through a csi-attacher ticket and hands out the
	// endpoint; a repeat is a no-op; unpublish detaches.
	publish := &csispec.ControllerPublishVolumeRequest{VolumeId: "pvc-e2e-create", NodeId: "node-2", VolumeCapability: rwo[0]}
	published, err := controller.ControllerPublishVolume(ctx, publish)
	require.NoError(t, err)
	endpoint := published.PublishContext[csi.PublishContextEndpoint]
	require.NotEmpty(t, endpoint)
	assert.Equal(t, "node-2", getVolume(t, "pvc-e2e-create").Status.CurrentNodeID)
	qemuIO(t, endpoint, "write -P 0x5a 0 1M")
	assert.Contains(t, qemuIO(t, endpoint, "read -P 0x5a 0 1M"), "read 1048576/1048576")
	again2, err := controller.ControllerPublishVolume(ctx, publish)
	require.NoError(t, err)
	assert.Equal(t, endpoint, again2.PublishContext[csi.PublishContextEndpoint])
	assert.Contains(t, getVA(t, "pvc-e2e-create").Spec.AttachmentTickets, "csi-node-2")
	for range 2 {
		_, err = controller.ControllerUnpublishVolume(ctx, &csispec.ControllerUnpublishVolumeRequest{VolumeId: "pvc-e2e-create", NodeId: "node-2"})
		require.NoError(t, err, "ControllerUnpublishVolume is idempotent")
	}
	assert.True(t, isDetached(getVolume(t, "pvc-e2e-create")), "unpublished: detached")
	_, err = controller.ControllerPublishVolume(ctx, &csispec.ControllerPublishVolumeRequest{VolumeId: "pvc-e2e-create",
		NodeId: "node-9", VolumeCapability: rwo[0]})
	assert.Equal(t, codes.NotFound, status.Code(err), "an unknown node: %v", err)

	// A snapshot of the detached volume: ready once the Snapshot controller
	// has taken it (the sidecar polls CreateSnapshot the same way).
	snapReq := &csispec.CreateSnapshotRequest{Name: "snapshot-e2e-1", SourceVolumeId: "pvc-e2e-create"}
	require.Eventually(t, func() bool {
		resp, err := controller.CreateSnapshot(ctx, snapReq)
		require.NoError(t, err)
		return resp.Snapshot.ReadyToUse
	}, time.Minute, 300*time.Millisecond, "the snapshot becomes ready to use")
	listed, err := controller.ListSnapshots(ctx, &csispec.ListSnapshotsRequest{SourceVolumeId: "pvc-e2e-create"})
	require.NoError(t, err)
	require.Len(t, listed.Entries, 1)
	assert.Equal(t, "snapshot-e2e-1", listed.Entries[0].Snapshot.SnapshotId)
	assert.Equal(t, int64(10<<20), listed.Entries[0].Snapshot.SizeBytes)
	_, err = controller.CreateSnapshot(ctx, &csispec.CreateSnapshotRequest{Name: "snapshot-e2e-2", SourceVolumeId: "pvc-missing"})
	assert.Equal(t, codes.NotFound, status.Code(err), "a snapshot of a missing volume: %v", err)
	for range 2 {
		_, err = controller.DeleteSnapshot(ctx, &csispec.DeleteSnapshotRequest{SnapshotId: "snapshot-e2e-1"})
		require.NoError(t, err, "DeleteSnapshot is idempotent")
	}
	require.Eventually(t, func() bool {
		_, err := env.adminStrata.StrataV1beta1().Snapshots(ns).Get(ctx, "snapshot-e2e-1", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, time.Minute, 200*time.Millisecond, "the Snapshot CR goes")

	for range 2 {
		_, err = controller.DeleteVolume(ctx, &csispec.DeleteVolumeRequest{VolumeId: "pvc-e2e-create"})
		require.NoError(t, err, "DeleteVolume is idempotent")
	}
	waitVolumeGone(t, "pvc-e2e-create")
}

// startCSIController runs `strata-manager csi --mode controller` for the
// test and returns a connection once it is ready.
func startCSIController(t *testing.T) *grpc.ClientConn {
	socket := filepath.Join(env.runDir, "csi-controller-"+strings.ToLower(t.Name())+".sock")
	if len(socket) > 100 {
		socket = filepath.Join(env.runDir, "csi-controller.sock")
	}
	_, conn := startCSIPlugin(t, "csi-controller", socket, "--mode", "controller")
	return conn
}

func startCSIPlugin(t *testing.T, name, socket string, args ...string) (*localcluster.Process, *grpc.ClientConn) {
	t.Helper()
	p, err := localcluster.StartProcess(name, filepath.Join(env.runDir, "logs", name+".log"), env.managerOpts.Bin,
		append([]string{"csi", "--csi-address", socket, "--kubeconfig", env.cluster.CSIControllerKubeconfig()}, args...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	require.Eventually(t, func() bool {
		probe, err := csispec.NewIdentityClient(conn).Probe(context.Background(), &csispec.ProbeRequest{})
		return err == nil && probe.GetReady().GetValue()
	}, time.Minute, 200*time.Millisecond, "%s becomes ready (log: %s)", name, p.LogTail(10))
	return p, conn
}
