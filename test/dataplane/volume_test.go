package dataplane

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

const volSize = 64 << 20

// volume is a 3-replica volume with its engine (and NBD frontend) on the first node.
type volume struct {
	name     string
	nodes    []*node
	replicas map[string]string // name -> dataconn address
	engine   string
	endpoint string
}

func createVolume(t *testing.T, name string, nodes []*node) *volume {
	t.Helper()
	ctx := context.Background()
	v := &volume{name: name, nodes: nodes, replicas: map[string]string{}, engine: name + "-e"}
	for i, n := range nodes {
		rname := name + "-r" + string(rune('1'+i))
		inst, err := n.client(t).InstanceCreate(ctx, &impb.InstanceCreateRequest{
			Name: rname, Type: impb.InstanceType_INSTANCE_TYPE_REPLICA, VolumeName: name, Size: volSize,
			DataDir: filepath.Join(n.diskDir, rname)})
		require.NoError(t, err)
		require.Equal(t, impb.InstanceState_INSTANCE_STATE_RUNNING, inst.State)
		v.replicas[rname] = inst.Address
	}
	v.startEngine(t)
	return v
}

func (v *volume) startEngine(t *testing.T) {
	t.Helper()
	inst, err := v.nodes[0].client(t).InstanceCreate(context.Background(), &impb.InstanceCreateRequest{
		Name: v.engine, Type: impb.InstanceType_INSTANCE_TYPE_ENGINE, VolumeName: v.name, Size: volSize,
		Replicas: v.replicas, Frontend: "nbd"})
	require.NoError(t, err)
	require.Len(t, inst.ReplicaModes, len(v.replicas))
	for r, m := range inst.ReplicaModes {
		require.Equal(t, impb.ReplicaMode_REPLICA_MODE_RW, m, "replica %s", r)
	}
	v.endpoint = inst.FrontendEndpoint
}

func (v *volume) im(t *testing.T) *engineapi.Client { return v.nodes[0].client(t) }

func (v *volume) snapshot(t *testing.T, name string) {
	t.Helper()
	_, err := v.im(t).SnapshotCreate(context.Background(), v.engine, name, true, nil, 0)
	require.NoError(t, err)
}

func (v *volume) revert(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	_, err := v.im(t).FrontendStop(ctx, v.engine)
	require.NoError(t, err)
	require.NoError(t, v.im(t).SnapshotRevert(ctx, v.engine, name))
	inst, err := v.im(t).FrontendStart(ctx, v.engine, "nbd")
	require.NoError(t, err)
	v.endpoint = inst.FrontendEndpoint
}

// purge starts a purge and waits until every replica reports it complete.
func (v *volume) purge(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, v.im(t).SnapshotPurge(ctx, v.engine))
	require.Eventually(t, func() bool {
		st, err := v.im(t).SnapshotPurgeStatus(ctx, v.engine)
		require.NoError(t, err)
		for _, s := range st {
			if s.IsPurging || s.State != "complete" {
				return false
			}
		}
		return len(st) == len(v.replicas)
	}, time.Minute, 50*time.Millisecond, "purge completes on every replica")
}

func threeNodes(t *testing.T) []*node {
	return []*node{startNode(t, "node-1"), startNode(t, "node-2"), startNode(t, "node-3")}
}

// The scenario: write with qemu-io, snapshot over gRPC, overwrite,
// revert, read back with nbdcopy and qemu-img; then the same after purging
// the middle snapshot.
func TestSnapshotRevertPurgeWithExternalClients(t *testing.T) {
	v := createVolume(t, "vol1", threeNodes(t))
	ctx := context.Background()

	stepA := []string{"write -P 0x11 0 8M", "write -P 0x12 32M 1M"}
	stepB := []string{"write -P 0x22 4M 8M", "write -z 32M 512k"}
	stepC := []string{"write -P 0x33 0 2M", "discard 60M 1M", "write -P 0x34 63M 1M"}
	imgA := expected(t, volSize, "a", stepA...)
	imgB := expected(t, volSize, "b", append(append([]string{}, stepA...), stepB...)...)
	imgC := expected(t, volSize, "c", append(append(append([]string{}, stepA...), stepB...), stepC...)...)

	qemuIO(t, v.endpoint, stepA...)
	v.snapshot(t, "s1")
	qemuIO(t, v.endpoint, stepB...)
	v.snapshot(t, "s2")
	qemuIO(t, v.endpoint, append(stepC, "flush")...)
	v.snapshot(t, "s3")
	// qemu-img compare reads through NBD itself: the live volume equals C.
	tool(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", v.endpoint, imgC)

	v.revert(t, "s1")
	assert.Equal(t, sha256File(t, imgA), readVolume(t, v.endpoint), "reverted to s1")
	v.revert(t, "s2")
	assert.Equal(t, sha256File(t, imgB), readVolume(t, v.endpoint), "reverted to s2, a later snapshot kept as a branch")

	// Remove the middle snapshot and purge: s1 and s3 keep their content.
	// With the head on s3, s2 has one child and is coalesced into it.
	v.revert(t, "s3")
	require.NoError(t, v.im(t).SnapshotRemove(ctx, v.engine, "s2"))
	v.purge(t)
	snaps, err := v.im(t).SnapshotList(ctx, v.engine)
	require.NoError(t, err)
	assert.NotContains(t, snaps, "s2", "the purged snapshot is gone from the chain")

	assert.Equal(t, sha256File(t, imgC), readVolume(t, v.endpoint), "s3 after purging s2")
	v.revert(t, "s1")
	assert.Equal(t, sha256File(t, imgA), readVolume(t, v.endpoint), "s1 after purging s2")
	tool(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", v.endpoint, imgA)
}

func TestTypedErrorsReachTheClient(t *testing.T) {
	v := createVolume(t, "vol2", []*node{startNode(t, "node-1")})
	ctx := context.Background()
	c := v.im(t)

	_, err := c.InstanceGet(ctx, "nope")
	assert.ErrorIs(t, err, engineapi.ErrNotFound)

	v.snapshot(t, "dup")
	_, err = c.SnapshotCreate(ctx, v.engine, "dup", true, nil, 0)
	assert.ErrorIs(t, err, engineapi.ErrAlreadyExists)

	require.NoError(t, c.SnapshotLimitsSet(ctx, v.engine, 2, 0))
	v.snapshot(t, "second")
	_, err = c.SnapshotCreate(ctx, v.engine, "third", true, nil, 0)
	assert.ErrorIs(t, err, engineapi.ErrLimitExceeded, "a user snapshot over the limit is refused")
	_, err = c.SnapshotCreate(ctx, v.engine, "system", false, nil, 0)
	assert.NoError(t, err, "system snapshots are exempt from the limit")

	_, err = c.SnapshotCreate(ctx, v.engine, "bad/name", true, nil, 0)
	assert.ErrorIs(t, err, engineapi.ErrInvalid)
	assert.ErrorIs(t, c.SnapshotRevert(ctx, v.engine, "second"), engineapi.ErrBusy, "revert needs the frontend stopped")
	assert.ErrorIs(t, c.SnapshotRemove(ctx, v.engine, "never"), engineapi.ErrNotFound)

	inst, err := c.InstanceGet(ctx, v.engine)
	require.NoError(t, err)
	for _, r := range inst.ReplicaModes {
		assert.Equal(t, impb.ReplicaMode_REPLICA_MODE_RW, r, "refusals fail no replica")
	}
}
