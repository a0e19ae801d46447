package csi

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func snapshotCR(name, volume string, edit ...func(*v1beta1.Snapshot)) *v1beta1.Snapshot {
	s := &v1beta1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: types.DefaultNamespace},
		Spec: v1beta1.SnapshotSpec{Volume: volume, CreateSnapshot: true}}
	for _, e := range edit {
		e(s)
	}
	return s
}

func TestCreateSnapshot(t *testing.T) {
	vol := existingVolume("pvc-1", 1<<20, 1)
	ready := func(s *v1beta1.Snapshot) {
		s.Status.ReadyToUse, s.Status.RestoreSize, s.Status.CreationTime = true, 1<<20, "2026-11-24T10:00:00.5Z"
	}
	tests := []struct {
		name      string
		existing  []runtime.Object
		req       *csi.CreateSnapshotRequest
		wantCode  codes.Code
		wantMsg   string
		wantReady bool
		wantWrite bool
		wantID    string // "": the request's name
	}{
		{name: "new snapshot: not ready yet", existing: []runtime.Object{vol},
			req: &csi.CreateSnapshotRequest{Name: "snapshot-1", SourceVolumeId: "pvc-1"}, wantWrite: true},
		{name: "again once ready", existing: []runtime.Object{vol, snapshotCR("snapshot-1", "pvc-1", ready)},
			req: &csi.CreateSnapshotRequest{Name: "snapshot-1", SourceVolumeId: "pvc-1"}, wantReady: true},
		{name: "same name, other volume", existing: []runtime.Object{vol, snapshotCR("snapshot-1", "pvc-2")},
			req: &csi.CreateSnapshotRequest{Name: "snapshot-1", SourceVolumeId: "pvc-1"}, wantCode: codes.AlreadyExists, wantMsg: "exists of volume pvc-2"},
		{name: "missing volume", req: &csi.CreateSnapshotRequest{Name: "snapshot-1", SourceVolumeId: "pvc-1"},
			wantCode: codes.NotFound, wantMsg: "source volume pvc-1"},
		{name: "failed in the data plane", existing: []runtime.Object{vol, snapshotCR("snapshot-1", "pvc-1", func(s *v1beta1.Snapshot) { s.Status.Error = "replica lost" })},
			req: &csi.CreateSnapshotRequest{Name: "snapshot-1", SourceVolumeId: "pvc-1"}, wantCode: codes.Internal, wantMsg: "replica lost"},
		{name: "the head's name: a name derived from it", existing: []runtime.Object{vol},
			req: &csi.CreateSnapshotRequest{Name: types.VolumeHeadName, SourceVolumeId: "pvc-1"}, wantID: derivedName("snap", types.VolumeHeadName), wantWrite: true},
		{name: "a 128-character name", existing: []runtime.Object{vol},
			req: &csi.CreateSnapshotRequest{Name: strings.Repeat("S", 128), SourceVolumeId: "pvc-1"}, wantID: derivedName("snap", strings.Repeat("S", 128)), wantWrite: true},
		{name: "unknown parameter", existing: []runtime.Object{vol},
			req:      &csi.CreateSnapshotRequest{Name: "snapshot-1", SourceVolumeId: "pvc-1", Parameters: map[string]string{"type": "bak"}},
			wantCode: codes.InvalidArgument, wantMsg: `parameter "type": unknown (a VolumeSnapshotClass takes none of Strata's)`},
		{name: "the class's deletionPolicy copied into its parameters", existing: []runtime.Object{vol},
			req:       &csi.CreateSnapshotRequest{Name: "snapshot-1", SourceVolumeId: "pvc-1", Parameters: map[string]string{"deletionPolicy": "Retain"}},
			wantWrite: true},
		{name: "no source", req: &csi.CreateSnapshotRequest{Name: "snapshot-1"}, wantCode: codes.InvalidArgument, wantMsg: "source_volume_id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, env := controllerDriver(t, tc.existing, nil, nil)
			resp, err := d.CreateSnapshot(t.Context(), tc.req)
			assert.Equal(t, tc.wantWrite, len(writeActions(env)) > 0, "writes: %v", writeActions(env))
			if !wantResult(t, err, tc.wantCode, tc.wantMsg) {
				return
			}
			s := resp.Snapshot
			wantID := tc.wantID
			if wantID == "" {
				wantID = tc.req.Name
			}
			assert.Equal(t, wantID, s.SnapshotId)
			assert.Equal(t, "pvc-1", s.SourceVolumeId)
			assert.Equal(t, tc.wantReady, s.ReadyToUse)
			assert.Equal(t, int64(1<<20), s.SizeBytes)
			if tc.wantReady {
				assert.Equal(t, int32(500_000_000), s.CreationTime.Nanos, "the data plane's creation time")
			}
		})
	}
}

func TestListSnapshotsPages(t *testing.T) {
	objs := []runtime.Object{existingVolume("pvc-1", 1<<20, 1), existingVolume("pvc-2", 1<<20, 1),
		snapshotCR("s-a", "pvc-1"), snapshotCR("s-b", "pvc-1"), snapshotCR("s-c", "pvc-2"), snapshotCR("s-d", "pvc-1"),
		snapshotCR("system", "pvc-1", func(s *v1beta1.Snapshot) { s.Spec.CreateSnapshot = false })}
	env := dstest.New(t, objs, nil)
	d, err := NewDriver(Options{Mode: ModeController, Version: "test", Store: env.DS})
	require.NoError(t, err)

	ids := func(r *csi.ListSnapshotsResponse) (out []string) {
		for _, e := range r.Entries {
			out = append(out, e.Snapshot.SnapshotId)
		}
		return out
	}
	var got []string
	token := ""
	for {
		resp, err := d.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{SourceVolumeId: "pvc-1", MaxEntries: 2, StartingToken: token})
		require.NoError(t, err)
		got = append(got, ids(resp)...)
		if token = resp.NextToken; token == "" {
			break
		}
	}
	assert.Equal(t, []string{"s-a", "s-b", "s-d"}, got, "pvc-1's CSI snapshots, in pages of 2, without the system snapshot")

	byID, err := d.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{SnapshotId: "s-c"})
	require.NoError(t, err)
	assert.Equal(t, []string{"s-c"}, ids(byID))
	none, err := d.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{SnapshotId: "missing"})
	require.NoError(t, err)
	assert.Empty(t, none.Entries)
	_, err = d.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{StartingToken: "x"})
	assert.Equal(t, codes.Aborted, status.Code(err))
}
