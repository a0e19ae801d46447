package dataplane

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

// Live migration: a second engine on another node attaches to the same
// replicas while the first still serves; it reads what the first wrote,
// and once the first is deleted it carries on alone. Only one side writes
// at a time, as during a VM live migration.
func TestLiveMigrationSharesReplicas(t *testing.T) {
	nodes := threeNodes(t)
	v := createVolume(t, "mig", nodes)
	ctx := context.Background()
	qemuIO(t, v.endpoint, "write -P 0x41 0 4M", "flush")

	target, err := nodes[1].client(t).InstanceCreate(ctx, &impb.InstanceCreateRequest{
		Name: "mig-e-target", Type: impb.InstanceType_INSTANCE_TYPE_ENGINE, VolumeName: v.name, Size: volSize,
		Replicas: v.replicas, Frontend: "nbd"})
	require.NoError(t, err)
	for r, m := range target.ReplicaModes {
		require.Equal(t, impb.ReplicaMode_REPLICA_MODE_RW, m, "replica %s", r)
	}
	out := qemuIO(t, target.FrontendEndpoint, "read -P 0x41 0 4M")
	assert.NotContains(t, out, "verification failed", "the target reads what the source wrote")

	qemuIO(t, v.endpoint, "write -P 0x42 8M 1M", "flush")
	out = qemuIO(t, target.FrontendEndpoint, "read -P 0x42 8M 1M")
	assert.NotContains(t, out, "verification failed", "and what it writes while both run")

	_, err = v.im(t).InstanceDelete(ctx, v.engine)
	require.NoError(t, err)
	out = qemuIO(t, target.FrontendEndpoint, "write -P 0x43 16M 1M", "flush",
		"read -P 0x43 16M 1M", "read -P 0x41 0 4M", "read -P 0x42 8M 1M")
	assert.NotContains(t, out, "verification failed", "the target carries on alone")
	inst, err := nodes[1].client(t).InstanceGet(ctx, "mig-e-target")
	require.NoError(t, err)
	for r, m := range inst.ReplicaModes {
		assert.Equal(t, impb.ReplicaMode_REPLICA_MODE_RW, m, "replica %s after the source is gone", r)
	}
}

// A replica's data is deleted only once its instance is: a live one is
// refused, a deleted one's directory goes, and deleting again succeeds.
func TestReplicaDataDelete(t *testing.T) {
	n := startNode(t, "node-1")
	ctx := context.Background()
	dir := filepath.Join(n.diskDir, "gone-r1")
	_, err := n.client(t).InstanceCreate(ctx, &impb.InstanceCreateRequest{Name: "gone-r1",
		Type: impb.InstanceType_INSTANCE_TYPE_REPLICA, VolumeName: "gone", Size: volSize, DataDir: dir})
	require.NoError(t, err)

	require.ErrorIs(t, n.client(t).ReplicaDataDelete(ctx, dir), engineapi.ErrBusy)
	require.ErrorIs(t, n.client(t).ReplicaDataDelete(ctx, n.stateDir), engineapi.ErrInvalid,
		"a directory that is no replica's is left alone")
	_, err = n.client(t).InstanceDelete(ctx, "gone-r1")
	require.NoError(t, err)
	require.NoError(t, n.client(t).ReplicaDataDelete(ctx, dir))
	_, err = os.Stat(dir)
	assert.True(t, os.IsNotExist(err), "the directory is gone")
	require.NoError(t, n.client(t).ReplicaDataDelete(ctx, dir), "deleting again is success")
}
