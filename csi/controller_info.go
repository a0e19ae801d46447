package csi

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/scheduler"
	"github.com/strata-storage/strata/types"
)

// The controller's read-only answers: capacity, the volume list, one volume,
// and the volumes' health. They are polled (the external-provisioner's
// capacity tracking, the attacher's and the health monitor's resyncs), so
// they read the cache, except the lists (listVolumes says why).

// GetCapacity reports the space new replicas may take on the disks of the
// node the topology names, or of every node when it names none. Replicas go
// on whole disks, so maximum_volume_size is the largest single disk's share.
func (d *Driver) GetCapacity(_ context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	if _, err := parseParameters(req.GetParameters(), map[string]string{}); err != nil {
		return nil, err
	}
	// volumeSize rounds every request up to a whole block, at least one.
	resp := &csi.GetCapacityResponse{MaximumVolumeSize: wrapperspb.Int64(0), MinimumVolumeSize: wrapperspb.Int64(types.BlockSize)}
	if caps := req.GetVolumeCapabilities(); len(caps) > 0 && checkCapabilities(caps) != nil {
		return resp, nil // no volume with these capabilities can be made anywhere
	}
	nodes, err := d.capacityNodes(req.GetAccessibleTopology())
	if err != nil {
		return nil, err
	}
	rules, err := d.capacityRules(nodes)
	if err != nil {
		return nil, err
	}
	var largest int64
	for _, n := range nodes {
		for _, space := range rules.diskSpaces(n) {
			resp.AvailableCapacity += space
			largest = max(largest, space)
		}
	}
	resp.MaximumVolumeSize = wrapperspb.Int64(largest)
	return resp, nil
}

// capacityNodes are the nodes a topology stands for: every node for none,
// else the node its TopologyNodeKey segment names, if it exists.
func (d *Driver) capacityNodes(top *csi.Topology) ([]*v1beta1.Node, error) {
	if len(top.GetSegments()) == 0 {
		nodes, err := d.ds.Nodes.ListRO(nil)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "listing nodes: %v", err)
		}
		return nodes, nil
	}
	name := top.GetSegments()[TopologyNodeKey]
	if name == "" {
		return nil, nil // a topology this driver does not serve
	}
	node, err := d.ds.Nodes.GetRO(name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "reading node %s: %v", name, err)
	}
	return []*v1beta1.Node{node}, nil
}

// capacityRules are the settings and cluster facts a disk's schedulable
// space depends on, read once per call.
type capacityRules struct {
	overProvisioningPct int64
	minimalAvailablePct int64
	alive               func(node string) bool
	// scheduled is, by disk UUID, the sizes of the replicas the cache places
	// there: a disk's status counts new replicas only at its next check.
	scheduled map[string]int64
}

func (d *Driver) capacityRules(nodes []*v1beta1.Node) (capacityRules, error) {
	r := capacityRules{alive: d.ds.IsNodeAlive, scheduled: map[string]int64{}}
	var err error
	if r.overProvisioningPct, err = d.ds.GetSettingInt(types.SettingStorageOverProvisioningPercentage); err != nil {
		return r, status.Errorf(codes.Internal, "reading setting: %v", err)
	}
	if r.minimalAvailablePct, err = d.ds.GetSettingInt(types.SettingStorageMinimalAvailablePercentage); err != nil {
		return r, status.Errorf(codes.Internal, "reading setting: %v", err)
	}
	for _, n := range nodes {
		for _, st := range n.Status.DiskStatus {
			if st == nil || st.DiskUUID == "" {
				continue
			}
			onDisk, err := d.ds.Replicas.ListByIndexRO(datastore.IndexByDisk, st.DiskUUID)
			if err != nil {
				return r, status.Errorf(codes.Internal, "listing replicas on disk %s: %v", st.DiskUUID, err)
			}
			for _, rep := range onDisk {
				r.scheduled[st.DiskUUID] += rep.Spec.VolumeSize
			}
		}
	}
	return r, nil
}

// diskSpaces is the schedulable space of each disk of a node, none when the
// node takes no replica: the scheduler's node rules (heartbeat, Ready,
// allowScheduling). A stopped instance manager is left out: it restarts in
// seconds, and reporting no capacity for it would steer pods away for the
// provisioner's whole polling period.
func (r capacityRules) diskSpaces(node *v1beta1.Node) []int64 {
	if !r.alive(node.Name) || !node.Spec.AllowScheduling ||
		!meta.IsStatusConditionTrue(node.Status.Conditions, v1beta1.ConditionTypeReady) {
		return nil
	}
	var spaces []int64
	for name, spec := range node.Spec.Disks {
		spaces = append(spaces, scheduler.DiskSchedulable(node.Name, spec, node.Status.DiskStatus[name], scheduler.Options{
			OverProvisioningPercentage: r.overProvisioningPct, MinimalAvailablePercentage: r.minimalAvailablePct,
			ScheduledBytes: r.scheduled}))
	}
	return spaces
}

// volumeTokenPrefix marks the page tokens this driver gives, so that one it
// never gave is refused rather than read as a name (csi-sanity sends
// "invalid-token", a valid name). After it comes the last name listed: the
// next page starts after that name even when that volume has gone since, so
// no volume is listed twice or skipped for a deletion.
const volumeTokenPrefix = "after:"

// ListVolumes lists the volumes in name order, with the nodes each is
// attached to.
func (d *Driver) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	vols, err := d.listVolumes(ctx)
	if err != nil {
		return nil, err
	}
	page, next, err := volumePage(vols, req.GetMaxEntries(), req.GetStartingToken())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, v := range page {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: csiVolume(v),
			Status: &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: publishedNodes(v)}})
	}
	return resp, nil
}

