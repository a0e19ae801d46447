package datastore

import (
	"sort"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/strata-storage/strata/types"
)

// LeaseExpiry is when a heartbeat lease runs out: its last renewal plus its
// own duration. A lease without either has never been renewed.
func LeaseExpiry(lease *coordinationv1.Lease) (time.Time, bool) {
	if lease.Spec.RenewTime == nil || lease.Spec.LeaseDurationSeconds == nil {
		return time.Time{}, false
	}
	return lease.Spec.RenewTime.Add(time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second), true
}

// NodeLeaseExpiry is when the named node's heartbeat runs out; false when the
// node has no heartbeat lease at all.
func (ds *DataStore) NodeLeaseExpiry(nodeName string) (time.Time, bool) {
	lease, err := ds.Leases.Get(types.NodeLeaseName(nodeName))
	if err != nil {
		return time.Time{}, false
	}
	return LeaseExpiry(lease)
}

// IsNodeAlive is true while the node's manager keeps renewing its lease.
func (ds *DataStore) IsNodeAlive(nodeName string) bool {
	expiry, ok := ds.NodeLeaseExpiry(nodeName)
	return ok && ds.Clock.Now().Before(expiry)
}

// AliveNodeNames lists, sorted, the registered nodes whose managers are alive.
func (ds *DataStore) AliveNodeNames() ([]string, error) {
	nodes, err := ds.Nodes.ListRO(labels.Everything())
	if err != nil {
		return nil, err
	}
	var alive []string
	for _, n := range nodes {
		if ds.IsNodeAlive(n.Name) {
			alive = append(alive, n.Name)
		}
	}
	sort.Strings(alive)
	return alive, nil
}

// DiskLocation is where a disk is: its node, its name there and its path.
type DiskLocation struct {
	Node, Name, Path string
}

// LocateDisk finds a disk by UUID through the nodes' disk status; ok is
// false when no node reports it (its node is gone, or its UUID file was not
// read yet).
func (ds *DataStore) LocateDisk(uuid string) (DiskLocation, bool) {
	nodes, err := ds.Nodes.ListByIndexRO(IndexByDisk, uuid)
	if err != nil {
		return DiskLocation{}, false
	}
	for _, n := range nodes {
		for name, st := range n.Status.DiskStatus {
			if st == nil || st.DiskUUID != uuid {
				continue
			}
			if spec, ok := n.Spec.Disks[name]; ok {
				return DiskLocation{Node: n.Name, Name: name, Path: spec.Path}, true
			}
		}
	}
	return DiskLocation{}, false
}
