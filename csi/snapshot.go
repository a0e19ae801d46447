package csi

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// A CSI snapshot is a Strata Snapshot CR with createSnapshot: true; its id
// is the CR's name, which is also the snapshot's name in the volume's chain.
// The Snapshot controller takes it (attaching a detached volume for the
// moment it needs) and reports readyToUse, size and creation time.

func (d *Driver) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	name, volume := req.GetName(), req.GetSourceVolumeId()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "name: required")
	}
	csiName := name
	// The snapshot is named as asked when that is a valid snapshot and object
	// name, else after the hash of the name (same name, same snapshot).
	if types.ValidateSnapshotName(name) != nil || len(validation.IsDNS1123Subdomain(name)) > 0 {
		name = derivedName("snap", name)
	}
	if volume == "" {
		return nil, status.Error(codes.InvalidArgument, "source_volume_id: required")
	}
	if err := checkSnapshotClassParameters(req.GetParameters(), "VolumeSnapshotClass"); err != nil {
		return nil, err
	}
	snap, err := d.ensureSnapshot(ctx, name, csiName, volume)
	if err != nil {
		return nil, err
	}
	if snap.Status.Error != "" {
		// The volume's limits are not a failure of the driver: CSI's code for
		// a request the storage cannot hold now, which later calls may pass.
		code := codes.Internal
		if strings.HasPrefix(snap.Status.Error, v1beta1.SnapshotLimitExceeded) {
			code = codes.ResourceExhausted
		}
		return nil, status.Errorf(code, "snapshot %s of volume %s failed: %s", name, volume, snap.Status.Error)
	}
	return &csi.CreateSnapshotResponse{Snapshot: d.csiSnapshot(snap)}, nil
}

func (d *Driver) ensureSnapshot(ctx context.Context, name, csiName, volume string) (*v1beta1.Snapshot, error) {
	existing, err := d.ds.Snapshots.GetROOrLive(ctx, name)
	switch {
	case err == nil:
		if existing.Spec.Volume != volume {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %s exists of volume %s, requested of %s",
				name, existing.Spec.Volume, volume)
		}
		return existing, nil
	case !apierrors.IsNotFound(err):
		return nil, apiStatus(err, "reading snapshot "+name)
	}
	if _, err := d.ds.Volumes.GetROOrLive(ctx, volume); err != nil {
		return nil, apiStatus(err, "source volume "+volume)
	}
	snap := &v1beta1.Snapshot{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.ds.Namespace, Annotations: map[string]string{AnnotationCSIName: csiName}},
		Spec:       v1beta1.SnapshotSpec{Volume: volume, CreateSnapshot: true},
	}
	created, err := d.ds.Snapshots.Create(ctx, snap)
	if apierrors.IsAlreadyExists(err) {
		return d.ensureSnapshot(ctx, name, csiName, volume)
	}
	if err != nil {
		return nil, apiStatus(err, "creating snapshot "+name)
	}
	d.log.WithFields(map[string]any{"snapshot": name, "volume": volume}).Info("Created snapshot")
	return created, nil
}

func (d *Driver) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id: required")
	}
	if err := d.ds.Snapshots.Delete(ctx, req.GetSnapshotId()); err != nil && !apierrors.IsNotFound(err) {
		return nil, apiStatus(err, "deleting snapshot "+req.GetSnapshotId())
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

// ListSnapshots lists by id, by source volume or all, in name order. The
// page token is the position of the next entry.
func (d *Driver) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	snaps, err := d.snapshotsFor(ctx, req.GetSnapshotId(), req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	slices.SortFunc(snaps, func(a, b *v1beta1.Snapshot) int { return strings.Compare(a.Name, b.Name) })
	start := 0
	if tok := req.GetStartingToken(); tok != "" {
		if start, err = strconv.Atoi(tok); err != nil || start < 0 || start > len(snaps) {
			return nil, status.Errorf(codes.Aborted, "starting_token %q: not a token this driver gave", tok)
		}
	}
	end := len(snaps)
	if n := int(req.GetMaxEntries()); n > 0 && start+n < end {
		end = start + n
	}
	resp := &csi.ListSnapshotsResponse{}
	for _, s := range snaps[start:end] {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: d.csiSnapshot(s)})
	}
	if end < len(snaps) {
		resp.NextToken = strconv.Itoa(end)
	}
	return resp, nil
}

// snapshotsFor lists the snapshots a user made (createSnapshot: true, or a
// member of a SnapshotGroup), not being deleted, asked for; an unknown id or volume lists none. It reads the API
// server, not the cache: a snapshot created or deleted a moment ago must be
// listed as such, and the call is rare (the snapshotter does not poll it).
func (d *Driver) snapshotsFor(ctx context.Context, id, volume string) ([]*v1beta1.Snapshot, error) {
	var snaps []*v1beta1.Snapshot
	if id != "" {
		s, err := d.ds.Snapshots.GetROOrLive(ctx, id)
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, apiStatus(err, "reading snapshot "+id)
		}
		if err == nil && (volume == "" || s.Spec.Volume == volume) {
			snaps = []*v1beta1.Snapshot{s}
		}
	} else {
		list, err := d.ds.StrataClient.StrataV1beta1().Snapshots(d.ds.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, apiStatus(err, "listing snapshots")
		}
		for i := range list.Items {
			if s := &list.Items[i]; volume == "" || s.Spec.Volume == volume {
				snaps = append(snaps, s)
			}
		}
	}
	return slices.DeleteFunc(snaps, func(s *v1beta1.Snapshot) bool { return !userMade(s) || s.DeletionTimestamp != nil }), nil
}

// userMade: a snapshot a user asked for, alone or in a group (the group's
// members are recorded from the engine's chain, createSnapshot false); not
// one Strata took for itself or found in a chain.
func userMade(s *v1beta1.Snapshot) bool {
	return s.Spec.CreateSnapshot || s.Labels[types.LabelSnapshotGroup] != ""
}

func (d *Driver) csiSnapshot(s *v1beta1.Snapshot) *csi.Snapshot {
	created := s.CreationTimestamp.Time
	if t, err := time.Parse(time.RFC3339Nano, s.Status.CreationTime); err == nil {
		created = t
	}
	size := s.Status.RestoreSize
	if size == 0 {
		if v, err := d.ds.Volumes.GetRO(s.Spec.Volume); err == nil {
			size = v.Spec.Size.Value()
		}
	}
	return &csi.Snapshot{SnapshotId: s.Name, SourceVolumeId: s.Spec.Volume, SizeBytes: size,
		CreationTime: timestamppb.New(created), ReadyToUse: s.Status.ReadyToUse}
}

// deletionPolicyParameter is a snapshot class's own deletionPolicy field,
// which some tools (the Kubernetes storage e2e suite among them) also copy
// into its parameters: the sidecars act on the field, so the key tells
// Strata nothing and is let through.
const deletionPolicyParameter = "deletionPolicy"

// checkSnapshotClassParameters refuses a (group) snapshot class parameter
// Strata does not know, naming it: a class takes none of Strata's, and a
// key meant for another driver (Longhorn's type: bak asks for a backup)
// would otherwise silently get a plain snapshot. The sidecars' own metadata
// (csi.storage.k8s.io/…) and deletionPolicy pass.
func checkSnapshotClassParameters(params map[string]string, class string) error {
	for key := range params {
		if !strings.HasPrefix(key, provisionerPrefix) && key != deletionPolicyParameter {
			return status.Errorf(codes.InvalidArgument, "parameter %q: unknown (a %s takes none of Strata's)", key, class)
		}
	}
	return nil
}
