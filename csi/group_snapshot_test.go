package csi

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func groupCR(name string, volumes []string, edit ...func(*v1beta1.SnapshotGroup)) *v1beta1.SnapshotGroup {
	g := &v1beta1.SnapshotGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: types.DefaultNamespace},
		Spec: v1beta1.SnapshotGroupSpec{Volumes: volumes}}
	for _, e := range edit {
		e(g)
	}
	return g
}

// readyGroup is group g cut, with its members' CRs ready.
func readyGroup(name string, volumes ...string) []runtime.Object {
	var members []v1beta1.SnapshotGroupMember
	objs := []runtime.Object{}
	for _, v := range volumes {
		snap := name + "-" + v
		members = append(members, v1beta1.SnapshotGroupMember{Volume: v, Snapshot: snap})
		objs = append(objs, snapshotCR(snap, v, func(s *v1beta1.Snapshot) {
			s.Spec.CreateSnapshot = false
			s.Labels = map[string]string{types.LabelSnapshotGroup: name}
			s.Status.ReadyToUse, s.Status.RestoreSize, s.Status.CreationTime = true, 1<<20, "2026-11-29T10:00:00Z"
		}))
	}
	return append(objs, groupCR(name, volumes, func(g *v1beta1.SnapshotGroup) {
		g.Status = v1beta1.SnapshotGroupStatus{State: v1beta1.SnapshotGroupReady, ReadyToUse: true,
			CreationTime: "2026-11-29T10:00:00Z", Snapshots: members}
	}))
}

func TestCreateVolumeGroupSnapshot(t *testing.T) {
	vols := []runtime.Object{existingVolume("pvc-1", 1<<20, 1), existingVolume("pvc-2", 1<<20, 1)}
	tests := []struct {
		name     string
		existing []runtime.Object
		req      *csi.CreateVolumeGroupSnapshotRequest
		wantCode codes.Code
		wantMsg  string
	}{
		{name: "taken: its members, ready", existing: append(vols, readyGroup("g1", "pvc-1", "pvc-2")...),
			req: &csi.CreateVolumeGroupSnapshotRequest{Name: "g1", SourceVolumeIds: []string{"pvc-2", "pvc-1"}}},
		{name: "no name", req: &csi.CreateVolumeGroupSnapshotRequest{SourceVolumeIds: []string{"pvc-1"}},
			wantCode: codes.InvalidArgument, wantMsg: "name: required"},
		{name: "no volumes", req: &csi.CreateVolumeGroupSnapshotRequest{Name: "g1"},
			wantCode: codes.InvalidArgument, wantMsg: "source_volume_ids: required"},
		{name: "a volume twice", req: &csi.CreateVolumeGroupSnapshotRequest{Name: "g1", SourceVolumeIds: []string{"pvc-1", "pvc-1"}},
			wantCode: codes.InvalidArgument, wantMsg: `"pvc-1" is empty or listed twice`},
		{name: "same name, other volumes", existing: append(vols, groupCR("g1", []string{"pvc-1"})),
			req:      &csi.CreateVolumeGroupSnapshotRequest{Name: "g1", SourceVolumeIds: []string{"pvc-1", "pvc-2"}},
			wantCode: codes.AlreadyExists, wantMsg: "exists of volumes [pvc-1]"},
		{name: "a missing volume", existing: vols,
			req:      &csi.CreateVolumeGroupSnapshotRequest{Name: "g1", SourceVolumeIds: []string{"pvc-1", "pvc-9"}},
			wantCode: codes.NotFound, wantMsg: "source volume pvc-9"},
		{name: "failed", existing: append(vols, groupCR("g1", []string{"pvc-1"}, func(g *v1beta1.SnapshotGroup) {
			g.Status.State, g.Status.Error = v1beta1.SnapshotGroupFailed, "volume pvc-1's limit"
		})), req: &csi.CreateVolumeGroupSnapshotRequest{Name: "g1", SourceVolumeIds: []string{"pvc-1"}},
			wantCode: codes.Internal, wantMsg: "volume pvc-1's limit"},
		{name: "unknown parameter", existing: vols,
			req:      &csi.CreateVolumeGroupSnapshotRequest{Name: "g1", SourceVolumeIds: []string{"pvc-1"}, Parameters: map[string]string{"x": "y"}},
			wantCode: codes.InvalidArgument, wantMsg: `parameter "x": unknown`},
		{name: "the class's deletionPolicy copied into its parameters", existing: append(vols, readyGroup("g1", "pvc-1", "pvc-2")...),
			req: &csi.CreateVolumeGroupSnapshotRequest{Name: "g1", SourceVolumeIds: []string{"pvc-1", "pvc-2"},
				Parameters: map[string]string{"deletionPolicy": "Delete", "csi.storage.k8s.io/group-snapshotter-secret-name": "s"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := controllerDriver(t, tc.existing, nil, nil)
			resp, err := d.CreateVolumeGroupSnapshot(t.Context(), tc.req)
			if !wantResult(t, err, tc.wantCode, tc.wantMsg) {
				return
			}
			g := resp.GroupSnapshot
			assert.Equal(t, "g1", g.GroupSnapshotId)
			assert.True(t, g.ReadyToUse)
			require.Len(t, g.Snapshots, 2)
			for _, s := range g.Snapshots {
				assert.Equal(t, "g1-"+s.SourceVolumeId, s.SnapshotId)
				assert.Equal(t, "g1", s.GroupSnapshotId)
				assert.True(t, s.ReadyToUse)
				assert.Equal(t, int64(1<<20), s.SizeBytes)
			}
		})
	}
}

func TestGetAndDeleteVolumeGroupSnapshot(t *testing.T) {
	objs := append([]runtime.Object{existingVolume("pvc-1", 1<<20, 1)}, readyGroup("g1", "pvc-1")...)
	d, env := controllerDriver(t, append(objs, groupCR("pending", []string{"pvc-1"})), nil, nil)
	got, err := d.GetVolumeGroupSnapshot(t.Context(), &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "g1"})
	require.NoError(t, err)
	assert.True(t, got.GroupSnapshot.ReadyToUse)
	assert.Len(t, got.GroupSnapshot.Snapshots, 1)
	got, err = d.GetVolumeGroupSnapshot(t.Context(), &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "pending"})
	require.NoError(t, err)
	assert.False(t, got.GroupSnapshot.ReadyToUse)
	_, err = d.GetVolumeGroupSnapshot(t.Context(), &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "nope"})
	wantResult(t, err, codes.NotFound, "group snapshot nope not found")
	_, err = d.GetVolumeGroupSnapshot(t.Context(), &csi.GetVolumeGroupSnapshotRequest{})
	wantResult(t, err, codes.InvalidArgument, "group_snapshot_id: required")

	_, err = d.DeleteVolumeGroupSnapshot(t.Context(), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "g1"})
	require.NoError(t, err)
	_, err = env.Strata.StrataV1beta1().SnapshotGroups(types.DefaultNamespace).Get(t.Context(), "g1", metav1.GetOptions{})
	assert.Error(t, err, "the group is deleted (its members go with it: owner references)")
	_, err = d.DeleteVolumeGroupSnapshot(t.Context(), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "g1"})
	require.NoError(t, err, "gone is success")
	_, err = d.DeleteVolumeGroupSnapshot(t.Context(), &csi.DeleteVolumeGroupSnapshotRequest{})
	wantResult(t, err, codes.InvalidArgument, "group_snapshot_id: required")
}
