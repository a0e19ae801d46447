package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// fakeBlocks pages through fixed extents per (snapshot, base) as the REST
// API does, and records the pages asked for.
type fakeBlocks struct {
	extents        map[[2]string][]engineapi.BlockExtent
	asked          []int64 // starting offsets
	opened, closed int
}

func (f *fakeBlocks) OpenBlocks(context.Context) (BlocksReader, error) { f.opened++; return f, nil }
func (f *fakeBlocks) Close()                                           { f.closed++ }

func (f *fakeBlocks) SnapshotBlocks(_ context.Context, volume, snapshot, base string, from int64, max int) (BlocksPage, error) {
	f.asked = append(f.asked, from)
	all, ok := f.extents[[2]string{snapshot, base}]
	if !ok || volume != "pvc-1" {
		return BlocksPage{}, ErrBlocksInvalid
	}
	page := BlocksPage{VolumeSize: 64 << 20}
	for _, e := range all {
		if e.Offset+e.Length <= from {
			continue
		}
		if len(page.Extents) == max {
			next := page.Extents[max-1].Offset + page.Extents[max-1].Length
			page.Next = &next
			break
		}
		page.Extents = append(page.Extents, e)
	}
	return page, nil
}

// sent collects what a server stream sends.
type sent[T any] struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []*T
}

func (s *sent[T]) Send(m *T) error          { s.msgs = append(s.msgs, m); return nil }
func (s *sent[T]) Context() context.Context { return s.ctx }

func metadataDriver(t *testing.T, blocks BlocksSource) *Driver {
	t.Helper()
	taken := func(s *v1beta1.Snapshot) { s.Status.ReadyToUse = true }
	env := dstest.New(t, []runtime.Object{existingVolume("pvc-1", 64<<20, 1), existingVolume("pvc-2", 64<<20, 1),
		snapshotCR("s1", "pvc-1", taken), snapshotCR("s2", "pvc-1", taken), snapshotCR("o1", "pvc-2", taken),
		snapshotCR("pending", "pvc-1")}, nil)
	d, err := NewDriver(Options{Mode: ModeController, Version: "test", Store: env.DS, Log: logrus.New(), Blocks: blocks})
	require.NoError(t, err)
	return d
}

// The allocated and delta answers page through the manager's pages and go
// out as messages of at most max_results variable-length extents, each
// carrying the volume's size; bad requests get their codes.
func TestSnapshotMetadata(t *testing.T) {
	src := &fakeBlocks{extents: map[[2]string][]engineapi.BlockExtent{
		{"s2", ""}:   {{Offset: 0, Length: 4096}, {Offset: 1 << 20, Length: 8192}, {Offset: 5 << 20, Length: 4096}},
		{"s2", "s1"}: {{Offset: 1 << 20, Length: 8192}},
	}}
	d := metadataDriver(t, src)

	alloc := &sent[csi.GetMetadataAllocatedResponse]{ctx: t.Context()}
	require.NoError(t, d.GetMetadataAllocated(&csi.GetMetadataAllocatedRequest{SnapshotId: "s2", MaxResults: 2}, alloc))
	require.Len(t, alloc.msgs, 2, "three extents, two a message")
	assert.Equal(t, []int64{0, (1 << 20) + 8192}, src.asked, "the second page starts where the first ended")
	var got [][2]int64
	for _, m := range alloc.msgs {
		assert.Equal(t, csi.BlockMetadataType_VARIABLE_LENGTH, m.BlockMetadataType)
		assert.Equal(t, int64(64<<20), m.VolumeCapacityBytes)
		for _, b := range m.BlockMetadata {
			got = append(got, [2]int64{b.ByteOffset, b.SizeBytes})
		}
	}
	assert.Equal(t, [][2]int64{{0, 4096}, {1 << 20, 8192}, {5 << 20, 4096}}, got)
	assert.Equal(t, [2]int{1, 1}, [2]int{src.opened, src.closed}, "one reader for the stream's pages, closed at its end")

	delta := &sent[csi.GetMetadataDeltaResponse]{ctx: t.Context()}
	require.NoError(t, d.GetMetadataDelta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2"}, delta))
	require.Len(t, delta.msgs, 1)
	assert.Equal(t, []*csi.BlockMetadata{{ByteOffset: 1 << 20, SizeBytes: 8192}}, delta.msgs[0].BlockMetadata)

	empty := &sent[csi.GetMetadataDeltaResponse]{ctx: t.Context()}
	require.NoError(t, d.GetMetadataDelta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2",
		StartingOffset: 2 << 20}, empty))
	require.Len(t, empty.msgs, 1, "nothing past the offset: one message with the size")
	assert.Empty(t, empty.msgs[0].BlockMetadata)
	assert.Equal(t, int64(64<<20), empty.msgs[0].VolumeCapacityBytes)

	refused := []struct {
		name    string
		req     *csi.GetMetadataDeltaRequest
		code    codes.Code
		wantMsg string
	}{
		{"no target", &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1"}, codes.InvalidArgument, "target_snapshot_id: missing"},
		{"no base", &csi.GetMetadataDeltaRequest{TargetSnapshotId: "s2"}, codes.InvalidArgument, "base_snapshot_id: missing"},
		{"unknown target", &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "nope"}, codes.NotFound, "no such snapshot"},
		{"a base of another volume", &csi.GetMetadataDeltaRequest{BaseSnapshotId: "o1", TargetSnapshotId: "s2"},
			codes.InvalidArgument, "base_snapshot_id o1 is of volume pvc-2"},
		{"a target not taken yet", &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "pending"},
			codes.FailedPrecondition, "not taken yet"},
		{"a base the engine refuses", &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s2", TargetSnapshotId: "s1"},
			codes.InvalidArgument, "invalid"},
		{"a negative offset", &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2", StartingOffset: -1},
			codes.InvalidArgument, "starting_offset"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			err := d.GetMetadataDelta(tc.req, &sent[csi.GetMetadataDeltaResponse]{ctx: t.Context()})
			wantResult(t, err, tc.code, tc.wantMsg)
		})
	}

	caps, err := d.GetPluginCapabilities(t.Context(), &csi.GetPluginCapabilitiesRequest{})
	require.NoError(t, err)
	assert.Contains(t, caps.Capabilities, pluginCap(csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE))
	without := metadataDriver(t, nil)
	err = without.GetMetadataAllocated(&csi.GetMetadataAllocatedRequest{SnapshotId: "s2"}, alloc)
	wantResult(t, err, codes.Unimplemented, "no snapshot metadata")
}
