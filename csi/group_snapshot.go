package csi

import (
	"context"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// A CSI group snapshot is a Strata SnapshotGroup: its id is the group's
// name, its members' ids their Snapshot CRs' names. The SnapshotGroup
// controller takes the crash-consistent cut; the calls here make and read
// the CR, as CreateSnapshot does with a Snapshot.

// groupWait bounds how long CreateVolumeGroupSnapshot waits for the cut
// (which may have to attach detached volumes first); past it the call
// fails Unavailable and the snapshotter calls again (the call is
// idempotent: the same name finds the same group).
const groupWait = 90 * time.Second

// maxGroupVolumes is SnapshotGroup.spec.volumes' bound.
const maxGroupVolumes = v1beta1.SnapshotGroupMaxVolumes

func (d *Driver) GroupControllerGetCapabilities(context.Context, *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	return &csi.GroupControllerGetCapabilitiesResponse{Capabilities: []*csi.GroupControllerServiceCapability{{
		Type: &csi.GroupControllerServiceCapability_Rpc{Rpc: &csi.GroupControllerServiceCapability_RPC{
			Type: csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT}}}}}, nil
}

func (d *Driver) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	csiName, volumes := req.GetName(), req.GetSourceVolumeIds()
	if csiName == "" {
		return nil, status.Error(codes.InvalidArgument, "name: required")
	}
	if err := checkGroupVolumes(volumes); err != nil {
		return nil, err
	}
	if err := checkSnapshotClassParameters(req.GetParameters(), "VolumeGroupSnapshotClass"); err != nil {
		return nil, err
	}
	name := csiName
	if len(name) > 40 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		// Member snapshots are named <group>-<volume>: a short group name
		// keeps them readable. Same name, same group.
		name = derivedName("group", csiName)
	}
	if _, err := d.ensureGroup(ctx, name, csiName, volumes); err != nil {
		return nil, err
	}
	var group *csi.VolumeGroupSnapshot
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, groupWait, true, func(context.Context) (bool, error) {
		g, err := d.ds.SnapshotGroups.GetROOrLive(ctx, name)
		if err != nil {
			return false, apiStatus(err, "reading group snapshot "+name)
		}
		if g.Status.State == v1beta1.SnapshotGroupFailed {
			return false, status.Errorf(codes.Internal, "group snapshot %s failed: %s", name, g.Status.Error)
		}
		group = d.csiGroup(g)
		return group != nil, nil
	})
	if wait.Interrupted(err) {
		return nil, status.Errorf(codes.Unavailable, "group snapshot %s of %d volumes is not taken yet; call again", name, len(volumes))
	}
	if err != nil {
		return nil, err // the group failed, or reading it did
	}
	return &csi.CreateVolumeGroupSnapshotResponse{GroupSnapshot: group}, nil
}

func checkGroupVolumes(volumes []string) error {
	switch {
	case len(volumes) == 0:
		return status.Error(codes.InvalidArgument, "source_volume_ids: required")
	case len(volumes) > maxGroupVolumes:
		return status.Errorf(codes.InvalidArgument, "source_volume_ids: %d volumes, at most %d", len(volumes), maxGroupVolumes)
	}
	seen := map[string]bool{}
	for _, v := range volumes {
		if v == "" || seen[v] {
			return status.Errorf(codes.InvalidArgument, "source_volume_ids: %q is empty or listed twice", v)
		}
		seen[v] = true
	}
	return nil
}

// ensureGroup finds the group of that name, of the same volumes, or makes it.
func (d *Driver) ensureGroup(ctx context.Context, name, csiName string, volumes []string) (*v1beta1.SnapshotGroup, error) {
	existing, err := d.ds.SnapshotGroups.GetROOrLive(ctx, name)
	switch {
	case err == nil:
		if !sameSet(existing.Spec.Volumes, volumes) {
			return nil, status.Errorf(codes.AlreadyExists, "group snapshot %s exists of volumes %v, requested of %v",
				name, existing.Spec.Volumes, volumes)
		}
		return existing, nil
	case !apierrors.IsNotFound(err):
		return nil, apiStatus(err, "reading group snapshot "+name)
	}
	for _, v := range volumes {
		if _, err := d.ds.Volumes.GetROOrLive(ctx, v); err != nil {
			return nil, apiStatus(err, "source volume "+v)
		}
	}
	g := &v1beta1.SnapshotGroup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.ds.Namespace, Annotations: map[string]string{AnnotationCSIName: csiName}},
		Spec:       v1beta1.SnapshotGroupSpec{Volumes: slices.Clone(volumes)},
	}
	created, err := d.ds.SnapshotGroups.Create(ctx, g)
	if apierrors.IsAlreadyExists(err) {
		return d.ensureGroup(ctx, name, csiName, volumes)
	}
	if err != nil {
		return nil, apiStatus(err, "creating group snapshot "+name)
	}
	return created, nil
}

func sameSet(a, b []string) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

// csiGroup is the group as CSI tells it, nil until it is Ready and every
// member's Snapshot CR reports it ready.
func (d *Driver) csiGroup(g *v1beta1.SnapshotGroup) *csi.VolumeGroupSnapshot {
	if g.Status.State != v1beta1.SnapshotGroupReady {
		return nil
	}
	out := &csi.VolumeGroupSnapshot{GroupSnapshotId: g.Name, ReadyToUse: true, CreationTime: timestamppb.New(g.CreationTimestamp.Time)}
	if t, err := time.Parse(time.RFC3339, g.Status.CreationTime); err == nil {
		out.CreationTime = timestamppb.New(t)
	}
	for _, m := range g.Status.Snapshots {
		s, err := d.ds.Snapshots.GetRO(m.Snapshot)
		if err != nil || !s.Status.ReadyToUse {
			return nil
		}
		snap := d.csiSnapshot(s)
		snap.GroupSnapshotId = g.Name
		out.Snapshots = append(out.Snapshots, snap)
	}
	return out
}

func (d *Driver) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	id := req.GetGroupSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "group_snapshot_id: required")
	}
	g, err := d.ds.SnapshotGroups.GetROOrLive(ctx, id)
	if apierrors.IsNotFound(err) {
		return nil, status.Errorf(codes.NotFound, "group snapshot %s not found", id)
	}
	if err != nil {
		return nil, apiStatus(err, "reading group snapshot "+id)
	}
	group := d.csiGroup(g)
	if group == nil {
		group = &csi.VolumeGroupSnapshot{GroupSnapshotId: g.Name, ReadyToUse: false, CreationTime: timestamppb.New(g.CreationTimestamp.Time)}
	}
	return &csi.GetVolumeGroupSnapshotResponse{GroupSnapshot: group}, nil
}

// DeleteVolumeGroupSnapshot deletes the group; its members go with it (they
// are owned by it). A group already gone is success.
func (d *Driver) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	id := req.GetGroupSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "group_snapshot_id: required")
	}
	if err := d.ds.SnapshotGroups.Delete(ctx, id); err != nil && !apierrors.IsNotFound(err) {
		return nil, apiStatus(err, "deleting group snapshot "+id)
	}
	return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
}
