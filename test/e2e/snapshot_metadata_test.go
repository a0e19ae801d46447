package e2e

import (
	"context"
	"io"
	"testing"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// metadataStream is what both SnapshotMetadata streams send.
type metadataStream[T interface {
	GetVolumeCapacityBytes() int64
	GetBlockMetadata() []*csispec.BlockMetadata
}] interface {
	Recv() (T, error)
}

// receiveBlocks reads a SnapshotMetadata stream to its end as [offset,
// length] pairs, checking each message carries the volume's size.
func receiveBlocks[T interface {
	GetVolumeCapacityBytes() int64
	GetBlockMetadata() []*csispec.BlockMetadata
}](t *testing.T, stream metadataStream[T], err error, size int64) [][2]int64 {
	t.Helper()
	require.NoError(t, err)
	var out [][2]int64
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		assert.Equal(t, size, msg.GetVolumeCapacityBytes())
		for _, b := range msg.GetBlockMetadata() {
			out = append(out, [2]int64{b.ByteOffset, b.SizeBytes})
		}
	}
}

// The CSI SnapshotMetadata service against the real managers: writes at
// known offsets around two snapshots; GetMetadataAllocated and
// GetMetadataDelta, asked of the controller plugin, come from the engine
// through a manager's REST API and list exactly those blocks, while the
// volume is attached and again once it is detached (attached for the
// call).
func TestCSISnapshotMetadataListsTheWrittenBlocks(t *testing.T) {
	t.Parallel() // a volume of its own, no fault
	const vol, size, mib = "e2e-cbt", 16 << 20, 1 << 20
	createVolume(t, vol, "16Mi", 2)
	waitVolume(t, vol, time.Minute, "detached", isDetached)
	updateTickets(t, vol, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	ep := waitVolume(t, vol, time.Minute, "attached to node-1", attachedTo("node-1")).Status.FrontendEndpoint
	write := func(cmds ...string) {
		_, err := runQemuIO(ep, append(cmds, "flush")...)
		require.NoError(t, err)
	}
	write("write -P 1 0 1M", "write -P 2 5M 4k")
	createSnapshot(t, vol, "e2e-cbt-s1")
	waitSnapshotsReady(t, vol, 1, time.Minute)
	write("write -P 3 5M 4k", "write -P 4 9M 64k")
	createSnapshot(t, vol, "e2e-cbt-s2")
	waitSnapshotsReady(t, vol, 2, time.Minute)
	write("write -P 5 12M 4k") // the head only

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	md := csispec.NewSnapshotMetadataClient(startCSIController(t))
	allocated := func(how string) {
		alloc, err := md.GetMetadataAllocated(ctx, &csispec.GetMetadataAllocatedRequest{SnapshotId: "e2e-cbt-s1"})
		assert.Equal(t, [][2]int64{{0, mib}, {5 * mib, 4096}}, receiveBlocks(t, alloc, err, size), "%s: the blocks of s1", how)
	}
	delta := func(how string) {
		delta, err := md.GetMetadataDelta(ctx, &csispec.GetMetadataDeltaRequest{BaseSnapshotId: "e2e-cbt-s1",
			TargetSnapshotId: "e2e-cbt-s2", MaxResults: 1})
		assert.Equal(t, [][2]int64{{5 * mib, 4096}, {9 * mib, 64 << 10}}, receiveBlocks(t, delta, err, size),
			"%s: written between s1 and s2", how)
	}
	allocated("attached")
	delta("attached")
	// Detached, each call attaches the volume for itself and gives it
	// back; the next is asked once it is detached again (one asked while
	// it detaches may be refused as Unavailable, which a client retries).
	updateTickets(t, vol, removeTicket("admin"))
	waitVolume(t, vol, time.Minute, "detached", isDetached)
	start := time.Now()
	delta("detached")
	t.Logf("the delta of a detached volume (attached for the call) in %s", time.Since(start).Round(time.Millisecond))
	waitVolume(t, vol, time.Minute, "detached again", isDetached)
	allocated("detached")
}
