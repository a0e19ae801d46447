package datastore

import (
	"context"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// SnapshotBytesOf sums what the volumes' snapshots hold: their Snapshot
// CRs (SnapshotUsage), and what deleted snapshots still hold on disk
// (RemovedBytesOf): that data occupies the disk as much as a snapshot's,
// so a quota counts it until a purge frees it.
func (ds *DataStore) SnapshotBytesOf(volumes []string) int64 {
	var total int64
	for _, v := range volumes {
		total += ds.SnapshotUsage.VolumeBytes(v)
	}
	return total + ds.RemovedBytesOf(volumes)
}

// RemovedBytesOf sums the volumes' status.removedSnapshotsSize: deleted
// snapshots' layers still in their chains.
func (ds *DataStore) RemovedBytesOf(volumes []string) int64 {
	var total int64
	for _, name := range volumes {
		if v, err := ds.Volumes.GetRO(name); err == nil {
			total += v.Status.RemovedSnapshotsSize
		}
	}
	return total
}

// HeadBytes is what a snapshot of the volume would hold if taken now: the
// allocated size of its live head, as the engine last reported it (the
// data plane refreshes it every few seconds while writes go on, and the
// figure stays while the volume is detached). Each engine is read from the
// API server, not this manager's cache: admission charges a snapshot asked
// for right after writes, and the cache may not hold the report of them
// yet (seen under load in the end-to-end suite). A failed read falls back
// to the cached engine.
func (ds *DataStore) HeadBytes(ctx context.Context, volume string) int64 {
	engines, err := ds.Engines.ListByIndexRO(IndexByVolume, volume)
	if err != nil {
		return 0
	}
	var most int64
	for _, e := range engines {
		if live, err := ds.Engines.GetLive(ctx, e.Name); err == nil {
			e = live
		}
		if head := e.Status.Snapshots[types.VolumeHeadName]; head != nil && head.Size > most {
			most = head.Size
		}
	}
	return most
}

// VirtualMachineVolumes are the Strata volumes behind a VM's claims; claims
// not bound, or of another driver, are left out.
func (ds *DataStore) VirtualMachineVolumes(vm *unstructured.Unstructured) []string {
	var out []string
	for _, c := range VirtualMachineClaims(vm) {
		if v, ok := ds.VolumeOfClaim(c); ok {
			out = append(out, v)
		}
	}
	return out
}

// NamespaceQuota is the namespace's default-resource-quota, if it has one.
func (ds *DataStore) NamespaceQuota(namespace string) (*v1beta1.ResourceQuota, bool) {
	rq, err := ds.ResourceQuotas.GetInNamespaceRO(namespace, v1beta1.DefaultResourceQuotaName)
	return rq, err == nil
}