func (d *Driver) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	v, err := d.getVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeResponse{Volume: csiVolume(v),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: publishedNodes(v)}}, nil
}

// ControllerGetVolumeHealth and ControllerListVolumeHealth carry what spec
// 1.13 removed from ListVolumes and ControllerGetVolume (volume_condition).
func (d *Driver) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	v, err := d.getVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: volumeHealth(v)}, nil
}

// ControllerListVolumeHealth lists the volumes with a health problem, in
// name order; the spec lists only those.
func (d *Driver) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	vols, err := d.listVolumes(ctx)
	if err != nil {
		return nil, err
	}
	vols = slices.DeleteFunc(vols, func(v *v1beta1.Volume) bool { return len(volumeHealth(v).HealthStatuses) == 0 })
	page, next, err := volumePage(vols, req.GetMaxEntries(), req.GetStartingToken())
	if err != nil {
		return nil, err
	}
	resp := &csi.ControllerListVolumeHealthResponse{NextToken: next}
	for _, v := range page {
		resp.Entries = append(resp.Entries, volumeHealth(v))
	}
	return resp, nil
}

// listVolumes lists the volumes that are not being deleted: once
// DeleteVolume has succeeded the volume is gone as far as CSI is concerned,
// while the volume controller still tears it down. It reads the API server,
// not the cache: a CO that lists right after a create or delete must see
// it (csi-sanity does), and the sidecars list rarely (csi-attacher's
// reconcile, once a minute).
func (d *Driver) listVolumes(ctx context.Context) ([]*v1beta1.Volume, error) {
	list, err := d.ds.StrataClient.StrataV1beta1().Volumes(d.ds.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, apiStatus(err, "listing volumes")
	}
	vols := make([]*v1beta1.Volume, 0, len(list.Items))
	for i := range list.Items {
		if list.Items[i].DeletionTimestamp == nil {
			vols = append(vols, &list.Items[i])
		}
	}
	return vols, nil
}

// getVolume reads one volume, from the API server when the cache does not
// hold it yet; a volume being deleted is NotFound, as in listVolumes.
func (d *Driver) getVolume(ctx context.Context, id string) (*v1beta1.Volume, error) {
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: required")
	}
	v, err := d.ds.Volumes.GetROOrLive(ctx, id)
	if err != nil {
		return nil, apiStatus(err, "volume "+id)
	}
	if v.DeletionTimestamp != nil {
		return nil, status.Errorf(codes.NotFound, "volume %s is being deleted", id)
	}
	return v, nil
}

// volumePage sorts vols by name and returns the page after token, with the
// token of the next page ("" on the last).
func volumePage(vols []*v1beta1.Volume, maxEntries int32, token string) ([]*v1beta1.Volume, string, error) {
	if maxEntries < 0 {
		return nil, "", status.Errorf(codes.InvalidArgument, "max_entries %d: must not be negative", maxEntries)
	}
	slices.SortFunc(vols, func(a, b *v1beta1.Volume) int { return strings.Compare(a.Name, b.Name) })
	if token != "" {
		after, ok := strings.CutPrefix(token, volumeTokenPrefix)
		if !ok || after == "" {
			return nil, "", status.Errorf(codes.Aborted, "starting_token %q: not a token this driver gave", token)
		}
		i, found := slices.BinarySearchFunc(vols, after, func(v *v1beta1.Volume, name string) int { return strings.Compare(v.Name, name) })
		if found {
			i++
		}
		vols = vols[i:]
	}
	if n := int(maxEntries); n > 0 && n < len(vols) {
		return vols[:n], volumeTokenPrefix + vols[n-1].Name, nil
	}
	return vols, "", nil
}

func csiVolume(v *v1beta1.Volume) *csi.Volume {
	return &csi.Volume{VolumeId: v.Name, CapacityBytes: v.Spec.Size.Value()}
}

// publishedNodes are the Strata nodes (the CSI node ids) the volume is
// attached to: its node, and during a live migration the target too.
func publishedNodes(v *v1beta1.Volume) []string {
	var nodes []string
	for _, n := range []string{v.Status.CurrentNodeID, v.Status.CurrentMigrationNodeID} {
		if n != "" && !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	return nodes
}

// volumeHealth says what is wrong with a volume: nothing while it is healthy
// or its robustness is not known yet; DEGRADED while it runs short of a
// healthy replica; INACCESSIBLE when no replica can serve it (not DATA_LOSS:
// a faulted volume can often be salvaged). The message adds the volume's
// first false condition, which usually says why (a replica that cannot be
// placed, no replica to salvage).
func volumeHealth(v *v1beta1.Volume) *csi.VolumeHealth {
	h := &csi.VolumeHealth{VolumeId: v.Name}
	var kind csi.VolumeHealthErrorType
	var reason string
	switch v.Status.Robustness {
	case v1beta1.VolumeRobustnessDegraded:
		kind, reason = csi.VolumeHealthErrorType_DEGRADED, "Degraded"
	case v1beta1.VolumeRobustnessFaulted:
		kind, reason = csi.VolumeHealthErrorType_INACCESSIBLE, "Faulted"
	default:
		return h
	}
	msg := fmt.Sprintf("volume is %s", v.Status.Robustness)
	for _, c := range v.Status.Conditions {
		if c.Status == metav1.ConditionFalse {
			msg += fmt.Sprintf(": %s is False (%s): %s", c.Type, c.Reason, c.Message)
			break
		}
	}
	h.HealthStatuses = []*csi.VolumeHealth_VolumeHealthEntry{{Status: kind, Reason: reason, Message: msg}}
	return h
}
